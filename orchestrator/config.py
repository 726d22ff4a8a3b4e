"""Pipeline configs: one loader for YAML and JSON, strict models, graph checks.

The fields every stage has live with the stage-kind interface
(``stages.base.StageConfig``); each kind adds its own through its
``config_model`` (see ``stages.registry``), so a third-party kind is validated
as strictly as a built-in one. Unknown keys are errors, never
warnings. Paths resolve relative to the config file.

What the loader is given may be a file, a shipped pipeline's name or a model's Hub id
(``load_config``, ``orchestrator.pipelines``: a file that exists wins), and a config may
``extends:`` another pipeline, overriding or adding stages (``_extended``).

Then the graph (``check_graph``; docs/pipelines.md): joins where inputs meet,
cycles as their path, stages the request never reaches, outputs that go
nowhere, and every edge's payload types (``stages.payloads``, each stage's
``StageKind.ports``) — all before anything is planned.

Users coming from vLLM-Omni will recognise ``stage_id``, ``final_output`` and
``final_output_type``: omni-edge stages have them too. A vLLM-Omni stage config
itself (``stage_args:``, or a deploy YAML's ``stages:``) is refused with one
problem that names ``omni-edge import vllm-omni`` (``_refuse_vllm_omni``): the
importer (``orchestrator.importers.vllm_omni``) is the one reader of that format.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from orchestrator.core.errors import ConfigError, Problem
from orchestrator.core.hub import HubRef
from orchestrator.core.validation import Strict, problems_from_validation, read_document
from orchestrator.pipelines import locate, model_pipeline
from stages.base import REQUEST, StageConfig
from stages.payloads import (
    REQUEST_PAYLOADS,
    PayloadSpecError,
    Ports,
    edge_mismatch,
    parse_payloads,
    spell,
    split_input,
)
from stages.registry import get_kind, known_kinds

PIPELINE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""Pipeline names become file names (run records, caches): letters, digits, '.',
'_' and '-', starting with a letter or digit, at most 64 characters — no path
separator, no '..', nothing a shell or a file system reads specially."""


class PipelineConfig(Strict):
    """A whole pipeline: its name and stages (already validated per kind)."""

    name: str = Field(
        pattern=PIPELINE_NAME_PATTERN, description="Pipeline name, shown in plans and run records."
    )
    description: str = Field("", description="Free text for humans.")
    stages: list[StageConfig] = Field(
        min_length=1, description="Stages, any order; inputs define the graph."
    )
    source: str = Field("", description="The file this config was read from (set by the loader).")
    given_as: str = Field(
        "",
        description="How it was named to the loader: a path, a shipped pipeline's name or a model's "
        "Hub id (what `omni-edge pull` takes; set by the loader).",
    )

    def stage(self, name: str) -> StageConfig:
        return next(s for s in self.stages if s.name == name)

    def topological(self) -> list[StageConfig]:
        """Stages ordered so that every stage comes after its inputs (stable)."""
        done: list[str] = []
        pending = [s.name for s in self.stages]
        while pending:
            for name in pending:
                if all(i == REQUEST or i in done for i in sources(self.stage(name).inputs)):
                    done.append(name)
                    pending.remove(name)
                    break
            else:  # pragma: no cover - check_graph rejects cycles first
                raise RuntimeError("cycle")
        return [self.stage(n) for n in done]


def sources(inputs: Iterable[str]) -> list[str]:
    """The stages (and/or ``request``) a stage's ``inputs`` take items from, each once, in order:
    ``[thinker.hidden_states, thinker.text]`` → ``[thinker]`` (``stages.payloads.split_input``)."""
    return list(dict.fromkeys(split_input(i)[0] for i in inputs))


class _TopLevel(Strict):
    """The top level of a config file, before the stages are validated per kind (``extends``
    has been read by then: ``_extended``)."""

    name: str = Field(pattern=PIPELINE_NAME_PATTERN, description="Pipeline name.")
    description: str = Field("", description="Free text for humans.")
    stages: list[Any] = Field(description="Stage mappings.")


