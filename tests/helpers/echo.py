"""Hand-written plans for the ``echo`` test kind, and the kind's names re-exported.

The kind itself lives in the test plugin distribution
(tests/plugins/omni_edge_testkinds, installed by scripts/bootstrap.sh) and is
found through the ``omni_edge.stage_kinds`` entry point: importing this module
registers nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_edge_testkinds.echo import (
    GATE_TIMEOUT_S,
    REPLY,
    SAMPLE_RATE,
    EchoConfig,
    EchoKind,
    EchoRunner,
)

from orchestrator.config import PipelineConfig, parse_config
from orchestrator.ledger import Reservation
from orchestrator.plan import PipelinePlan, PoolPlan, StagePlan
from orchestrator.units import GiB, MiB

__all__ = [
    "GATE_TIMEOUT_S",
    "REPLY",
    "SAMPLE_RATE",
    "EchoConfig",
    "EchoKind",
    "EchoRunner",
    "echo_pipeline",
]


def echo_pipeline(
    tmp_path: Path,
    *,
    thinker: dict[str, Any] | None = None,
    voice: dict[str, Any] | None = None,
    voice_device: str = "cpu",
    host_ram: int = 8 * GiB,
) -> tuple[PipelinePlan, PipelineConfig]:
    """A two-stage words → tone pipeline with its config and a hand-written plan."""
    doc = {
        "name": "echo-pipeline",
        "stages": [
            {
                "name": "thinker",
                "kind": "echo",
                "mode": "words",
                "devices": ["cpu"],
                "final_output": True,
                "final_output_type": "text",
                **(thinker or {}),
            },
            {
                "name": "voice",
                "kind": "echo",
                "mode": "tone",
                "inputs": ["thinker"],
                "devices": [voice_device],
                "final_output": True,
                "final_output_type": "audio",
                **(voice or {}),
            },
        ],
    }
    config = parse_config(doc, where=str(tmp_path / "echo.yaml"), base_dir=tmp_path)

    def stage(
        name: str, device: str, inputs: tuple[str, ...], held: int, out_type: str
    ) -> StagePlan:
        rs = (
            Reservation(
                "host_ram",
                "weights",
                max(held, 1 * MiB),
                "session",
                "D",
                "what the echo stage holds",
            ),
            Reservation("host_ram", "load_transient", 16 * MiB, "load", "E", "freed after load"),
        )
        return StagePlan(
            name=name,
            kind="echo",
            admitted=True,
            device=device,
            backend="ort-cpu",
            route="this-process",
            reservations=rs,
            refusals=(),
            engine_kwargs={},
            artifact={},
            inputs=inputs,
            final_output=True,
            final_output_type=out_type,
        )

    t_held = (thinker or {}).get("hold_bytes", 0)
    v_held = (voice or {}).get("hold_bytes", 0)
    stages = (
        stage("thinker", "cpu", ("request",), t_held, "text"),
        stage("voice", voice_device, ("thinker",), v_held, "audio"),
    )
    shared = (
        Reservation("host_ram", "safety_margin", 64 * MiB, "session", "E", "test margin"),
        Reservation(
            "host_ram", "ray_runtime", 900 * MiB, "session", "E", "estimate the runtime replaces"
        ),
    )
    plan = PipelinePlan(
        pipeline="echo-pipeline",
        admitted=True,
        profile="test",
        stages=stages,
        pools=(PoolPlan("host_ram", host_ram, 0, {}),),
        shared_reservations=shared,
    )
    return plan, config
