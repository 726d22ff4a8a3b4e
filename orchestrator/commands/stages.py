"""``omni-edge stages``: the stage kinds and exported artifacts this installation knows.

Kinds: the built-ins and every ``omni_edge.stage_kinds`` entry point (each
loaded, so a broken plugin is listed with its error), where each came from
(built in, or which distribution), and what it consumes and produces
(``stages/payloads.py`` spelling). Artifacts: every ``manifest.yaml`` of
format ``omni-edge.export/1`` under the shipped ``exports/`` and
``configs/models/`` directories and under each ``--path DIR``, with where it
was found, where the graph came from, its precisions and its ports. Hooks
registered under ``omni_edge.hooks`` are listed (and loaded) too.

Exit 0 even when a plugin or an artifact is broken (they are listed, marked);
``--strict`` makes that exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Group

    from orchestrator.core.documents import JsonObject
    from stages.registry import Survey

STAGES_FORMAT = "omni-edge.stages/1"
_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_DIRS = (("shipped", _ROOT / "exports"), ("shipped", _ROOT / "configs" / "models"))
"""Where the artifacts this repository ships live (configs point at them by relative path)."""
MAX_DEPTH = 4
"""How deep below a search directory a manifest is looked for."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json", action="store_true", help=f"print the listing as JSON (format {STAGES_FORMAT})"
    )
    p.add_argument(
        "--path",
        action="append",
        default=[],
        metavar="DIR",
        help="also look for exported artifacts (directories holding manifest.yaml) under DIR; repeatable",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 2 when a plugin failed to load or an artifact cannot be read",
    )


@dataclass
class ArtifactRow:
    dir: str
    found_in: str
    ok: bool
    name: str = ""
    version: str = ""
    origin: str = ""
    license: str = ""
    precisions: dict[str, str] = field(default_factory=dict)
    inputs: list[JsonObject] = field(default_factory=list)
    outputs: list[JsonObject] = field(default_factory=list)
    consumes: list[str] | None = None
    produces: list[str] | None = None
    not_exported: bool = False
    error: str = ""

    def to_dict(self) -> JsonObject:
        d = dict(self.__dict__)
        if self.ok:
            d.pop("error")
        else:
            d = {k: d[k] for k in ("dir", "found_in", "ok", "name", "error")}
        return d


def _manifests(root: Path) -> list[Path]:
    out: list[Path] = []
    base = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        if len(Path(dirpath).parts) - base >= MAX_DEPTH:
            dirnames[:] = []
        if "manifest.yaml" in filenames:
            out.append(Path(dirpath))
    return out


def find_artifacts(extra: list[Path]) -> list[ArtifactRow]:
    """Every export manifest under the shipped directories and ``extra``, read and checked."""
    from orchestrator.core.validation import read_document
    from stages.exported_graph.artifact import EXPORT_FORMAT, load_artifact

    roots = [*SHIPPED_DIRS, *(("path", d) for d in extra)]
    seen: set[Path] = set()
    rows: list[ArtifactRow] = []
    for found_in, root in roots:
        if not root.is_dir():
            continue
        for d in _manifests(root):
            if d.resolve() in seen:
                continue
            seen.add(d.resolve())
            shown = os.path.relpath(d, Path.cwd()) if d.is_relative_to(Path.cwd()) else str(d)
            try:
                doc = read_document(d / "manifest.yaml")
            except ConfigError as exc:
                rows.append(ArtifactRow(shown, found_in, False, error=exc.problems[0].what))
                continue
            if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
                continue  # another kind of manifest (a checkpoint's), not an export
            try:
                art = load_artifact(d)
            except ConfigError as exc:
                p = exc.problems[0]
                more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
                rows.append(
                    ArtifactRow(
                        shown,
                        found_in,
                        False,
                        name=str(doc.get("name", "")),
                        error=f"{p.where}: {p.what}{more}",
                    )
                )
                continue
            m = art.manifest
            rows.append(
                ArtifactRow(
                    shown,
                    found_in,
                    True,
                    name=m.name,
                    version=m.version,
                    origin=m.source.origin,
                    license=m.source.license,
                    precisions={str(k): v for k, v in m.precisions.items()},
                    inputs=[t.model_dump() for t in m.inputs],
                    outputs=[t.model_dump() for t in m.outputs],
                    consumes=m.consumes,
                    produces=m.produces,
                    not_exported=m.not_exported is not None,
                )
            )
    return rows