# ---- loading -------------------------------------------------------------------


def load_config(path: str | Path) -> PipelineConfig:
    """Load, validate and graph-check a pipeline config.

    ``path`` is a file, a shipped pipeline's name or a model's Hub id
    (``orchestrator.pipelines.locate``: a file that exists wins). Every problem found is
    reported at once (not only the first) as a ``ConfigError``; relative paths inside stages
    resolve against the file's directory (a shipped pipeline's own, once installed). A config
    may ``extends:`` another (``_extended``).
    """
    target = locate(str(path))
    if isinstance(target, HubRef):
        config = parse_config(model_pipeline(target), where=target.text, base_dir=Path.cwd())
    else:
        config = _load(target, ())
    return config.model_copy(update={"given_as": str(path)})


def _load(p: Path, seen: tuple[Path, ...]) -> PipelineConfig:
    data = read_document(p)
    return parse_config(data, where=str(p), base_dir=p.resolve().parent, _seen=seen)


def parse_config(
    data: Any, *, where: str, base_dir: Path, _seen: tuple[Path, ...] = ()
) -> PipelineConfig:
    """A pipeline config from a parsed document (``where`` names it in errors; relative
    paths resolve against ``base_dir``): every stage and top-level problem at once as a
    ``ConfigError``, then the graph checked (``check_graph``)."""
    if not isinstance(data, dict):
        got = "nothing (the file is empty)" if data is None else f"a {type(data).__name__}"
        raise ConfigError.single(
            where,
            f"the top level must be a mapping, got {got}",
            "start the file with 'name:' and 'stages:'",
        )
    if "extends" in data:
        data = _extended(data, where, base_dir, _seen)
    _refuse_vllm_omni(data, where)
    problems: list[Problem] = []
    raw_stages = data.get("stages")
    stages: list[StageConfig] = []
    if isinstance(raw_stages, list):
        for i, raw in enumerate(raw_stages):
            stage, found = _parse_stage(raw, f"{where}: stages[{i}]", base_dir)
            problems += found
            if stage is not None:
                stages.append(stage)
    top = {k: v for k, v in data.items() if k != "stages"}
    problems += _top_level_problems(top, raw_stages, where)
    problems = [_readable_name_problem(problem, where) for problem in problems]
    if problems:
        raise ConfigError(problems)
    config = PipelineConfig.model_construct(
        name=top["name"], description=top.get("description", ""), stages=stages, source=where
    )
    check_graph(config, where)
    return config


def _extended(
    data: dict[str, object], where: str, base_dir: Path, seen: tuple[Path, ...]
) -> dict[str, object]:
    """``extends: NAME``: the pipeline NAME names (a path relative to this file, else a shipped
    pipeline's name) loaded and checked as it stands, then this file's keys over it. A stage of
    this file whose ``name`` the base has is merged into the base's stage (its keys win; a
    mapping such as ``sampling`` is merged key by key), any other stage is added; ``name`` and
    ``description`` default to the base's. The base's relative paths were resolved against the
    base's own file, this file's against this one; the result is validated like any config."""
    name = data["extends"]
    loc = f"{where}: extends"
    fix = "name a shipped pipeline (omni-edge pipelines lists them) or a config file's path"
    if not isinstance(name, str) or not name.strip():
        raise ConfigError.single(loc, f"must be a pipeline's name or path, got {name!r}", fix)
    local = Path(name).expanduser()
    target = base_dir / local if not local.is_absolute() and (base_dir / local).exists() else None
    found = target or locate(name)
    if isinstance(found, HubRef):
        raise ConfigError.single(loc, f"{name} names a model (a Hub id), not a pipeline", fix)
    key = found.resolve()
    if key in seen:
        chain = " → ".join(str(p) for p in (*seen, key))
        raise ConfigError.single(loc, f"extends goes round in a circle: {chain}", "break the cycle")
    base = _load(found, (*seen, key))
    raw = data.get("stages", [])
    if not isinstance(raw, list):
        raise ConfigError.single(
            f"{where}: stages", "must be a list of stages (each overrides or adds one)", fix
        )
    dumped = {s.name: s.model_dump(mode="json", exclude_unset=True) for s in base.stages}
    mine = {m["name"]: m for m in raw if isinstance(m, dict) and m.get("name") in dumped}
    stages = [_merged(dumped[n], mine[n]) if n in mine else dumped[n] for n in dumped]
    stages += [m for m in raw if not (isinstance(m, dict) and m.get("name") in dumped)]
    top = {k: v for k, v in data.items() if k not in ("extends", "stages")}
    return {"name": base.name, "description": base.description, **top, "stages": stages}


