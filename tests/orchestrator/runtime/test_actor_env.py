"""The device actors' environment: vLLM's usage statistics off on every backend; the plan's CPU
threads as OpenMP's."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.config import parse_config
from orchestrator.core.plan import StagePlan
from orchestrator.core.profile import load_profile
from orchestrator.planner import plan_pipeline
from orchestrator.runtime.runtime import Runtime
from stages.registry import get_kind
from tests.helpers import REPO

DEFAULT = REPO / "configs/voice-assistant.yaml"


@pytest.mark.parametrize(
    ("device", "backend"), [("cpu", "vllm-cpu"), ("gpu:0", "vllm"), ("igpu:0", "vllm")]
)
def test_the_decode_kind_turns_usage_stats_off_for_every_backend(device: str, backend: str) -> None:
    plan = StagePlan(
        name="thinker",
        kind="ar_decode",
        admitted=True,
        device=device,
        backend=backend,
        route="this-process",
        reservations=(),
        refusals=(),
        engine_kwargs={"model": "m"},
        artifact={},
        inputs=("request",),
    )
    env = get_kind("ar_decode").actor_env(plan)
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["DO_NOT_TRACK"] == "1"


def _vllm_cpu(threads: int | None) -> StagePlan:
    return StagePlan(
        name="thinker",
        kind="ar_decode",
        admitted=True,
        device="cpu",
        backend="vllm-cpu",
        route="this-process",
        reservations=(),
        refusals=(),
        engine_kwargs={"model": "m"},
        artifact={},
        inputs=("request",),
        cpu_threads=threads,
    )


def test_vllm_on_the_cpu_runs_the_plans_threads_as_openmps() -> None:
    assert get_kind("ar_decode").actor_env(_vllm_cpu(3))["OMP_NUM_THREADS"] == "3"
    # no budget (thread budgets off, or a profile without cores): OpenMP's own default
    assert "OMP_NUM_THREADS" not in get_kind("ar_decode").actor_env(_vllm_cpu(None))


def test_two_torch_stages_and_a_voice_share_the_cpu_actor_with_one_openmp_setting() -> None:
    """Two vLLM stages on the CPU share torch's pool in the one actor: the plan gives them one
    budget, so the merged environment has one OMP_NUM_THREADS (a split that gave them
    different counts would be refused when the actor's environment is merged)."""
    raw = yaml.safe_load(DEFAULT.read_text())
    thinker, voice = raw["stages"]
    raw["stages"] = [
        {**thinker, "devices": ["cpu"]},
        {**thinker, "name": "critic", "devices": ["cpu"]},
        voice,
    ]
    config = parse_config(raw, where="t.yaml", base_dir=DEFAULT.parent)
    profile = load_profile(REPO / "configs/profiles/cpu-only-linux.json")
    profile = profile.model_copy(update={"host": profile.host.model_copy(update={"cpu_cores": 8})})
    plan = plan_pipeline(config, profile)
    assert [(s.name, s.cpu_threads) for s in plan.stages] == [
        ("thinker", 5),
        ("critic", 5),
        ("voice", 2),
    ]
    env = Runtime(plan, config).actor_envs["cpu"]
    assert env["OMP_NUM_THREADS"] == "5"
