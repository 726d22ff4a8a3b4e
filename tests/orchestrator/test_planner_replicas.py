"""Stage replicas in the plan (``replicas: N``, docs/pipelines.md): each instance placed
and reserved on its own in the one planning ledger (holders ``voice#0``, ``voice#1``),
spread over devices then nodes, refused all together with the replica that did not fit
and the numbers; the plan JSON carries them only when N > 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.commands.render import plan_table
from orchestrator.config import parse_config
from orchestrator.core import errors
from orchestrator.core.console import make_console
from orchestrator.core.errors import RefusalCode
from orchestrator.core.plan import PipelinePlan
from orchestrator.core.profile import load_profile
from orchestrator.core.units import fmt_bytes
from orchestrator.planner import build_ledger, parse_mask, plan_pipeline
from stages.base import MAX_REPLICAS
from tests.helpers import REPO

EXAMPLE = REPO / "configs/examples/voice-replicas.yaml"
DEFAULT = REPO / "configs/voice-assistant.yaml"
PROFILES = REPO / "configs/profiles"
LUNAR_LAKE = PROFILES / "lunar-lake-32gb.json"
"""A laptop with a CPU, an Intel iGPU (OpenVINO) and an NPU: the voice's two devices."""
TWO_CORES = PROFILES / "cpu-only-linux.json"
"""The CI machine class: a CPU only, 2 cores."""
CLUSTER = PROFILES / "clusters/laptop-desktop.json"


def _config(path: Path = EXAMPLE, **voice: Any) -> Any:
    """``path``'s config with the voice stage's fields replaced (None deletes one)."""
    raw = yaml.safe_load(path.read_text())
    stage = next(s for s in raw["stages"] if s["name"] == "voice")
    for key, value in voice.items():
        if value is None:
            stage.pop(key, None)
        else:
            stage[key] = value
    return parse_config(raw, where="t.yaml", base_dir=path.parent)


def _plan(
    profile: Path, mask: tuple[str, ...] = (), path: Path = EXAMPLE, **voice: Any
) -> PipelinePlan:
    p = load_profile(profile)
    return plan_pipeline(_config(path, **voice), p, mask=parse_mask(mask, p))


def _placed(plan: PipelinePlan, stage: str = "voice") -> list[tuple[str, str | None]]:
    return [(r.holder, r.device) for r in plan.stage(stage).placements()]


def test_each_replica_is_reserved_in_the_one_ledger_and_spread_over_the_devices() -> None:
    plan = _plan(LUNAR_LAKE)
    voice = plan.stage("voice")
    assert plan.admitted and _placed(plan) == [("voice#0", "igpu:0"), ("voice#1", "cpu")]
    # the stage's own fields are replica 0's
    assert (voice.device, voice.reservations) == (
        voice.replicas[0].device,
        voice.replicas[0].reservations,
    )
    pools = {p.id: p for p in plan.pools}
    assert set(pools["shared:igpu:0"].contributors) == {"voice#0"}
    # the iGPU's shared memory is host RAM too, so both count there, and the peak is their sum
    host = pools["host_ram"]
    assert {"voice#0", "voice#1", "thinker"} <= set(host.contributors)
    assert host.contributors["voice#1"] == voice.replicas[1].budget_bytes() > 0
    assert host.peak_bytes == sum(host.contributors.values())
    # each replica's engine is configured for its own device
    assert voice.replicas[0].engine_kwargs["session"]["provider_options"][0]["device_type"] == "GPU"
    assert voice.replicas[1].engine_kwargs != voice.replicas[0].engine_kwargs


def test_replica_zero_keeps_the_config_s_preference_and_extra_replicas_balance() -> None:
    three = _plan(LUNAR_LAKE, replicas=3)
    assert _placed(three) == [("voice#0", "igpu:0"), ("voice#1", "cpu"), ("voice#2", "igpu:0")]
    reversed_order = _plan(LUNAR_LAKE, devices=["cpu", "igpu:0"])
    assert _placed(reversed_order) == [("voice#0", "cpu"), ("voice#1", "igpu:0")]


