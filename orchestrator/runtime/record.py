"""The run record (contract ``omni-edge.run/1``): one JSON file per run.

What it holds (docs/runtime.md documents every field):

* ``plan`` — the ``omni-edge.plan/1`` document the run carried out;
* ``requests[]`` — per request: the prompt, the text, the speakable chunks,
  seconds of audio, time to first token / first audio / total, and per stage
  the figures of its ``done`` event;
* ``stages[]`` — per stage: device, backend, route, load time, time to first
  output, throughput, the plan's budget next to the measured peak (evidence
  M) with the ratio budget/measured and how it was measured; whether the
  figure is only an upper bound (then ``within_budget`` is null, with
  ``within_budget_reason``), the plan's ``calibration`` and ``drift`` (a
  measured peak above a calibrated budget; docs/calibration.md);
* ``calibration`` — the stages planned from measurements, and what this run
  recorded in the measurement store;
* ``edges[]`` — per edge between two stages: its nodes, whether it crosses
  between nodes, and the items and bytes that went over it in the record's
  requests (its transfer cost, measured);
* ``runtime`` — Ray start-up time, Ray's measured memory and how, the actor
  start-up time; ``streaming``: the data path (direct or through the driver),
  how many times each edge's items cross between nodes, and the driver's share
  (outputs it read, feeds it sent, its CPU seconds);
* ``ledger`` — the ledger actor's pools and holders when the record was made;
* ``versions`` — ONNX Runtime (this interpreter and each route's), Ray, torch,
  Python, omni-edge, and each decode engine's (``orchestrator.core.engines``: vLLM
  and its distribution, llama.cpp, transformers).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.core import engines, ort_builds, packages
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import ConfigError
from orchestrator.core.fileio import check_writable, remove_orphans, write_json_atomic
from orchestrator.core.ledger import MeasuredPeak

RUN_FORMAT = "omni-edge.run/1"
DEFAULT_DIR = Path("runs")


def versions(routes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Versions of what ran, read from package metadata (nothing is imported)."""
    out: dict[str, Any] = {
        "omni_edge": packages.installed_version("omni-edge"),
        "python": platform.python_version(),
        "onnxruntime": ort[1] if (ort := ort_builds.ort_build()) else None,
        "ray": packages.installed_version("ray"),
        "torch": packages.installed_version("torch"),
    }
    for engine in engines.rows():  # each decode engine's, and which build where it has several
        out[engine.engine] = engines.installed_version(engine)
        if len(engine.distributions) > 1:
            out[f"{engine.engine}_distribution"] = engines.installed_distribution(
                engine.distributions
            )
    route_ort = {
        name: getattr(r, "ort_version", None)
        for name, r in (routes or {}).items()
        if getattr(r, "ort_version", None)
    }
    if route_ort:
        out["onnxruntime_by_route"] = route_ort
    return out


def stage_rows(
    runtime: Any, results: list[Any], measured: dict[str, MeasuredPeak]
) -> list[JsonObject]:
    """One row per stage: where it ran, how fast, and budget vs measured; a stage with
    ``replicas: N`` > 1 has one row per replica, each with ``replica`` (1-based, as
    ``replica 2 of 2`` says it), its ``holder`` and the ``requests`` it served."""
    rows = []
    views = getattr(runtime, "views", {})
    for stage in runtime.stages:
        for ref in getattr(runtime, "replicas", {}).get(stage.name) or [None]:
            holder = stage.name if ref is None else ref.holder
            row = _stage_row(runtime, views.get(holder, stage), holder, results, measured)
            if ref is not None and ref.of > 1:
                m = measured.get(holder) or runtime.load_results.get(holder, {}).get("measured")
                row = {
                    "stage": stage.name,
                    "replica": ref.index + 1,
                    "holder": holder,
                    "requests": (m or {}).get("requests"),
                    **row,
                }
            rows.append(row)
    return rows


