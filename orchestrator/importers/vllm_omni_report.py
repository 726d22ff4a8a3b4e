"""What an import reports: each upstream key mapped, dropped or kept foreign (ImportReport), and the imported config with it (Imported)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.importers.vllm_omni_schema import (
    DEFAULT_WHY,
    NO_EQUIVALENT,
)

FORMAT = "omni-edge.import/1"


DEFAULT_MAX_MODEL_LEN = 32768
"""A generation stage's ``max_model_len`` when the file gives none and no ``--model`` gives the
model's own: Qwen2.5-Omni-3B's thinker context (``max_position_embeddings`` in
configs/models/qwen2.5-omni-3b/config.json)."""


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
