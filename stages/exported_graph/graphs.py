"""Kinds that run several exported graphs as one stage (``asr``: encoder + decoder step;
``token2wav``: DiT step + vocoder): planning is each graph's, as an ``exported_graph`` stage.

A :class:`GraphsKind` subclass names its graphs (``graph_names``: fields of its config, each
an artifact directory), the one that speaks for the stage (``primary``) and the command
that builds them (``build_hint``). Planning treats each graph exactly as an
``exported_graph`` stage would — the same describe (graph statistics, manifests), precision
choice, refusals, session specs and reservations — by asking an :class:`ExportedGraphKind`
about a per-graph ``ExportedGraphConfig`` (:meth:`GraphsKind.graph_config`). What this
adds is how the graphs are combined:

* memory: every graph's weights and EP workspace; the largest load transient (the sessions
  open one after the other); one activation figure, the largest graph's, since one graph's
  intermediates are freed before the next one runs;
* engine kwargs: one session spec per graph, keyed by graph name;
* gates: one ``GateSpec`` per graph (``gate_specs``): ``omni-edge verify`` measures each and
  the planner trusts the placement only when every one passed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.core import backends as ort_backends
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import ConfigError, Problem
from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import Refusal
from stages.base import ArtifactInfo, GateSpec, StageConfig, StageKind
from stages.exported_graph.artifact import ExportedArtifact
from stages.exported_graph.kind import (
    ExportedGraphConfig,
    ExportedGraphKind,
    GraphStageConfig,
    as_graph_stage,
)

if TYPE_CHECKING:
    from orchestrator.core.profile import Device


class GraphsKind(StageKind):
    """Several exported graphs on one ONNX Runtime EP, combined by the kind's runner."""

    graph_names: ClassVar[tuple[str, ...]] = ()
    """The config fields that name the graphs' artifact directories, in the order they load."""
    primary: ClassVar[str] = ""
    """The graph that speaks for the stage where one answer is wanted: its EP in the engine
    kwargs, its gate in ``gate_spec``, its remedy when the pool is too small."""
    build_hint: ClassVar[str] = ""
    """The command that builds the graphs (the remedy when one cannot be read)."""
    backends = ort_backends.TableBackends()
    runner_imports = ("numpy", "onnxruntime")
    needs_gates = True

    def __init__(self) -> None:
        self.graphs = ExportedGraphKind()
        """Asked about each graph as if it were an exported_graph stage (it memoises the manifests)."""

    def cfg(self, stage: StageConfig) -> GraphStageConfig:
        if not isinstance(stage, self.config_model) or not isinstance(stage, GraphStageConfig):
            raise TypeError(f"stage {stage.name!r} is not a {self.kind} stage")
        return stage

    def graph_config(self, stage: StageConfig, graph: str) -> ExportedGraphConfig:
        """The ``exported_graph`` stage one of the graphs would be, with this stage's settings."""
        return as_graph_stage(self.cfg(stage), getattr(stage, graph))

    @classmethod
    def resolve_paths(cls, stage: StageConfig, base_dir: Path) -> StageConfig:
        update: dict[str, Any] = {}
        for graph in cls.graph_names:
            assert isinstance(stage, GraphStageConfig)
            resolved = ExportedGraphKind.resolve_paths(
                as_graph_stage(stage, getattr(stage, graph)), base_dir
            )
            assert isinstance(resolved, ExportedGraphConfig)
            update[graph] = resolved.artifact
        return stage.model_copy(update=update)

    def artifacts(self, stage: StageConfig) -> dict[str, ExportedArtifact]:
        """Every graph's artifact, by graph name."""
        return {g: self.graphs.artifact(self.graph_config(stage, g)) for g in self.graph_names}

    # -- planning ------------------------------------------------------------
    def describe(self, stage: StageConfig) -> ArtifactInfo:
        """Each graph described as exported_graph describes one; a missing graph names the build command."""
        infos: dict[str, ArtifactInfo] = {}
        for graph in self.graph_names:
            try:
                infos[graph] = self.graphs.describe(self.graph_config(stage, graph))
            except ConfigError as exc:
                raise ConfigError(
                    [
                        *exc.problems,
                        Problem(
                            f"stages.{stage.name}.{graph}",
                            f"a graph of the {self.kind} stage cannot be read",
                            self.build_hint,
                        ),
                    ]
                ) from None
        first = infos[self.graph_names[0]]
        formats = sorted({i.weight_format for i in infos.values()})
        return ArtifactInfo(
            kind="exported",
            path=first.path,
            weight_bytes=sum(i.weight_bytes for i in infos.values()),
            weight_format=formats[0]
            if len(formats) == 1
            else "+".join(i.weight_format for i in infos.values()),
            details={
                g: {"path": i.path, "weight_bytes": i.weight_bytes, **i.details}
                for g, i in infos.items()
            },
            internal={"graphs": infos},
        )

    def check(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[Refusal]:
        return [
            r
            for g in self.graph_names
            for r in self.graphs.check(
                self.graph_config(stage, g), graph_info(info, g), device, backend
            )
        ]

    def reservations(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str, pool: str
    ) -> list[Reservation]:
        """Every graph's session memory (weights, EP workspace), the largest activation figure,
        and the largest load transient (the sessions are opened one after the other)."""
        per_graph = {
            g: self.graphs.reservations(
                self.graph_config(stage, g), graph_info(info, g), device, backend, pool
            )
            for g in self.graph_names
        }
        if not all(per_graph.values()):
            return []
        held = [
            renamed(r, f"{g}_{r.purpose}")
            for g in self.graph_names
            for r in per_graph[g]
            if r.purpose in ("weights", "ep_workspace")
        ]
        for purpose, why in (
            ("activations", "one graph's intermediates are freed before the next one runs"),
            ("load_transient", "the sessions are opened one after the other"),
        ):
            largest = max(
                (r for g in self.graph_names for r in per_graph[g] if r.purpose == purpose),
                key=lambda r: r.bytes,
            )
            n = len(self.graph_names)
            which = "the larger of the two graphs'" if n == 2 else f"the largest of the {n} graphs'"
            held.append(renamed(largest, purpose, f"{largest.note}; {which} ({why})"))
        return held

    def engine_kwargs(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        reservations: list[Reservation],
        pool_capacity: int,
    ) -> JsonObject:
        graphs: dict[str, dict[str, Any]] = {
            g: self.graphs.engine_kwargs(
                self.graph_config(stage, g), graph_info(info, g), device, backend, [], pool_capacity
            )
            for g in self.graph_names
        }
        if not all(graphs.values()):
            return {}
        return {**graphs, "ep": graphs[self.primary]["ep"]}

    def gate_spec(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> GateSpec | None:
        """The primary graph's gate; ``gate_specs`` has every graph's."""
        return self.graphs.gate_spec(
            self.graph_config(stage, self.primary), graph_info(info, self.primary), device, backend
        )

    def gate_specs(
        self, stage: StageConfig, info: ArtifactInfo, device: Device, backend: str
    ) -> list[GateSpec]:
        """Every graph's gate, in ``graph_names`` order; none when a graph has no runnable precision."""
        specs = [
            self.graphs.gate_spec(self.graph_config(stage, g), graph_info(info, g), device, backend)
            for g in self.graph_names
        ]
        return [s for s in specs if s is not None] if all(specs) else []

    def remedy_for_budget(
        self,
        stage: StageConfig,
        info: ArtifactInfo,
        device: Device,
        backend: str,
        pool: str,
        available: int,
    ) -> str:
        return self.graphs.remedy_for_budget(
            self.graph_config(stage, self.primary),
            graph_info(info, self.primary),
            device,
            backend,
            pool,
            available,
        )


def graph_info(info: ArtifactInfo, graph: str) -> ArtifactInfo:
    """One graph's ``ArtifactInfo`` out of the stage's."""
    found: ArtifactInfo = info.internal["graphs"][graph]
    return found


def renamed(r: Reservation, purpose: str, note: str | None = None) -> Reservation:
    return Reservation(
        r.pool,
        purpose,
        r.bytes,
        r.lifetime,
        r.evidence,
        r.note if note is None else note,
        r.at_load,
    )