def _stage_row(
    runtime: Any, s: Any, holder: str, results: list[Any], measured: dict[str, MeasuredPeak]
) -> JsonObject:
    """The row of ``s`` (a stage, or one replica's view of it, ledger ``holder``)."""
    load = runtime.load_results.get(holder, {})
    m = measured.get(holder) or load.get("measured") or {}
    per_request = [  # a replica's row: the requests it served (``holder`` in their figures)
        f
        for r in results
        if (f := r.stages.get(s.name)) is not None and f.get("holder", s.name) == holder
    ]
    last = per_request[-1] if per_request else {}
    budget = s.budget_bytes()
    peak = m.get("measured_peak_bytes")
    upper_bound = bool(m.get("upper_bound"))
    judged: JsonObject = {"within_budget": (peak <= budget) if peak is not None else None}
    if upper_bound and peak is not None and peak > budget:
        judged = {
            "within_budget": None,
            "within_budget_reason": m.get("within_budget_reason")
            or "not judged: the figure is an upper bound (another load in the same process is counted)",
        }
    drift = None
    if s.calibration is not None and peak is not None and peak > budget and not upper_bound:
        drift = {
            "over_by_bytes": peak - budget,
            "calibrated_budget_bytes": budget,
            "match": s.calibration.get("match"),
            "note": "measured above its calibrated budget: the next plan widens the margin",
        }
    return {
        "stage": s.name,
        "kind": s.kind,
        "device": s.device,
        "backend": s.backend,
        "route": s.route,
        "load_s": load.get("load_s"),
        "time_to_first_output_s": last.get("time_to_first_output_s"),
        "throughput": last.get("throughput"),
        "budget_bytes": budget,
        "measured_peak_bytes": peak,
        "budget_over_measured": round(budget / peak, 3) if peak else None,
        **judged,
        "upper_bound": upper_bound,
        "load_peak_bytes": m.get("load_peak_bytes"),
        "steady_peak_bytes": m.get("steady_peak_bytes"),
        "resident_bytes": m.get("resident_bytes"),
        "max_in_flight": m.get("max_in_flight"),
        **({"worker_recycles": last["worker_recycles"]} if "worker_recycles" in last else {}),
        # a worker recycled at a limit: the limit, the largest rise of one call, what the calls left
        # behind — what the next plan budgets it from (its peak the limit shaped; docs/calibration.md)
        "worker": m.get("worker"),
        "calibration": s.calibration,
        "drift": drift,
        "measured_by": m.get("method"),
        "measured_where": m.get("where"),
        "measured_when": m.get("when"),
        "load_info": load.get("load_info", {}),
    }


def build(
    runtime: Any,
    results: list[Any],
    *,
    measured: dict[str, MeasuredPeak] | None = None,
    ledger: Mapping[str, object] | None = None,
    extra: JsonObject | None = None,
) -> JsonObject:
    measured = measured or {}
    return {
        "format": RUN_FORMAT,
        "pipeline": runtime.plan.pipeline,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "requests": [r.summary() for r in results],
        "stages": stage_rows(runtime, results, measured),
        "edges": edge_rows(runtime, results),
        "runtime": {
            "ray": {
                "address": getattr(runtime.cluster, "address", None),
                "started_here": getattr(runtime.cluster, "owned", None),
                "memory": runtime.ray_memory,
            },
            "startup": runtime.startup,
            "streaming": streaming(runtime, results),
        },
        "ledger": _ledger_summary(ledger or {}),
        "calibration": calibration_summary(runtime),
        "versions": versions(runtime.routes),
        "plan": runtime.plan.to_json(),
        **(extra or {}),
    }


def _edge_groups(
    runtime: Any, results: list[Any], producer: Any, consumer: Any
) -> list[tuple[tuple[str, str, str, str], list[JsonObject]]]:
    """The edge's per-request counts (``edges_out``) grouped by the instances that ran it:
    ``(producer holder, consumer holder, producer device, consumer device)`` → counts, in
    the order first seen. One group for stages of one instance; a stage with replicas may
    give one per pair of replicas a request was balanced to (their nodes may differ)."""
    groups: dict[tuple[str, str, str, str], list[JsonObject]] = {}
    for r in results:
        out = r.stages.get(producer.name, {})
        if "edges_out" not in out:
            continue
        into = r.stages.get(consumer.name, {})
        key = (
            str(out.get("holder", producer.name)),
            str(into.get("holder", consumer.name)),
            str(out.get("device") or producer.device or ""),
            str(into.get("device") or consumer.device or ""),
        )
        groups.setdefault(key, []).append(out["edges_out"].get(consumer.name, {}))
    if not groups:  # nothing ran it: the plan's placement, no requests
        key = (producer.name, consumer.name, producer.device or "", consumer.device or "")
        return [(key, [])]
    return list(groups.items())


def _edges(runtime: Any, results: list[Any]) -> list[tuple[tuple[str, str], JsonObject]]:
    """``edge_rows``' rows, each with the holders of the two instances it counts."""
    rows = []
    for s in runtime.stages:
        for consumer in runtime.consumers.get(s.name, []):
            c = runtime.plan.stage(consumer)
            for (a, b, src_dev, dst_dev), counts in _edge_groups(runtime, results, s, c):
                items = sum(int(x.get("items", 0)) for x in counts)
                size = sum(int(x.get("bytes", 0)) for x in counts)
                src, dst = src_dev.rpartition("/")[0], dst_dev.rpartition("/")[0]
                row = {
                    "from": s.name,
                    "to": consumer,
                    "from_node": src,
                    "to_node": dst,
                    "crosses_nodes": src != dst,
                    "requests": len(counts),
                    "items": items,
                    "bytes": size,
                    "bytes_per_item": round(size / items, 1) if items else None,
                }
                rows.append(((a, b), row))
    return rows


def edge_rows(runtime: Any, results: list[Any]) -> list[JsonObject]:
    """One row per edge of the graph (producer → consumer), in graph order: the nodes of
    its two stages (``""`` on one machine), ``crosses_nodes``, and what went over it in
    ``results`` — items, bytes (``pump.payload_bytes``: the payload's size, not Ray's
    framing), bytes per item (null when nothing went over it, e.g. a request that
    entered downstream of it), and how many requests ran it. Read from each producer's
    ``done`` stats (``edges_out``). An edge into or out of a stage with replicas has one
    row per pair of instances its requests were balanced to, each with those instances'
    nodes (a replica on another node is another crossing)."""
    return [row for _, row in _edges(runtime, results)]


