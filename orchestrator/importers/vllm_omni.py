"""vLLM-Omni stage configs → an omni-edge pipeline config (``omni-edge import vllm-omni``).

Two shapes are read:

* the **legacy** ``stage_args:`` files (``vllm_omni/model_executor/stage_configs/*.yaml``):
  one entry per stage with ``stage_type``, ``runtime``, ``engine_args``,
  ``engine_input_source``, ``default_sampling_params``, ``final_output[_type]``;
* the **deploy** YAML (``vllm_omni/deploy/*.yaml``): ``stages:`` keyed by
  ``stage_id`` with the engine fields flat on the stage, ``devices: "0"``,
  ``platforms:`` (per-platform overrides) and ``base_config`` (an overlay's
  parent, deep-merged by ``stage_id``).

A deploy file carries only per-stage settings; which stage is the thinker, the
talker or code2wav, and what feeds what, is the model's own pipeline in
vLLM-Omni. So the importer keeps a small table of known Omni topologies
(:data:`TOPOLOGIES`), selected by the file's ``pipeline:`` key (vLLM-Omni's
pipeline registry key), else by the deploy file's name (vLLM-Omni names its
bundled deploy files by pipeline), else by the checkpoint's ``architectures``
(``--model``'s config.json) or a legacy file's ``engine_args.model_arch``, and
says which one it used; a pipeline it has no topology for is refused with the
list of those it knows. Every key is either mapped (``mapped``: from where, to where) or listed
as having no equivalent here with one line on why (``no_equivalent``) — never a
"did you mean": a foreign key is not a misspelling.

Each stage entry is read by one :class:`_Stage` (a method per part: model, devices, engine,
sampling, inputs, final output). This is the one reader of the format: ``orchestrator.config``
refuses a vLLM-Omni file, naming this command. The mapping table is in docs/pipelines.md
("Importing vLLM-Omni configs").
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import parse_config, sources
from orchestrator.core.errors import ConfigError, Problem
from orchestrator.core.validation import read_document
from orchestrator.importers.vllm_omni_schema import (  # noqa: F401  (re-exported: the importer's vocabulary)
    CONNECTOR_WHY,
    DEFAULT_WHY,
    DTYPES,
    ENGINE_KEYS,
    NO_EQUIVALENT,
    PLATFORM_WHY,
    SAMPLING_KEYS,
    THINKER_ONLY,
    TOPOLOGIES,
    UPSTREAM_PIPELINES,
    Topology,
    TopologyStage,
    known_pipelines,
    pipeline_by_file_name,
    topology_for,
    topology_for_pipeline,
)
from stages.ar_decode.kv import model_context_limit, text_config
from stages.base import MAX_REPLICAS
from stages.payloads import split_input
from stages.registry import get_kind

FORMAT = "omni-edge.import/1"
DEFAULT_MAX_MODEL_LEN = 32768
"""A generation stage's ``max_model_len`` when the file gives none and no ``--model`` gives the
model's own: Qwen2.5-Omni-3B's thinker context (``max_position_embeddings`` in
configs/models/qwen2.5-omni-3b/config.json)."""


# ---- the result ------------------------------------------------------------------


@dataclass
class ImportReport:
    source: str
    shape: str
    topology: str
    topology_by: str
    stages: list[dict[str, Any]] = field(default_factory=list)
    mapped: list[dict[str, Any]] = field(default_factory=list)
    no_equivalent: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def map(self, key: str, to: str, value: Any) -> None:
        self.mapped.append({"key": key, "to": to, "value": value})

    def foreign(self, key: str, why: str | None = None) -> None:
        leaf = key.rsplit(".", 1)[-1]
        self.no_equivalent.append({"key": key, "why": why or NO_EQUIVALENT.get(leaf, DEFAULT_WHY)})

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "source": self.source,
            "shape": self.shape,
            "topology": {"name": self.topology, "selected_by": self.topology_by},
            "stages": self.stages,
            "mapped": self.mapped,
            "no_equivalent": self.no_equivalent,
            "notes": self.notes,
        }


@dataclass
class Imported:
    config: dict[str, Any]
    report: ImportReport


# ---- reading the two shapes ------------------------------------------------------


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _deep_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


def _merge_stages(base: list[Any], over: list[Any]) -> list[Any]:
    """``stages:`` deep-merged by ``stage_id`` (vLLM-Omni's base_config overlay)."""
    out = [copy.deepcopy(s) for s in base]
    for s in over:
        sid = s.get("stage_id") if isinstance(s, dict) else None
        hit = next(
            (i for i, b in enumerate(out) if isinstance(b, dict) and b.get("stage_id") == sid), None
        )
        if hit is None or sid is None:
            out.append(copy.deepcopy(s))
        else:
            out[hit] = _deep_merge(out[hit], s)
    return out


def read_deploy(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A deploy YAML with its ``base_config`` parents applied (stages and platforms deep-merged
    by stage_id, other scalars: the overlay wins)."""
    data = read_document(path)
    if not isinstance(data, dict):
        raise ConfigError.single(
            str(path),
            "the top level must be a mapping",
            "pass a vLLM-Omni stage config or deploy YAML",
        )
    parent_ref = data.get("base_config")
    if parent_ref is None:
        return data
    if not isinstance(parent_ref, str):
        raise ConfigError.single(
            f"{path}: base_config", "must be a path", "write base_config: other.yaml"
        )
    parent = (path.parent / parent_ref).resolve()
    if parent in seen or parent == path.resolve():
        chain = " → ".join(str(p) for p in (*seen, path.resolve(), parent))
        raise ConfigError.single(
            f"{path}: base_config",
            f"the overlays form a cycle: {chain}",
            "remove base_config from one of them",
        )
    base = read_deploy(parent, (*seen, path.resolve()))
    merged = {k: v for k, v in base.items() if k not in ("stages", "platforms")}
    for k, v in data.items():
        if k in ("stages", "platforms", "base_config"):
            continue
        merged[k] = copy.deepcopy(v)
    merged["stages"] = _merge_stages(base.get("stages") or [], data.get("stages") or [])
    platforms = copy.deepcopy(base.get("platforms") or {})
    for plat, over in (data.get("platforms") or {}).items():
        mine = platforms.get(plat)
        if isinstance(mine, dict) and isinstance(over, dict):
            merged_plat = _deep_merge(
                {k: v for k, v in mine.items() if k != "stages"},
                {k: v for k, v in over.items() if k != "stages"},
            )
            merged_plat["stages"] = _merge_stages(
                mine.get("stages") or [], over.get("stages") or []
            )
            platforms[plat] = merged_plat
        else:
            platforms[plat] = copy.deepcopy(over)
    if platforms:
        merged["platforms"] = platforms
    merged["base_config"] = str(parent)
    return merged


def _shape(data: dict[str, Any], where: str) -> str:
    if "stage_args" in data:
        return "stage_args"
    stages = data.get("stages")
    if (
        isinstance(stages, list)
        and all(isinstance(s, dict) and "stage_id" in s for s in stages)
        and stages
    ):
        return "deploy"
    raise ConfigError.single(
        where,
        "neither a vLLM-Omni stage_args: file nor a deploy YAML (stages: with stage_id on each)",
        "pass a file from vllm_omni/model_executor/stage_configs/ or vllm_omni/deploy/",
    )


# ---- the model -------------------------------------------------------------------


def _model_config(model: Path | None) -> dict[str, Any] | None:
    if model is None:
        return None
    cfg = model / "config.json"
    data = read_document(cfg)
    if not isinstance(data, dict):
        raise ConfigError.single(
            str(cfg),
            "not a model config (a JSON object)",
            "point --model at a checkpoint directory",
        )
    return data


def _declared_pipeline(
    data: dict[str, Any], src: Path, shape: str, where: str
) -> tuple[str, str, str] | None:
    """``(registry key, what says so, where)`` for a deploy file: its ``pipeline:`` key (an
    overlay's, else its base's), else its name or its base_config parent's name
    (:func:`pipeline_by_file_name`); None for a legacy file or a name that names none."""
    if shape != "deploy":
        return None
    if "pipeline" in data:
        key = data["pipeline"]
        if not isinstance(key, str) or not key.strip():
            raise ConfigError.single(
                f"{where}: pipeline",
                f"must be a vLLM-Omni pipeline name, got {key!r}"[:200],
                f"write pipeline: one of {', '.join(p for t in TOPOLOGIES for p in t.pipelines)}",
            )
        return key.strip(), f"pipeline: {key.strip()} in the file", f"{where}: pipeline"
    names = [("the file name", src.name)]
    if data.get("base_config"):
        names.append(("the name of its base_config", Path(str(data["base_config"])).name))
    for what, name in names:
        key = pipeline_by_file_name(name)
        if key is not None:
            return key, f"{what} {name}, as vLLM-Omni names its deploy files by pipeline", where
    return None


def _pick_topology(
    model_cfg: dict[str, Any] | None,
    model: Path | None,
    stages: list[dict[str, Any]],
    where: str,
    declared: tuple[str, str, str] | None = None,
    deploy: bool = False,
) -> tuple[Topology, str]:
    file_archs = sorted(
        {
            str((s.get("engine_args") or {}).get("model_arch"))
            for s in stages
            if isinstance(s.get("engine_args"), dict)
            and (s.get("engine_args") or {}).get("model_arch")
        }
    )
    known = f"the importer knows the pipelines {', '.join(known_pipelines())}"
    declared_topo: Topology | None = None
    if declared is not None:
        key, how, loc = declared
        declared_topo = topology_for_pipeline(key)
        if declared_topo is None:
            raise ConfigError.single(
                loc,
                f"vLLM-Omni pipeline {key!r}"
                + ("" if loc.endswith(": pipeline") else f" (by {how})")
                + " is not one the importer has a topology for",
                f"{known}; for another model, write the omni-edge config by hand (docs/pipelines.md)",
            )
    if model_cfg is not None:
        archs = [str(a) for a in model_cfg.get("architectures") or []]
        topo = topology_for(archs)
        if topo is None:
            raise ConfigError.single(
                f"{model}/config.json: architectures",
                f"{archs or 'none'}: no known Omni topology for it",
                f"the importer knows {', '.join(dict.fromkeys(a for t in TOPOLOGIES for a in t.architectures))}",
            )
        if (
            declared is not None
            and declared_topo is not None
            and not set(archs) & set(declared_topo.architectures)
        ):
            raise ConfigError.single(
                declared[2],
                f"the file is for pipeline {declared[0]} ({declared_topo.name}, by {declared[1]}), "
                f"and --model {model} is {', '.join(archs)} ({topo.name})",
                "pass the checkpoint this file was written for, or the deploy file written for this checkpoint",
            )
        file_topo = topology_for(file_archs)
        if file_topo is not None and file_topo is not topo:
            raise ConfigError.single(
                f"{where}: engine_args.model_arch",
                f"the file is for {', '.join(file_archs)} ({file_topo.name}), and --model {model} is {', '.join(archs)} ({topo.name})",
                "pass the checkpoint this file was written for, or the stage config written for this checkpoint",
            )
        if declared is not None and declared_topo is not None:
            return declared_topo, f"{declared[1]}; --model's architectures {archs} agree"
        return topo, f"architectures {archs} in {model}/config.json"
    if declared is not None and declared_topo is not None:
        return declared_topo, f"{declared[1]}; no --model given"
    archs = file_archs
    topo = topology_for(archs)
    if topo is None:
        if deploy:
            raise ConfigError.single(
                where,
                "which Omni model this is cannot be told: the file has no pipeline: key and its name "
                "is no vLLM-Omni pipeline's",
                f"pass --model DIR (a checkpoint directory): its config.json's architectures selects the topology; "
                f"or add pipeline: to the file ({known})",
            )
        raise ConfigError.single(
            where,
            "which Omni model this is cannot be told: the file names no known model_arch",
            "pass --model DIR (a checkpoint directory): its config.json's architectures selects the topology",
        )
    return topo, f"engine_args.model_arch {archs} in the file (no --model given)"


def _context_limit(model_cfg: dict[str, Any] | None, model_stage: str) -> int | None:
    if model_cfg is None:
        return None
    try:
        return model_context_limit(text_config(model_cfg, model_stage))
    except KeyError:
        return None


def _devices(value: Any) -> list[str] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return [f"gpu:{value}"]
    if isinstance(value, str) and re.fullmatch(r"\s*\d+(\s*,\s*\d+)*\s*", value):
        return [f"gpu:{int(d)}" for d in value.split(",")]
    return None


def _pipeline_name(path: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-._") or "imported"
    return name[:64]


# ---- the import ------------------------------------------------------------------


def import_vllm_omni(
    path: str | Path,
    *,
    model: str | Path | None = None,
    output: str | Path | None = None,
    only: list[str] | None = None,
    name: str | None = None,
) -> Imported:
    """Read a vLLM-Omni stage config (either shape) and return the omni-edge config and the report.

    ``model`` is the checkpoint directory (its config.json selects the topology and gives
    context limits); ``output`` is where the config will be written, so the model path in it
    is relative to that file; ``only`` keeps those stages (by name) and leaves the others out,
    a kept stage whose consumers are all left out becoming a final output. Raises
    ``ConfigError`` for a file that cannot be read as either shape.
    """
    src = Path(path)
    model_dir = Path(model).resolve() if model is not None else None
    where = str(src)
    shape, data, list_key, entries = _read(src)
    model_cfg = _model_config(model_dir)
    topo, topo_by = _topology(data, entries, src, shape, model, model_cfg)
    report = ImportReport(str(src), shape, topo.name, topo_by)
    if shape == "deploy" and data.get("base_config"):
        report.notes.append(
            f"base_config: applied {data['base_config']} under this file (stages merged by stage_id)"
        )
    if model_dir is None:
        report.notes.append(
            "no --model given: stages' model is MODEL_DIR; pass --model DIR (the checkpoint) or edit it"
        )
    if shape == "deploy":
        entries = _apply_cuda_platform(data, entries, report)
    if topo.name in THINKER_ONLY.values():
        entries = _thinker_only(entries, topo, list_key, report)
    by_id = _stage_topology(entries, topo, list_key, where)
    missing = [t for t in topo.stages if t not in by_id.values()]
    if shape == "deploy" and missing and not only:
        report.notes.append(
            f"{', '.join(t.model_stage for t in missing)}: not in the file, so not imported (vLLM-Omni runs a "
            "pipeline's other stages with its defaults, or leaves them out for a checkpoint without them); "
            "add them to the file to import them"
        )
    ctx = _Context(topo, by_id, report, _model_ref(model_dir, output), model_cfg, shape, model_dir)
    stages_out = [
        _Stage(s, f"{list_key}[{i}]", by_id[s.get("stage_id", i)], ctx).convert()
        for i, s in enumerate(entries)
    ]
    used_connector_keys = (
        _async_chunk(data, shape, topo, stages_out, entries, report) if shape == "deploy" else set()
    )
    if only:
        stages_out = _keep_only(stages_out, only, topo, report, where)
    _report_top_level(data, list_key, shape, topo, used_connector_keys, report)
    config = {
        "name": name or _pipeline_name(src),
        "description": f"Imported from vLLM-Omni's {src.name} (topology {topo.name}) by omni-edge import vllm-omni.",
        "stages": stages_out,
    }
    return Imported(config, report)


def _read(src: Path) -> tuple[str, dict[str, Any], str, list[dict[str, Any]]]:
    """``(shape, document, the key of its stage list, the stages)``: a deploy file with its
    ``base_config`` parents applied (:func:`read_deploy`), a legacy file as written."""
    where = str(src)
    raw = read_document(src)
    if not isinstance(raw, dict):
        raise ConfigError.single(
            where, "the top level must be a mapping", "pass a vLLM-Omni stage config or deploy YAML"
        )
    shape = _shape(raw, where)
    data = read_deploy(src) if shape == "deploy" else raw
    list_key = "stage_args" if shape == "stage_args" else "stages"
    entries = data.get(list_key)
    if not isinstance(entries, list) or not all(isinstance(s, dict) for s in entries):
        raise ConfigError.single(
            f"{where}: {list_key}",
            "must be a list of stage mappings",
            f"write {list_key}: as a list",
        )
    return shape, data, list_key, entries


def _topology(
    data: dict[str, Any],
    entries: list[dict[str, Any]],
    src: Path,
    shape: str,
    model: str | Path | None,
    model_cfg: dict[str, Any] | None,
) -> tuple[Topology, str]:
    """The file's topology and what selected it (:func:`_pick_topology`); a checkpoint without
    audio output (``enable_audio_output: false``) selects the thinker-only one, as vLLM-Omni does."""
    where = str(src)
    declared = _declared_pipeline(data, src, shape, where)
    topo, topo_by = _pick_topology(
        model_cfg,
        Path(model) if model is not None else None,
        entries,
        where,
        declared,
        deploy=shape == "deploy",
    )
    if (
        model_cfg is not None
        and model_cfg.get("enable_audio_output") is False
        and topo.name in THINKER_ONLY
    ):
        topo = next(t for t in TOPOLOGIES if t.name == THINKER_ONLY[topo.name])
        topo_by += (
            " and its enable_audio_output: false (the thinker alone, as vLLM-Omni resolves it)"
        )
    return topo, topo_by


def _model_ref(model_dir: Path | None, output: str | Path | None) -> str:
    """The stages' ``model:``: ``MODEL_DIR`` without ``--model``; else relative to the written
    config when both live under one tree (a repository), else absolute."""
    if model_dir is None:
        return "MODEL_DIR"
    out_dir = Path(output).resolve().parent if output is not None else Path.cwd()
    shared = Path(os.path.commonpath([model_dir, out_dir]))
    return os.path.relpath(model_dir, out_dir) if len(shared.parts) > 2 else str(model_dir)


def _thinker_only(
    entries: list[dict[str, Any]], topo: Topology, list_key: str, report: ImportReport
) -> list[dict[str, Any]]:
    """The entries a checkpoint without audio output keeps (its thinker); the others listed."""
    kept = [
        e
        for e in entries
        if topo.by_id(e.get("stage_id", -1)) is not None
        or topo.by_model_stage(
            str((e.get("engine_args") or {}).get("model_stage") or e.get("model_stage"))
        )
    ]
    for i, e in enumerate(entries):
        if not any(e is k for k in kept):
            report.foreign(
                f"{list_key}[{i}]",
                f"stage_id {e.get('stage_id')!r}: the checkpoint has no audio output "
                "(enable_audio_output: false), so vLLM-Omni runs its thinker alone",
            )
    return kept


def _stage_topology(
    entries: list[dict[str, Any]], topo: Topology, list_key: str, where: str
) -> dict[Any, TopologyStage]:
    """Each entry's stage of ``topo`` by its stage_id; ``ConfigError`` listing every entry
    that is malformed, is no stage of the topology, or repeats a stage_id."""
    problems: list[Problem] = []
    by_id: dict[Any, TopologyStage] = {}
    for i, s in enumerate(entries):
        loc = f"{list_key}[{i}]"
        sid = s.get("stage_id", i)
        if isinstance(sid, bool) or not isinstance(sid, (int, str)):
            problems.append(
                Problem(
                    f"{where}: {loc}.stage_id",
                    f"must be a whole number, got {sid!r}"[:200],
                    "write stage_id: 0",
                )
            )
            continue
        for key in ("engine_args", "runtime", "default_sampling_params"):
            if key in s and not isinstance(s[key], (dict, type(None))):
                problems.append(
                    Problem(
                        f"{where}: {loc}.{key}",
                        f"must be a mapping, got a {type(s[key]).__name__}",
                        f"write {key}: as key: value lines",
                    )
                )
        sources = s.get("engine_input_source")
        if sources is not None and not (
            isinstance(sources, list)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in sources)
        ):
            problems.append(
                Problem(
                    f"{where}: {loc}.engine_input_source",
                    f"must be a list of stage ids, got {sources!r}"[:200],
                    "write engine_input_source: [0]",
                )
            )
        engine = s.get("engine_args") if isinstance(s.get("engine_args"), dict) else {}
        model_stage = (engine or {}).get("model_stage") or s.get("model_stage")
        ts = (
            topo.by_model_stage(str(model_stage))
            if model_stage
            else topo.by_id(s.get("stage_id", -1))
        )
        if ts is None:
            what = f"model_stage {model_stage!r}" if model_stage else f"stage_id {sid!r}"
            problems.append(
                Problem(
                    f"{where}: {loc}",
                    f"{what} is no stage of the {topo.name} topology",
                    f"use the topology's stages: {', '.join(f'{t.stage_id} {t.model_stage}' for t in topo.stages)}",
                )
            )
            continue
        if sid in by_id:
            problems.append(
                Problem(
                    f"{where}: {loc}.stage_id",
                    f"stage_id {sid} is used more than once",
                    "give each stage its own stage_id",
                )
            )
        by_id[sid] = ts
    if problems:
        raise ConfigError(problems)
    return by_id


def _report_top_level(
    data: dict[str, Any],
    list_key: str,
    shape: str,
    topo: Topology,
    used_connector_keys: set[str],
    report: ImportReport,
) -> None:
    """The file's keys besides its stages: what each became, or why it has no equivalent."""
    for key, value in data.items():
        if key in (list_key, "base_config", "async_chunk"):
            continue
        if key == "pipeline" and shape == "deploy":
            report.map("pipeline", "the topology", f"{value} → {topo.name}")
            continue
        if key == "connectors" and isinstance(value, dict):
            for cname, conn in value.items():
                extra = conn.get("extra") if isinstance(conn, dict) else None
                for k in extra if isinstance(extra, dict) else {}:
                    if f"connectors.{cname}.extra.{k}" not in used_connector_keys:
                        report.foreign(f"connectors.{cname}.extra.{k}", CONNECTOR_WHY)
                for k in conn if isinstance(conn, dict) else {}:
                    if k != "extra":
                        report.foreign(f"connectors.{cname}.{k}", CONNECTOR_WHY)
            continue
        if key == "platforms" and isinstance(value, dict):
            for plat in value:
                if plat == "cuda":
                    continue  # applied (_apply_cuda_platform)
                report.foreign(
                    f"platforms.{plat}",
                    PLATFORM_WHY.get(
                        plat,
                        f"overrides for {plat} machines: not applied; "
                        "omni-edge plans against a hardware profile, so the file's own (CUDA) values are used",
                    ),
                )
            continue
        if key == "runtime" and isinstance(value, dict):
            for k in value:
                report.foreign(f"runtime.{k}")
            continue
        if key in ("name", "description"):
            continue
        report.foreign(key)


def _apply_cuda_platform(
    data: dict[str, Any], entries: list[dict[str, Any]], report: ImportReport
) -> list[dict[str, Any]]:
    """``platforms.cuda``'s stage overrides applied over the stages, as vLLM-Omni applies
    them on an NVIDIA machine (``_apply_platform_overrides``): omni-edge's ``gpu:N``
    devices are CUDA devices. Sampling and engine_extras are deep-merged, other keys replaced."""
    cuda = (
        (data.get("platforms") or {}).get("cuda")
        if isinstance(data.get("platforms"), dict)
        else None
    )
    if not isinstance(cuda, dict):
        return entries
    out = [copy.deepcopy(e) for e in entries]
    for k in cuda:
        if k != "stages":
            report.foreign(f"platforms.cuda.{k}")
    for j, ps in enumerate(cuda.get("stages") or []):
        if not isinstance(ps, dict):
            continue
        hit = next((i for i, e in enumerate(out) if e.get("stage_id") == ps.get("stage_id")), None)
        if hit is None:
            report.foreign(
                f"platforms.cuda.stages[{j}]",
                f"stage_id {ps.get('stage_id')!r} is no stage of the file",
            )
            continue
        for k, v in ps.items():
            if k == "stage_id":
                continue
            mine = out[hit].get(k)
            out[hit][k] = (
                _deep_merge(mine, v)
                if isinstance(mine, dict) and isinstance(v, dict)
                else copy.deepcopy(v)
            )
            report.map(
                f"platforms.cuda.stages[{j}].{k}",
                f"stages[{hit}].{k} (vLLM-Omni applies it on CUDA machines; gpu:N here is one)",
                v,
            )
    return out


def _connector_extra(
    data: dict[str, Any], entries: list[dict[str, Any]], src_id: int, dst_id: int
) -> tuple[str, dict[str, Any]] | None:
    """``(name, extra)`` of the connector on the edge ``src_id → dst_id``: the receiving stage's
    ``input_connectors.from_stage_<src>``, else the sender's ``output_connectors.to_stage_<dst>``."""
    found = data.get("connectors")
    connectors: dict[str, Any] = found if isinstance(found, dict) else {}
    for sid, side, key in (
        (dst_id, "input_connectors", f"from_stage_{src_id}"),
        (src_id, "output_connectors", f"to_stage_{dst_id}"),
    ):
        entry = next((e for e in entries if e.get("stage_id") == sid), None)
        ref = (
            ((entry or {}).get(side) or {}).get(key)
            if isinstance((entry or {}).get(side), dict)
            else None
        )
        conn = connectors.get(ref) if isinstance(ref, str) else None
        if isinstance(conn, dict):
            extra = conn.get("extra")
            return str(ref), (extra if isinstance(extra, dict) else {})
    return None


CHUNK_KEYS = (
    ("codec_chunk_frames", "frames", 25),
    ("codec_left_context_frames", "left_context", 25),
    ("initial_codec_chunk_frames", "first_frames", 0),
)
"""vLLM-Omni's async-chunk connector extras → the exported_graph kind's ``chunk:`` fields, with
upstream's defaults when the file gives none (``talker2code2wav_async_chunk`` in
``vllm_omni/model_executor/stage_input_processors/qwen3_omni.py``: 25, 25, and no smaller
first chunk)."""


def _async_chunk(
    data: dict[str, Any],
    shape: str,
    topo: Topology,
    stages: list[dict[str, Any]],
    entries: list[dict[str, Any]],
    report: ImportReport,
) -> set[str]:
    """vLLM-Omni's ``async_chunk`` (a deploy file's; true when absent, as its ``DeployConfig``
    has it): the talker starting on the thinker's first chunk, code2wav decoding the talker's
    codes in windows. Returns the connector extras it mapped."""
    value = data.get("async_chunk", True)
    given = "async_chunk" in data
    by_name = {s["name"]: s for s in stages}
    talker, code2wav = by_name.get("talker"), by_name.get("code2wav")
    if not isinstance(value, bool):
        report.foreign(
            "async_chunk", f"{value!r} is not true or false; read as vLLM-Omni's default, true"
        )
        value = True
    if talker is None and code2wav is None:
        if given:
            report.foreign(
                "async_chunk",
                "a one-stage pipeline: nothing streams between stages (vLLM-Omni turns it off too)",
            )
        return set()
    said = f"async_chunk: {str(value).lower()}" + (
        "" if given else " (absent: vLLM-Omni's default)"
    )
    if talker is not None and len(talker.get("inputs", [])) > 1:
        _talker_join(talker, value, said, topo, report)
    if code2wav is not None:
        return _code2wav_chunk(code2wav, value, said, data, topo, entries, report)
    return set()


def _talker_join(
    talker: dict[str, Any], value: bool, said: str, topo: Topology, report: ImportReport
) -> None:
    """The talker's ``join`` over its several inputs: ``latest`` (it starts on the thinker's
    first steps) where ``async_chunk`` is on and the topology's talker streams, else ``all``."""
    if value and topo.streaming_talker:
        talker["join"] = "latest"
        report.notes[:] = [n for n in report.notes if not n.startswith("stages.talker.join: all")]
        report.map("async_chunk", "stages.talker.join", "latest")
        report.notes.append(
            f"stages.talker.join: latest ({said}): the talker starts on the thinker's first steps "
            "and gives the same codes as with its whole hand-over (docs/omni.md, streaming); "
            "vLLM-Omni itself refuses async_chunk for this pipeline (it has no async producer)"
        )
    elif value:
        report.notes.append(
            f"stages.talker.join: all ({said}): this model's talker takes the thinker's whole "
            "hand-over here (it refuses join: latest: docs/omni.md), so only code2wav streams"
        )
    else:
        report.map("async_chunk", "stages.talker.join", "all")


def _code2wav_chunk(
    code2wav: dict[str, Any],
    value: bool,
    said: str,
    data: dict[str, Any],
    topo: Topology,
    entries: list[dict[str, Any]],
    report: ImportReport,
) -> set[str]:
    """code2wav's ``chunk:``: windows of the talker's codes where ``async_chunk`` is on and
    the topology's code2wav decodes in chunks, the whole sequence at once where it is off.
    Returns the connector extras it mapped."""
    if not topo.chunked_code2wav:
        if value:
            report.notes.append(
                f"stages.code2wav ({said}): no chunk: this model's code2wav has no chunked "
                "decode here (docs/omni.md, code2wav)"
            )
        return set()
    if not value:
        code2wav["chunk"] = {"frames": None}
        report.map("async_chunk", "stages.code2wav.chunk", {"frames": None})
        report.notes.append(
            f"stages.code2wav.chunk: frames null ({said}): the talker's whole code sequence "
            "in one call once it has ended (vLLM-Omni's talker2code2wav_full_payload)"
        )
        return set()
    edge = _connector_extra(data, entries, 1, 2)
    chunk, used = _chunk_fields(edge, report)
    code2wav["chunk"] = chunk
    report.map("async_chunk", "stages.code2wav.chunk", chunk)
    report.notes.append(
        f"stages.code2wav.chunk: {chunk} ({said}): the talker's codes decoded in windows "
        "with left context as they come, so audio starts before the talker ends"
        + (
            ""
            if edge
            else "; the file names no connector on the talker → code2wav edge, so "
            "vLLM-Omni's defaults"
        )
    )
    report.notes.append(
        f"stages.code2wav.artifact: {code2wav.get('artifact')} is where the checkpoint's "
        "code2wav, exported with metadata.samples_per_frame, goes (docs/export.md, "
        "Qwen3-Omni's code2wav); a manifest marked not_exported there is refused by name "
        "(no_exported_graph)"
    )
    return used


def _chunk_fields(
    edge: tuple[str, dict[str, Any]] | None, report: ImportReport
) -> tuple[dict[str, Any], set[str]]:
    """The ``chunk:`` fields from the talker → code2wav connector's extras (``CHUNK_KEYS``,
    upstream's defaults where absent or not an integer), and the extras it mapped."""
    extra = edge[1] if edge else {}
    chunk: dict[str, Any] = {}
    used: set[str] = set()
    for up, mine, default in CHUNK_KEYS:
        v = extra.get(up, default)
        if edge and up in extra:
            used.add(f"connectors.{edge[0]}.extra.{up}")
            report.map(f"connectors.{edge[0]}.extra.{up}", f"stages.code2wav.chunk.{mine}", v)
        chunk[mine] = int(v) if isinstance(v, int) and not isinstance(v, bool) else default
    return chunk, used


@dataclass(frozen=True)
class _Context:
    """What every stage of one import shares."""

    topo: Topology
    by_id: dict[Any, TopologyStage]
    """The file's stage ids → their stage of the topology (``_stage_topology``)."""
    report: ImportReport
    model_ref: str
    """The stages' ``model:`` (relative to the written config, or ``MODEL_DIR``)."""
    model_cfg: dict[str, Any] | None
    shape: str
    model_dir: Path | None


_DEPLOY_NOT_ENGINE = (
    "stage_id",
    "stage_type",
    "devices",
    "default_sampling_params",
    "engine_input_source",
    "final_output",
    "final_output_type",
    "max_num_seqs",
)
"""A deploy stage's flat keys that are not engine settings (the rest are ``engine_args``)."""
_STAGE_KEYS = (
    "stage_id",
    "stage_type",
    "engine_args",
    "runtime",
    "default_sampling_params",
    "engine_input_source",
    "final_output",
    "final_output_type",
    "model_stage",
)
"""A legacy stage entry's keys that a method of :class:`_Stage` reads."""


class _Stage:
    """One stage entry of a vLLM-Omni file becoming an omni-edge stage (:meth:`convert`): a
    method for each part of the entry — :meth:`model`, :meth:`devices`, :meth:`engine`,
    :meth:`sampling`, :meth:`inputs`, :meth:`final` — each writing its fields into ``out``
    and what it mapped, or found no equivalent for, into the report, in that order."""

    def __init__(self, entry: dict[str, Any], loc: str, ts: TopologyStage, ctx: _Context) -> None:
        self.s, self.loc, self.ts, self.ctx = entry, loc, ts, ctx
        self.report = ctx.report
        self.name = ts.model_stage
        self.out: dict[str, Any] = {"name": self.name, "kind": ts.kind}
        self.deploy = ctx.shape == "deploy"
        self.flat = {k: v for k, v in entry.items() if k not in ("engine_args", "runtime")}
        self.engine_args: dict[str, Any]
        self.runtime: dict[str, Any]
        if self.deploy:  # engine fields flat on the stage
            self.engine_args = {k: v for k, v in self.flat.items() if k not in _DEPLOY_NOT_ENGINE}
            self.runtime = {k: self.flat[k] for k in ("devices", "max_num_seqs") if k in self.flat}
        else:
            self.engine_args = dict(entry.get("engine_args") or {})
            self.runtime = dict(entry.get("runtime") or {})
        self.eloc = loc if self.deploy else f"{loc}.engine_args"
        self.rloc = loc if self.deploy else f"{loc}.runtime"

    def convert(self) -> dict[str, Any]:
        sid = self.s.get("stage_id")
        if isinstance(sid, int) and not isinstance(sid, bool):
            self.out["stage_id"] = sid
            self.report.map(f"{self.loc}.stage_id", f"stages.{self.name}.stage_id", sid)
        ts = self.ts
        self.report.stages.append(
            {
                "stage_id": sid,
                "name": self.name,
                "kind": ts.kind,
                "model_stage": ts.model_stage,
                "inputs": list(ts.inputs),
                "carries": ts.carries,
            }
        )
        self.model()
        devices = self.devices()
        self.engine()
        self.sampling()
        self.inputs()
        self.out["devices"] = devices
        self.final()
        return _ordered(self.out)

    def model(self) -> None:
        """``kind``, and ``model`` and ``model_stage`` (a generation stage) or ``artifact`` (an
        exported graph), from the topology."""
        ts, name, out, report = self.ts, self.name, self.out, self.report
        stage_type = self.s.get("stage_type")
        if stage_type is not None:
            report.map(
                f"{self.loc}.stage_type",
                f"stages.{name}.kind",
                f"{stage_type} → {ts.kind} ({ts.model_stage} in {self.ctx.topo.name})",
            )
        if ts.kind == "ar_decode":
            out["model"] = self.ctx.model_ref
            out["model_stage"] = ts.model_stage
        else:
            out["artifact"] = f"{self.ctx.model_ref}/{ts.model_stage}"
            model_dir = self.ctx.model_dir
            if model_dir is not None and (model_dir / ts.model_stage / "manifest.yaml").is_file():
                report.notes.append(
                    f"stages.{name}: {ts.model_stage} runs as an exported graph, artifact {out['artifact']}"
                )
            else:
                report.notes.append(
                    f"stages.{name}: {ts.model_stage} runs as an exported graph; artifact {out['artifact']} "
                    "must hold its manifest (docs/exported-artifacts.md)"
                )
        if "model_stage" in self.engine_args:
            report.map(
                f"{self.eloc}.model_stage",
                f"stages.{name}.model_stage"
                if ts.kind == "ar_decode"
                else f"stages.{name}.artifact",
                self.engine_args["model_stage"],
            )

    def devices(self) -> list[str]:
        """vLLM-Omni's ``devices: "0,1"`` (CUDA indices) as ``gpu:N`` candidates; gpu:0 when
        the file names none or names them some other way."""
        runtime, name, report = self.runtime, self.name, self.report
        devices = _devices(runtime.get("devices")) if "devices" in runtime else None
        if devices is None:
            if "devices" in runtime:
                report.foreign(
                    f"{self.rloc}.devices",
                    f'{runtime["devices"]!r} is not a list of GPU indices ("0", "0,1"); gpu:0 assumed',
                )
            else:
                report.notes.append(
                    f"stages.{name}.devices: the file names no devices; gpu:0 assumed"
                )
            return ["gpu:0"]
        report.map(f"{self.rloc}.devices", f"stages.{name}.devices", devices)
        replicas = (self.flat if self.deploy else runtime).get("num_replicas")
        if len(devices) > 1:
            report.notes.append(
                f"stages.{name}.devices: {runtime['devices']!r} lists {len(devices)} GPUs; here they are "
                + (
                    f"candidates in preference order and its {replicas} replicas are spread over them "
                    "(one a GPU while there are enough)"
                    if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas > 1
                    else "candidates in preference order and the stage is placed on one of them"
                )
            )
        return devices

    def engine(self) -> None:
        """The engine's settings (``engine_args``, a deploy stage's flat fields, ``runtime``):
        a generation stage's batch and context, every other key listed with why."""
        ts, name, out, report, runtime = self.ts, self.name, self.out, self.report, self.runtime
        generates = ts.kind == "ar_decode"
        if generates:
            self._batch_and_context()
        self._replicas()
        for k, v in self.engine_args.items():
            key = f"{self.eloc}.{k}"
            if k == "model_stage" or (k == "num_replicas" and self.deploy):
                continue
            if generates and k in ENGINE_KEYS and not (k == "dtype" and v not in DTYPES):
                out[ENGINE_KEYS[k]] = v
                report.map(key, f"stages.{name}.{ENGINE_KEYS[k]}", v)
            elif k == "enable_prefix_caching" and v is False:
                report.map(key, f"stages.{name} (always off here)", v)
            elif k in ("max_num_batched_tokens", "enforce_eager") and not generates:
                report.foreign(
                    key,
                    f"an engine setting of a generation engine; {ts.model_stage} runs as an exported graph here",
                )
            else:
                report.foreign(key)
        for k in runtime:
            if k in ("devices", "num_replicas") or (
                k in ("max_batch_size", "max_num_seqs") and generates
            ):
                continue
            report.foreign(
                f"{self.rloc}.{k}",
                f"{ts.model_stage} runs as an exported graph here, one item at a time"
                if k in ("max_batch_size", "max_num_seqs")
                else None,
            )

    def _replicas(self) -> None:
        """vLLM-Omni's ``num_replicas`` (a deploy stage's flat field, a legacy stage's
        ``runtime``) as the stage's ``replicas``: each instance placed and reserved on its
        own, spread over the stage's devices."""
        where = self.flat if self.deploy else self.runtime
        if "num_replicas" not in where:
            return
        n, key = where["num_replicas"], f"{self.rloc}.num_replicas"
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_REPLICAS:
            self.report.foreign(
                key, f"{n!r} is not a number of instances from 1 to {MAX_REPLICAS}; one is planned"
            )
        elif n == 1:
            self.report.map(key, f"stages.{self.name} (one instance, the default)", n)
        else:
            self.out["replicas"] = n
            self.report.map(key, f"stages.{self.name}.replicas", n)

    def _batch_and_context(self) -> None:
        """A generation stage's ``max_num_seqs`` (the file's batch size) and ``max_model_len``
        (the file's, else the model's own limit, else 32768)."""
        name, out, report, runtime = self.name, self.out, self.report, self.runtime
        seqs = runtime.get("max_batch_size", runtime.get("max_num_seqs"))
        if isinstance(seqs, int) and not isinstance(seqs, bool) and seqs >= 1:
            out["max_num_seqs"] = seqs
            key = "max_batch_size" if "max_batch_size" in runtime else "max_num_seqs"
            report.map(f"{self.rloc}.{key}", f"stages.{name}.max_num_seqs", seqs)
        if "max_model_len" in self.engine_args:
            return
        limit = _context_limit(self.ctx.model_cfg, self.ts.model_stage)
        if limit is not None:
            out["max_model_len"] = limit
            report.notes.append(
                f"stages.{name}.max_model_len: {limit}, the model's own limit "
                "(vLLM-Omni leaves it to the engine, which takes the same)"
            )
        else:
            out["max_model_len"] = DEFAULT_MAX_MODEL_LEN
            report.notes.append(
                f"stages.{name}.max_model_len: {DEFAULT_MAX_MODEL_LEN} assumed "
                "(no --model to read the limit from)"
            )

    def sampling(self) -> None:
        """``default_sampling_params``: a generation stage's ``sampling``; nothing for code2wav."""
        sampling = self.s.get("default_sampling_params")
        if not isinstance(sampling, dict):
            return
        loc, name, report = self.loc, self.name, self.report
        if self.ts.kind != "ar_decode":
            report.foreign(
                f"{loc}.default_sampling_params",
                f"{self.ts.model_stage} does not sample (it turns codec "
                "codes into audio); the settings do nothing here",
            )
            return
        mapped = {k: sampling[k] for k in SAMPLING_KEYS if k in sampling}
        if mapped:
            self.out["sampling"] = mapped
        for k, v in sampling.items():
            if k in mapped:
                report.map(f"{loc}.default_sampling_params.{k}", f"stages.{name}.sampling.{k}", v)
            else:
                report.foreign(f"{loc}.default_sampling_params.{k}")
        _fit_max_tokens(self.out, name, report)

    def inputs(self) -> None:
        """``engine_input_source`` (stage ids) as ``inputs`` — a source the topology takes by its
        output ports as those ports — else the topology's; ``join: all`` for several."""
        ts, name, report, by_id, topo = (
            self.ts,
            self.name,
            self.report,
            self.ctx.by_id,
            self.ctx.topo,
        )
        src = self.s.get("engine_input_source")
        if src is not None:
            ids = src if isinstance(src, list) else [src]
            unknown = [x for x in ids if x not in by_id]
            if unknown:
                raise ConfigError.single(
                    f"{report.source}: {self.loc}.engine_input_source",
                    f"no stage has stage_id {unknown[0]}",
                    f"use one of {', '.join(str(k) for k in by_id)}",
                )
            names = [by_id[x].model_stage for x in ids]
            # a source the topology takes by its output ports (thinker2talker: hidden states and text) is those ports
            inputs = [
                p for n in names for p in ([i for i in ts.inputs if split_input(i)[0] == n] or [n])
            ] or ["request"]
            report.map(f"{self.loc}.engine_input_source", f"stages.{name}.inputs", inputs)
            if tuple(inputs) != ts.inputs:
                report.notes.append(
                    f"stages.{name}.inputs: the file says {inputs}, the {topo.name} topology "
                    f"{list(ts.inputs)}; the file's is kept"
                )
        else:
            inputs = list(ts.inputs)
            if inputs != ["request"]:
                report.notes.append(
                    f"stages.{name}.inputs: {inputs} from the {topo.name} topology ({ts.carries})"
                )
        self.out["inputs"] = inputs
        if len(inputs) > 1:
            self.out["join"] = "all"
            report.notes.append(
                f"stages.{name}.join: all (each input's whole output, once every input has ended)"
            )

    def final(self) -> None:
        """``final_output`` and its type: the file's, else (a deploy file) the topology's; the
        legacy entry's remaining keys listed as having no equivalent."""
        s, ts, name, out, report = self.s, self.ts, self.name, self.out, self.report
        if self.deploy and "final_output" not in s and ts.final_output_type is not None:
            out["final_output"] = True
            out["final_output_type"] = ts.final_output_type
            report.notes.append(
                f"stages.{name}.final_output: true, {ts.final_output_type}, "
                f"from the {self.ctx.topo.name} topology"
            )
        if "final_output" in s:
            out["final_output"] = bool(s["final_output"])
            report.map(f"{self.loc}.final_output", f"stages.{name}.final_output", s["final_output"])
        if "final_output_type" in s:
            out["final_output_type"] = s["final_output_type"]
            report.map(
                f"{self.loc}.final_output_type",
                f"stages.{name}.final_output_type",
                s["final_output_type"],
            )
        if self.deploy:
            return  # a deploy stage's other keys are its flat engine fields (engine())
        for k in s:
            if k not in _STAGE_KEYS:
                report.foreign(f"{self.loc}.{k}")


def _fit_max_tokens(out: dict[str, Any], name: str, report: ImportReport) -> None:
    """``sampling.max_tokens`` at or above ``max_model_len`` — vLLM-Omni's way of writing "up to
    the context" (its engine caps a reply at what the context has left) — as the largest value
    that loads here: one below ``max_model_len`` (``ArDecodeConfig`` keeps room for a prompt)."""
    sampling, limit = out.get("sampling") or {}, out.get("max_model_len")
    value = sampling.get("max_tokens")
    if not (
        isinstance(value, int)
        and isinstance(limit, int)
        and not isinstance(value, bool)
        and value >= limit > 1
    ):
        return
    sampling["max_tokens"] = limit - 1
    report.notes.append(
        f"stages.{name}.sampling.max_tokens: {limit - 1}, the largest that loads: the file's {value} is at or above "
        f'max_model_len {limit} (vLLM-Omni\'s "up to the context"). A request that leaves max_tokens to the '
        f"config gets what its prompt leaves of the context, as vLLM's server gives it; one that asks for more "
        f"than that is refused"
    )


def _keep_only(
    stages: list[dict[str, Any]], only: list[str], topo: Topology, report: ImportReport, where: str
) -> list[dict[str, Any]]:
    """The stages ``only`` names; one whose consumers are all left out becomes a final output of
    what its stage of the topology hands on (``TopologyStage.hands_on``)."""
    names = [s["name"] for s in stages]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ConfigError.single(
            f"--only {','.join(only)}",
            f"no stage named {', '.join(unknown)} in {where}",
            f"use the imported stage names: {', '.join(names)}",
        )
    kept = [s for s in stages if s["name"] in only]
    for s in kept:
        dropped = [i for i in sources(s["inputs"]) if i != "request" and i not in only]
        if dropped:
            raise ConfigError.single(
                f"--only {','.join(only)}",
                f"{s['name']} takes its input from {', '.join(dropped)}, which is left out",
                f"keep {', '.join(dropped)} too",
            )
    for s in kept:
        fed = any(s["name"] in sources(k["inputs"]) for k in kept)
        if not fed and not s.get("final_output"):
            ts = topo.by_model_stage(s["name"])
            produced = get_kind(s["kind"]).produces
            sub = ts.hands_on if ts is not None else (produced[0] if produced else None)
            s["final_output"] = True
            if sub:
                s["final_output_type"] = sub
            report.notes.append(
                f"stages.{s['name']}.final_output: true ({sub}): the stages it fed are left out (--only)"
            )
    report.notes.append(
        f"--only {','.join(only)}: left out {', '.join(n for n in names if n not in only)}"
    )
    report.stages = [r for r in report.stages if r["name"] in only]
    return kept


_ORDER = (
    "name",
    "kind",
    "stage_id",
    "model",
    "model_stage",
    "artifact",
    "inputs",
    "join",
    "devices",
    "replicas",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "dtype",
    "enforce_eager",
    "sampling",
    "final_output",
    "final_output_type",
)


def _ordered(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in (*_ORDER, *(k for k in d if k not in _ORDER)) if k in d}


def check_imported(imported: Imported, output: Path) -> list[str]:
    """The written config loaded as ``omni-edge plan`` would load it: the problems, or []."""
    try:
        parse_config(
            copy.deepcopy(imported.config), where=str(output), base_dir=output.resolve().parent
        )
    except ConfigError as exc:
        return [" ".join(p.lines()) for p in exc.problems]
    return []
