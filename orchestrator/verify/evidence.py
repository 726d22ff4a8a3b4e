"""The evidence cache: gate measurements (evidence M) on disk, keyed by what they depend on.

One JSON file per key under ``settings.evidence_dir()``. The key holds
everything that changes what a gate would measure: the graph's sha256, the
reference data's sha256, the precision, the backend and its EP, the route's
onnxruntime build (``distribution==version``), the device (id and name), and
the provider/session options (minus options that only say where compiled
blobs go). Change any of them and the lookup misses, so the placement is
unverified until ``omni-edge verify`` measures again.

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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from orchestrator import settings
from orchestrator.fileio import write_json_atomic

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
    options: dict[str, Any] = field(default_factory=dict)
    gates_version: int = GATES_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def digest(self) -> str:
        """sha256 of the canonical JSON of every part (computed once per key)."""
        cached = self.__dict__.get("_digest")
        if cached is None:
            canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
            cached = hashlib.sha256(canonical.encode()).hexdigest()
            object.__setattr__(self, "_digest", cached)
        return cached

    def filename(self) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in f"{self.artifact}-{self.precision}-{self.backend}-{self.device_id}")
        return f"{safe}-{self.digest()[:16]}.json"


def machine() -> dict[str, str]:
    """Where a measurement was taken (part of every record, not of the key)."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
    }


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class EvidenceStore:
    """Evidence files under one directory (default: the omni-edge cache)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else settings.evidence_dir()

    def path(self, key: EvidenceKey) -> Path:
        return self.root / key.filename()

    def load(self, key: EvidenceKey) -> dict[str, Any] | None:
        """The record for exactly this key, or None (missing, unreadable or another key)."""
        try:
            record = json.loads(self.path(key).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable evidence %s: %s", self.path(key), exc)
            return None
        if record.get("format") != EVIDENCE_FORMAT or record.get("key_digest") != key.digest():
            return None
        return record

    def save(self, key: EvidenceKey, measurement: dict[str, Any]) -> Path:
        """Write a record atomically; returns its path."""
        record = {
            "format": EVIDENCE_FORMAT,
            "key_digest": key.digest(),
            "key": key.to_dict(),
            "evidence": "M",
            "machine": machine(),
            "measured_at": now(),
            **measurement,
        }
        path = self.path(key)
        write_json_atomic(path, record, indent=1, default=_jsonable)
        return path


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
