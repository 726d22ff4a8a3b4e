"""Evidence cannot be forged: a record is judged from the counts it claims, checked
for consistency when read, and bound to the artifact's content digest."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.profile import Route
from orchestrator.verify.evidence import EvidenceStore
from orchestrator.verify.gates import judge
from orchestrator.verify.placement import Placement, cached_verdict
from stages.exported_graph.artifact import Tolerance
from tests.helpers.graphs import machine_profile, placement, write_artifact

EP = "CPUExecutionProvider"


def honest() -> dict[str, Any]:
    """A measurement as ``gates.measure`` writes it: 2 of 2 nodes on the CPU EP, exact outputs."""
    return {
        "ep": EP,
        "precision": "fp32",
        "graph": "fp32.onnx",
        "coverage": {
            "ep": EP,
            "taken": 2,
            "total": 2,
            "fraction": 1.0,
            "partitions": None,
            "by_ep": {EP: 2},
            "fallback_op_types": {},
            "source": "ort_assignment_info",
        },
        "numeric": {
            "reference": "CPU EP, fp32 graph",
            "error": None,
            "bit_identical_to_cpu": None,
            "outputs": {
                "y": {
                    "shape": [1, 4],
                    "reference_shape": [1, 4],
                    "dtype": "float32",
                    "shape_match": True,
                    "rel_l2": 0.0,
                    "max_abs": 0.0,
                    "cosine": 1.0,
                }
            },
        },
        "suspicious": False,
        "timings": {"total_s": 0.1},
    }


@pytest.fixture
def placed(tmp_path: Path) -> tuple[Placement, Route]:
    p = placement(write_artifact(tmp_path / "art", "full"), "ort-cpu")
    route = machine_profile().route("this-process")
    assert route is not None and p.key is not None
    return p, route


def forge(store: EvidenceStore, p: Placement, edit: Any) -> Path:
    """Write an honest record, then edit its JSON on disk as an attacker would."""
    assert p.key is not None
    path = store.save(p.key, honest())
    record = json.loads(path.read_text())
    replaced = edit(record)
    record = replaced if isinstance(replaced, dict) and "format" in replaced else record
    path.write_text(json.dumps(record))
    return path


def test_an_honest_record_is_verified(
    store: EvidenceStore, placed: tuple[Placement, Route]
) -> None:
    p, route = placed
    forge(store, p, lambda r: None)
    verification, refusals = cached_verdict(p.gate, route, store)
    assert verification.status == "verified" and refusals == []


def test_a_fraction_contradicting_the_counts_is_never_verified(
    store: EvidenceStore,
    placed: tuple[Placement, Route],
    caplog: pytest.LogCaptureFixture,
) -> None:
    p, route = placed

    def zero_of_2685(r: dict[str, Any]) -> None:
        r["coverage"].update(taken=0, total=2685, fraction=1.0, by_ep={EP: 0, "X": 2685})

    path = forge(store, p, zero_of_2685)
    with caplog.at_level(logging.WARNING):
        verification, _ = cached_verdict(p.gate, route, store)
    assert verification.status == "unverified"
    assert (
        str(path) in verification.details["reason"]
        and "fraction 1.0 is not taken/total = 0/2685" in verification.details["reason"]
    )
    assert any(str(path) in m and "treated as no evidence" in m for m in caplog.messages)
    # and the judge itself reads the counts, not the fraction
    record = honest()
    record["coverage"].update(taken=0, total=2685, fraction=1.0)
    (refusal,) = judge(
        record, artifact_name="a", device_id="cpu", min_coverage=0.5, tolerance=Tolerance()
    ).refusals
    assert refusal.code == "execution_provider_declined_graph"
    assert "took 0 of 2685 nodes (0.0%)" in refusal.message


def test_a_record_holding_only_its_key_and_a_fraction_is_no_evidence(
    store: EvidenceStore,
    placed: tuple[Placement, Route],
    caplog: pytest.LogCaptureFixture,
) -> None:
    p, route = placed
    path = forge(
        store, p, lambda r: {k: r[k] for k in ("format", "key_digest", "key")} | {"fraction": 1}
    )
    with caplog.at_level(logging.WARNING):
        verification, refusals = cached_verdict(p.gate, route, store)
    assert verification.status == "unverified" and refusals == []
    assert str(path) in verification.details["reason"]
    assert any(str(path) in m for m in caplog.messages)
    assert store.load(p.key) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda r: r["coverage"].update(taken=3, fraction=1.5), "exceeds coverage.total"),
        (lambda r: r["coverage"].update(taken=-2, total=-2, fraction=1.0), "non-negative integers"),
        (lambda r: r["coverage"].update(taken="2"), "non-negative integers"),
        (lambda r: r["coverage"].update(taken=2.0), "non-negative integers"),
        (lambda r: r["coverage"].update(total=0, taken=0, fraction=1.0), "total is 0"),
        (lambda r: r["coverage"].pop("fraction"), "fraction None is not taken/total"),
        (lambda r: r["coverage"].update(by_ep={EP: 1, "X": 1}), "by_ep"),
        (lambda r: r.pop("numeric"), "numeric is missing"),
        (lambda r: r["numeric"].update(outputs={}), "nothing was compared"),
        (lambda r: r["numeric"]["outputs"]["y"].update(rel_l2=-1.0), "impossible values"),
        (
            lambda r: r["numeric"]["outputs"]["y"].update(cosine="1"),
            "cosine is missing or not a number",
        ),
        (lambda r: r["numeric"]["outputs"]["y"].pop("shape_match"), "shape_match is missing"),
        (lambda r: r["key"].update(graph_sha256="0" * 64), "is not the one it is filed under"),
        (lambda r: r.update(evidence="D"), "evidence is not 'M'"),
        (
            lambda r: (r.update(ep="X"), r["coverage"].update(ep="X")),
            "ep 'X' is not the key's 'CPUExecutionProvider'",
        ),
        (lambda r: r.update(precision="int8"), "precision 'int8' is not the key's 'fp32'"),
        (lambda r: r.pop("measured_at"), "measured_at is missing"),
    ],
)
def test_an_inconsistent_record_is_rejected_naming_the_file(
    store: EvidenceStore,
    placed: tuple[Placement, Route],
    caplog: pytest.LogCaptureFixture,
    edit: Any,
    why: str,
) -> None:
    p, route = placed
    path = forge(store, p, edit)
    with caplog.at_level(logging.WARNING):
        verification, refusals = cached_verdict(p.gate, route, store)
    assert verification.status == "unverified" and refusals == []
    assert why in verification.details["reason"] and str(path) in verification.details["reason"]
    assert any(str(path) in m and why in m for m in caplog.messages)


def test_evidence_is_bound_to_the_graphs_content(store: EvidenceStore, tmp_path: Path) -> None:
    """Re-exporting the graph (same name, other bytes) misses the evidence of the old one."""
    art = write_artifact(tmp_path / "art", "full")
    before = placement(art, "ort-cpu")
    assert before.key is not None
    store.save(before.key, honest())
    write_artifact(art, "relu", name="full")
    after = placement(art, "ort-cpu")
    assert after.key is not None and after.key.graph_sha256 != before.key.graph_sha256
    assert store.load(after.key) is None


def test_verify_measures_again_over_a_forged_record_and_replaces_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from orchestrator.cli import main
    from tests.orchestrator.verify.test_cache_dir import _argv

    argv = [*_argv(tmp_path, "verify"), "--json"]
    assert main(argv) == 0
    (first,) = json.loads(capsys.readouterr().out)["results"]
    evidence = Path(first["evidence"])
    record = json.loads(evidence.read_text())
    record["coverage"].update(taken=0, fraction=1.0)
    evidence.write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0
    (again,) = json.loads(capsys.readouterr().out)["results"]
    assert again["status"] == "passed" and again["cached"] is False
    assert any(str(evidence) in m and "is not taken/total" in m for m in caplog.messages)
    fixed = json.loads(evidence.read_text())["coverage"]
    assert fixed["taken"] == fixed["total"] > 0 and fixed["fraction"] == 1.0
