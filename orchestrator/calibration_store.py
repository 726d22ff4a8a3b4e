"""The measurement store's files: keys, samples, entries and the store that keeps them
(docs/calibration.md); ``orchestrator.calibration`` turns them into budgets.

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
prompt, when and where. Files are written atomically and durably under a lock,
carry a format version and are validated on read: an entry that is corrupt or
inconsistent is ignored with a warning (and the plan says so), never trusted —
and never destroyed: before a run writes that key again the file is kept aside
as ``NAME.corrupt-<time>`` (named in a warning), and an entry of a newer format
is planned from as unknown and never written over. Temporary files a killed
writer left are removed when the store is opened.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from orchestrator.core import engines, ort_builds, packages, settings
from orchestrator.core.documents import JsonObject
from orchestrator.core.fileio import exclusive_lock, keep_aside, remove_orphans, write_json_atomic
from orchestrator.core.ledger import Reservation
from orchestrator.core.profile import HardwareProfile

log = logging.getLogger("orchestrator.calibration")
"""The store's warnings are the measurement store's: logged under ``orchestrator.calibration``."""

CALIBRATION_FORMAT = "omni-edge.calibration/1"
FORMAT_PREFIX, _, _FORMAT_VERSION = CALIBRATION_FORMAT.rpartition("/")
ENTRY_NAME = re.compile(r"^[\w.-]{1,60}-[0-9a-f]{16}\.json$")
"""The name of an entry (``Key.filename``): its label, then 16 hex digits of its key's digest."""
FORMAT_MARK = re.compile(rb'^\s*\{\s*"format"\s*:\s*"' + re.escape(FORMAT_PREFIX.encode()) + rb"/")
"""How an entry's file begins (``format`` is its first key), readable even when it was cut short."""
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

    def to_dict(self) -> JsonObject:
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
    extra: dict[str, int] = {}
    path = artifact.get("path")
    if isinstance(path, str) and os.path.isfile(path):
        st = os.stat(path)
        extra = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return _sha({"artifact": dict(artifact), "file": extra})


def _dist_version(name: str) -> str:
    """``name==version`` of an installed distribution, ``unknown`` when it is not installed."""
    version = packages.installed_version(name)
    return f"{name}=={version}" if version is not None else "unknown"


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
    ort = ort_builds.ort_build()  # this interpreter's, whichever of the table's builds it is
    return f"{ort[0]}=={ort[1]}" if ort is not None else "unknown"


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
class Sample(TypedDict):
    """One run's measured peak as the store keeps it (:func:`sample`; read back, checked by
    :func:`sample_problem` first): which run, when and where, the pool, the peak and its load,
    steady and resident parts, the budget it ran under and whether that was calibrated, whether
    the figure is an upper bound or over the budget, the requests, and a recycled worker's
    figures (``WORKER_FIELDS``; None for any other runner)."""

    run: str
    when: str
    where: str
    peak_bytes: int
    calibrated: bool
    upper_bound: bool
    over_budget: bool
    # what an older entry may lack (sample_problem checks them only where present)
    pool: NotRequired[str]
    load_bytes: NotRequired[int | None]
    steady_bytes: NotRequired[int | None]
    resident_bytes: NotRequired[int | None]
    budget_bytes: NotRequired[int | None]
    requests: NotRequired[int]
    max_in_flight: NotRequired[int]
    max_prompt_chars: NotRequired[int | None]
    method: NotRequired[str]
    recycle_limit_bytes: NotRequired[int | None]
    call_rise_bytes: NotRequired[int | None]
    worker_recycles: NotRequired[int | None]
    worker_calls: NotRequired[int | None]
    retained_bytes: NotRequired[int | None]
    fresh_bytes: NotRequired[int | None]


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
    samples: tuple[Sample, ...]
    basis: tuple[Reservation, ...]
    label: str = ""
    pipeline: str = ""
    stage: str = ""

    def trusted(self) -> list[Sample]:
        """Samples that are true measurements (no upper bounds)."""
        return [s for s in self.samples if not s["upper_bound"]]