def test_two_replicas_share_a_device_only_when_nothing_else_fits_and_split_its_cores() -> None:
    plan = _plan(TWO_CORES)  # no iGPU here: the CPU twice
    assert plan.admitted and _placed(plan) == [("voice#0", "cpu"), ("voice#1", "cpu")]
    masked = _plan(LUNAR_LAKE, mask=("igpu:0",))
    assert _placed(masked) == [("voice#0", "cpu"), ("voice#1", "cpu")]
    threads = [
        (r.holder, r.cpu_threads, r.cpu_threads_from) for r in masked.stage("voice").replicas
    ]
    assert threads == [("voice#0", 2, "plan"), ("voice#1", 2, "plan")]
    (note,) = [n for n in masked.notes if n.startswith("cpu: ")]
    assert "threads thinker 3, voice#0 2, voice#1 2" in note
    assert "voice#0, voice#1 are replicas of voice on cpu: each its own process" in note


def test_replicas_spread_over_the_nodes_of_a_cluster() -> None:
    plan = _plan(CLUSTER)
    # replica 0: the laptop's iGPU (first in the config); replica 1: another device, and of
    # those the one on another node (the desktop's CPU before the laptop's)
    assert plan.admitted and _placed(plan) == [
        ("voice#0", "laptop/igpu:0"),
        ("voice#1", "desktop/cpu"),
    ]
    voice = plan.stage("voice")
    assert [r.node for r in voice.replicas] == ["laptop", "desktop"]
    assert voice.details["node"] == "laptop"
    thinker = plan.stage("thinker")
    (cluster_note,) = [n for n in plan.notes if n.startswith("cluster of 2 nodes")]
    for r in voice.replicas:
        crossing = f"thinker → {r.holder} ({thinker.details['node']} → {r.node})"
        assert (crossing in cluster_note) == (thinker.details["node"] != r.node)
    pools = {p.id: p for p in plan.pools}
    assert "voice#1" in pools["desktop/host_ram"].contributors
    assert "voice#1" not in pools["laptop/host_ram"].contributors


def test_replicas_that_do_not_all_fit_refuse_the_stage_naming_the_replica_and_the_numbers() -> None:
    only_openvino = {"backends": ["ort-openvino"]}  # 1.49 GiB each: 16 overflow 22 GiB
    plan = _plan(TWO_CORES, replicas=MAX_REPLICAS, **only_openvino)
    voice = plan.stage("voice")
    assert not plan.admitted and not voice.admitted and voice.replicas == ()
    # all or none: no replica holds anything
    assert not any(h.startswith("voice") for p in plan.pools for h in p.contributors)
    (refusal,) = [r for r in voice.refusals if "replica" in r.message]
    assert refusal.code == RefusalCode.BUDGET_EXCEEDS_DEVICE
    # the numbers, from the ledger: replicas admitted one by one beside the pipeline's own
    # reservations until one does not fit
    reservations = list(
        _plan(TWO_CORES, replicas=None, **only_openvino).stage("voice").reservations
    )
    ledger, _ = build_ledger(load_profile(TWO_CORES))
    fit = 0
    while ledger.admit(f"voice#{fit}", reservations).ok:
        fit += 1
    assert 1 < fit < MAX_REPLICAS
    (sf,) = ledger.check({f"voice#{fit}": reservations})
    own = sf.contributors[f"voice#{fit}"]
    beside = f"{fit} replicas on cpu (voice#0, voice#1, …, voice#{fit - 1})"
    assert refusal.message == (
        f"replica {fit + 1} of {MAX_REPLICAS} (voice#{fit}) fits on none of the stage's devices "
        f"beside {beside} and the pipeline's own reservations: on cpu it needs {fmt_bytes(own)} "
        f"of host_ram, and {fmt_bytes(sf.capacity - (sf.peak - own))} of {fmt_bytes(sf.capacity)} "
        f"is left ({fmt_bytes(sf.over_by)} short)"
    )
    assert refusal.remedy == (
        f"lower replicas (stages.voice.replicas: {fit} fit here) or allow more devices "
        "(stages.voice.devices)"
    )


def test_a_replica_that_fits_only_on_another_backend_takes_it() -> None:
    """Replicas spread over options (device, backend), so once OpenVINO's budget no longer
    fits beside the others on the CPU, the next replicas take the CPU EP's smaller one."""
    plan = _plan(TWO_CORES, replicas=MAX_REPLICAS)
    backends = [r.backend for r in plan.stage("voice").replicas]
    assert plan.admitted and backends[0] == "ort-openvino" and backends[-1] == "ort-cpu"
    assert backends == sorted(backends, key=lambda b: b != "ort-openvino")