def _merged(base: dict[str, object], override: dict[str, object]) -> dict[str, object]:
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        out[key] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def _parse_stage(raw: Any, loc: str, base_dir: Path) -> tuple[StageConfig | None, list[Problem]]:
    """One ``stages[i]`` entry validated by its kind's model, its paths resolved (None and
    the problems when it cannot be)."""
    if not isinstance(raw, dict):
        return None, [Problem(loc, "a stage must be a mapping", "write name:, kind:, devices: ...")]
    kind_name = raw.get("kind")
    if kind_name is None:
        return None, [
            Problem(
                f"{loc}.kind",
                "required field is missing",
                f"add kind: one of {', '.join(known_kinds())}",
            )
        ]
    try:
        kind = get_kind(str(kind_name))
    except KeyError:
        return None, [
            Problem(
                f"{loc}.kind",
                f"unknown stage kind {kind_name!r}",
                f"use one of {', '.join(known_kinds())}, or install the plugin that provides it",
            )
        ]
    try:
        stage = kind.config_model.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as exc:
        return None, problems_from_validation(exc, loc, kind.config_model)
    if (
        len(stage.inputs) > 1
        and stage.join is None
        and (join := kind.default_join(stage)) is not None
    ):
        stage = stage.model_copy(
            update={"join": join}
        )  # the kind's own default (StageKind.default_join)
    return kind.resolve_paths(stage, base_dir), []


def _top_level_problems(top: dict[str, Any], raw_stages: Any, where: str) -> list[Problem]:
    """What is wrong outside the stages: the top-level fields, a missing or empty ``stages``."""
    problems: list[Problem] = []
    try:
        _TopLevel.model_validate(
            {**top, "stages": raw_stages if isinstance(raw_stages, list) else []}
        )
    except ValidationError as exc:
        problems.extend(problems_from_validation(exc, where, _TopLevel))
    if raw_stages is None:
        problems.append(
            Problem(f"{where}: stages", "required field is missing", "add a list of stages")
        )
    elif not isinstance(raw_stages, list) or not raw_stages:
        problems.append(
            Problem(f"{where}: stages", "must be a non-empty list", "add at least one stage")
        )
    return problems


def _readable_name_problem(problem: Problem, where: str) -> Problem:
    """A ``name`` that fails its pattern, said in words (pydantic quotes the regex)."""
    if problem.where == f"{where}: name" and "pattern" in problem.what:
        return Problem(
            problem.where,
            f"{problem.what.split(' (got ', 1)[-1].removesuffix(')')} is not a usable pipeline name: it becomes part of file names",
            "use letters, digits, '.', '_' and '-' only, starting with a letter or digit, at most 64 characters",
        )
    return problem