def listing(found: Survey, artifacts: list[ArtifactRow]) -> JsonObject:
    """The JSON document (``omni-edge.stages/1``)."""
    from stages import registry

    kinds = []
    for name, kind in sorted(found.kinds.items()):
        where = registry.origin(name)
        kinds.append(
            {
                "name": name,
                "source": where.source if where else "registered",
                "target": where.target if where else "",
                "distribution": where.distribution if where else None,
                "consumes": list(kind.consumes),
                "produces": list(kind.produces),
                "backends": list(kind.backends),
                "needs_gates": kind.needs_gates,
            }
        )
    return {
        "format": STAGES_FORMAT,
        "kinds": kinds,
        "artifacts": [a.to_dict() for a in artifacts],
        "hooks": [
            {"name": h.name, "target": h.target, "distribution": h.distribution}
            for h in found.hooks
        ],
        "broken_plugins": [f.to_dict() for f in found.failures],
    }


def run(args: argparse.Namespace) -> int:
    from stages.registry import survey

    extra: list[Path] = []
    for i, given in enumerate(args.path):
        p = Path(given)
        if not p.is_dir():
            raise ConfigError.single(
                f"--path #{i + 1} {given}",
                "not a directory",
                "pass a directory that holds artifact directories (each with manifest.yaml)",
            )
        extra.append(p.absolute())
    found = survey()
    artifacts = find_artifacts(extra)
    doc = listing(found, artifacts)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from orchestrator.core.console import make_console

        make_console().print(stages_view(doc))
    broken = bool(doc["broken_plugins"]) or any(not a["ok"] for a in doc["artifacts"])
    return 2 if broken and args.strict else 0


def _ports(tensors: list[JsonObject]) -> str:
    return ", ".join(f"{t['name']}[{','.join(str(s) for s in t['shape'])}]" for t in tensors)


def stages_view(doc: JsonObject) -> Group:
    """The listing as a user reads it: kinds, artifacts, hooks, broken plugins."""
    from rich.text import Text

    from orchestrator.commands.render import Col, Sheet, spaced

    kinds = Sheet(
        "stage kinds",
        (
            Col("kind"),
            Col("from", wrap=True),
            Col("consumes", wrap=True),
            Col("produces", wrap=True),
        ),
    )
    for k in doc["kinds"]:
        source = f"{k['distribution']}\n(entry point)" if k["distribution"] else k["source"]
        kinds.add_row(k["name"], source, ", ".join(k["consumes"]), ", ".join(k["produces"]))

    arts = Sheet(
        "exported artifacts", (Col("artifact"), Col("precisions"), Col("where / from", wrap=True))
    )
    ports = Sheet(
        "artifact ports", (Col("artifact"), Col("inputs", wrap=True), Col("outputs", wrap=True))
    )
    for a in doc["artifacts"]:
        if not a["ok"]:
            arts.add_row(
                Text(a["name"] or "?", style="bold red"),
                Text("BROKEN", style="bold red"),
                f"{a['dir']} ({a['found_in']}): {a['error']}",
            )
            continue
        precisions = ", ".join(a["precisions"]) + (" (not exported)" if a["not_exported"] else "")
        arts.add_row(
            a["name"],
            precisions,
            f"{a['dir']} ({a['found_in']}, version {a['version']}); {a['origin']}",
        )
        ports.add_row(a["name"], _ports(a["inputs"]), _ports(a["outputs"]))

    parts: list[Any] = [kinds, arts, ports if ports.rows else None]
    if doc["hooks"]:
        hooks = Sheet(
            "hooks (omni_edge.hooks)",
            (Col("hook"), Col("target", wrap=True), Col("from", wrap=True)),
        )
        for h in doc["hooks"]:
            hooks.add_row(h["name"], h["target"], h["distribution"])
        parts.append(hooks)
    if doc["broken_plugins"]:
        broken = Sheet(
            "BROKEN plugins (failed to load; exit 2 with --strict)",
            (Col("plugin"), Col("group"), Col("from", wrap=True), Col("error", wrap=True)),
        )
        for f in doc["broken_plugins"]:
            group = "kind" if f["group"].endswith("stage_kinds") else "hook"
            broken.add_row(
                Text(f["name"], style="bold red"),
                group,
                f["distribution"],
                f"{f['target']}: {f['error']}",
            )
        parts.append(broken)
    return spaced(parts)
