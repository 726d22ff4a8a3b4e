"""The Piper voice's estimate on OpenVINO counts the memory the plugin keeps per new
shape (its output length comes from sampled durations), stated as per-item bytes x
items; the CPU EP and graphs whose output shapes follow their inputs do not get it."""

from __future__ import annotations

from orchestrator.config import load_config
from orchestrator.core.backends import OPENVINO_ITEM_HORIZON, OPENVINO_RETAINED_PER_ITEM
from orchestrator.core.profile import load_profile
from stages.exported_graph.kind import ExportedGraphKind
from tests.helpers import REPO

MiB = 2**20


def reservations(
    backend: str, config: str = "configs/voice-assistant.yaml", stage: str = "voice"
) -> dict[str, int]:
    kind = ExportedGraphKind()
    cfg = kind.resolve_paths(load_config(str(REPO / config)).stage(stage), REPO)
    info = kind.describe(cfg)
    cpu = next(
        d
        for d in load_profile(str(REPO / "configs/profiles/cpu-only-linux.json")).devices
        if d.id == "cpu"
    )
    return {r.purpose: r.bytes for r in kind.reservations(cfg, info, cpu, backend, "host_ram")}


def test_the_voice_on_openvino_reserves_what_the_plugin_keeps_per_item() -> None:
    ov = reservations("ort-openvino")
    assert ov["shape_memory"] == OPENVINO_RETAINED_PER_ITEM * OPENVINO_ITEM_HORIZON == 768 * MiB
    # the whole estimate covers what its route worker measured at concurrency 4 (1.19-1.27 GiB)
    assert sum(ov[p] for p in ("weights", "activations", "ep_workspace", "shape_memory")) > int(
        1.3 * 1024 * MiB
    )
    assert "shape_memory" not in reservations("ort-cpu")  # the CPU EP does not grow