def check_graph(config: PipelineConfig, where: str) -> None:
    """Every graph problem, before anything is planned (``ConfigError``, exit 2):

    1. the structure — duplicate names or ids, unknown or repeated inputs, a stage
       fed by itself, device ids, several inputs without a ``join`` (or a join on
       one input);
    2. the shape — a cycle (named as its path, in the direction data flows) and no
       final output;
    3. the flow — stages no path from the request reaches, outputs that go
       nowhere (no consumer and not a final output), every edge's payload types
       (``stages.payloads``: both stages and both types named; an input naming an
       output port, ``thinker.hidden_states``, must name one the producer has and is
       checked against that port's types only), the request's payloads into entry
       stages, and ``final_output_type`` against what the stage produces;
    4. a ``zip`` that would stall: one upstream stage reaching the join along a path
       that streams and along one that waits for its end (both paths named).

    Several entry stages and several final outputs are allowed; fan-in is
    accepted with a declared join on a stage whose kind takes joined items
    (``StageKind.takes_join``; the runtime joins, ``orchestrator.runtime.joins``).
    """
    _raise(_structure_problems(config, where))
    problems: list[Problem] = []
    cycle = _find_cycle(config)
    if cycle:
        problems.append(
            Problem(
                f"{where}: stages",
                f"the stage graph has a cycle: {' → '.join(cycle)} (each stage feeds the next)",
                "make one of these stages take its input from earlier stages or 'request'",
            )
        )
    if not any(s.final_output for s in config.stages):
        problems.append(
            Problem(
                f"{where}: stages",
                "no stage has final_output: true, so the pipeline would return nothing",
                "set final_output: true on the stage(s) whose output the caller gets",
            )
        )
    _raise(problems)
    _raise(
        [
            *_reach_problems(config, where),
            *_type_problems(config, where),
            *_join_kind_problems(config, where),
        ]
    )
    _raise(_zip_stall_problems(config, where))


def _raise(problems: list[Problem]) -> None:
    if problems:
        raise ConfigError(problems)


def _structure_problems(config: PipelineConfig, where: str) -> list[Problem]:
    problems: list[Problem] = []
    names = [s.name for s in config.stages]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(
            Problem(
                f"{where}: stages",
                f"stage name {dup!r} is used more than once",
                "give each stage a unique name",
            )
        )
    ids = [s.stage_id for s in config.stages if s.stage_id is not None]
    for dup_id in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(
            Problem(
                f"{where}: stages",
                f"stage_id {dup_id} is used more than once",
                "give each stage a unique stage_id",
            )
        )
    for s in config.stages:
        for inp in s.inputs:
            src, port = split_input(inp)
            if src != REQUEST and src not in names:
                problems.append(
                    Problem(
                        f"{where}: stages.{s.name}.inputs",
                        f"unknown input {inp!r}",
                        f"use 'request' or one of the stage names: {', '.join(names)}",
                    )
                )
            elif src == REQUEST and port is not None:
                problems.append(
                    Problem(
                        f"{where}: stages.{s.name}.inputs",
                        f"{inp!r}: the request has no output ports",
                        "write request",
                    )
                )
            if src == s.name:
                problems.append(
                    Problem(
                        f"{where}: stages.{s.name}.inputs",
                        "a stage cannot take its own output as input",
                        "remove it",
                    )
                )
        for inp in sorted({i for i in s.inputs if s.inputs.count(i) > 1}):
            problems.append(
                Problem(
                    f"{where}: stages.{s.name}.inputs",
                    f"{inp!r} is listed more than once",
                    "list each input once",
                )
            )
        for src in sources(s.inputs):
            if src in s.inputs and any(split_input(i)[0] == src and i != src for i in s.inputs):
                ported = [i for i in s.inputs if i != src and split_input(i)[0] == src]
                problems.append(
                    Problem(
                        f"{where}: stages.{s.name}.inputs",
                        f"{src} is listed whole and by port ({', '.join(ported)}): {src} alone already takes every item it yields",
                        f"list {src} alone, or only the ports {s.name} takes",
                    )
                )
        problems.extend(_join_problems(s, where))
        for dev in s.devices:
            if not _DEVICE_ID.match(dev):
                problems.append(
                    Problem(
                        f"{where}: stages.{s.name}.devices",
                        f"{dev!r} is not a device id",
                        "use cpu, gpu:N, igpu:N or npu:N",
                    )
                )
    return problems


