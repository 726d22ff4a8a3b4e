"""The evidence cache: gate measurements (evidence M) on disk, keyed by what they depend on.

One JSON file per key under ``settings.evidence_dir()``. The key holds
everything that changes what a gate would measure: the graph's sha256, the
reference data's sha256, the precision, the backend and its EP, the route's
onnxruntime build (``distribution==version``), the device (id and name), and
the provider/session options (minus options that only say where compiled
blobs go). Change any of them and the lookup misses, so the placement is
unverified until ``omni-edge verify`` measures again.

Evidence measured on a node of a Ray cluster (``omni-edge verify --address``:
the gates run in a task on that node) is keyed by that node's machine too
(:func:`machine_identity`: OS, CPU model, physical RAM, read on the node when
the record is written), and the record names the machine that measured it: a
record whose measuring machine is not the one its key names is rejected. A
local ``verify`` leaves the machine out of the key (its records and digests are
as before).

Records hold measurements, not verdicts: the verdict is recomputed against the
current thresholds (``judge``), so loosening a tolerance needs no re-run, and
tightening one cannot be dodged by an old "pass".
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from orchestrator.core import settings
from orchestrator.core.backends import row_for_ep
from orchestrator.core.documents import JsonObject
from orchestrator.core.fileio import remove_orphans, write_json_atomic
from orchestrator.core.profile import Host
from orchestrator.probe.host import this_host

log = logging.getLogger(__name__)

EVIDENCE_FORMAT = "omni-edge.evidence/1"
GATES_VERSION = 1
"""Bump when the way a gate measures changes; older evidence then stops matching."""


@dataclass(frozen=True)
class EvidenceKey:
    artifact: str
    graph_sha256: str
    reference_sha256: str
    precision: str
    backend: str
    ep: str
    runtime: str
    """The route's onnxruntime build, ``distribution==version``."""
    device_id: str
    device_name: str
    options: JsonObject = field(default_factory=dict)
    gates_version: int = GATES_VERSION
    machine: str = ""
    """The machine that measured it (:func:`machine_identity`) for evidence measured on a
    cluster node by ``verify --address``; empty for a local ``verify`` (left out of the
    key, so those records and digests are as they were)."""

    def to_dict(self) -> JsonObject:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if not self.machine:
            del out["machine"]
        return out

    def digest(self) -> str:
        """sha256 of the canonical JSON of every part (computed once per key)."""
        cached = self.__dict__.get("_digest")
        if cached is None:
            canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
            cached = hashlib.sha256(canonical.encode()).hexdigest()
            object.__setattr__(self, "_digest", cached)
        return cached

    def filename(self) -> str:
        safe = "".join(
            c if c.isalnum() or c in "-_." else "-"
            for c in f"{self.artifact}-{self.precision}-{self.backend}-{self.device_id}"
        )
        return f"{safe}-{self.digest()[:16]}.json"


def machine() -> dict[str, str]:
    """Where a measurement was taken (part of every record, not of the key)."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
    }


def machine_identity(host: Host) -> str:
    """A machine as evidence is keyed by it: OS (and WSL), CPU model, physical RAM —
    what a profile's ``host`` says (the same parts as the calibration store's machine)."""
    return f"{host.os}{'/wsl' if host.wsl else ''}|{host.cpu_name.strip()}|{host.ram_total_bytes}"


def machine_identity_here() -> str:
    """This machine's :func:`machine_identity`, read now."""
    return machine_identity(this_host())


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class EvidenceStore:
    """Evidence files under one directory (default: the omni-edge cache), written durably;
    opening it removes the temporary files writers killed mid-write left there."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else settings.evidence_dir()
        remove_orphans(self.root)

    def path(self, key: EvidenceKey) -> Path:
        return self.root / key.filename()

    def load(self, key: EvidenceKey) -> dict[str, object] | None:
        """The record for exactly this key, or None (missing, unreadable, another key,
        or not a consistent measurement: see :func:`record_problem`)."""
        return self.load_checked(key)[0]

    def load_checked(self, key: EvidenceKey) -> tuple[dict[str, object] | None, str | None]:
        """``(record, None)``, or ``(None, why)`` when a file exists but cannot be trusted
        (logged as a warning naming the file); ``(None, None)`` when there is none."""
        path = self.path(key)
        problem: str | None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, NotADirectoryError):
            return None, None
        except (OSError, ValueError) as exc:
            problem = f"unreadable: {exc}"
        else:
            problem = record_problem(record, key)
        if problem is not None:
            log.warning(
                "ignoring evidence %s: %s; it is treated as no evidence (`omni-edge verify CONFIG` measures again)",
                path,
                problem,
            )
            return None, problem
        return record, None

    def save(self, key: EvidenceKey, measurement: Mapping[str, object]) -> Path:
        """Write a record atomically; returns its path."""
        where = machine()
        if key.machine:
            where["identity"] = machine_identity_here()
            if where["identity"] != key.machine:
                raise ValueError(
                    f"evidence keyed by machine {key.machine!r} cannot be measured on {where['identity']!r}"
                )
        record = {
            "format": EVIDENCE_FORMAT,
            "key_digest": key.digest(),
            "key": key.to_dict(),
            "evidence": "M",
            "machine": where,
            "measured_at": now(),
            **measurement,
        }
        path = self.path(key)
        write_json_atomic(path, record, indent=1, default=_jsonable)
        return path


def record_problem(record: Any, key: EvidenceKey) -> str | None:
    """Why ``record`` is not a consistent measurement for ``key``, or None.

    Evidence is judged from what it claims to have counted, so the counts must
    be there and agree with each other: a record carrying a verdict-like
    ``fraction`` without the counts behind it, or counts that contradict it,
    is a forgery or a corruption, never a pass.
    """
    if not isinstance(record, dict):
        return f"not a JSON object but {type(record).__name__}"
    return _header_problem(record, key) or _coverage_problem(record) or _numeric_problem(record)


def _header_problem(record: dict[str, Any], key: EvidenceKey) -> str | None:
    """The record's format, key, evidence kind and the strings that name what it measured."""
    if record.get("format") != EVIDENCE_FORMAT:
        return f"format is {record.get('format')!r}, not {EVIDENCE_FORMAT!r}"
    if record.get("key_digest") != key.digest():
        return "key_digest does not match the file's key"
    if record.get("key") != key.to_dict():
        return "its key (graph digest, runtime, device, options) is not the one it is filed under"
    if record.get("evidence") != "M":
        return "evidence is not 'M' (a measurement)"
    if key.machine:
        where = record.get("machine")
        measured_on = where.get("identity") if isinstance(where, dict) else None
        if measured_on != key.machine:
            return f"it was measured on machine {measured_on!r}, not on {key.machine!r}, the node's machine it is keyed by"
    for name in ("measured_at", "ep", "precision"):
        if not isinstance(record.get(name), str):
            return f"{name} is missing or not a string"
    if record["ep"] != key.ep:
        return f"ep {record['ep']!r} is not the key's {key.ep!r}"
    if record["precision"] != key.precision:
        return f"precision {record['precision']!r} is not the key's {key.precision!r}"
    return None


