"""``python -m orchestrator.exporter REQUEST.json``: the exporter's Python API as a process.

For build scripts that may not import the exporter (a shipped artifact's hook
module, ``exports/``, imports neither ``orchestrator.exporter`` nor the gates it
runs: the import contracts in pyproject.toml). The JSON object holds
:class:`~orchestrator.exporter.build.ExportRequest`'s fields by name (``out`` a
path; ``int8`` an object with ``activations`` and ``nodes``), relative paths
read from the current directory. Each phase is one line on standard error; the
result (``omni-edge.export-result/1``) is printed on standard output. A request
the exporter refuses exits 2 with where, what and how to fix, nothing written.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.core.errors import ConfigError, Problem
from orchestrator.exporter.build import ExportRequest, Int8Scheme, export

EXIT_OK, EXIT_INPUT = 0, 2


def request_from_json(doc: Any, where: str) -> ExportRequest:
    """An :class:`ExportRequest` from its JSON form; unknown or missing fields are a ``ConfigError``."""
    if not isinstance(doc, dict):
        raise ConfigError.single(
            where,
            "the request is not a JSON object",
            'write {"source": ..., "location": ..., "out": ...}',
        )
    fields = {f.name for f in dataclasses.fields(ExportRequest)}
    unknown = sorted(set(doc) - fields)
    if unknown:
        raise ConfigError.single(
            where,
            f"unknown request field(s): {', '.join(unknown)}",
            f"use {', '.join(sorted(fields))}",
        )
    values = dict(doc)
    try:
        values["out"] = Path(values["out"])
        if "precisions" in values:
            values["precisions"] = tuple(values["precisions"])
        if "int8" in values:
            int8 = values["int8"]
            values["int8"] = Int8Scheme(
                activations=int8.get("activations", "uint8"), nodes=tuple(int8.get("nodes", ()))
            )
        return ExportRequest(**values)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConfigError.single(
            where,
            f"not an export request: {type(exc).__name__}: {exc}",
            "give source, location and out, and the other fields as ExportRequest names them",
        ) from None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m orchestrator.exporter REQUEST.json", file=sys.stderr)
        return EXIT_INPUT
    t0 = time.perf_counter()
    last = [t0]

    def step(text: str) -> None:
        now = time.perf_counter()
        print(f"  {text} (at {now - t0:.1f} s)", file=sys.stderr, flush=True)
        last[0] = now

    try:
        try:
            doc = json.loads(Path(argv[0]).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError.single(
                argv[0], f"cannot read the request: {exc}", "write the request as a JSON file"
            ) from None
        result = export(request_from_json(doc, argv[0]), step)
    except ConfigError as exc:
        print("error: the input cannot be used:", file=sys.stderr)
        for p in exc.problems:
            assert isinstance(p, Problem)
            print(f"  {p.where}: {p.what}\n    how to fix: {p.fix}", file=sys.stderr)
        return EXIT_INPUT
    json.dump(result.to_json(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