def test_the_plan_json_carries_each_replica_and_reads_back() -> None:
    plan = _plan(LUNAR_LAKE)
    doc = json.loads(json.dumps(plan.to_json()))
    voice = next(s for s in doc["stages"] if s["name"] == "voice")
    assert [(r["index"], r["holder"], r["device"]) for r in voice["replicas"]] == [
        (0, "voice#0", "igpu:0"),
        (1, "voice#1", "cpu"),
    ]
    assert voice["replicas"][1]["budget_bytes"] == plan.stage("voice").replicas[1].budget_bytes()
    assert "node" not in voice["replicas"][0]  # a single machine's plan has no nodes
    back = PipelinePlan.from_json(doc)
    assert back.stage("voice").replicas == plan.stage("voice").replicas
    assert back.to_json() == doc
    assert "replicas" not in back.stage("voice").details
    cluster = json.loads(json.dumps(_plan(CLUSTER).to_json()))
    assert PipelinePlan.from_json(cluster).to_json() == cluster
    assert [r["node"] for r in cluster["stages"][1]["replicas"]] == ["laptop", "desktop"]


@pytest.mark.parametrize("profile", [LUNAR_LAKE, TWO_CORES, CLUSTER], ids=lambda p: p.stem)
def test_one_replica_plans_exactly_as_before(profile: Path) -> None:
    before = _plan(profile, path=DEFAULT).to_json()
    explicit = _plan(profile, path=DEFAULT, replicas=1).to_json()
    assert explicit == before
    assert all("replicas" not in s for s in before["stages"])
    (stage,) = [s for s in _plan(profile, path=DEFAULT).stages if s.name == "voice"]
    assert [r.holder for r in stage.placements()] == ["voice"]


def test_the_human_plan_shows_the_replicas_in_80_columns() -> None:
    console = make_console(width=80)
    with console.capture() as shown:
        console.print(plan_table(_plan(LUNAR_LAKE)))
    text = shown.get()
    assert "Replicas: voice ×2: igpu:0, cpu" in text
    assert "voice#1 engine (ort-openvino):" in text
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (0, "greater than or equal to 1"),
        (MAX_REPLICAS + 1, f"less than or equal to {MAX_REPLICAS}"),
        ("2", "valid integer"),
        (True, "valid integer"),
        (1.5, "valid integer"),
    ],
)
def test_a_bad_replicas_is_refused_where_it_is_written(value: Any, said: str) -> None:
    with pytest.raises(errors.ConfigError) as e:
        _config(replicas=value)
    assert "t.yaml: stages[1].replicas" in str(e.value) and said in str(e.value)


def test_the_cli_plans_replicas_and_refuses_a_bad_count_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(EXAMPLE), "--profile", str(LUNAR_LAKE)]) == 0
    out = capsys.readouterr().out
    assert "Replicas: voice ×2: igpu:0, cpu" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        EXAMPLE.read_text()
        .replace("replicas: 2", "replicas: 17")
        .replace("../../exports", str(REPO / "exports"))
    )
    assert main(["plan", str(bad), "--profile", str(LUNAR_LAKE)]) == 2
    err = capsys.readouterr().err
    assert "stages[1].replicas" in err and "Traceback" not in err


def test_plan_json_profile_for_the_example_is_unchanged_by_a_reload(tmp_path: Path) -> None:
    """The example's plan goes through --out and back the way the runtime's actors read it."""
    out = tmp_path / "plan.json"
    assert main(["plan", str(EXAMPLE), "--profile", str(CLUSTER), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert PipelinePlan.from_json(doc).to_json() == doc


def test_replicas_that_fit_alone_but_not_beside_the_other_stages_are_counted_in_the_refusal() -> (
    None
):
    only_openvino = {"backends": ["ort-openvino"]}
    voice = _plan(TWO_CORES, replicas=None, **only_openvino).stage("voice")
    ledger, _ = build_ledger(load_profile(TWO_CORES))
    fit = 0  # replicas that fit beside the pipeline's own reservations
    while ledger.admit(f"voice#{fit}", list(voice.reservations)).ok:
        fit += 1
    plan = _plan(TWO_CORES, replicas=fit, **only_openvino)  # the thinker's 1.5 GiB tips it over
    assert not plan.admitted
    for name in ("thinker", "voice"):
        refusal = plan.stage(name).refusals[-1]
        assert refusal.code == RefusalCode.BUDGET_EXCEEDS_DEVICE
        assert refusal.message.startswith("host_ram cannot hold every stage placed on it: ")
        assert f"+ {fit} replicas of voice {fmt_bytes(voice.budget_bytes())} each (cpu) = " in (
            refusal.message
        )
        assert "shrink one of thinker, voice" in refusal.remedy
        assert "fewer replicas of voice" in refusal.remedy