@dataclass(frozen=True)
class Unusable:
    """An entry the store could not use: ``kind`` is ``unreadable`` (cut short, not JSON, a read
    error), ``newer`` (a format this version does not know: never written over) or
    ``untrusted`` (inconsistent); ``why`` says what is wrong with it."""

    kind: str
    why: str


def newer_format(doc: Any) -> str | None:
    """The format of ``doc`` when it is an entry of a later format version than this one reads."""
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if not isinstance(fmt, str) or not fmt.startswith(FORMAT_PREFIX + "/"):
        return None
    version = fmt[len(FORMAT_PREFIX) + 1 :]
    return fmt if version.isdigit() and int(version) > int(_FORMAT_VERSION) else None


def is_entry_file(path: Path) -> bool | None:
    """Whether ``path`` is a calibration entry by name and format (its first bytes say it, so an
    entry cut short still counts); None when it cannot be read to tell."""
    if not ENTRY_NAME.match(path.name) or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    return FORMAT_MARK.match(head) is not None


class CalibrationStore:
    """Entries under one directory (default ``calibration_dir()``). Opening it removes the
    temporary files that writers killed mid-write left (``fileio.remove_orphans``)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else calibration_dir()
        self.problems: list[str] = []
        """What was ignored on read, for the plan's notes (one line per file)."""
        self.unusable: dict[Path, Unusable] = {}
        """Each entry file read but not used, and why (the plan says so for its stage)."""
        self.orphans_removed = remove_orphans(self.root)
        if self.orphans_removed:
            log.info(
                "removed %d temporary file(s) left by writers that are gone from %s: %s",
                len(self.orphans_removed),
                self.root,
                ", ".join(p.name for p in self.orphans_removed),
            )

    def path(self, key: Key) -> Path:
        return self.root / key.filename()

    def _read(self, path: Path) -> Entry | None:
        return self._checked(path)[0]

    def _checked(self, path: Path) -> tuple[Entry | None, str | None]:
        """The entry at ``path`` (None when there is none), or why it is not trusted."""
        trouble: Unusable | None
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError) as exc:
            trouble = Unusable("unreadable", f"unreadable: {exc}")
        else:
            newer = newer_format(doc)
            problem = entry_problem(doc, path)
            trouble = (
                Unusable(
                    "newer",
                    f"it is of a newer format ({newer}) than this omni-edge reads "
                    f"({CALIBRATION_FORMAT}): planned from metadata, and never written over",
                )
                if newer
                else Unusable("untrusted", problem)
                if problem is not None
                else None
            )
        if trouble is not None:
            self.unusable[path] = trouble
            line = f"calibration entry {path} ignored: {trouble.why}"
            if line not in self.problems:
                self.problems.append(line)
                log.warning("%s; it is not trusted (plans use the metadata estimates)", line)
            return None, trouble.why
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

    def _entry_paths(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in sorted(self.root.glob("*.json")) if ENTRY_NAME.match(p.name)]

    def near(self, key: Key) -> Entry | None:
        """The entry with the most trusted samples that shares ``key``'s identity but not its
        scaling settings (another context length), or None."""
        near, exact = key.near_digest(), key.digest()
        best: Entry | None = None
        for path in self._entry_paths():
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

    def record(self, key: Key, sample: Sample, basis: Iterable[Reservation] = ()) -> Path | None:
        """Add ``sample`` to ``key``'s entry (replacing the sample of the same ``run``),
        atomically and durably under a lock. An entry that cannot be used is never lost: one
        of a newer format is left as it is (nothing is recorded: None, with a warning), any
        other is kept aside as ``NAME.corrupt-<time>`` (with a warning naming it) and a new
        entry starts with ``sample``."""
        problem = sample_problem(sample)
        if problem:
            raise ValueError(f"not a consistent sample: {problem}")
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        with exclusive_lock(self.root / ".lock"):
            entry, _ = self._checked(path)
            trouble = self.unusable.get(path) if entry is None else None
            if trouble is not None and trouble.kind == "newer":
                log.warning(
                    "not recording %s's measured peak: its entry %s %s",
                    key.label or key.subject,
                    path,
                    trouble.why,
                )
                return None
            if trouble is not None and path.exists():
                self._keep_aside(path, trouble)
            doc = self._doc(key, entry, sample, basis)
            write_json_atomic(path, doc, indent=1)
        return path

    def _keep_aside(self, path: Path, trouble: Unusable) -> Path:
        aside = keep_aside(path, "corrupt")
        log.warning(
            "calibration entry %s could not be used (%s); it is kept aside as %s and a new "
            "entry starts with this run. Its measurements are in that file: repair it and move "
            "it back over %s, or remove it once it is not wanted",
            path,
            trouble.why,
            aside.name,
            path.name,
        )
        return aside

    def _doc(
        self, key: Key, entry: Entry | None, sample: Sample, basis: Iterable[Reservation]
    ) -> JsonObject:
        """The entry ``key`` holds once ``sample`` is added (the largest peak survives trimming)."""
        samples = [s for s in (entry.samples if entry else ()) if s["run"] != sample["run"]]
        samples.append(sample)
        if len(samples) > MAX_SAMPLES:
            largest = max(samples, key=lambda s: s["peak_bytes"])
            keep = samples[-(MAX_SAMPLES - 1) :]
            samples = keep if largest in keep else [largest, *keep]
        return {
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

    def entries(self) -> tuple[list[Entry], list[tuple[Path, str]]]:
        """Every entry in the store, and every file named as one that cannot be used (path, why),
        sorted by name. Other files in the directory are not the store's, and not listed."""
        good: list[Entry] = []
        bad: list[tuple[Path, str]] = []
        for path in self._entry_paths():
            entry, problem = self._checked(path)
            if entry is not None:
                good.append(entry)
            elif problem is not None:
                bad.append((path, problem))
        return good, bad

    def removable(self) -> tuple[list[Path], list[tuple[Path, str]]]:
        """What ``reset --all`` may remove — the files that are entries by name and by format
        (one cut short too) — and the other files of the directory, each with why it stays."""
        entries: list[Path] = []
        others: list[tuple[Path, str]] = []
        if not self.root.is_dir():
            return entries, others
        for path in sorted(self.root.iterdir()):
            if path.name.startswith(".") and not ENTRY_NAME.match(path.name):
                continue  # the lock, temporary files: the store's own workings
            verdict = is_entry_file(path)
            if verdict:
                entries.append(path)
            elif verdict is None:
                others.append((path, "cannot be read to tell"))
            elif ".json.corrupt-" in path.name:
                others.append((path, "a damaged entry kept aside"))
            elif ENTRY_NAME.match(path.name) and path.is_file():
                others.append((path, "an entry's name, not its format"))
            else:
                others.append((path, "not an entry"))
        return entries, others

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
) -> Sample:
    """One sample, as the store keeps it (``worker``: a recycled worker's figures, ``WORKER_FIELDS``)."""

    def figure(k: str) -> int | None:
        return None if not worker or worker.get(k) is None else int(worker[k])

    return Sample(
        run=run,
        when=when or now(),
        where=where or socket.gethostname(),
        pool=pool,
        peak_bytes=int(peak),
        load_bytes=None if load is None else int(load),
        steady_bytes=None if steady is None else int(steady),
        resident_bytes=None if resident is None else int(resident),
        budget_bytes=budget,
        calibrated=calibrated,
        upper_bound=upper_bound,
        over_budget=budget is not None and int(peak) > budget,
        requests=requests,
        max_in_flight=max_in_flight,
        max_prompt_chars=max_prompt_chars,
        method=method,
        recycle_limit_bytes=figure("recycle_limit_bytes"),
        call_rise_bytes=figure("call_rise_bytes"),
        worker_recycles=figure("worker_recycles"),
        worker_calls=figure("worker_calls"),
        retained_bytes=figure("retained_bytes"),
        fresh_bytes=figure("fresh_bytes"),
    )
