"""Hand-written plans for the ``echo`` test kind, and the kind's names re-exported.

The kind itself lives in the test plugin distribution
(tests/plugins/omni_edge_testkinds, installed by scripts/bootstrap.sh) and is
found through the ``omni_edge.stage_kinds`` entry point: importing this module
registers nothing.
"""

from __future__ import annotations

import dataclasses
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
from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import PipelinePlan, PoolPlan, ReplicaPlan, StagePlan
from orchestrator.core.units import GiB, MiB

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
    voice_replicas: tuple[str, ...] = (),
) -> tuple[PipelinePlan, PipelineConfig]:
    """A two-stage words → tone pipeline with its config and a hand-written plan;
    ``voice_replicas``: the voice as that many replicas, one on each device named
    (holders ``voice#0``, ``voice#1``, ...), as the planner writes them."""
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
                "devices": list(dict.fromkeys(voice_replicas)) or [voice_device],
                "final_output": True,
                "final_output_type": "audio",
                **({"replicas": len(voice_replicas)} if voice_replicas else {}),
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
    voice_plan = stage(
        "voice", (voice_replicas or (voice_device,))[0], ("thinker",), v_held, "audio"
    )
    if voice_replicas:
        voice_plan = dataclasses.replace(
            voice_plan,
            replicas=tuple(
                ReplicaPlan(
                    index=i,
                    holder=f"voice#{i}",
                    device=device,
                    backend=voice_plan.backend,
                    route=voice_plan.route,
                    reservations=voice_plan.reservations,
                    engine_kwargs={},
                )
                for i, device in enumerate(voice_replicas)
            ),
        )
    stages = (stage("thinker", "cpu", ("request",), t_held, "text"), voice_plan)
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