def _join_problems(s: StageConfig, where: str) -> list[Problem]:
    if len(s.inputs) > 1 and s.join is None:
        return [
            Problem(
                f"{where}: stages.{s.name}.join",
                f"{s.name} has {len(s.inputs)} inputs ({', '.join(s.inputs)}) and no join, so how they combine is unsaid",
                "add join: all (each input's whole output, once every input has ended), zip (items paired by sequence) "
                "or latest (each input's newest item)",
            )
        ]
    if len(s.inputs) <= 1 and s.join is not None:
        return [
            Problem(
                f"{where}: stages.{s.name}.join",
                f"join: {s.join} combines several inputs, and {s.name} has "
                + (f"one ({s.inputs[0]})" if s.inputs else "none"),
                "remove join, or list the other inputs it should combine",
            )
        ]
    return []


def _join_kind_problems(config: PipelineConfig, where: str) -> list[Problem]:
    """A stage with several inputs must be of a kind that takes joined items (``StageKind.takes_join``)."""
    return [
        Problem(
            f"{where}: stages.{s.name}.inputs",
            f"{s.name} ({s.kind}) has {len(s.inputs)} inputs ({', '.join(s.inputs)}), and the {s.kind} kind does not take "
            f"joined items (one dict keyed by source per item)",
            f"give {s.name} one input, or put a stage of a kind that takes a join in front of it",
        )
        for s in config.stages
        if len(s.inputs) > 1 and s.join is not None and not get_kind(s.kind).stage_takes_join(s)
    ]


def _reach_problems(config: PipelineConfig, where: str) -> list[Problem]:
    """Stages the request never reaches, and outputs that go nowhere (the graph has no cycle)."""
    consumers = {
        s.name: [c.name for c in config.stages if s.name in sources(c.inputs)]
        for s in config.stages
    }
    reached = {s.name for s in config.stages if REQUEST in s.inputs}
    todo = list(reached)
    while todo:
        for c in consumers[todo.pop()]:
            if c not in reached:
                reached.add(c)
                todo.append(c)
    problems: list[Problem] = []
    for s in config.stages:
        if s.name not in reached:
            chain = _chain_to_root(config, s.name)
            problems.append(
                Problem(
                    f"{where}: stages.{s.name}.inputs",
                    f"no path from the request reaches {s.name}: {' → '.join(chain)} starts at {chain[0]}, which has no inputs",
                    f"give {chain[0]} inputs: [request] (or the stage that should feed it), or remove the stages that nothing feeds",
                )
            )
        elif not consumers[s.name] and not s.final_output:
            problems.append(
                Problem(
                    f"{where}: stages.{s.name}",
                    f"the output of {s.name} goes nowhere: no stage takes it as input and it is not a final output",
                    f"set final_output: true on {s.name}, add it to a later stage's inputs, or remove the stage",
                )
            )
    return problems


def _chain_to_root(config: PipelineConfig, name: str) -> list[str]:
    """``root → … → name``, following first inputs back to a stage with none (no cycle, no request)."""
    chain = [name]
    while config.stage(chain[0]).inputs:
        chain.insert(0, sources(config.stage(chain[0]).inputs)[0])
    return chain


