"""Planning across the nodes of a cluster: a laptop with an NPU and a desktop with
an RTX GPU (configs/profiles/cluster-laptop-desktop.json). Every check per node,
host_ram per node, refusals that name the node, --mask by node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.core import errors
from orchestrator.core.errors import RefusalCode
from orchestrator.core.plan import PipelinePlan
from orchestrator.core.profile import (
    ClusterNode,
    Device,
    HardwareProfile,
    build_cluster,
    cluster_document,
    load_profile,
    profile_pools,
)
from orchestrator.planner import parse_mask, plan_pipeline

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "configs" / "profiles" / "clusters" / "laptop-desktop.json"
VOICE = REPO / "configs" / "voice-assistant.yaml"


@pytest.fixture(scope="module")
def cluster() -> HardwareProfile:
    return load_profile(CLUSTER)


def _plan(
    cluster: HardwareProfile, mask: tuple[str, ...] = (), config: Path = VOICE
) -> PipelinePlan:
    return plan_pipeline(load_config(config), cluster, mask=parse_mask(mask, cluster))


def test_the_cluster_profile_qualifies_devices_routes_and_pools_by_node(
    cluster: HardwareProfile,
) -> None:
    p = cluster

    def dev(i: str) -> Device:
        d = p.device(i)
        assert d is not None
        return d

    assert [d.id for d in p.devices] == [
        "laptop/cpu",
        "laptop/igpu:0",
        "laptop/npu:0",
        "desktop/cpu",
        "desktop/gpu:0",
    ]
    assert p.node_names == ["laptop", "desktop"]
    assert dev("desktop/gpu:0").route == "desktop/this-process"
    assert dev("laptop/cpu").route_for("vllm-cpu") == "laptop/vllm-needs-linux"
    pools = {s.id: s for s in profile_pools(p)}
    assert set(pools) == {
        "laptop/host_ram",
        "laptop/shared:igpu:0",
        "desktop/host_ram",
        "desktop/vram:gpu:0",
    }
    assert (
        pools["laptop/shared:igpu:0"].parent == "laptop/host_ram"
    )  # the iGPU shares only its own node's RAM
    assert (
        pools["laptop/host_ram"].capacity == 24051816857
        and pools["desktop/host_ram"].capacity == 48103633715
    )
    assert (
        dev("laptop/npu:0").pool == "laptop/host_ram"
        and dev("desktop/gpu:0").pool == "desktop/vram:gpu:0"
    )


def test_thinker_on_the_desktop_gpu_voice_on_the_laptop_npu(cluster: HardwareProfile) -> None:
    plan = _plan(cluster)
    assert plan.admitted
    thinker, voice = plan.stage("thinker"), plan.stage("voice")
    assert (thinker.device, thinker.backend, thinker.route) == (
        "desktop/gpu:0",
        "vllm-cuda",
        "desktop/this-process",
    )
    assert (voice.device, voice.backend) == ("laptop/npu:0", "ort-openvino")
    doc = plan.to_json()
    stages = {s["name"]: s for s in doc["stages"]}
    assert stages["thinker"]["node"] == "desktop" and stages["voice"]["node"] == "laptop"
    assert (
        stages["voice"]["inputs_across_nodes"] == ["thinker"]
        and stages["thinker"]["inputs_across_nodes"] == []
    )
    crossing = next(n for n in plan.notes if "thinker → voice (desktop → laptop)" in n)
    assert (
        "measured at run time" in crossing and "edges[]" in crossing
    )  # where to read the transfer cost
    # host_ram per node: the engine's host process on the desktop, the voice on the laptop
    pools = {p.id: p for p in plan.pools}
    assert set(pools["desktop/host_ram"].contributors) == {"(pipeline)", "thinker"}
    assert set(pools["laptop/host_ram"].contributors) == {"(pipeline)", "voice"}
    ray = [r.pool for r in plan.shared_reservations if r.purpose == "ray_runtime"]
    assert ray == ["laptop/host_ram", "desktop/host_ram"]  # Ray's daemons on every node
    # the laptop was tried for the thinker and refused, naming the node
    laptop = [r for r in thinker.refusals if r.device.startswith("laptop/")]
    assert laptop and all(r.message.startswith("on laptop: ") for r in laptop)
    assert (
        PipelinePlan.from_json(json.loads(json.dumps(doc))).stage("voice").details["node"]
        == "laptop"
    )


def test_mask_a_whole_node(cluster: HardwareProfile) -> None:
    plan = _plan(cluster, ("desktop",))
    codes = {(r.device, r.code) for r in plan.stage("thinker").refusals}
    assert ("desktop/gpu:0", RefusalCode.NO_RUNNABLE_DEVICE) in codes and (
        "desktop/cpu",
        RefusalCode.NO_RUNNABLE_DEVICE,
    ) in codes
    # the laptop runs native Windows: vLLM cannot run there, llama.cpp can (the thinker's first choice on a CPU)
    assert any(
        r.device == "laptop/cpu"
        and r.code == RefusalCode.DEVICE_UNREACHABLE
        and "vllm-cpu" in r.message
        for r in plan.stage("thinker").refusals
    )
    assert plan.admitted and (plan.stage("thinker").device, plan.stage("thinker").backend) == (
        "laptop/cpu",
        "llamacpp-cpu",
    )
    plan = _plan(cluster, ("laptop",))
    assert plan.admitted and plan.stage("voice").device == "desktop/cpu"
    with pytest.raises(errors.ConfigError) as exc:
        parse_mask(["nodeZ"], cluster)
    assert "its nodes: laptop, desktop" in str(exc.value)


def test_a_stage_may_name_its_node(cluster: HardwareProfile, tmp_path: Path) -> None:
    text = VOICE.read_text().replace("devices: [npu:0, igpu:0, cpu]", "devices: [desktop/cpu]")
    cfg = tmp_path / "voice-on-desktop.yaml"
    cfg.write_text(text.replace("artifact: ../exports", f"artifact: {REPO}/exports"))
    plan = _plan(cluster, config=cfg)
    assert plan.admitted and plan.stage("voice").device == "desktop/cpu"
    assert plan.stage("voice").details["inputs_across_nodes"] == []
    assert any("edges between nodes: none" in n for n in plan.notes)


def _shrunk(cluster: HardwareProfile, ram: dict[str, int]) -> HardwareProfile:
    nodes = []
    for n in cluster.nodes.values():
        host = n.profile.host.model_copy(update={"ram_available_bytes": ram[n.name]})
        nodes.append(ClusterNode(n.name, n.profile.model_copy(update={"host": host})))
    return build_cluster("shrunk", nodes)


def test_host_ram_is_checked_per_node(cluster: HardwareProfile) -> None:
    """The laptop's RAM cannot hold the voice beside Ray; the desktop's can: the voice moves there."""
    small = _shrunk(cluster, {"laptop": 2 * 2**30, "desktop": 48103633715})
    plan = _plan(small)
    assert plan.admitted and plan.stage("voice").device == "desktop/cpu"
    refused = [
        r for r in plan.stage("voice").refusals if r.code == RefusalCode.BUDGET_EXCEEDS_DEVICE
    ]
    assert refused and all(
        r.device.startswith("laptop/") and "on laptop: " in r.message and "host_ram" in r.message
        for r in refused
    )


def test_refused_when_neither_node_fits_naming_each_nodes_shortfall(
    cluster: HardwareProfile,
) -> None:
    small = _shrunk(cluster, {"laptop": 2 * 2**30, "desktop": 2 * 2**30})
    plan = _plan(small)
    assert not plan.admitted
    voice = plan.stage("voice")
    assert not voice.admitted
    short = {
        r.device: r.message for r in voice.refusals if r.code == RefusalCode.BUDGET_EXCEEDS_DEVICE
    }
    assert {"laptop/npu:0", "desktop/cpu"} <= set(short)
    assert (
        short["laptop/npu:0"].startswith("on laptop: voice needs")
        and "short)" in short["laptop/npu:0"]
    )
    assert (
        short["desktop/cpu"].startswith("on desktop: voice needs")
        and "short)" in short["desktop/cpu"]
    )


def test_bad_cluster_files_are_clear_errors(tmp_path: Path) -> None:
    lunar = REPO / "configs" / "profiles" / "lunar-lake-32gb.json"
    doc = {
        "format": "omni-edge.cluster/1",
        "name": "x",
        "nodes": [{"name": "a", "profile": str(lunar)}, {"name": "a", "profile": str(lunar)}],
    }
    f = tmp_path / "c.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(errors.ConfigError, match="node names must be unique; repeated: a"):
        load_profile(f)
    doc["nodes"] = [{"name": "a", "profile": str(CLUSTER)}]
    f.write_text(json.dumps(doc))
    with pytest.raises(errors.ConfigError, match="is itself a cluster profile"):
        load_profile(f)
    doc["nodes"] = [{"name": "a/b", "profile": str(lunar)}]
    f.write_text(json.dumps(doc))
    with pytest.raises(errors.ConfigError, match="nodes"):
        load_profile(f)


def test_a_cluster_profile_written_as_a_file_reads_back(
    cluster: HardwareProfile, tmp_path: Path
) -> None:
    f = tmp_path / "cluster.json"
    f.write_text(json.dumps(cluster_document(cluster)))
    again = load_profile(f)
    assert [d.id for d in again.devices] == [d.id for d in cluster.devices]
    assert [(p.id, p.capacity) for p in profile_pools(again)] == [
        (p.id, p.capacity) for p in profile_pools(cluster)
    ]


def test_this_machines_evidence_does_not_verify_another_machines_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evidence is this machine's: a node that is another machine stays unverified."""
    import orchestrator.planner as planner
    from orchestrator.core.plan import Verification

    monkeypatch.setattr(
        planner, "cached_verdict", lambda gate, route: (Verification("verified", "M here"), [])
    )
    monkeypatch.setattr(planner, "describes_this_machine", lambda p: p.host.cpu_name == "this one")
    base = load_profile(REPO / "configs" / "profiles" / "cpu-only-linux.json")
    here = base.model_copy(update={"host": base.host.model_copy(update={"cpu_name": "this one"})})
    other = base.model_copy(
        update={"host": base.host.model_copy(update={"cpu_name": "another one"})}
    )
    two = build_cluster("two", [ClusterNode("here", here), ClusterNode("other", other)])
    for node, status in (("here", "verified"), ("other", "unverified")):
        text = VOICE.read_text().replace("devices: [npu:0, igpu:0, cpu]", f"devices: [{node}/cpu]")
        cfg = tmp_path / f"{node}.yaml"
        cfg.write_text(text.replace("artifact: ../exports", f"artifact: {REPO}/exports"))
        voice = _plan(two, config=cfg).stage("voice")
        assert voice.device == f"{node}/cpu" and voice.verification is not None
        assert voice.verification.status == status, voice.verification


def test_an_address_without_a_profile_plans_on_the_cluster_gathered_there(
    cluster: HardwareProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Pipeline.from_config(address=...)`` with no profile plans on the live cluster
    profile (``cluster_probe.gather_at``, here replaced by the recorded one); with a
    profile it never probes. The two-node test runs the real probe (``run --address``)."""
    from orchestrator import api
    from orchestrator.runtime.cluster_probe import nodes_found

    asked: list[str] = []

    def gather_at(address: str) -> HardwareProfile:
        asked.append(address)
        return cluster

    monkeypatch.setattr(api, "gather_at", gather_at)
    pipeline = api.Pipeline.from_config(
        VOICE, address="10.0.0.2:6379", record=None, start=False, verify=False, calibration=False
    )
    assert asked == ["10.0.0.2:6379"]
    assert pipeline.plan.stage("thinker").device == "desktop/gpu:0" and pipeline.profile is cluster
    assert (
        api.plan_profile(CLUSTER, "10.0.0.2:6379").node_names == ["laptop", "desktop"]
        and len(asked) == 1
    )
    assert nodes_found(cluster) == "2 nodes: laptop (cpu, igpu:0, npu:0); desktop (cpu, gpu:0)"
