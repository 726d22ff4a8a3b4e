"""Faults while a pipeline starts: each a named error within a bounded time, the
ledger as it was before, nothing left running."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import StageFailed
from orchestrator.runtime.runtime import Runtime
from tests.helpers.echo import echo_pipeline
from tests.helpers.waiting import NEVER_HANGS_S, wait_until

pytestmark = pytest.mark.ray

LOAD_S = 10 * NEVER_HANGS_S
"""A load no wait in these tests outlasts: a start that ends did not wait it out."""


def test_a_device_actor_killed_while_loading_is_named_and_the_ledger_is_as_before(
    ray_cluster: Any, tmp_path: Path
) -> None:
    import ray

    # load() creates ``loading`` as it begins, then takes LOAD_S: a start() that ends at all
    # (within the never-hangs deadline) ended because of the kill, not because the load did
    loading = tmp_path / "voice-is-inside-load"
    plan, config = echo_pipeline(
        tmp_path,
        voice={"load_s": LOAD_S, "loading_file": str(loading)},
        voice_device="igpu:0",
    )
    rt = Runtime(plan, config)
    failure: list[BaseException] = []
    ended = threading.Event()

    def start() -> None:
        try:
            rt.start()
        except BaseException as exc:
            failure.append(exc)
        finally:
            ended.set()

    threading.Thread(target=start, daemon=True).start()
    wait_until(loading.exists, "the voice stage's load() began")
    # inside load(): the stage holds its reservations, load transient included
    held = ray.get(rt.ledger.snapshot.remote(), timeout=30)["holders"]
    assert {r["purpose"] for r in held["voice"]} >= {"weights", "load_transient"}, held
    rt.kill_device("igpu:0")
    assert ended.wait(NEVER_HANGS_S), (
        "start() did not end after its device actor was killed mid-load"
    )
    assert len(failure) == 1 and isinstance(failure[0], StageFailed)
    e = failure[0]
    assert (e.stage, e.device) == ("voice", "igpu:0") and "died" in e.cause
    history = dict(rt.ledger_history)
    before, after = history["before load voice"], history["after failed load voice"]
    assert after["holders"] == before["holders"] and "voice" not in after["holders"]
    assert rt.final_ledger is not None and rt.final_ledger["held_bytes"] == 0


def test_an_onnx_session_that_fails_to_open_is_named_and_the_ledger_is_as_before(
    ray_cluster: Any, tmp_path: Path, private_cache: Path
) -> None:
    from orchestrator.config import parse_config
    from orchestrator.planner import plan_pipeline
    from tests.helpers.graphs import machine_profile, write_artifact

    artifact = write_artifact(tmp_path / "full", "full")
    config = parse_config(
        {
            "name": "p",
            "stages": [
                {
                    "name": "net",
                    "kind": "exported_graph",
                    "artifact": str(artifact),
                    "devices": ["cpu"],
                    "backends": ["ort-cpu"],
                    "final_output": True,
                    "final_output_type": "tensor",
                }
            ],
        },
        where="t.yaml",
        base_dir=tmp_path,
    )
    plan = plan_pipeline(config, machine_profile(), runtime=False)
    assert plan.admitted
    # The graph is damaged between the plan and the run (a partial copy, a bad disk).
    graph = artifact / "fp32.onnx"
    graph.write_bytes(graph.read_bytes()[:200])
    rt = Runtime(plan, config)
    t0 = time.monotonic()
    with pytest.raises(StageFailed) as info:
        rt.start()
    assert time.monotonic() - t0 < 60
    e = info.value
    assert (e.stage, e.device) == ("net", "cpu") and e.cause.startswith("load failed:")
    history = dict(rt.ledger_history)
    assert history["after failed load net"]["holders"] == history["before load net"]["holders"]
    assert rt.final_ledger is not None and rt.final_ledger["held_bytes"] == 0


def _worker_runner(tmp_path: Path, **stage: Any) -> Any:
    """An exported stage whose session runs in a route worker (this venv's python as
    the route's interpreter), loaded; ``stage``: more fields of the stage's config (its
    ``restart``)."""
    import sys

    from orchestrator.config import parse_config
    from orchestrator.ort.sessions import ResolvedRoute
    from orchestrator.planner import plan_pipeline
    from stages.exported_graph.kind import ExportedGraphKind
    from stages.exported_graph.runner import ExportedGraphRunner
    from tests.helpers.graphs import machine_profile, write_artifact

    artifact = write_artifact(tmp_path / "full", "full")
    config = parse_config(
        {
            "name": "p",
            "stages": [
                {
                    "name": "net",
                    "kind": "exported_graph",
                    "artifact": str(artifact),
                    "devices": ["cpu"],
                    "backends": ["ort-cpu"],
                    "final_output": True,
                    "final_output_type": "tensor",
                    **stage,
                }
            ],
        },
        where="t.yaml",
        base_dir=tmp_path,
    )
    plan = plan_pipeline(config, machine_profile(), runtime=False)
    kind = ExportedGraphKind()
    runner = ExportedGraphRunner(
        plan.stage("net"),
        kind.artifact(config.stage("net")),
        ResolvedRoute("worker", "interpreter", sys.executable),
    )
    runner.load()
    return runner


def _one(runner: Any, rid: str) -> Any:
    import asyncio

    import numpy as np

    from tests.helpers.graphs import K

    async def items() -> Any:
        yield {"x": np.ones((2, K), np.float32)}

    async def main() -> list[Any]:
        return [x async for x in runner.stream(rid, items())]

    return asyncio.run(main())


@pytest.mark.ort
def test_a_route_worker_that_exits_mid_run_is_named_and_the_next_request_refused_clearly(
    tmp_path: Path, private_cache: Path
) -> None:
    """``restart: never``: today's rule, a dead route worker is said and stays dead."""
    import os
    import signal

    runner = _worker_runner(tmp_path, restart="never")
    try:
        assert len(_one(runner, "ok")) == 1  # works while the worker lives
        os.kill(runner._host.pid, signal.SIGKILL)  # what an OOM kill does
        t0 = time.monotonic()
        with pytest.raises(StageFailed) as info:
            _one(runner, "r1")
        assert time.monotonic() - t0 < 15
        e = info.value
        assert (e.stage, e.device) == ("net", "cpu") and "request r1" in e.cause
        assert "route 'worker'" in e.cause and "exited with code -9" in e.cause
        with pytest.raises(StageFailed, match="exited"):
            _one(runner, "r2")
    finally:
        runner.close()


@pytest.mark.ort
def test_a_route_worker_that_hangs_is_killed_after_its_timeout_and_named(
    tmp_path: Path, private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import signal

    from orchestrator.core import settings

    runner = _worker_runner(tmp_path)
    try:
        monkeypatch.setattr(settings, "RUN_TIMEOUT_S", 2.0)
        os.kill(runner._host.pid, signal.SIGSTOP)  # alive, answering nothing
        t0 = time.monotonic()
        with pytest.raises(StageFailed) as info:
            _one(runner, "r1")
        assert time.monotonic() - t0 < 15
        assert "did not answer within 2 s; the worker was killed" in info.value.cause
    finally:
        runner.close()


@pytest.mark.vllm
@pytest.mark.slow
def test_a_vllm_engine_that_fails_to_start_is_named_and_the_ledger_is_as_before(
    ray_cluster: Any,
) -> None:
    import dataclasses

    from orchestrator.config import load_config
    from orchestrator.core.plan import StagePlan
    from orchestrator.planner import plan_pipeline
    from tests.helpers import REPO
    from tests.helpers.profiles import make_profile

    config = load_config(REPO / "configs/voice-assistant.yaml")
    plan = plan_pipeline(config, make_profile())
    assert plan.admitted
    sp = plan.stage("thinker")
    bad = StagePlan.from_dict(
        {**sp.to_dict(), "engine_kwargs": {**sp.engine_kwargs, "kv_cache_memory_bytes": 4096}}
    )
    plan = dataclasses.replace(
        plan, stages=tuple(bad if s.name == "thinker" else s for s in plan.stages)
    )
    rt = Runtime(plan, config)
    t0 = time.monotonic()
    with pytest.raises(StageFailed) as info:
        rt.start()
    assert time.monotonic() - t0 < 180
    e = info.value
    assert (e.stage, e.device) == (
        "thinker",
        "cpu",
    ) and "load failed: vLLM engine did not start" in e.cause
    history = dict(rt.ledger_history)
    assert (
        history["after failed load thinker"]["holders"] == history["before load thinker"]["holders"]
    )
    assert rt.final_ledger is not None and rt.final_ledger["held_bytes"] == 0


def _until(what: str, ok: Any, wait_s: float = 60.0) -> None:
    deadline = time.monotonic() + wait_s
    while not ok():
        assert time.monotonic() < deadline, f"not within {wait_s:g} s: {what}"
        time.sleep(0.02)


FAST = {"max": 5, "window_s": 600, "backoff_s": 0.1, "backoff_max_s": 0.2}


@pytest.mark.ort
def test_a_route_worker_killed_before_its_output_is_replaced_and_said_while_it_is(
    tmp_path: Path, private_cache: Path
) -> None:
    """Killed while idle (before the next call's output): the watch replaces it at once, its
    session reopened from the artifact; while it is down the stage says so
    (``route_worker_restarting``); the next call is served as before, and counted."""
    import os
    import signal

    import numpy as np

    runner = _worker_runner(tmp_path, restart=FAST)
    host = runner._host
    try:
        (before,) = _one(runner, "ok")
        old = host.pid
        with host._lock:  # the replacement waits for this lock: the dead worker is seen first
            os.kill(old, signal.SIGKILL)
            _until("the worker's death", lambda: host._proc.poll() is not None)
            said = runner.health()
            assert said is not None and said["code"] == "route_worker_restarting", said
        _until("replaced", lambda: host.revival.restarts == 1 and not host.revival.restarting)
        assert host.pid != old and runner.health() is None and runner.worker_restarts() == 1
        assert "exited with code -9 while idle" in host.revival.last
        (after,) = _one(runner, "again")
        for name in before:
            np.testing.assert_allclose(after[name], before[name], rtol=1e-6)
        assert runner.request_stats("again")["worker_restarts"] == 1  # its stats say so
    finally:
        runner.close()


@pytest.mark.ort
def test_a_call_cut_by_its_workers_death_is_run_once_more_and_delivered_once(
    tmp_path: Path, private_cache: Path
) -> None:
    """Killed mid-call (its request sent, no reply yet: the worker stopped with SIGSTOP, then
    SIGKILL): nothing of that call reached the caller, so it runs again once on a fresh
    worker, and its one output comes back once."""
    import os
    import signal
    import threading

    import numpy as np

    runner = _worker_runner(tmp_path, restart=FAST)
    host = runner._host
    try:
        (before,) = _one(runner, "ok")
        os.kill(host.pid, signal.SIGSTOP)  # alive, answering nothing
        out: list[Any] = []
        caller = threading.Thread(target=lambda: out.append(_one(runner, "cut")))
        caller.start()
        _until("the call in flight", lambda: host.in_call == "run")
        os.kill(host.pid, signal.SIGKILL)
        caller.join(60)
        assert not caller.is_alive() and len(out) == 1
        (items,) = out
        assert len(items) == 1  # one output: delivered once
        for name in before:
            np.testing.assert_allclose(items[0][name], before[name], rtol=1e-6)
        assert host.revival.restarts == 1 and "died during 'run'" in host.revival.last
    finally:
        runner.close()


@pytest.mark.ort
def test_a_route_worker_that_keeps_dying_is_a_crash_loop_named_and_not_replaced(
    tmp_path: Path, private_cache: Path
) -> None:
    import os
    import signal

    runner = _worker_runner(tmp_path, restart={**FAST, "max": 1})
    host = runner._host
    try:
        os.kill(host.pid, signal.SIGKILL)
        _until("the first replacement", lambda: host.revival.restarts == 1)
        os.kill(host.pid, signal.SIGKILL)  # a second death within the window: over max 1
        _until("the crash loop", lambda: host.revival.crash_loop is not None)
        with pytest.raises(StageFailed) as info:
            _one(runner, "r1")
        e = info.value
        assert (e.stage, e.device) == ("net", "cpu") and "route 'worker'" in e.cause
        assert "a crash loop" in e.cause and "died 2 times within 600 s (restart: max 1)" in e.cause
        said = runner.health()
        assert said is not None and said["code"] == "route_worker_failed"
        assert host.revival.restarts == 1 and host._proc.poll() is not None
    finally:
        runner.close()
