"""``omni-edge verify``: what a user reads, and the exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from tests.helpers.graphs import OV_PYTHON, write_artifact

pytestmark = [pytest.mark.openvino, pytest.mark.ort]


def _write(
    tmp_path: Path,
    graph: str,
    *,
    ov_route: str | None = "openvino",
    backends: tuple[str, ...] = ("ort-openvino", "ort-cpu"),
    stage: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    if not OV_PYTHON.exists():
        pytest.skip("no OpenVINO route")
    write_artifact(tmp_path / "art", graph)
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "stages": [
                    {
                        "name": "net",
                        "kind": "exported_graph",
                        "artifact": "art",
                        "devices": ["cpu", "npu:0"],
                        "backends": list(backends),
                        "final_output": True,
                        **(stage or {}),
                    }
                ],
            }
        )
    )
    device: dict[str, Any] = {
        "id": "cpu",
        "kind": "cpu",
        "name": "test CPU",
        "backends": ["ort-openvino", "ort-cpu"],
    }
    if ov_route:
        device["backend_routes"] = {"ort-openvino": ov_route}
    profile = tmp_path / "profile.json"
    profile.write_text(
        json.dumps(
            {
                "format": "omni-edge.profile/1",
                "name": "test box",
                "host": {"os": "linux", "ram_total_bytes": 2**34, "ram_available_bytes": 2**33},
                "devices": [device],
                "routes": [
                    {"name": "this-process"},
                    {"name": "openvino", "kind": "interpreter", "python": str(OV_PYTHON)},
                ],
            }
        )
    )
    return config, profile


def _row(out: str, backend: str) -> list[str]:
    """The words of the first table row that names ``backend`` (the gates table)."""
    return next(line.split() for line in out.splitlines() if f" {backend} " in line)


def test_all_placements_pass_exit_0_and_the_plan_reads_the_evidence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, profile = _write(tmp_path, "full")
    assert main(["verify", str(config), "--profile", str(profile), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "omni-edge.verify/1"
    assert [(r["backend"], r["status"]) for r in doc["results"]] == [
        ("ort-openvino", "passed"),
        ("ort-cpu", "passed"),
    ]
    ov = doc["results"][0]
    assert (ov["coverage"]["taken"], ov["coverage"]["total"]) == (2, 2)
    assert ov["runtime"].startswith("onnxruntime-openvino==")
    assert Path(ov["evidence"]).is_file()
    assert doc["skipped"] == [{"stage": "net", "device": "npu:0", "why": "test box has no npu:0"}]
    assert doc["plan"]["stages"]["net"] == {
        "device": "cpu",
        "backend": "ort-openvino",
        "verification": "verified",
    }
    # second run: the evidence is reused, and the table says so
    assert main(["verify", str(config), "--profile", str(profile)]) == 0
    out = capsys.readouterr().out
    assert _row(out, "ort-openvino") == [
        "1",
        "net",
        "cpu",
        "ort-openvino",
        "fp32",
        "2/2",
        "100%",
        "1",
        "pass",
        "(cached)",
    ]
    assert "plan now: net → cpu (ort-openvino), verified" in out


def test_replicas_are_verified_once_per_placement_and_the_plan_now_names_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``verify`` takes ``replicas`` as it is (``run`` refuses them for now): the gates run once
    per candidate, and the plan now places both replicas, each verified."""
    config, profile = _write(tmp_path, "full", stage={"replicas": 2})
    assert main(["verify", str(config), "--profile", str(profile), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["backend"], r["status"]) for r in doc["results"]] == [
        ("ort-openvino", "passed"),
        ("ort-cpu", "passed"),
    ]
    replica = {"device": "cpu", "backend": "ort-openvino", "verification": "verified"}
    assert doc["plan"]["stages"]["net"]["replicas"] == [replica, replica]
    assert main(["verify", str(config), "--profile", str(profile)]) == 0
    out = capsys.readouterr().out
    assert (
        "plan now: net ×2 → cpu (ort-openvino) verified, cpu (ort-openvino) verified"
        in " ".join(out.split())
    )


def test_a_declined_graph_exits_3_with_the_counts_and_the_remedy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, profile = _write(tmp_path, "fp64_only", backends=("ort-openvino",))
    assert main(["verify", str(config), "--profile", str(profile)]) == 3
    out = capsys.readouterr().out
    assert _row(out, "ort-openvino") == [
        "1",
        "net",
        "cpu",
        "ort-openvino",
        "fp32",
        "0/2",
        "0%",
        "0",
        "refused",
    ]
    # the refusal block wraps at the terminal's width: compare the words
    assert (
        "[execution_provider_declined_graph] #1 net · cpu · ort-openvino [fp32] "
        "OpenVINOExecutionProvider took 0 of 2 nodes (0.0%)"
    ) in " ".join(out.split())
    assert "Abs×1, Neg×1" in out
    assert "remedy:" in out and "ort-cpu" in out
    assert "min_ep_coverage" not in out  # 0 nodes taken: no partial offload to admit


def test_a_route_without_the_ep_exits_3_as_unreachable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, profile = _write(tmp_path, "full", ov_route=None, backends=("ort-openvino",))
    assert main(["verify", str(config), "--profile", str(profile), "--json"]) == 3
    (result,) = json.loads(capsys.readouterr().out)["results"]
    (refusal,) = result["refusals"]
    assert refusal["code"] == "device_unreachable_from_this_process"
    assert "offers" in refusal["message"] and "not OpenVINOExecutionProvider" in refusal["message"]
    assert "pip install onnxruntime-openvino" in refusal["remedy"]


def test_bad_input_exits_2_with_where_and_how_to_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, profile = _write(tmp_path, "full", stage={"min_ep_coverage": 1.5})
    assert main(["verify", str(config), "--profile", str(profile)]) == 2
    err = capsys.readouterr().err
    assert "stages[0].min_ep_coverage" in err and "less than or equal to 1" in err


def test_a_profile_of_another_machine_is_refused_as_bad_input(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Evidence is keyed by the profile's device names: measuring here under a
    Windows laptop's names would record a result that laptop never produced."""
    from tests.helpers.graphs import REPO

    profile = REPO / "configs" / "profiles" / "strix-point-rtx5090-windows.json"
    assert (
        main(["verify", str(REPO / "configs" / "voice-assistant.yaml"), "--profile", str(profile)])
        == 2
    )
    err = capsys.readouterr().err
    assert "it describes a windows host; this process runs on linux" in err
    assert "run omni-edge verify on that machine" in err


def test_an_address_with_one_machine_s_profile_is_bad_input_before_joining(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--address`` verifies on a cluster's nodes: a one-machine profile is exit 2, and no
    cluster is joined (the address here answers nothing: joining it would hang for minutes)."""
    from tests.helpers.graphs import REPO

    profile = REPO / "configs" / "profiles" / "cpu-only-linux.json"
    config = REPO / "configs" / "voice-assistant.yaml"
    argv = ["verify", str(config), "--address", "127.0.0.1:1", "--profile", str(profile)]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "is one machine's, not a cluster's" in err
    assert "omni-edge probe --address ADDRESS --save cluster.json" in err