def _coverage_problem(record: dict[str, Any]) -> str | None:
    """The coverage counts: present, non-negative, and agreeing with each other."""
    cov = record.get("coverage")
    if not isinstance(cov, dict):
        return "coverage is missing"
    if cov.get("ep") != record["ep"]:
        return f"coverage.ep {cov.get('ep')!r} is not the record's ep {record['ep']!r}"
    if cov.get("source") == "session_error":
        if not isinstance(cov.get("session_error"), str) or cov.get("taken") != 0:
            return "a session_error coverage must name the error and have taken 0"
        return None
    taken, total, fraction = cov.get("taken"), cov.get("total"), cov.get("fraction")
    if (
        not isinstance(taken, int)
        or not isinstance(total, int)
        or not _is_count(taken)
        or not _is_count(total)
    ):
        return f"coverage.taken and coverage.total must be non-negative integers (got {taken!r}, {total!r})"
    if taken > total:
        return f"coverage.taken {taken} exceeds coverage.total {total}"
    if total == 0:
        return "coverage.total is 0: no node was counted"
    if (
        not isinstance(fraction, int | float)
        or not _is_number(fraction)
        or abs(float(fraction) - taken / total) > 1e-9
    ):
        return f"coverage.fraction {fraction!r} is not taken/total = {taken}/{total}"
    by_ep = cov.get("by_ep")
    row = row_for_ep(str(cov["ep"]))
    # an EP's own report counts by device, not by EP (its row's coverage_report)
    own_report = row.coverage_report.source if row and row.coverage_report else None
    if (
        by_ep
        and (
            not isinstance(by_ep, dict)
            or not all(_is_count(v) for v in by_ep.values())
            or sum(by_ep.values()) != total
            or by_ep.get(cov["ep"], 0) != taken
        )
        and not (own_report and str(cov.get("source", "")).startswith(own_report))
    ):
        return f"coverage.by_ep {by_ep!r} does not add up to taken {taken} of total {total}"
    return None


def _numeric_problem(record: dict[str, Any]) -> str | None:
    """The numeric comparison: each output's metrics present and possible."""
    num = record.get("numeric")
    if not isinstance(num, dict):
        return "numeric is missing"
    outputs = num.get("outputs")
    if not isinstance(outputs, dict):
        return "numeric.outputs is missing"
    source = record["coverage"].get("source")
    if not outputs and not num.get("error") and source != "session_error":
        # (a session that failed to open is the measurement: nothing could be compared)
        return "numeric has neither outputs nor an error: nothing was compared"
    for name, m in outputs.items():
        if not isinstance(m, dict) or not isinstance(m.get("shape_match"), bool):
            return f"numeric.outputs[{name!r}].shape_match is missing"
        for metric in ("rel_l2", "max_abs", "cosine"):
            if not _is_number(m.get(metric)):
                return f"numeric.outputs[{name!r}].{metric} is missing or not a number"
        if m["rel_l2"] < 0 or m["max_abs"] < 0 or not -1.0 - 1e-6 <= m["cosine"] <= 1.0 + 1e-6:
            return f"numeric.outputs[{name!r}] holds impossible values (negative distance or |cosine| > 1)"
    if not isinstance(record.get("suspicious", False), bool):
        return "suspicious is not a boolean"
    return None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and value == value
    )  # not NaN


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
