"""Ray's memory calibrated per node of a cluster, as it is measured per node.

A run on a cluster measures Ray on each node (``cluster_probe.node_ray_memory``) and
records one sample per node, keyed by that node's own machine and name
(``calibration.ray_key(node_profile, node=NAME)``); the next plan reserves each node's
``NODE/host_ram`` from that node's samples. The recorded laptop + desktop cluster
(configs/profiles/clusters/laptop-desktop.json) with a 0.4 GiB Ray on the laptop and a
1.2 GiB one on the desktop (the head, with the GCS) gets two different reservations.
The store is written by the test into its own directory; no Ray is started.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import MethodType, SimpleNamespace

import pytest

from orchestrator import calibration as cal
from orchestrator.api import Pipeline
from orchestrator.cli import main
from orchestrator.config import load_config
from orchestrator.core.plan import PipelinePlan
from orchestrator.core.profile import HardwareProfile, load_profile
from orchestrator.core.units import MiB
from orchestrator.planner import plan_pipeline
from tests.helpers import REPO

CLUSTER = REPO / "configs" / "profiles" / "clusters" / "laptop-desktop.json"
CONFIG = REPO / "configs" / "voice-assistant.yaml"
LAPTOP_RAY = 400 * MiB
DESKTOP_RAY = 1200 * MiB
"""Made-up figures, three times apart, so that the two reservations cannot coincide."""


@pytest.fixture(scope="module")
def cluster() -> HardwareProfile:
    return load_profile(CLUSTER)


def _plan(cluster: HardwareProfile, store: cal.CalibrationStore | None) -> PipelinePlan:
    return plan_pipeline(load_config(CONFIG), cluster, calibration=store)


def _ray(plan: PipelinePlan) -> dict[str, tuple[int, str]]:
    return {
        r.pool: (r.bytes, r.evidence)
        for r in plan.shared_reservations
        if r.purpose == "ray_runtime"
    }


def _record(
    cluster: HardwareProfile, store: cal.CalibrationStore, nodes: dict[str, int]
) -> list[dict[str, object]]:
    """What ``Pipeline.close`` records after a run whose start measured ``nodes`` (name → bytes)."""
    runtime = SimpleNamespace(
        _closed=False,
        load_results={"thinker": {}},
        stages=[],
        views={},  # no stage measured: only the Ray rows
        measure=dict,
        ray_memory={
            "bytes": 300 * MiB,  # the driver-side figure of a joined cluster: not a node's
            "measure": "sum of PSS of this project's actors + driver RSS growth from ray.init",
            "nodes": {
                name: {"bytes": b, "measure": f"sum of PSS of the {name} node's Ray session"}
                for name, b in nodes.items()
            },
        },
        cluster=SimpleNamespace(owned=False),
    )
    pipeline = SimpleNamespace(
        calibration=store,
        profile=cluster,
        plan=_plan(cluster, None),
        runtime=runtime,
        results=[],
        run_id="cluster-run-1",
    )
    pipeline.server_memory = MethodType(Pipeline.server_memory, pipeline)
    return list(Pipeline.record_calibration(pipeline))  # type: ignore[arg-type]


def test_each_node_s_host_ram_reserves_the_ray_memory_measured_on_that_node(
    cluster: HardwareProfile, tmp_path: Path, private_cache: Path
) -> None:
    store = cal.CalibrationStore(tmp_path / "calibration")
    before = _ray(_plan(cluster, store))
    assert {e for _, e in before.values()} == {"E"}, before  # nothing measured yet
    rows = _record(cluster, store, {"laptop": LAPTOP_RAY, "desktop": DESKTOP_RAY})
    assert {r["stage"]: r["peak_bytes"] for r in rows} == {
        "(ray_runtime) on laptop": LAPTOP_RAY,
        "(ray_runtime) on desktop": DESKTOP_RAY,
    }  # one sample per node; the driver-side figure is no node's and is not recorded
    assert {r["budget_bytes"] for r in rows} == {before["laptop/host_ram"][0]}

    planned = _ray(_plan(cluster, cal.CalibrationStore(store.root)))
    laptop, desktop = planned["laptop/host_ram"], planned["desktop/host_ram"]
    assert laptop[1] == desktop[1] == "M"
    assert LAPTOP_RAY < laptop[0] < 1.15 * LAPTOP_RAY, laptop
    assert DESKTOP_RAY < desktop[0] < 1.15 * DESKTOP_RAY, desktop
    notes = " ".join(_plan(cluster, cal.CalibrationStore(store.root)).notes)
    assert "ray_runtime (M) on laptop, desktop" in notes, notes


def test_a_node_without_its_own_measurement_keeps_the_estimate(
    cluster: HardwareProfile, tmp_path: Path, private_cache: Path
) -> None:
    store = cal.CalibrationStore(tmp_path / "calibration")
    _record(cluster, store, {"desktop": DESKTOP_RAY})
    # this machine's own (single-machine) Ray figure is not the laptop node's either
    store.record(
        cal.ray_key(cluster.nodes["laptop"].profile),
        cal.sample(run="alone", peak=LAPTOP_RAY, budget=None, calibrated=False),
    )
    estimate = _ray(_plan(cluster, None))["laptop/host_ram"]
    planned = _ray(_plan(cluster, cal.CalibrationStore(store.root)))
    assert planned["laptop/host_ram"] == estimate and estimate[1] == "E"
    assert planned["desktop/host_ram"][1] == "M"


def test_a_node_s_key_is_its_own_machine_and_name() -> None:
    cluster = load_profile(CLUSTER)
    laptop, desktop = cluster.nodes["laptop"].profile, cluster.nodes["desktop"].profile
    key = cal.pool_ray_key(cluster, "laptop/host_ram")
    assert key.parts["machine"] == cal.machine_id(laptop) != cal.machine_id(desktop)
    assert key.parts["node"] == "laptop" and key.parts["cluster"] == "node"
    assert key.digest() != cal.ray_key(laptop).digest()  # not the laptop's own, alone
    assert key.digest() != cal.pool_ray_key(cluster, "desktop/host_ram").digest()
    one = load_profile(REPO / "configs" / "profiles" / "lunar-lake-32gb.json")
    assert cal.pool_ray_key(one, "host_ram").digest() == cal.ray_key(one).digest()


def test_calibration_show_and_reset_name_each_node_s_ray_entry(
    cluster: HardwareProfile,
    tmp_path: Path,
    private_cache: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = cal.CalibrationStore(tmp_path / "calibration")
    _record(cluster, store, {"laptop": LAPTOP_RAY, "desktop": DESKTOP_RAY})
    assert main(["calibration", "--store", str(store.root), "show"]) == 0
    listed = [
        line.split(" on ")[1].split()[0]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("(ray_runtime) on ")
    ]
    assert sorted(listed) == ["desktop", "laptop"]
    root = str(store.root)
    assert main(["calibration", "--store", root, "reset", "(ray_runtime) on laptop", "--json"]) == 0
    (removed,) = json.loads(capsys.readouterr().out)["removed"]
    assert "ray-runtime-laptop" in removed
    planned = _ray(_plan(cluster, cal.CalibrationStore(store.root)))
    assert planned["laptop/host_ram"][1] == "E" and planned["desktop/host_ram"][1] == "M"
