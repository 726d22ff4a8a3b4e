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

Each stage entry is read by one :class:`StageEntry` (a method per part: model, devices, engine,
sampling, inputs, final output). This is the one reader of the format: ``orchestrator.config``
refuses a vLLM-Omni file, naming this command. The mapping table is in docs/pipelines.md
("Importing vLLM-Omni configs").
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from orchestrator.config import parse_config
from orchestrator.core.errors import ConfigError
from orchestrator.core.validation import read_document
from orchestrator.importers.vllm_omni_read import (
    config_shape,
    declared_pipeline,
    deep_merge,
    model_config,
    pick_topology,
    pipeline_name,
    read_deploy,
)
from orchestrator.importers.vllm_omni_report import Imported, ImportReport
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
from orchestrator.importers.vllm_omni_stage import (
    StageContext,
    StageEntry,
    async_chunk,
    keep_only,
    stage_topology,
)

# ---- the result ------------------------------------------------------------------


# ---- reading the two shapes ------------------------------------------------------


# ---- the model -------------------------------------------------------------------


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
    model_cfg = model_config(model_dir)
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
    by_id = stage_topology(entries, topo, list_key, where)
    missing = [t for t in topo.stages if t not in by_id.values()]
    if shape == "deploy" and missing and not only:
        report.notes.append(
            f"{', '.join(t.model_stage for t in missing)}: not in the file, so not imported (vLLM-Omni runs a "
            "pipeline's other stages with its defaults, or leaves them out for a checkpoint without them); "
            "add them to the file to import them"
        )
    ctx = StageContext(
        topo, by_id, report, _model_ref(model_dir, output), model_cfg, shape, model_dir
    )
    stages_out = [
        StageEntry(s, f"{list_key}[{i}]", by_id[s.get("stage_id", i)], ctx).convert()
        for i, s in enumerate(entries)
    ]
    used_connector_keys = (
        async_chunk(data, shape, topo, stages_out, entries, report) if shape == "deploy" else set()
    )
    if only:
        stages_out = keep_only(stages_out, only, topo, report, where)
    _report_top_level(data, list_key, shape, topo, used_connector_keys, report)
    config = {
        "name": name or pipeline_name(src),
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
    shape = config_shape(raw, where)
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
    """The file's topology and what selected it (:func:`pick_topology`); a checkpoint without
    audio output (``enable_audio_output: false``) selects the thinker-only one, as vLLM-Omni does."""
    where = str(src)
    declared = declared_pipeline(data, src, shape, where)
    topo, topo_by = pick_topology(
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
                deep_merge(mine, v)
                if isinstance(mine, dict) and isinstance(v, dict)
                else copy.deepcopy(v)
            )
            report.map(
                f"platforms.cuda.stages[{j}].{k}",
                f"stages[{hit}].{k} (vLLM-Omni applies it on CUDA machines; gpu:N here is one)",
                v,
            )
    return out


def check_imported(imported: Imported, output: Path) -> list[str]:
    """The written config loaded as ``omni-edge plan`` would load it: the problems, or []."""
    try:
        parse_config(
            copy.deepcopy(imported.config), where=str(output), base_dir=output.resolve().parent
        )
    except ConfigError as exc:
        return [" ".join(p.lines()) for p in exc.problems]
    return []