def streaming(runtime: Any, results: list[Any]) -> JsonObject:
    """``runtime.streaming``: ``mode`` (``direct``: producer → consumer; ``relay``: through the
    driver), the Ray node the driver ran on, per edge (per pair of instances, as
    ``edge_rows``) the nodes its two actors ran on (their ``ready()`` node ids), its
    ``path`` and the node crossings of each item and of all its items (direct: 1 when the
    two nodes differ; relay: producer → driver, then driver → consumer), and ``driver``:
    outputs it read, ``feed`` calls it made, its CPU seconds."""
    mode = getattr(runtime, "streaming", "relay")
    here = getattr(runtime, "driver_node", "") or ""
    devices = getattr(runtime, "devices", {})
    refs = getattr(runtime, "refs", {})

    def node(holder: str, stage: str) -> str:
        ref = refs.get(holder)
        key = ref.key if ref is not None else (runtime.plan.stage(stage).device or "?")
        dev = devices.get(key)
        return str((dev.info or {}).get("node_id") or "") if dev is not None else ""

    edges = []
    for (ha, hb), row in _edges(runtime, results):
        a, b = node(ha, row["from"]), node(hb, row["to"])
        per_item = int(a != b) if mode == "direct" else int(a != here) + int(here != b)
        edges.append(
            {
                "from": row["from"],
                "to": row["to"],
                "from_node": a,
                "to_node": b,
                "path": "direct" if mode == "direct" else "driver",
                "crossings_per_item": per_item,
                "node_crossings": per_item * row["items"],
            }
        )
    driver = dict(getattr(runtime, "driver_stats", {}) or {})
    if "cpu_s" in driver:
        driver["cpu_s"] = round(float(driver["cpu_s"]), 4)
    return {"mode": mode, "driver_node": here, "edges": edges, "driver": driver}


def calibration_summary(runtime: Any) -> JsonObject:
    """Which stages were planned from measurements, and what the run recorded for the next plan
    (``runtime.calibration_recorded``, set when the pipeline wrote the measurement store)."""
    return {
        "calibrated_stages": [s.name for s in runtime.stages if s.calibration is not None],
        "recorded": getattr(runtime, "calibration_recorded", None),
    }


def _ledger_summary(snapshot: Mapping[str, object]) -> JsonObject:
    return {
        "pools": snapshot.get("pools", []),
        "holders": snapshot.get("holders", {}),
        "held_bytes": snapshot.get("held_bytes"),
    }


def default_path(directory: Path, pipeline: str, request_id: str) -> Path:
    return directory / f"{pipeline}-{time.strftime('%Y%m%d-%H%M%S')}-{request_id}.json"


UNIQUE_TRIES = 1000
"""Names tried for one record in a directory (``-2`` … on a clash) before giving up."""


def write(doc: JsonObject, target: str | Path | None, *, request_id: str = "run") -> Path:
    """Write ``doc`` durably to ``target``: a ``.json`` path as given (replaced whole if it
    exists: the user named it), or a directory (default ``runs/``) that receives
    ``<pipeline>-<time>-<request>.json`` — never over a record already there: a name taken
    (two runs stopped in the same second, both named ``run``) gets ``-2``, ``-3``, …, the
    last step a hard link that fails on an existing name. Opening the directory removes
    the temporary files of writers that are gone (``fileio.remove_orphans``)."""
    t = Path(target) if target is not None else DEFAULT_DIR
    if t.suffix.lower() == ".json":
        write_json_atomic(t, doc)
        return t
    remove_orphans(t)
    first = default_path(t, doc.get("pipeline", "pipeline"), request_id)
    for n in range(1, UNIQUE_TRIES + 1):
        path = first if n == 1 else first.with_name(f"{first.stem}-{n}.json")
        try:
            write_json_atomic(path, doc, overwrite=False)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{first}: {UNIQUE_TRIES} records of that name exist")


def check_target(target: str | Path | None, *, what: str = "--record") -> None:
    """Before any work: a record can be written to ``target`` (a ``.json`` file, or
    a directory that exists or can be created). ``ConfigError`` naming ``what``."""
    t = Path(target) if target is not None else DEFAULT_DIR
    if t.suffix.lower() == ".json":
        check_writable(t, what=what)
    elif t.is_dir():
        check_writable(t / "record.json", what=what)
    elif t.exists():
        raise ConfigError.single(
            f"{what} {t}",
            "this is a file without the .json suffix, not a directory",
            "name a .json file or a directory for the run records",
        )
    else:
        # a directory to be created: its first missing component must be creatable
        ancestor = t.absolute()
        while not ancestor.parent.exists():
            ancestor = ancestor.parent
        check_writable(ancestor, what=what)
