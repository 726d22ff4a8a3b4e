"""CPU cores as a planned resource: the split rule, and what the plan says for each CPU stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.commands.render import plan_table
from orchestrator.config import load_config, parse_config
from orchestrator.core import errors
from orchestrator.core.console import make_console
from orchestrator.core.cpu_threads import DECODE_WEIGHT, OTHER_WEIGHT, Pool, split_cores
from orchestrator.core.plan import PipelinePlan
from orchestrator.core.profile import HardwareProfile, load_profile
from orchestrator.planner import plan_pipeline
from tests.helpers import REPO

DECODE, OTHER = Pool(DECODE_WEIGHT), Pool(OTHER_WEIGHT)
DEFAULT = REPO / "configs/voice-assistant.yaml"
TWO_CORES = REPO / "configs/profiles/cpu-only-linux.json"


# -- the rule ------------------------------------------------------------------------------


def test_two_cores_give_the_decoder_and_the_voice_one_each() -> None:
    split = split_cores(2, [DECODE, OTHER])
    assert split.threads == (1, 1) and split.usable == 2 and not split.oversubscribed


def test_eight_cores_keep_one_back_and_weight_the_decoder_first() -> None:
    split = split_cores(8, [DECODE, OTHER])
    assert split.usable == 7  # one left to Ray and the OS above RESERVE_ABOVE_CORES
    assert split.threads == (5, 2) and not split.oversubscribed


def test_one_core_is_oversubscribed_with_one_thread_each() -> None:
    split = split_cores(1, [DECODE, OTHER])
    assert split.threads == (1, 1) and split.oversubscribed


def test_three_cpu_stages_on_two_cores_get_one_each_and_say_it_oversubscribes() -> None:
    split = split_cores(2, [DECODE, OTHER, OTHER])
    assert split.threads == (1, 1, 1) and split.oversubscribed


def test_an_override_is_taken_as_it_is_and_the_others_share_the_rest() -> None:
    split = split_cores(8, [Pool(DECODE_WEIGHT, override=3), OTHER, OTHER])
    assert split.threads == (3, 2, 2) and not split.oversubscribed
    over = split_cores(2, [Pool(DECODE_WEIGHT, override=4), OTHER])
    assert over.threads == (4, 1) and over.oversubscribed


@pytest.mark.parametrize("cores", range(1, 65))
@pytest.mark.parametrize("weights", [(2, 1), (2, 1, 1), (1,), (2, 2, 1, 1, 1)])
def test_the_split_never_exceeds_the_cores_unless_there_are_more_pools_than_cores(
    cores: int, weights: tuple[int, ...]
) -> None:
    split = split_cores(cores, [Pool(w) for w in weights])
    assert min(split.threads) >= 1
    if len(weights) <= split.usable:
        assert sum(split.threads) == split.usable and not split.oversubscribed
        decoder, *rest = split.threads
        assert all(
            decoder >= t for t in rest
        )  # the decode stage (weight 2, listed first) is never behind
    else:
        assert split.threads == (1,) * len(weights) and split.oversubscribed


# -- the plan ------------------------------------------------------------------------------


def _cores(profile: HardwareProfile, n: int | None) -> HardwareProfile:
    return profile.model_copy(update={"host": profile.host.model_copy(update={"cpu_cores": n})})


def test_the_default_pipeline_on_a_recorded_two_core_profile_plans_one_thread_each() -> None:
    plan = plan_pipeline(load_config(DEFAULT), load_profile(TWO_CORES))
    assert [(s.name, s.device, s.cpu_threads, s.cpu_threads_from) for s in plan.stages] == [
        ("thinker", "cpu", 1, "plan"),
        ("voice", "cpu", 1, "plan"),
    ]
    assert any(
        n.startswith("cpu: 2 logical CPUs, 2 shared by its stages") and "thinker 1, voice 1" in n
        for n in plan.notes
    )


def test_the_default_pipeline_on_eight_cores_gives_the_decoder_the_larger_share() -> None:
    plan = plan_pipeline(load_config(DEFAULT), _cores(load_profile(TWO_CORES), 8))
    assert (plan.stage("thinker").cpu_threads, plan.stage("voice").cpu_threads) == (5, 2)


def test_a_stage_off_the_cpu_has_no_thread_budget() -> None:
    plan = plan_pipeline(
        load_config(DEFAULT), load_profile(REPO / "configs/profiles/strix-point-rtx5090-wsl.json")
    )
    thinker = plan.stage("thinker")
    assert (
        thinker.device == "gpu:0"
        and thinker.cpu_threads is None
        and thinker.cpu_threads_from is None
    )


def test_a_config_override_is_respected_and_the_plan_says_it_came_from_the_config(
    tmp_path: Path,
) -> None:
    raw = yaml.safe_load(DEFAULT.read_text())
    raw["stages"][0]["cpu_threads"] = 3
    config = parse_config(raw, where="t.yaml", base_dir=DEFAULT.parent)
    plan = plan_pipeline(config, _cores(load_profile(TWO_CORES), 8))
    assert (plan.stage("thinker").cpu_threads, plan.stage("thinker").cpu_threads_from) == (
        3,
        "config",
    )
    assert (plan.stage("voice").cpu_threads, plan.stage("voice").cpu_threads_from) == (
        4,
        "plan",
    )  # 7 usable − 3
    console = make_console(width=80)
    with console.capture() as shown:
        console.print(plan_table(plan))
    assert "CPU threads: thinker 3 (config), voice 4" in shown.get()


def test_a_cpu_threads_of_zero_is_refused_where_it_is_written(tmp_path: Path) -> None:
    raw = {
        "name": "p",
        "stages": [
            {
                "name": "voice",
                "kind": "exported_graph",
                "artifact": str(REPO / "exports/piper-en-us-joe-medium"),
                "devices": ["cpu"],
                "cpu_threads": 0,
            }
        ],
    }
    with pytest.raises(errors.ConfigError) as e:
        parse_config(raw, where="t.yaml", base_dir=tmp_path)
    assert "t.yaml: stages[0].cpu_threads" in str(e.value) and "greater than or equal to 1" in str(
        e.value
    )


def test_a_profile_without_cores_leaves_threads_to_the_engines_and_says_so() -> None:
    plan = plan_pipeline(load_config(DEFAULT), _cores(load_profile(TWO_CORES), None))
    assert all(s.cpu_threads is None for s in plan.stages)
    assert any("does not say how many cores" in n for n in plan.notes)


def test_thread_budgets_off_leave_every_engine_its_own_default() -> None:
    plan = plan_pipeline(load_config(DEFAULT), load_profile(TWO_CORES), plan_threads=False)
    assert all(s.cpu_threads is None for s in plan.stages)
    assert any("CPU thread budgets are off" in n for n in plan.notes)


def test_the_plan_json_carries_cpu_threads_and_an_older_plan_without_them_loads() -> None:
    plan = plan_pipeline(load_config(DEFAULT), load_profile(TWO_CORES))
    doc = json.loads(json.dumps(plan.to_json()))
    assert doc["format"] == "omni-edge.plan/1"
    assert [(s["cpu_threads"], s["cpu_threads_from"]) for s in doc["stages"]] == [
        (1, "plan"),
        (1, "plan"),
    ]
    assert PipelinePlan.from_json(doc).stage("thinker").cpu_threads == 1
    for s in doc["stages"]:
        del s["cpu_threads"], s["cpu_threads_from"]
    older = PipelinePlan.from_json(doc)
    assert (
        older.stage("thinker").cpu_threads is None
        and "cpu_threads" not in older.stage("thinker").details
    )
