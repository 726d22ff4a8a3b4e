"""``--address`` where nothing listens is bad input, said at once (exit 2), not a wait in Ray.

Ray's connect, given an address where no GCS listens, retries for minutes before it
gives up. ``cluster.check_address`` asks the port for a TCP connection first (within
``ADDRESS_CHECK_TIMEOUT_S``), for every command that joins a cluster: ``verify`` and
``probe`` (``cluster.connect``), ``run`` (``admit_plan``, before any gate runs).
The port is unused by construction: bound, then closed, so nothing listens there.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.runtime.cluster import ADDRESS_CHECK_TIMEOUT_S, check_address, split_address
from tests.helpers import REPO

CLI = str(Path(sys.executable).parent / "omni-edge")
BOUND_S = 30.0
"""Generous: the interpreter's start and imports take seconds on a loaded 2-core machine;
the old code waited in Ray's connect for minutes."""
CLUSTER = str(REPO / "configs/profiles/clusters/laptop-desktop.json")
CONFIG = str(REPO / "configs/voice-assistant.yaml")


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed on the way out: nothing listens there


def test_an_address_where_nothing_listens_is_a_config_error_at_once() -> None:
    address = f"127.0.0.1:{_unused_port()}"
    with pytest.raises(ConfigError) as caught:
        check_address(address)
    (problem,) = caught.value.problems
    assert problem.where == "--address"
    assert f"nothing accepts connections at {address}" in problem.what
    # at once: the refusal itself, not the check's timeout running out
    assert f"no answer within {ADDRESS_CHECK_TIMEOUT_S:.0f} s" not in problem.what, problem.what
    assert "ray start --head" in problem.fix


@pytest.mark.parametrize("bad", ["desktop", "desktop:", ":6379", "desktop:port", "10.0.0.2:70000"])
def test_an_address_that_is_not_host_and_port_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        split_address(bad)
    assert caught.value.problems[0].where == "--address"
    assert "is not HOST:PORT" in caught.value.problems[0].what


def test_the_address_forms_ray_takes_are_read() -> None:
    assert split_address("10.0.0.2:6379") == ("10.0.0.2", 6379)
    assert split_address("ray://head.lan:10001") == ("head.lan", 10001)
    assert split_address("[::1]:6379") == ("::1", 6379)
    assert split_address("auto") is None  # Ray finds the cluster itself


@pytest.mark.parametrize(
    "command",
    [
        ["verify", CONFIG],
        ["probe"],
        ["run", CONFIG, "--profile", CLUSTER, "--prompt", "hi", "--no-calibration"],
    ],
    ids=["verify", "probe", "run"],
)
def test_a_command_given_an_address_where_nothing_listens_exits_2_at_once(
    command: list[str], tmp_path: Path
) -> None:
    address = f"127.0.0.1:{_unused_port()}"
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            [CLI, *command, "--address", address],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=BOUND_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"omni-edge {command[0]} --address {address} still ran after {BOUND_S:.0f} s")
    took = time.monotonic() - t0
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"--address: nothing accepts connections at {address}" in said, said[-2000:]
    assert "how to fix: start the cluster's head there" in said, said[-2000:]
    assert "Traceback" not in done.stderr
    print(f"omni-edge {command[0]} --address {address}: exit 2 after {took:.1f} s")
