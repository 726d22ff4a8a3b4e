"""The measurement store: measured peaks that feed the next plan (docs/calibration.md).

One JSON file per key under ``calibration_dir()`` (``$OMNI_EDGE_CALIBRATION_DIR``,
else ``<cache>/calibration``). A key holds what determines a stage's peak: the
stage kind, a digest of its artifact (what the plan's ``artifact`` says, plus the
file's size and mtime when it is a file), the backend and its version, the
device (id and name), the machine (OS, CPU, RAM), the precision and the
backend's settings (``engine_kwargs`` minus the fields derived from the budget).
The settings that only scale memory (``SCALING_SETTINGS``: context length,
sequences, batched tokens) are kept apart, so that a *near* match (same
everything, another context length) can be found and scaled.

An entry holds samples, one per run (a server's periodic recording replaces its
own run's sample): the measured peak on the stage's pool, its load path and
steady state where known, the budget it ran under, whether that budget was
calibrated, whether the figure is only an upper bound (a load that overlapped
another in one process), the requests, the most in flight at once, the longest
prompt, when and where. Files are written atomically under a lock, carry a
format version and are validated on read: an entry that is corrupt or
inconsistent is ignored with a warning (and the plan says so), never trusted.

:func:`calibrate` turns an entry into reservations (evidence M) with a margin
from the observed spread; :func:`scaled` does the same from a near match by the
kind's own arithmetic (evidence E, "from M").
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import socket
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.core import engines, settings
from orchestrator.core.fileio import exclusive_lock, write_json_atomic
from orchestrator.core.ledger import RETAINED_GROWTH, Evidence, Reservation, load_and_steady
from orchestrator.core.profile import HardwareProfile
from orchestrator.core.units import MiB, fmt_bytes

log = logging.getLogger(__name__)

CALIBRATION_FORMAT = "omni-edge.calibration/1"
CALIBRATION_ENV = "OMNI_EDGE_CALIBRATION_DIR"
MEASURE_VERSION = 1
"""Bump when the way a peak is measured changes; older entries then stop matching."""

SCALING_SETTINGS = (
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "n_ctx",
    "n_seq_max",
    "n_batch",
    "n_ubatch",
)
"""Settings that only scale memory: a key differing in these alone is a near match (vLLM's, and
llama.cpp's context cells, sequences, prefill chunk and physical batch)."""
BUDGET_DERIVED = ("kv_cache_memory_bytes", "gpu_memory_utilization")
"""Engine settings computed from the budget itself: never part of a key."""

# -- the margin ------------------------------------------------------------------
FLOOR_FRACTION = 0.05
"""Margin floor: 5 % of the largest peak seen (run-to-run noise here is 1-2 %)."""
SETTLED_FRACTION = 0.03
"""The floor once ``SETTLED_RUNS`` recent runs all stayed within budget (tightening)."""
SETTLED_RUNS = 5
MIN_MARGIN_BYTES = 8 * MiB
SPREAD_K = 2.0
"""The budget is at least the mean of the recent peaks + k x their standard deviation."""
MAX_OVERRUN_WIDENING = 4
REQUEST_PRIOR = 0.10
"""Until ``SPREAD_SAMPLES`` runs show how the part of a peak that requests bring (the
peak above what was resident after the load: activations for the longest input, what
the allocator kept between requests) varies, the margin covers a tenth of that part:
one run is one draw of what its requests carried (docs/calibration.md)."""
SPREAD_SAMPLES = 3
WINDOW = 20
"""Recent samples the spread, overruns and settling are judged over."""
GROWTH_HORIZON_CALLS = 64
"""For a recycled worker whose kind reserves no growth of its own: the calls, at the growth
rate its runs measured, that the budget lets it grow over before it is recycled (the horizon
of ``OPENVINO_ITEM_HORIZON`` in ``stages/exported_graph/kind.py``: a recycle costs a reopen,
about 2.5 s for the voice, so at most one every 64 calls)…"""
GROWTH_FRACTION = 0.5
"""…and at most half of what one call needs (resident + its rise) again: a fast-growing
worker is recycled more often rather than budgeted without bound."""
MAX_SAMPLES = 50
"""Samples kept per entry (the largest peak is always kept)."""


def calibration_dir() -> Path:
    """``$OMNI_EDGE_CALIBRATION_DIR`` when set, else ``<cache root>/calibration``."""
    env = os.environ.get(CALIBRATION_ENV)
    return Path(env).expanduser() if env else settings.cache_root() / "calibration"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _sha(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode()).hexdigest()


# -- keys --------------------------------------------------------------------------
@dataclass(frozen=True)
class Key:
    """What determines a measured peak. ``parts``: the identity (a near match shares
    them); ``scaling``: the settings that only scale memory."""

    subject: str
    """``stage`` or a pipeline cost (``ray_runtime``, ``server``)."""
    parts: Mapping[str, Any]
    scaling: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""
    """For people (pipeline-stage); not part of the key."""
    pipeline: str = ""
    stage: str = ""
    """The pipeline and stage (or the cost: ``(ray_runtime)``) it was recorded for; not part of the
    key: what ``omni-edge calibration show/reset`` select by."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "parts": dict(self.parts),
            "scaling": dict(self.scaling),
            "measure_version": MEASURE_VERSION,
        }

    def digest(self) -> str:
        return _sha(self.to_dict())

    def near_digest(self) -> str:
        return _sha(
            {"subject": self.subject, "parts": dict(self.parts), "measure_version": MEASURE_VERSION}
        )

    def filename(self) -> str:
        safe = "".join(
            c if c.isalnum() or c in "-_." else "-" for c in (self.label or self.subject)
        )[:60]
        return f"{safe}-{self.digest()[:16]}.json"


def machine_id(profile: HardwareProfile) -> str:
    """The machine a measurement belongs to: OS (and WSL), CPU model, physical RAM."""
    h = profile.host
    return f"{h.os}{'/wsl' if h.wsl else ''}|{h.cpu_name.strip()}|{h.ram_total_bytes}"


def artifact_digest(artifact: Mapping[str, Any]) -> str:
    """A digest of what the plan read (``artifact``: paths, weight bytes, graph sha256s,
    the manifest), plus the size and mtime of the artifact when it is one file."""
    extra: dict[str, Any] = {}
    path = artifact.get("path")
    if isinstance(path, str) and os.path.isfile(path):
        st = os.stat(path)
        extra = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return _sha({"artifact": dict(artifact), "file": extra})


def _dist_version(*names: str) -> str:
    for n in names:
        try:
            return f"{n}=={metadata.version(n)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def backend_version(backend: str, route: str | None, profile: HardwareProfile) -> str:
    """The version of the backend that runs the stage: its decode engine's, as the engine table
    names it (``orchestrator.core.engines.version_key``: the route's recorded build as probed,
    for an engine found by its build, else this interpreter's distribution), or the route's
    onnxruntime (as probed; this interpreter's for this process)."""
    r = profile.route(route) if route else None
    engine = engines.row_of(backend)
    if engine is not None:
        build = r.llama_cpp if r is not None and engine.found == "build" else None
        return engines.version_key(engine, build.version if build is not None else None)
    if r is not None and r.ort_version:
        return f"onnxruntime=={r.ort_version}"
    return _dist_version(
        "onnxruntime",
        "onnxruntime-openvino",
        "onnxruntime-gpu",
        "onnxruntime-directml",
        "onnxruntime-qnn",
    )


def stage_key(
    *,
    pipeline: str,
    stage: str,
    kind: str,
    artifact: Mapping[str, Any],
    device: str,
    backend: str,
    route: str | None,
    engine_kwargs: Mapping[str, Any],
    profile: HardwareProfile,
) -> Key:
    """The key of one placement (the planner's candidate, or the plan's stage at run time)."""
    dev = profile.device(device)
    kwargs = {k: v for k, v in engine_kwargs.items() if k not in BUDGET_DERIVED}
    scaling = {k: kwargs.pop(k) for k in SCALING_SETTINGS if k in kwargs}
    precision = str(
        kwargs.get("precision") or kwargs.get("dtype") or artifact.get("weight_format") or ""
    )
    parts = {
        "kind": kind,
        "artifact": artifact_digest(artifact),
        "backend": backend,
        "backend_version": backend_version(backend, route, profile),
        "device": device,
        "device_name": dev.name if dev is not None else "",
        "machine": machine_id(profile),
        "precision": precision,
        "settings": _sha(kwargs),
    }
    return Key("stage", parts, scaling, label=f"{pipeline}-{stage}", pipeline=pipeline, stage=stage)


def ray_key(profile: HardwareProfile, owned: bool = True, node: str | None = None) -> Key:
    """The key of the Ray runtime's own memory: on this machine (``profile`` is its own;
    ``owned``: the cluster was started here, not joined), or on the node named ``node`` of
    a cluster (``profile`` is that node's own profile, ``ClusterNode.profile``: its machine
    is the node's). A node's figure is its whole Ray session measured on it
    (``cluster_probe.node_ray_memory``: the GCS on the head, the raylet, agents, workers),
    so it is kept apart from this machine's, and by node name: two nodes on one machine (a
    head and a worker) hold different processes."""
    parts = {
        "machine": machine_id(profile),
        "ray": _dist_version("ray"),
        "cluster": "local" if owned else "joined",
    }
    if node is not None:
        parts.update(cluster="node", node=node)
    return Key(
        "ray_runtime",
        parts,
        label="ray-runtime" if node is None else f"ray-runtime-{node}",
        stage="(ray_runtime)",
    )


def pool_ray_key(profile: HardwareProfile, pool: str) -> Key:
    """The key of Ray's memory charged to the ``host_ram`` pool ``pool``: ``NODE/host_ram``
    of a cluster profile → that node's own key (:func:`ray_key` with its profile and name);
    this machine's ``host_ram`` → this machine's key, as a plan has always looked it up."""
    node, _, _ = pool.rpartition("/")
    if node and node in profile.nodes:
        return ray_key(profile.nodes[node].profile, node=node)
    return ray_key(profile)


def server_key(profile: HardwareProfile) -> Key:
    """The key of the ``serve`` process's own memory on this machine (its Python and Ray)."""
    return Key(
        "server",
        {
            "machine": machine_id(profile),
            "python": platform.python_version(),
            "ray": _dist_version("ray"),
        },
        label="server",
        stage="(server)",
    )


# -- samples and entries -------------------------------------------------------------
WORKER_FIELDS = (
    "recycle_limit_bytes",
    "call_rise_bytes",
    "worker_recycles",
    "worker_calls",
    "retained_bytes",
    "fresh_bytes",
)
"""A worker the runtime recycles at a limit (``StageRunner.worker_stats``): the limit it ran
under, the largest rise one call caused, recycles, calls, what the calls left behind, and a
fresh worker's RSS. Null for every other stage (and in samples recorded before them)."""
SAMPLE_INTS = (
    "peak_bytes",
    "load_bytes",
    "steady_bytes",
    "resident_bytes",
    "budget_bytes",
    "requests",
    "max_in_flight",
    "max_prompt_chars",
    *WORKER_FIELDS,
)


def sample_problem(s: Any) -> str | None:
    """Why ``s`` is not a consistent sample, or None."""
    if not isinstance(s, dict):
        return f"a sample is {type(s).__name__}, not an object"
    if not _count(s.get("peak_bytes")) or s["peak_bytes"] == 0:
        return f"peak_bytes {s.get('peak_bytes')!r} is not a positive integer"
    for name in SAMPLE_INTS:
        if s.get(name) is not None and not _count(s[name]):
            return f"{name} {s[name]!r} is not a non-negative integer"
    parts = [s[n] for n in ("load_bytes", "steady_bytes", "resident_bytes") if s.get(n) is not None]
    if parts and max(parts) > s["peak_bytes"]:
        return f"load/steady/resident ({parts}) exceed peak_bytes {s['peak_bytes']}"
    for name in ("calibrated", "upper_bound", "over_budget"):
        if not isinstance(s.get(name), bool):
            return f"{name} is missing or not a boolean"
    if s["over_budget"] != (
        s.get("budget_bytes") is not None and s["peak_bytes"] > s["budget_bytes"]
    ):
        return "over_budget contradicts peak_bytes and budget_bytes"
    for name in ("when", "where", "run"):
        if not isinstance(s.get(name), str) or not s[name]:
            return f"{name} is missing or not a string"
    return None


def entry_problem(doc: Any, path: Path) -> str | None:
    """Why ``doc`` (read from ``path``) is not a consistent entry, or None."""
    if not isinstance(doc, dict):
        return f"not a JSON object but {type(doc).__name__}"
    if doc.get("format") != CALIBRATION_FORMAT:
        return f"format is {doc.get('format')!r}, not {CALIBRATION_FORMAT!r}"
    key = doc.get("key")
    if (
        not isinstance(key, dict)
        or not isinstance(key.get("parts"), dict)
        or not isinstance(key.get("scaling"), dict)
    ):
        return "key is missing or malformed"
    if key.get("measure_version") != MEASURE_VERSION:
        return f"measure_version {key.get('measure_version')!r} is not {MEASURE_VERSION}"
    if doc.get("key_digest") != _sha(key):
        return "key_digest does not match its key"
    if not path.name.endswith(f"-{doc['key_digest'][:16]}.json"):
        return "it is not filed under its key's digest"
    near = {
        "subject": key.get("subject"),
        "parts": key["parts"],
        "measure_version": MEASURE_VERSION,
    }
    if doc.get("near_digest") != _sha(near):
        return "near_digest does not match its key"
    samples = doc.get("samples")
    if not isinstance(samples, list) or not samples:
        return "samples are missing or empty"
    for s in samples:
        problem = sample_problem(s)
        if problem:
            return problem
    basis = doc.get("basis", [])
    if not isinstance(basis, list):
        return "basis is not a list"
    try:
        [Reservation(**r) for r in basis]
    except (TypeError, ValueError) as exc:
        return f"basis holds an invalid reservation ({exc})"
    return None


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


@dataclass(frozen=True)
class Entry:
    path: Path
    key: dict[str, Any]
    near_digest: str
    samples: tuple[dict[str, Any], ...]
    basis: tuple[Reservation, ...]
    label: str = ""
    pipeline: str = ""
    stage: str = ""

    def trusted(self) -> list[dict[str, Any]]:
        """Samples that are true measurements (no upper bounds)."""
        return [s for s in self.samples if not s["upper_bound"]]


class CalibrationStore:
    """Entries under one directory (default ``calibration_dir()``)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else calibration_dir()
        self.problems: list[str] = []
        """What was ignored on read, for the plan's notes (one line per file)."""

    def path(self, key: Key) -> Path:
        return self.root / key.filename()

    def _read(self, path: Path) -> Entry | None:
        return self._checked(path)[0]

    def _checked(self, path: Path) -> tuple[Entry | None, str | None]:
        """The entry at ``path`` (None when there is none), or why it is not trusted."""
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError) as exc:
            problem: str | None = f"unreadable: {exc}"
        else:
            problem = entry_problem(doc, path)
        if problem is not None:
            line = f"calibration entry {path} ignored: {problem}"
            if line not in self.problems:
                self.problems.append(line)
                log.warning("%s; it is not trusted (plans use the metadata estimates)", line)
            return None, problem
        return Entry(
            path,
            doc["key"],
            doc["near_digest"],
            tuple(doc["samples"]),
            tuple(Reservation(**r) for r in doc.get("basis", [])),
            str(doc.get("label", "")),
            str(doc.get("pipeline") or ""),
            str(doc.get("stage") or ""),
        ), None

    def load(self, key: Key) -> Entry | None:
        return self._read(self.path(key))

    def near(self, key: Key) -> Entry | None:
        """The entry with the most trusted samples that shares ``key``'s identity but not its
        scaling settings (another context length), or None."""
        if not self.root.is_dir():
            return None
        near, exact = key.near_digest(), key.digest()
        best: Entry | None = None
        for path in sorted(self.root.glob("*.json")):
            if path.name.endswith(f"-{exact[:16]}.json"):
                continue
            try:
                head = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self._read(path)  # reports it
                continue
            if not isinstance(head, dict) or head.get("near_digest") != near:
                continue
            entry = self._read(path)
            if (
                entry is not None
                and entry.trusted()
                and (best is None or len(entry.trusted()) > len(best.trusted()))
            ):
                best = entry
        return best

    def record(self, key: Key, sample: dict[str, Any], basis: Iterable[Reservation] = ()) -> Path:
        """Add ``sample`` to ``key``'s entry (replacing the sample of the same ``run``),
        atomically under a lock; a corrupt entry is replaced (with a warning)."""
        problem = sample_problem(sample)
        if problem:
            raise ValueError(f"not a consistent sample: {problem}")
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        with exclusive_lock(self.root / ".lock"):
            entry = self._read(path)
            samples = [s for s in (entry.samples if entry else ()) if s["run"] != sample["run"]]
            samples.append(sample)
            if len(samples) > MAX_SAMPLES:
                largest = max(samples, key=lambda s: s["peak_bytes"])
                keep = samples[-(MAX_SAMPLES - 1) :]
                samples = keep if largest in keep else [largest, *keep]
            doc = {
                "format": CALIBRATION_FORMAT,
                "key_digest": key.digest(),
                "near_digest": key.near_digest(),
                "key": key.to_dict(),
                "label": key.label,
                "pipeline": key.pipeline or (entry.pipeline if entry else ""),
                "stage": key.stage or (entry.stage if entry else ""),
                "basis": [r.to_dict() for r in basis]
                or [r.to_dict() for r in (entry.basis if entry else ())],
                "samples": samples,
                "updated_at": now(),
            }
            write_json_atomic(path, doc, indent=1)
        return path

    def entries(self) -> tuple[list[Entry], list[tuple[Path, str]]]:
        """Every entry in the store, and every file that is not one (path, why), sorted by name."""
        good: list[Entry] = []
        bad: list[tuple[Path, str]] = []
        if not self.root.is_dir():
            return good, bad
        for path in sorted(self.root.glob("*.json")):
            entry, problem = self._checked(path)
            if entry is not None:
                good.append(entry)
            elif problem is not None:
                bad.append((path, problem))
        return good, bad

    def remove_paths(self, paths: Iterable[Path]) -> list[Path]:
        """Remove these entry files (under the lock); returns those that were there."""
        removed = []
        with exclusive_lock(self.root / ".lock"):
            for path in paths:
                try:
                    path.unlink()
                except FileNotFoundError:
                    continue
                removed.append(path)
        return removed

    def remove(self, key: Key) -> bool:
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            return False
        return True


def sample(
    *,
    run: str,
    peak: int,
    budget: int | None,
    calibrated: bool,
    upper_bound: bool = False,
    load: int | None = None,
    steady: int | None = None,
    resident: int | None = None,
    requests: int = 0,
    max_in_flight: int = 0,
    max_prompt_chars: int | None = None,
    where: str = "",
    method: str = "",
    pool: str = "host_ram",
    when: str | None = None,
    worker: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One sample, as the store keeps it (``worker``: a recycled worker's figures, ``WORKER_FIELDS``)."""
    figures = {
        k: (None if not worker or worker.get(k) is None else int(worker[k])) for k in WORKER_FIELDS
    }
    return {
        "run": run,
        "when": when or now(),
        "where": where or socket.gethostname(),
        "pool": pool,
        "peak_bytes": int(peak),
        "load_bytes": None if load is None else int(load),
        "steady_bytes": None if steady is None else int(steady),
        "resident_bytes": None if resident is None else int(resident),
        "budget_bytes": budget,
        "calibrated": calibrated,
        "upper_bound": upper_bound,
        "over_budget": budget is not None and int(peak) > budget,
        "requests": requests,
        "max_in_flight": max_in_flight,
        "max_prompt_chars": max_prompt_chars,
        "method": method,
        **figures,
    }


# -- the arithmetic --------------------------------------------------------------------
@dataclass(frozen=True)
class Margin:
    bytes: int
    rule: str
    """How it was derived, e.g. "max(5% of peak, 2.0 x spread 3.1 MiB, 8 MiB)"."""


def margin_for(
    peaks: list[int], overruns: int = 0, settled: bool = False, request_part: int = 0
) -> Margin:
    """The margin above the largest of ``peaks``: max(floor x largest, what it takes to reach k
    standard deviations above their mean, 8 MiB, and while fewer than ``SPREAD_SAMPLES`` runs
    are known, ``REQUEST_PRIOR`` x the part of the peak that requests brought). Each recent
    overrun widens the floor by 5 %; settled runs narrow it to 3 %.

    The spread counts from the mean, not from the largest peak: the largest of N draws already
    sits above the mean by about the spread, and counting k deviations on top of it again (as
    before) put Ray's reservation at 1.29 GiB over 25 runs whose peaks were 525-932 MiB, the
    early overruns widening k on top of a maximum that had already absorbed them. An overrun
    therefore widens the floor only: the largest peak already holds the overrun itself."""
    largest = max(peaks)
    mean = statistics.fmean(peaks)
    spread = statistics.pstdev(peaks) if len(peaks) > 1 else 0.0
    widen = min(overruns, MAX_OVERRUN_WIDENING)
    frac = (SETTLED_FRACTION if settled and not widen else FLOOR_FRACTION) + FLOOR_FRACTION * widen
    k = SPREAD_K
    candidates = {
        "floor": math.ceil(frac * largest),
        "spread": max(0, math.ceil(mean + k * spread - largest)),
        "minimum": MIN_MARGIN_BYTES,
    }
    prior = ""
    if len(peaks) < SPREAD_SAMPLES and request_part > 0:
        candidates["requests"] = math.ceil(REQUEST_PRIOR * request_part)
        prior = f", {REQUEST_PRIOR:.0%} of the {fmt_bytes(request_part)} requests brought"
    which = max(candidates, key=lambda c: candidates[c])
    rule = (
        f"max({frac:.0%} of the largest peak, mean + {k:g} x spread {fmt_bytes(int(spread))}, "
        f"{fmt_bytes(MIN_MARGIN_BYTES)}{prior}) = {which}"
    )
    if widen:
        rule += f"; widened for {widen} recent overrun(s)"
    elif settled:
        rule += f"; tightened: the last {SETTLED_RUNS}+ runs stayed within budget"
    return Margin(candidates[which], rule)


@dataclass(frozen=True)
class Calibration:
    """What calibration did to one stage: the plan's ``calibration`` field."""

    match: str
    """``exact`` (evidence M), ``near`` (E from M, scaled) or ``none``."""
    before_bytes: int
    after_bytes: int
    evidence: str
    margin_bytes: int
    margin_rule: str
    largest_peak_bytes: int
    provenance: dict[str, Any]
    note: str = ""
    entry: str = ""
    need: dict[str, Any] | None = None
    """For a recycled worker: what its budget is made of (``resident_bytes``, ``call_rise_bytes``,
    ``growth_bytes`` and ``growth_from``); None when the budget is the largest peak + margin."""

    def to_dict(self) -> dict[str, Any]:
        out = {
            "match": self.match,
            "before_bytes": self.before_bytes,
            "after_bytes": self.after_bytes,
            "evidence": self.evidence,
            "margin": {"bytes": self.margin_bytes, "rule": self.margin_rule},
            "largest_peak_bytes": self.largest_peak_bytes,
            "provenance": self.provenance,
            "note": self.note,
            "entry": self.entry,
        }
        if self.need is not None:
            out["need"] = dict(self.need)
            out["call_rise_bytes"] = self.need[
                "call_rise_bytes"
            ]  # the runner starts its worker from it
        return out


def _profile_of(samples: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(largest peak, largest load path, largest steady state) of trusted samples; an
    unknown part counts as the whole peak."""
    peak = max(s["peak_bytes"] for s in samples)
    load = max(
        (s["load_bytes"] if s.get("load_bytes") is not None else s["peak_bytes"]) for s in samples
    )
    steady = max(
        (s["steady_bytes"] if s.get("steady_bytes") is not None else s["peak_bytes"])
        for s in samples
    )
    return peak, min(load, peak), min(steady, peak)


def provenance(entry: Entry) -> dict[str, Any]:
    trusted = entry.trusted()
    peaks = [s["peak_bytes"] for s in trusted]
    recent = trusted[-WINDOW:]
    return {
        "samples": len(trusted),
        "upper_bounds_ignored": len(entry.samples) - len(trusted),
        "first": trusted[0]["when"],
        "last": trusted[-1]["when"],
        "where": sorted({s["where"] for s in trusted})[:3],
        "peak_min_bytes": min(peaks),
        "peak_max_bytes": max(peaks),
        "spread_bytes": int(statistics.pstdev(peaks)) if len(peaks) > 1 else 0,
        "overruns_recent": sum(1 for s in recent if s["over_budget"] and s["calibrated"]),
        "max_in_flight": max((s.get("max_in_flight") or 0) for s in trusted),
        "max_prompt_chars": max((s.get("max_prompt_chars") or 0) for s in trusted) or None,
    }


def _margin(entry: Entry) -> Margin:
    trusted = entry.trusted()
    recent = trusted[-WINDOW:]
    overruns = sum(1 for s in recent if s["over_budget"] and s["calibrated"])
    settled = len(recent) >= SETTLED_RUNS and overruns == 0
    request_part = max(
        (
            max(s["peak_bytes"] if s.get("steady_bytes") is None else s["steady_bytes"], 0)
            - s["resident_bytes"]
            for s in recent
            if s.get("resident_bytes") is not None
        ),
        default=0,
    )
    return margin_for([s["peak_bytes"] for s in recent], overruns, settled, max(0, request_part))


def _rebuild(
    reservations: list[Reservation],
    load: int,
    steady: int,
    evidence: Evidence,
    note: str,
) -> tuple[Reservation, ...]:
    """The stage's reservations with everything but the data (evidence D) replaced by one
    session reservation and one load reservation, so that its load path is ``load`` and its
    steady state ``steady`` (never below what the data alone holds)."""
    data = [r for r in reservations if r.evidence == "D"]
    pool = reservations[0].pool
    d_load, d_steady = load_and_steady(data)
    session = max(0, steady - d_steady)
    transient = max(0, load - (d_load + session))
    out = list(data)
    out.append(
        Reservation(
            pool,
            "measured_beyond_data",
            session,
            "session",
            evidence,
            f"{note}; steady state {fmt_bytes(steady)} less the data above",
        )
    )
    if transient:
        out.append(
            Reservation(
                pool,
                "measured_load_transient",
                transient,
                "load",
                evidence,
                f"{note}; load path {fmt_bytes(load)} above the steady state",
            )
        )
    return tuple(out)


def _growth_floor(
    reservations: list[Reservation], trusted: list[dict[str, Any]]
) -> tuple[int, str]:
    """The steady state a budget keeps at least when the kind reserves growth over more items
    than a run shows (``RETAINED_GROWTH``): what was resident after the load plus that growth,
    and the words for the note; (0, "") when it reserves none or no sample knows its resident."""
    growth = sum(r.bytes for r in reservations if r.purpose == RETAINED_GROWTH)
    resident = max(
        (s["resident_bytes"] for s in trusted if s.get("resident_bytes") is not None), default=None
    )
    if not growth or resident is None:
        return 0, ""
    return resident + growth, (
        f"; at least resident {fmt_bytes(resident)} + {RETAINED_GROWTH} "
        f"{fmt_bytes(growth)} (kept: growth beyond what a run shows)"
    )


def calibrate(
    reservations: list[Reservation], entry: Entry
) -> tuple[tuple[Reservation, ...], Calibration] | None:
    """The stage's reservations from an exact entry (evidence M), or None when it holds no
    trusted sample. The budget is the largest peak seen plus the margin, never below it."""
    trusted = entry.trusted()
    if not trusted or not reservations or len({r.pool for r in reservations}) != 1:
        return None
    before = max(load_and_steady(reservations))
    peak, load, steady = _profile_of(trusted)
    prov = provenance(entry)
    needed = _need(reservations, trusted)
    if needed is not None:
        return _from_need(reservations, entry, needed, before, peak, prov)
    margin = _margin(entry)
    floor, floor_note = _growth_floor(reservations, trusted)
    note = (
        f"measured: largest peak {fmt_bytes(peak)} of {prov['samples']} run(s) "
        f"({prov['first'][:16]}..{prov['last'][:16]}) + margin {fmt_bytes(margin.bytes)}{floor_note}"
    )
    out = _rebuild(reservations, load + margin.bytes, max(steady + margin.bytes, floor), "M", note)
    after = max(load_and_steady(out))
    assert after >= peak + margin.bytes, (
        "a calibrated budget is never below the largest peak plus its margin"
    )
    return out, Calibration(
        "exact", before, after, "M", margin.bytes, margin.rule, peak, prov, entry=str(entry.path)
    )


def _limited(s: Mapping[str, Any]) -> bool:
    """Whether ``s`` is a run of a worker recycled at a limit, with the figures to budget it from."""
    return all(
        s.get(k) is not None for k in ("recycle_limit_bytes", "call_rise_bytes", "resident_bytes")
    )


def _need(reservations: list[Reservation], trusted: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What a recycled worker needs to do its work, when the latest run was one (else None):
    the most it held right after a load (or a reopen), the largest rise one call caused, and the
    growth it may keep before it is recycled — the kind's ``RETAINED_GROWTH`` reservation, else
    the growth rate its runs measured over ``GROWTH_HORIZON_CALLS`` (at most ``GROWTH_FRACTION`` of
    the rest). Its peak is not among them: the recycle limit, set from the budget, decided it."""
    if not _limited(trusted[-1]):
        return None
    recent = [s for s in trusted[-WINDOW:] if _limited(s)]
    resident = max(max(s["resident_bytes"], s.get("fresh_bytes") or 0) for s in recent)
    rise = max(s["call_rise_bytes"] for s in recent)
    kind_growth = sum(r.bytes for r in reservations if r.purpose == RETAINED_GROWTH)
    calls = sum(s.get("worker_calls") or 0 for s in recent)
    rate = sum(s.get("retained_bytes") or 0 for s in recent) / calls if calls else 0.0
    if kind_growth:
        growth, source = kind_growth, f"the kind's {RETAINED_GROWTH} reservation"
    else:
        growth = min(
            math.ceil(rate * GROWTH_HORIZON_CALLS), math.ceil(GROWTH_FRACTION * (resident + rise))
        )
        source = (
            f"{fmt_bytes(int(rate))} a call measured over {calls} call(s) x {GROWTH_HORIZON_CALLS} "
            f"(at most {GROWTH_FRACTION:.0%} of resident + rise)"
        )
    return {
        "resident_bytes": resident,
        "call_rise_bytes": rise,
        "growth_bytes": growth,
        "growth_from": source,
        "runs": len(recent),
        "needs": [
            max(s["resident_bytes"], s.get("fresh_bytes") or 0) + s["call_rise_bytes"]
            for s in recent
        ],
        "overruns": sum(1 for s in recent if s["over_budget"] and s["calibrated"]),
        "load": max(
            s["resident_bytes"] if s.get("load_bytes") is None else s["load_bytes"] for s in recent
        ),
    }


def _from_need(
    reservations: list[Reservation],
    entry: Entry,
    need: dict[str, Any],
    before: int,
    peak: int,
    prov: dict[str, Any],
) -> tuple[tuple[Reservation, ...], Calibration]:
    """A recycled worker's reservations: steady state = resident + one call's rise + growth + a
    margin from the spread of (resident + rise) over its runs; the load path as measured + margin.
    Stationary figures, so the budget converges however long the runs (docs/calibration.md)."""
    needs, overruns, load = need.pop("needs"), need.pop("overruns"), need.pop("load")
    settled = need["runs"] >= SETTLED_RUNS and overruns == 0
    margin = margin_for(needs, overruns, settled)
    steady = need["resident_bytes"] + need["call_rise_bytes"] + need["growth_bytes"] + margin.bytes
    note = (
        f"measured need: resident {fmt_bytes(need['resident_bytes'])} + one call's rise "
        f"{fmt_bytes(need['call_rise_bytes'])} + growth {fmt_bytes(need['growth_bytes'])} "
        f"({need['growth_from']}) + margin {fmt_bytes(margin.bytes)} over {need['runs']} run(s); the largest "
        f"peak {fmt_bytes(peak)} is not evidence of need: the worker is recycled at its budget"
    )
    out = _rebuild(reservations, load + margin.bytes, steady, "M", note)
    after = max(load_and_steady(out))
    return out, Calibration(
        "exact",
        before,
        after,
        "M",
        margin.bytes,
        margin.rule,
        peak,
        prov,
        note=note,
        entry=str(entry.path),
        need=need,
    )


def scaled(
    reservations: list[Reservation],
    entry: Entry,
    scaling: Mapping[str, Any],
) -> tuple[tuple[Reservation, ...], Calibration] | None:
    """From a near match (other scaling settings): the measured load path and steady state
    moved by exactly what the kind's own arithmetic changes between the two (the difference
    of its metadata reservations then and now), with the entry's margin. Evidence E (from M)."""
    trusted = entry.trusted()
    if (
        not trusted
        or not entry.basis
        or not reservations
        or len({r.pool for r in reservations}) != 1
    ):
        return None
    before = max(load_and_steady(reservations))
    peak, load, steady = _profile_of(trusted)
    old_load, old_steady = load_and_steady(entry.basis)
    new_load, new_steady = load_and_steady(reservations)
    margin = _margin(entry)
    s_load = max(0, load + (new_load - old_load))
    s_steady = max(0, steady + (new_steady - old_steady))
    old_scaling = entry.key.get("scaling", {})
    changed = ", ".join(
        f"{k} {old_scaling.get(k)}→{scaling.get(k)}"
        for k in sorted(set(old_scaling) | set(scaling))
        if old_scaling.get(k) != scaling.get(k)
    )
    note = (
        f"E from M: measured {fmt_bytes(peak)} at {changed or 'other settings'}, moved by the kind's "
        f"arithmetic (load {fmt_bytes(new_load - old_load)}, steady {fmt_bytes(new_steady - old_steady)}) "
        f"+ margin {fmt_bytes(margin.bytes)}"
    )
    floor, floor_note = _growth_floor(reservations, trusted)
    note += floor_note
    out = _rebuild(
        reservations, s_load + margin.bytes, max(s_steady + margin.bytes, floor), "E", note
    )
    after = max(load_and_steady(out))
    prov = {**provenance(entry), "scaled_from": dict(old_scaling)}
    return out, Calibration(
        "near",
        before,
        after,
        "E",
        margin.bytes,
        margin.rule,
        peak,
        prov,
        note=note,
        entry=str(entry.path),
    )


def lookup(
    store: CalibrationStore,
    key: Key,
    reservations: list[Reservation],
) -> tuple[tuple[Reservation, ...], Calibration] | None:
    """Calibrated reservations for ``key``: an exact entry, else a near one, else None."""
    entry = store.load(key)
    if entry is not None:
        found = calibrate(reservations, entry)
        if found is not None:
            return found
    near = store.near(key)
    if near is not None:
        return scaled(reservations, near, key.scaling)
    return None


def calibrated_shared(
    store: CalibrationStore, key: Key, reservation: Reservation
) -> Reservation | None:
    """A pipeline cost (``ray_runtime``, ``server``) from its measurements: largest + margin (M)."""
    entry = store.load(key)
    if entry is None or not entry.trusted():
        return None
    peak = max(s["peak_bytes"] for s in entry.trusted())
    margin = _margin(entry)
    prov = provenance(entry)
    return Reservation(
        reservation.pool,
        reservation.purpose,
        peak + margin.bytes,
        reservation.lifetime,
        "M",
        f"measured: largest {fmt_bytes(peak)} of {prov['samples']} run(s), last {prov['last'][:16]}, "
        f"+ margin {fmt_bytes(margin.bytes)} (metadata estimate {fmt_bytes(reservation.bytes)})",
        reservation.at_load,
    )
