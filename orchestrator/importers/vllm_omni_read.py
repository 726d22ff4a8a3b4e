"""Reading vLLM-Omni's two config shapes (stage_args, and deploy YAML with its includes) and the model they name: its config.json, the pipeline it declares, the known topology it matches."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from orchestrator.core.errors import ConfigError
from orchestrator.core.validation import read_document
from orchestrator.importers.vllm_omni_schema import (
    TOPOLOGIES,
    Topology,
    known_pipelines,
    pipeline_by_file_name,
    topology_for,
    topology_for_pipeline,
)
from stages.ar_decode.kv import model_context_limit, text_config


def deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = deep_merge(base[k], v) if k in base else copy.deepcopy(v)
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
            out[hit] = deep_merge(out[hit], s)
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
            merged_plat = deep_merge(
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


def config_shape(data: dict[str, Any], where: str) -> str:
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


def model_config(model: Path | None) -> dict[str, Any] | None:
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


def declared_pipeline(
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


def pick_topology(
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


def context_limit(model_cfg: dict[str, Any] | None, model_stage: str) -> int | None:
    if model_cfg is None:
        return None
    try:
        return model_context_limit(text_config(model_cfg, model_stage))
    except KeyError:
        return None


def devices_of(value: Any) -> list[str] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return [f"gpu:{value}"]
    if isinstance(value, str) and re.fullmatch(r"\s*\d+(\s*,\s*\d+)*\s*", value):
        return [f"gpu:{int(d)}" for d in value.split(",")]
    return None


def pipeline_name(path: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-._") or "imported"
    return name[:64]
