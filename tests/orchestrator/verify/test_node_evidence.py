"""Evidence measured on a cluster node (``verify --address``): keyed by that node's machine,
counted for that node only, and never when it was measured on another machine.

The gates themselves run on a real two-node Ray cluster in
tests/orchestrator/runtime/test_cluster_nodes.py; here the records are written as the task
on a node writes them, with the machine that measured them named (another machine cannot
exist here, so its identity is given)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import PipelineConfig, parse_config
from orchestrator.core.profile import ClusterNode, HardwareProfile, Route, build_cluster
from orchestrator.planner import plan_pipeline
from orchestrator.verify import evidence
from orchestrator.verify.evidence import EvidenceStore, machine_identity
from orchestrator.verify.placement import Placement, placement_for
from orchestrator.verify.run import VerifyReport, keep_node_evidence
from stages.base import GateSpec
from stages.registry import get_kind
from tests.helpers.graphs import machine_profile, write_artifact
from tests.orchestrator.verify.test_evidence_forgery import honest


def _node(name: str, cpu: str) -> HardwareProfile:
    """This machine's test profile (ort-cpu in this process), on a host with CPU ``cpu``."""
    base = machine_profile(name=name)
    return base.model_copy(update={"host": base.host.model_copy(update={"cpu_name": cpu})})


HERE, OTHER, THIRD = "", "another CPU model", "a third CPU model"
"""``HERE`` names no CPU: a profile that names none is taken as this machine."""


@pytest.fixture
def cluster() -> HardwareProfile:
    return build_cluster(
        "two",
        [ClusterNode("here", _node("here", HERE)), ClusterNode("other", _node("other", OTHER))],
    )


@pytest.fixture
def config(tmp_path: Path) -> PipelineConfig:
    art = write_artifact(tmp_path / "art", "full")
    stage = {
        "name": "net",
        "kind": "exported_graph",
        "artifact": str(art),
        "devices": ["other/cpu"],
        "backends": ["ort-cpu"],
        "final_output": True,
    }
    return parse_config({"name": "tiny", "stages": [stage]}, where="t.yaml", base_dir=tmp_path)


def _gate(config: PipelineConfig, node: HardwareProfile) -> tuple[GateSpec, Route]:
    """The gate the planner computes for the stage on ``node``'s CPU, and the node's route."""
    stage = config.stages[0]
    kind = get_kind(stage.kind)
    device = node.device("cpu")
    assert device is not None
    route = node.route(device.route_for("ort-cpu"))
    assert route is not None
    gate = kind.gate_specs(stage, kind.describe(stage), device, "ort-cpu")[0]
    return gate, route


def _measured_on(
    monkeypatch: pytest.MonkeyPatch, store: EvidenceStore, p: Placement, cpu: str
) -> Path:
    """Save an honest record for ``p`` as the task on a node with CPU ``cpu`` writes it."""
    identity = machine_identity(_node("x", cpu).host)
    monkeypatch.setattr(evidence, "machine_identity_here", lambda: identity)
    assert p.key is not None
    return store.save(p.key, honest())


def _verification(config: PipelineConfig, cluster: HardwareProfile) -> Any:
    stage = plan_pipeline(config, cluster, runtime=False).stage("net")
    assert stage.device == "other/cpu" and stage.verification is not None, stage
    return stage.verification


def test_a_node_s_own_evidence_verifies_its_placement_and_this_machine_s_does_not(
    config: PipelineConfig,
    cluster: HardwareProfile,
    store: EvidenceStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = cluster.nodes["other"].profile
    gate, route = _gate(config, other)
    assert _verification(config, cluster).status == "unverified"
    # this machine's evidence for the same key: not the other machine's
    local = placement_for(gate, route)
    assert local.key is not None and store.save(local.key, honest())
    before = _verification(config, cluster)
    assert before.status == "unverified"
    assert "node other is another machine" in before.details["reason"]
    assert "--address" in before.details["hint"]
    # measured on the node (its machine in the key and in the record): verified
    on_node = placement_for(gate, route, machine=machine_identity(other.host))
    path = _measured_on(monkeypatch, store, on_node, OTHER)
    assert path != store.path(local.key)
    after = _verification(config, cluster)
    assert after.status == "verified", after
    assert after.details["node"] == "other" and after.details["evidence_file"] == str(path)


def test_a_per_node_record_measured_on_another_machine_does_not_count(
    config: PipelineConfig,
    cluster: HardwareProfile,
    store: EvidenceStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record a third machine measured, filed for the node: copied under the node's file
    name, or with its key rewritten to name the node's machine (digest recomputed)."""
    other = cluster.nodes["other"].profile
    gate, route = _gate(config, other)
    third = placement_for(gate, route, machine=machine_identity(_node("x", THIRD).host))
    foreign = json.loads(_measured_on(monkeypatch, store, third, THIRD).read_text())
    target = placement_for(gate, route, machine=machine_identity(other.host))
    assert target.key is not None
    dest = store.path(target.key)

    dest.write_text(json.dumps(foreign))
    copied = _verification(config, cluster)
    assert copied.status == "unverified" and "rejected" in copied.details["reason"]
    assert "key_digest does not match" in copied.details["reason"]

    rekeyed = dict(foreign, key=target.key.to_dict(), key_digest=target.key.digest())
    dest.write_text(json.dumps(rekeyed))
    forged = _verification(config, cluster)
    assert forged.status == "unverified", forged
    assert str(dest) in forged.details["reason"]
    assert "it was measured on machine" in forged.details["reason"]
    assert THIRD in forged.details["reason"] and "--address" in forged.details["hint"]


def test_the_driver_keeps_only_records_measured_on_the_machine_their_key_names(
    config: PipelineConfig,
    cluster: HardwareProfile,
    tmp_path: Path,
    store: EvidenceStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``keep_node_evidence``: what a node's task returns is checked before it is kept."""
    from orchestrator.verify.placement import PlacementResult

    other = cluster.nodes["other"].profile
    gate, route = _gate(config, other)
    on_node = placement_for(gate, route, machine=machine_identity(other.host))
    node_store = EvidenceStore(tmp_path / "on-node")
    record = json.loads(_measured_on(monkeypatch, node_store, on_node, OTHER).read_text())
    third = dict(record, machine={**record["machine"], "identity": "linux|a third CPU|1"})

    def result(rec: dict[str, Any]) -> PlacementResult:
        return PlacementResult(
            "net", "cpu", "ort-cpu", "this-process", "fp32", "passed", record=rec
        )

    report = VerifyReport("tiny", "node other", results=[result(record), result(third)])
    keep_node_evidence(report, "other", store)
    kept, rejected = report.results
    assert kept.device == "other/cpu" and kept.status == "passed"
    assert on_node.key is not None and kept.evidence_path == str(store.path(on_node.key))
    assert json.loads(store.path(on_node.key).read_text()) == record
    assert rejected.status == "error" and rejected.evidence_path is None
    assert (
        rejected.error is not None
        and "node other returned evidence that was rejected" in rejected.error
    )
    assert "it was measured on machine 'linux|a third CPU|1'" in rejected.error
