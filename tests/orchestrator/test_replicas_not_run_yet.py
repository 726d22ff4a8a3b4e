"""A plan with stage replicas is planned (``omni-edge plan``) but not run: the runtime
starts one instance per stage so far, so ``run``, ``chat``, ``serve`` and
``Pipeline.from_config``/``open`` refuse it as bad input (exit 2, no traceback) in
``admit_plan``, before the cluster is probed, the gates run or anything loads."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api import Pipeline
from orchestrator.cli import main
from orchestrator.errors import ConfigError
from tests.helpers import REPO

EXAMPLE = REPO / "configs/examples/voice-replicas.yaml"


def _said(text: str) -> None:
    """What a user must read: the stage, N, what is computed and the remedy."""
    assert "stages.voice.replicas" in text
    assert "voice has 2 replicas" in text
    assert (
        "the plan and each replica's reservations are computed (`omni-edge plan` shows them)"
        in (" ".join(text.split()))
    )
    assert "the runtime starts one instance per stage so far" in " ".join(text.split())
    assert "set replicas: 1 on voice to run it" in " ".join(text.split())


@pytest.fixture(autouse=True)
def nothing_is_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal comes before the plan is made (and so before anything slower)."""

    def planned(*args: object, **kwargs: object) -> None:
        raise AssertionError("planned a config with replicas that the runtime cannot start")

    monkeypatch.setattr(api, "plan_pipeline", planned)
    monkeypatch.setattr(api, "plan_profile", planned)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "argv",
    [
        ["run", str(EXAMPLE), "--prompt", "Hello."],
        ["chat", str(EXAMPLE)],
        ["serve", str(EXAMPLE), "--port", "PORT"],
    ],
    ids=["run", "chat", "serve"],
)
def test_the_cli_refuses_to_run_replicas_with_exit_2_naming_the_stage(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(_free_port()) if a == "PORT" else a for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    _said(captured.err)
    assert "Traceback" not in captured.err + captured.out


def test_the_python_api_raises_the_config_error() -> None:
    with pytest.raises(ConfigError) as e:
        Pipeline.from_config(EXAMPLE, record=None)
    _said(str(e.value))
    assert [p.where for p in e.value.problems] == [f"{EXAMPLE}: stages.voice.replicas"]

    async def opened() -> None:
        async with Pipeline.open(EXAMPLE, record=None):
            raise AssertionError("started")

    with pytest.raises(ConfigError) as e:
        asyncio.run(opened())
    _said(str(e.value))


def test_replicas_of_one_are_not_refused(tmp_path: Path) -> None:
    """``replicas: 1`` goes on to plan (here: the planner stand-in says it was reached)."""
    one = tmp_path / "one.yaml"
    one.write_text(
        EXAMPLE.read_text()
        .replace("replicas: 2", "replicas: 1")
        .replace("../../exports", str(REPO / "exports"))
    )
    with pytest.raises(AssertionError, match="planned a config"):
        api.admit_plan(one)


def test_a_plan_made_elsewhere_is_refused_by_the_pipeline_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Pipeline(plan, config)`` from a plan made without ``admit_plan`` (a saved plan, a
    program of its own) would start one instance while every replica is reserved: refused
    the same way, before the runtime exists."""
    from orchestrator.config import load_config
    from orchestrator.planner import plan_pipeline
    from orchestrator.profile import load_profile

    monkeypatch.undo()  # this test plans for real
    config = load_config(EXAMPLE)
    plan = plan_pipeline(config, load_profile(REPO / "configs/profiles/cpu-only-linux.json"))
    assert plan.admitted and len(plan.stage("voice").replicas) == 2
    with pytest.raises(ConfigError) as e:
        Pipeline(plan, config, record=None)
    _said(str(e.value))