def _type_problems(config: PipelineConfig, where: str) -> list[Problem]:
    """Every edge's payload types (``stages.payloads``), the request's into entry stages, and
    each ``final_output_type`` against what its stage produces."""
    ports, problems = _ports(config, where)
    if problems:
        return problems
    request = parse_payloads(REQUEST_PAYLOADS)
    for s in config.stages:
        consumes = ports[s.name].consumes
        for inp in s.inputs:
            src_name, port = split_input(inp)
            if port is not None and not ports[src_name].port(port):
                have = ports[src_name].port_names()
                problems.append(
                    Problem(
                        f"{where}: stages.{s.name}.inputs",
                        f"{s.name} takes {inp}, and {src_name} ({config.stage(src_name).kind}) has no output port {port!r}; "
                        f"its ports are {', '.join(have) or 'none'}",
                        f"name one of {', '.join(f'{src_name}.{p}' for p in have)}, or {src_name} alone for every item it yields",
                    )
                )
                continue
            gives = (
                request
                if inp == REQUEST
                else ports[src_name].port(port)
                if port
                else ports[src_name].produces
            )
            why = edge_mismatch(gives, consumes)
            if why is None:
                continue
            if inp == REQUEST:
                problems.append(
                    Problem(
                        f"{where}: stages.{s.name}.inputs",
                        f"{s.name} ({s.kind}) consumes {spell(consumes)}, and a request carries {spell(request)}",
                        f"feed {s.name} from a stage that produces {spell(consumes)} instead of 'request'",
                    )
                )
                continue
            src = config.stage(src_name)
            problems.append(
                Problem(
                    f"{where}: stages.{s.name}.inputs",
                    f"{inp} ({src.kind}) produces {spell(gives)}, and {s.name} ({s.kind}) consumes {spell(consumes)}: {why}",
                    f"feed {s.name} from a stage that produces {spell(consumes)}, or put a stage between {src_name} and "
                    f"{s.name} that turns {spell(gives)} into {spell(consumes)}",
                )
            )
        produced = {t.kind for t in ports[s.name].produces}
        if s.final_output_type is not None and s.final_output_type not in produced:
            problems.append(
                Problem(
                    f"{where}: stages.{s.name}.final_output_type",
                    f"{s.name} ({s.kind}) produces {spell(ports[s.name].produces)}, not {s.final_output_type}",
                    f"set final_output_type: {sorted(produced)[0]}, or leave it out",
                )
            )
    return problems


def _ports(config: PipelineConfig, where: str) -> tuple[dict[str, Ports], list[Problem]]:
    """Each stage's ports; a kind that spells a payload type wrongly is a problem named at the stage."""
    ports: dict[str, Ports] = {}
    problems: list[Problem] = []
    for s in config.stages:
        try:
            ports[s.name] = get_kind(s.kind).ports(s)
        except PayloadSpecError as exc:
            problems.append(
                Problem(
                    f"{where}: stages.{s.name}.kind",
                    f"the {s.kind} kind declares a payload type wrongly: {exc}",
                    "fix the kind's consumes/produces (the spelling is in stages/payloads.py)",
                )
            )
    return ports, problems


