"""The started pipeline's graph, as the runtime reads it per request: built once, then only read.

:class:`PipelineGraph` guarantees:

* **One order.** ``stages`` are the plan's stages in the config's topological order; every
  table below is keyed by stage name and complete.
* **The graph that runs is one that meets.** The config's graph was checked when it was
  loaded (``orchestrator.config.check_graph``: structure, cycles, joins, every edge's
  payload types); here a guard checks the plan's edges again against the kinds as they are
  now (``_check_graph``: a plugin kind may have changed, a plan made elsewhere may come
  with another config), so no request starts on a graph whose edges do not meet.
* **What a request needs is precomputed**: each stage's consumers, payload types
  (``StageKind.ports``), the consumers' inputs that name it with the ports they take
  (``routes_out``), fan-in joins, and each producer's ``router.RouteTable`` (it pickles:
  the direct mode hands it to the producer's actor).
"""

from __future__ import annotations

from typing import Any

from orchestrator.config import PipelineConfig, sources
from orchestrator.core.errors import ConfigError
from orchestrator.core.plan import PipelinePlan, StagePlan
from orchestrator.runtime.router import Route, RouteTable
from stages.base import REQUEST, StageKind
from stages.payloads import Ports, edge_mismatch, spell, split_input
from stages.registry import get_kind
from stages.text_chunks import SentenceChunker

RouteOut = tuple[str, str, frozenset[str] | None]
"""``(consumer, input, ports)``: a consumer's input that names a producer, with the output
ports it takes (None: every item of a single-port producer)."""


class PipelineGraph:
    """The plan's stages, their kinds and the edges between them (the module's guarantees)."""

    def __init__(self, plan: PipelinePlan, config: PipelineConfig) -> None:
        self.plan, self.config = plan, config
        order = [s.name for s in config.topological()]
        self.stages: list[StagePlan] = sorted(
            plan.stages, key=lambda s: order.index(s.name) if s.name in order else len(order)
        )
        self.kinds: dict[str, StageKind] = {s.name: get_kind(s.kind) for s in self.stages}
        _check_graph(self)
        self.consumers: dict[str, list[str]] = {
            s.name: [c.name for c in self.stages if s.name in sources(c.inputs)]
            for s in self.stages
        }
        """Stage → the stages that take its output (fan-out: several)."""
        self.stage_ports: dict[str, Ports] = {s.name: self.ports(s.name) for s in self.stages}
        """Stage → its payload types, read once: the pumps look at them per item."""
        self.routes_out: dict[str, list[RouteOut]] = {
            s.name: self._routes(s.name) for s in self.stages
        }
        self.joins: dict[str, str] = {
            s.name: str(config.stage(s.name).join) for s in self.stages if len(s.inputs) > 1
        }
        """Fan-in stage → its join (``zip``, ``all`` or ``latest``)."""
        self.route_tables: dict[str, RouteTable] = {
            s.name: self.route_table(s.name) for s in self.stages
        }

    def ports(self, name: str) -> Ports:
        """The stage's payload types as its config declares them (``StageKind.ports``)."""
        return self.kinds[name].ports(self.config.stage(name))

    @staticmethod
    def feeders(s: StagePlan) -> tuple[str, ...]:
        """Who calls ``feed`` on ``s`` (admission counts the calls): each stage it takes an input
        from (its actor feeds it directly; a fan-in's join runs in ``s``'s own actor)."""
        return tuple(
            dict.fromkeys(split_input(i)[0] for i in s.inputs if split_input(i)[0] != REQUEST)
        )

    def _routes(self, producer: str) -> list[RouteOut]:
        """Each input of a consumer that names ``producer``: ``thinker.text`` takes port ``text``
        only; a plain ``thinker`` takes every port whose types the consumer consumes (None for a
        single-port producer: every item), and every item whose port is unknown."""
        ports = self.ports(producer)
        out: list[RouteOut] = []
        for c in self.consumers[producer]:
            consumes = self.ports(c).consumes
            for entry in self.plan.stage(c).inputs:
                source, port = split_input(entry)
                if source != producer:
                    continue
                if port is not None:
                    out.append((c, entry, frozenset({port})))
                elif len(ports.port_names()) <= 1:
                    out.append((c, entry, None))
                else:
                    taken = (
                        p
                        for p in ports.port_names()
                        if edge_mismatch(ports.port(p), consumes) is None
                    )
                    out.append((c, entry, frozenset(taken)))
        return out

    def route_table(self, producer: str) -> RouteTable:
        """``producer``'s routes to its consumers and its final ports."""
        s = self.plan.stage(producer)
        ports = self.stage_ports[producer]
        final_ports = None
        if s.final_output_type is not None:
            final_ports = frozenset(
                p
                for p in ports.port_names()
                if any(t.kind == s.final_output_type for t in ports.port(p))
            )
        routes = []
        for c, entry, takes in self.routes_out[producer]:
            sentences = self.kinds[c].text_input == "sentences"
            cfg = next((x for x in self.config.stages if x.name == c), None)
            routes.append(
                Route(
                    consumer=c,
                    device=self.plan.stage(c).device or "?",
                    entry=entry,
                    ports=takes,
                    sentences=sentences,
                    first_chunk_chars=getattr(cfg, "first_chunk_chars", None),
                    join=c in self.joins,
                    trace=sentences and c not in self.joins,  # the clocks: per request (Router)
                )
            )
        return RouteTable(
            producer=producer,
            device=s.device or "?",
            port_names=tuple(ports.port_names()),
            final_output=bool(s.final_output),
            final_ports=final_ports,
            routes=tuple(routes),
        )

    def item_port(self, s: StagePlan, item: Any) -> tuple[str | None, Any]:
        """``(port, payload)`` of an item ``s`` yielded (``RouteTable.item_port``)."""
        return self.route_tables[s.name].item_port(item)

    def downstream(self, entry: str | None) -> list[StagePlan]:
        """The stages a request entering at ``entry`` runs (all of them for None), in graph order."""
        if entry is None:
            return list(self.stages)
        names, todo = {entry}, [entry]
        while todo:
            for c in self.consumers[todo.pop()]:
                if c not in names:
                    names.add(c)
                    todo.append(c)
        return [s for s in self.stages if s.name in names]

    def entry_stages(self, payload: str = "text") -> list[str]:
        """The stages a request of ``payload`` (text, or audio) may enter at: those that take it
        as their config declares them (an exported graph's manifest, not the kind's every
        payload), that are no fan-in, and downstream of which every fan-in gets all its inputs
        (a join would otherwise wait for an input that does not run)."""
        out = []
        for s in self.stages:
            if (
                not any(t.kind == payload for t in self.ports(s.name).consumes)
                or s.name in self.joins
            ):
                continue
            run = {d.name for d in self.downstream(s.name)}
            if all(
                split_input(i)[0] in run
                for j in run
                if j in self.joins
                for i in self.plan.stage(j).inputs
            ):
                out.append(s.name)
        return out

    def sentence_chunker(self, consumer: str) -> SentenceChunker:
        """The chunker for text fed to ``consumer``: sentences, its first chunk cut early when its
        config names ``first_chunk_chars`` (a voice that starts on a few words)."""
        cfg = next((s for s in self.config.stages if s.name == consumer), None)
        return SentenceChunker(first_max_chars=getattr(cfg, "first_chunk_chars", None))

    def cut(self, stage: str, text: str, chunks_in: dict[str, list[str]]) -> list[str]:
        """``text`` as ``stage``'s kind takes it: sentences (recorded in ``chunks_in``), or whole."""
        if self.kinds[stage].text_input != "sentences":
            return [text]
        chunker = self.sentence_chunker(stage)
        chunks = [*chunker.feed(text), *chunker.flush()]
        chunks_in.setdefault(stage, []).extend(chunks)
        return chunks


