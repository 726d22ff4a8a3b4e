"""The asr kind plans like two exported graphs: each graph's weights and EP workspace read
from its graph, the activation figure from the encoder's manifest, one session spec per graph
and the decoder's gate; ``omni-edge plan`` takes the example config; a missing graph names the
build command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.config import parse_config
from orchestrator.core import backends as ort_backends
from orchestrator.core.profile import HardwareProfile, parse_profile
from orchestrator.core.units import GiB
from orchestrator.planner import plan_pipeline
from stages.exported_graph.artifact import load_artifact
from stages.exported_graph.graph_stats import describe_graph
from stages.registry import get_kind, known_kinds
from stages.requests import as_request
from tests.helpers.graphs import REPO
from tests.stages.asr.conftest import GRAPHS, shipped_dir

EXAMPLE = REPO / "configs/examples/asr-only.yaml"
PROFILE: dict[str, Any] = {
    "format": "omni-edge.profile/1",
    "name": "test box",
    "host": {"os": "linux", "ram_total_bytes": 16 * GiB, "ram_available_bytes": 8 * GiB},
    "devices": [{"id": "cpu", "kind": "cpu", "name": "test CPU", "backends": ["ort-cpu"]}],
    "routes": [{"name": "this-process"}],
}


def profile(ram: int = 8 * GiB) -> HardwareProfile:
    return parse_profile({**PROFILE, "host": {**PROFILE["host"], "ram_available_bytes": ram}})


def asr_stage(graphs: dict[str, Path], **extra: Any) -> dict[str, Any]:
    return {
        "name": "asr",
        "kind": "asr",
        "encoder": str(graphs["encoder"]),
        "decoder": str(graphs["decoder"]),
        "devices": ["cpu"],
        "backends": ["ort-cpu"],
        "final_output": True,
        "final_output_type": "text",
        **extra,
    }


def test_asr_is_a_built_in_kind_that_takes_audio_and_yields_text() -> None:
    kind = get_kind("asr")
    assert "asr" in known_kinds()
    assert (kind.consumes, kind.produces, kind.needs_gates) == (("audio",), ("text",), True)


def test_the_plan_holds_both_graphs_and_the_manifests_activation_figure(
    whisper_graphs: dict[str, Path],
    tmp_path: Path,
) -> None:
    config = parse_config(
        {"name": "p", "stages": [asr_stage(whisper_graphs)]}, where="t.yaml", base_dir=tmp_path
    )
    plan = plan_pipeline(config, profile(), runtime=False)
    assert plan.admitted
    stage = plan.stage("asr")
    held = {r.purpose: r for r in stage.reservations}
    stats = {g: describe_graph(whisper_graphs[g] / "fp32.onnx") for g in GRAPHS}
    for g in GRAPHS:
        assert held[f"{g}_weights"].bytes == stats[g].initializer_bytes
        assert held[f"{g}_ep_workspace"].bytes == ort_backends.workspace_bytes(
            "ort-cpu", stats[g].initializer_bytes
        )
    assert 37_000_000 < held["encoder_weights"].bytes < 38_000_000
    assert 113_000_000 < held["decoder_weights"].bytes < 114_000_000
    declared = load_artifact(whisper_graphs["encoder"]).manifest.activation_bytes
    assert declared == 320 * 2**20 and held["activations"].bytes == declared
    assert held["load_transient"].bytes == max(s.file_bytes for s in stats.values())
    assert sorted(held) == [
        "activations",
        "decoder_ep_workspace",
        "decoder_weights",
        "encoder_ep_workspace",
        "encoder_weights",
        "load_transient",
    ]
    kwargs = stage.engine_kwargs
    for g in GRAPHS:
        assert kwargs[g]["session"]["graph"] == str(whisper_graphs[g] / "fp32.onnx")
        assert kwargs[g]["session"]["providers"] == ["CPUExecutionProvider"]
    assert (kwargs["max_new_tokens"], kwargs["ep"]) == (224, "CPUExecutionProvider")


def test_each_graph_has_its_gate(whisper_graphs: dict[str, Path], tmp_path: Path) -> None:
    config = parse_config(
        {"name": "p", "stages": [asr_stage(whisper_graphs)]}, where="t.yaml", base_dir=tmp_path
    )
    kind, stage = get_kind("asr"), config.stage("asr")
    info = kind.describe(stage)
    device = profile().device("cpu")
    assert device is not None
    gates = kind.gate_specs(stage, info, device, "ort-cpu")
    assert [(g.stage, g.artifact_name, g.precision) for g in gates] == [
        ("asr", "whisper-tiny-en-encoder", "fp32"),
        ("asr", "whisper-tiny-en-decoder", "fp32"),
    ]
    assert [g.session["graph"] for g in gates] == [
        str(whisper_graphs[g] / "fp32.onnx") for g in GRAPHS
    ]


@pytest.mark.ort
def test_the_plan_trusts_the_stage_only_when_both_gates_passed(
    whisper_graphs: dict[str, Path],
    tmp_path: Path,
) -> None:
    """No evidence: unverified. Evidence for the decoder alone: still unverified, naming the
    encoder's gate. Both measured (omni-edge verify's path): verified."""
    from orchestrator.ort.sessions import open_sessions, this_process
    from orchestrator.verify.placement import placement_for, verify_placement
    from orchestrator.verify.run import verify_pipeline

    config = parse_config(
        {"name": "p", "stages": [asr_stage(whisper_graphs)]}, where="t.yaml", base_dir=tmp_path
    )
    prof = profile()

    def verification() -> Any:
        found = plan_pipeline(config, prof, runtime=False).stage("asr").verification
        assert found is not None
        return found

    assert verification().status == "unverified"
    kind, stage = get_kind("asr"), config.stage("asr")
    device = prof.device("cpu")
    assert device is not None
    decoder_gate = kind.gate_specs(stage, kind.describe(stage), device, "ort-cpu")[1]
    host = open_sessions(this_process())
    try:
        route = prof.route("this-process")
        assert route is not None
        assert verify_placement(placement_for(decoder_gate, route), host).status == "passed"
    finally:
        host.shutdown()
    half = verification()
    assert half.status == "unverified"
    assert half.details["gates"] == {
        "whisper-tiny-en-encoder": "unverified",
        "whisper-tiny-en-decoder": "verified",
    }
    report = verify_pipeline(config, prof)
    assert [r.status for r in report.results] == ["passed", "passed"]
    both = verification()
    assert both.status == "verified"
    assert set(both.details["gates"].values()) == {"verified"}


def test_a_pool_too_small_for_both_graphs_is_refused_with_the_numbers(
    whisper_graphs: dict[str, Path],
    tmp_path: Path,
) -> None:
    """A pool 1 MiB short of the admitted plan's peak: the refusal names both graphs' weights."""
    config = parse_config(
        {"name": "p", "stages": [asr_stage(whisper_graphs)]}, where="t.yaml", base_dir=tmp_path
    )
    fits = plan_pipeline(config, profile(), runtime=False)
    (pool,) = fits.pools
    overhead = (
        8 * GiB - pool.capacity_bytes
    )  # what the profile's RAM holds besides the pool, if anything
    short = profile(ram=pool.peak_bytes - 2**20 + overhead)
    plan = plan_pipeline(config, short, runtime=False)
    assert not plan.admitted
    (refusal,) = plan.stage("asr").refusals
    assert refusal.code == "budget_exceeds_device"
    assert "encoder_weights" in refusal.message and "decoder_weights" in refusal.message


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
    )


def test_omni_edge_plan_takes_the_example_config(
    whisper_graphs: dict[str, Path], tmp_path: Path
) -> None:
    """The example as shipped (its graphs pointed at the built ones when exports/ has none)."""
    data = yaml.safe_load(EXAMPLE.read_text())
    for g in GRAPHS:
        data["stages"][0][g] = str(whisper_graphs[g])
    config = tmp_path / "asr-only.yaml"
    config.write_text(yaml.safe_dump(data))
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    done = _cli("plan", str(config), "--profile", str(prof), "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["admitted"] is True
    (stage,) = plan["stages"]
    assert (stage["name"], stage["kind"], stage["device"], stage["backend"]) == (
        "asr",
        "asr",
        "cpu",
        "ort-cpu",
    )


def test_a_missing_graph_is_exit_2_naming_the_build_command(tmp_path: Path) -> None:
    graphs = {}
    for g in GRAPHS:
        graphs[g] = tmp_path / g
        graphs[g].mkdir()
        shutil.copy(shipped_dir(g) / "manifest.yaml", graphs[g])
    config = tmp_path / "asr.yaml"
    config.write_text(yaml.safe_dump({"name": "p", "stages": [asr_stage(graphs)]}))
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    done = _cli("plan", str(config), "--profile", str(prof))
    assert done.returncode == 2
    assert "python -m exports.whisper_asr build" in done.stderr
    assert "fp32.onnx does not exist" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("bad", [{"max_new_tokens": 0}, {"max_new_tokens": 225}, {"decoder": None}])
def test_bad_stage_fields_are_refused_where_they_are(tmp_path: Path, bad: dict[str, Any]) -> None:
    from orchestrator.core.errors import ConfigError

    stage = {**asr_stage({g: shipped_dir(g) for g in GRAPHS}), **bad}
    stage = {k: v for k, v in stage.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        parse_config({"name": "p", "stages": [stage]}, where="t.yaml", base_dir=tmp_path)
    assert [p.where for p in err.value.problems] == [f"t.yaml: stages[0].{next(iter(bad))}"]


@pytest.mark.parametrize(
    ("prompt", "where", "what"),
    [
        ("hello", "request (stage asr, kind asr)", "takes audio, got text"),
        ({"audio": [0.0, 0.1]}, "request (stage asr, kind asr)", "takes audio, got dict"),
        (
            {"audio": [0.0, 0.1], "sample_rate": 0},
            "request (stage asr, kind asr): sample_rate",
            "0 Hz: outside the 8000-192000 Hz that is read",
        ),
        (
            {"audio": [0.0, 0.1], "sample_rate": True},
            "request (stage asr, kind asr): sample_rate",
            "True is not a whole number of Hz",
        ),
        (
            {"audio": [[0.0, 0.1], [0.2, 0.3]], "sample_rate": 16000},
            "request (stage asr, kind asr): audio",
            "shape (2, 2)",
        ),
        ({"audio": [], "sample_rate": 16000}, "request (stage asr, kind asr): audio", "shape (0,)"),
        (
            {"audio": ["a", "b"], "sample_rate": 16000},
            "request (stage asr, kind asr): audio",
            "not numbers",
        ),
    ],
)
def test_a_request_that_is_not_one_audio_item_is_refused_before_the_actor(
    tmp_path: Path,
    prompt: Any,
    where: str,
    what: str,
) -> None:
    from orchestrator.core.errors import BadRequest

    config = parse_config(
        {"name": "p", "stages": [asr_stage({g: shipped_dir(g) for g in GRAPHS})]},
        where="t.yaml",
        base_dir=tmp_path,
    )
    with pytest.raises(BadRequest) as err:
        get_kind("asr").validate_request(None, config.stage("asr"), as_request(prompt))
    (problem,) = err.value.problems
    assert problem.where == where and what in problem.what and problem.fix


def test_one_audio_item_is_a_good_request(tmp_path: Path) -> None:
    config = parse_config(
        {"name": "p", "stages": [asr_stage({g: shipped_dir(g) for g in GRAPHS})]},
        where="t.yaml",
        base_dir=tmp_path,
    )
    get_kind("asr").validate_request(
        None, config.stage("asr"), as_request({"audio": [0.0] * 160, "sample_rate": 8000})
    )