def _zip_stall_problems(config: PipelineConfig, where: str) -> list[Problem]:
    """A ``zip`` whose inputs come from one upstream stage along two paths, one that streams
    that stage's items and one that waits for its end (a stage on it takes ``whole`` text): the
    streaming input fills the join's buffer, its producer pauses, the upstream stage never ends,
    and the waiting input never comes — the request stalls. Named with both paths."""
    ports, problems = _ports(config, where)
    if problems:
        return []

    def waits(consumer: StageConfig, entry: str) -> bool:
        """Whether ``consumer`` gets nothing along ``entry`` before its producer has ended."""
        src, port = split_input(entry)
        gives = ports[src].port(port) if port else ports[src].produces
        return (
            get_kind(consumer.kind).text_input == "whole"
            and any(t.kind == "text" for t in gives)
            and any(t.kind == "text" for t in ports[consumer.name].consumes)
        )

    out: list[Problem] = []
    for j in config.stages:
        if j.join != "zip":
            continue
        # (upstream stage, the path from it to j as hops, whether the path waits, j's input it ends in)
        paths: list[tuple[str, list[str], str | None, str]] = []
        for entry in j.inputs:
            if entry == REQUEST:
                continue
            todo: list[tuple[list[str], str | None]] = [
                ([entry, j.name], j.name if waits(j, entry) else None)
            ]
            while todo and len(paths) < 256:
                hops, waiter = todo.pop()
                head = split_input(hops[0])[0]
                paths.append((head, hops, waiter, entry))
                for up in config.stage(head).inputs:
                    if up != REQUEST:
                        todo.append(
                            (
                                [up, *hops],
                                waiter or (head if waits(config.stage(head), up) else None),
                            )
                        )
        for head, hops, waiter, entry in paths:
            if waiter is None:
                continue
            streaming = next(
                (p for p in paths if p[0] == head and p[2] is None and p[3] != entry), None
            )
            if streaming is None:
                continue
            out.append(
                Problem(
                    f"{where}: stages.{j.name}.join",
                    f"join: zip can stall: {' → '.join(streaming[1])} hands {j.name} {head}'s items as they come, and "
                    f"{' → '.join(hops)} only once {head} has ended ({waiter} takes whole text), so the streaming input "
                    f"fills the join's buffer, {head} pauses and never ends",
                    f"use join: all (each input's whole output once every input has ended), or feed {j.name} from paths "
                    "that both stream",
                )
            )
            break
    return out


_DEVICE_ID = re.compile(
    r"^([A-Za-z][A-Za-z0-9_-]{0,31}/)?(cpu|gpu:\d+|igpu:\d+|npu:\d+)$"
)  # NODE/ID: one node of a cluster profile


def _find_cycle(config: PipelineConfig) -> list[str]:
    """A cycle as stage names in the direction data flows (``a → b → a``: a feeds b feeds a), or []."""
    graph = {s.name: [i for i in sources(s.inputs) if i != REQUEST] for s in config.stages}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        stack.append(n)
        for m in graph.get(n, []):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m][::-1]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return []

    for n in graph:
        if n not in state:
            found = visit(n)
            if found:
                return found
    return []


_VLLM_OMNI_MARKS = frozenset(
    {
        "stage_type",
        "runtime",
        "engine_args",
        "engine_input_source",
        "default_sampling_params",
        "gpu_memory_utilization",
        "worker_cls",
        "custom_process_input_func",
    }
)
"""Keys only a vLLM-Omni stage has (legacy ``stage_args:`` or the deploy YAML's ``stages:``; an
omni-edge stage has none of them): a list whose every stage has one and no ``kind`` is
vLLM-Omni's, not a mistyped omni-edge config."""


def _refuse_vllm_omni(data: dict[str, Any], where: str) -> None:
    """A vLLM-Omni stage config is one problem that names the importer (``omni-edge import
    vllm-omni``, ``orchestrator.importers.vllm_omni``, the one reader of that format), not one
    per foreign key: a ``stage_args:`` list (the legacy shape), or ``stages:`` whose every
    entry lacks ``kind`` and has one of vLLM-Omni's own keys (the deploy YAML)."""
    listed = data.get("stages")
    if "stage_args" in data:
        what, loc = (
            "its stages are listed under stage_args:, vLLM-Omni's legacy shape",
            f"{where}: stage_args",
        )
    elif (
        isinstance(listed, list)
        and listed
        and all(
            isinstance(s, dict) and "kind" not in s and _VLLM_OMNI_MARKS & s.keys() for s in listed
        )
    ):
        what, loc = (
            "its stages have stage_type, runtime or default_sampling_params and no kind",
            where,
        )
    else:
        return
    raise ConfigError.single(
        loc,
        f"this is a vLLM-Omni stage config ({what}), not an omni-edge pipeline config",
        f"convert it: omni-edge import vllm-omni {where} --model CHECKPOINT_DIR -o CONFIG "
        "(docs/pipelines.md, 'Importing vLLM-Omni configs')",
    )