def _check_graph(graph: PipelineGraph) -> None:
    """The guard: every input names a stage of the plan, several inputs come with a join on a
    kind that takes one, and every edge's payload types meet — as the kinds say now (a plugin
    kind may have changed since the config was checked, and a plan made elsewhere may be run
    with another config)."""
    names = {s.name for s in graph.stages}
    for s in graph.stages:
        if not s.inputs:
            raise ConfigError.single(
                f"stages.{s.name}.inputs",
                f"{s.name} has no input",
                "give it inputs: [request] or the stage(s) that feed it",
            )
        if len(s.inputs) > 1:
            _check_join(graph, s)
        for entry in s.inputs:
            source, port = split_input(entry)
            if source == REQUEST:
                continue
            if source not in names:
                raise ConfigError.single(
                    f"stages.{s.name}.inputs",
                    f"{source!r} is not a stage of this plan",
                    "plan and run the config the plan was made from",
                )
            takes = graph.ports(s.name).consumes
            gives = graph.ports(source).port(port) if port else graph.ports(source).produces
            if edge_mismatch(gives, takes) is not None:
                raise ConfigError.single(
                    f"stages.{s.name}.inputs",
                    f"{s.name} ({s.kind}) takes {spell(takes)}, and {source} "
                    f"({graph.plan.stage(source).kind}) yields {spell(gives)}",
                    f"feed {s.name} from a stage that yields {spell(takes)}, or from the request",
                )


def _check_join(graph: PipelineGraph, s: StagePlan) -> None:
    join = graph.config.stage(s.name).join
    if join is None:
        raise ConfigError.single(
            f"stages.{s.name}.join",
            f"{s.name} has {len(s.inputs)} inputs ({', '.join(s.inputs)}) and no join",
            "add join: zip, all or latest",
        )
    if not graph.kinds[s.name].stage_takes_join(graph.config.stage(s.name)):
        raise ConfigError.single(
            f"stages.{s.name}.inputs",
            f"{s.name} ({s.kind}) has {len(s.inputs)} inputs, and its kind does not take joined items",
            f"give {s.name} one input, or use a kind that takes a join (StageKind.takes_join)",
        )
