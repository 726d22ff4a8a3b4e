"""``omni-edge export --from {torch,transformers,onnx} SOURCE -o DIR``: a complete,
validated exported artifact (orchestrator/exporter/, docs/export.md)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from orchestrator.core.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.core.documents import JsonObject
    from orchestrator.exporter.build import ExportRequest, ExportResult, Int8Scheme


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Export a PyTorch module (pkg.module:factory), a transformers model directory (or package://pkg/dir) "
        "or an ONNX file as an omni-edge.export/1 artifact: one graph per precision, reference inputs and "
        "outputs, a manifest with a tolerance suggested from measurement, and digests. It is validated "
        "(onnx.checker, a CPU session, each precision through the gates on the CPU EP) before it is "
        "renamed into place; a failure leaves nothing behind."
    )
    _add_source_arguments(p)
    _add_manifest_arguments(p)
    _add_sample_arguments(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="replace DIR once the new artifact is complete and validated",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the summary as JSON (format omni-edge.export-result/1)",
    )


def _add_source_arguments(p: argparse.ArgumentParser) -> None:
    """What to export, where to, in which precisions and opset."""
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        choices=["torch", "transformers", "onnx"],
        help="what SOURCE is",
    )
    p.add_argument(
        "location",
        metavar="SOURCE",
        help="torch: pkg.module:factory; transformers: a model directory or package://pkg/dir; onnx: FILE.onnx",
    )
    p.add_argument(
        "-o",
        "--out",
        metavar="DIR",
        required=True,
        help="the artifact directory to write (must not exist)",
    )
    p.add_argument(
        "--precision",
        default="fp32",
        metavar="LIST",
        help="comma-separated, from fp32,fp16,int8 (fp32 is required; default: fp32)",
    )
    p.add_argument(
        "--opset",
        type=int,
        default=None,
        help="ONNX opset for torch/transformers (13-20, default 17)",
    )


def _add_manifest_arguments(p: argparse.ArgumentParser) -> None:
    """What the manifest says: name, version, provenance, hooks, payload types, metadata."""
    p.add_argument("--name", help="artifact name (default: the directory's name)")
    p.add_argument(
        "--version",
        dest="artifact_version",
        default="1.0.0",
        metavar="VERSION",
        help="artifact version (default 1.0.0)",
    )
    p.add_argument("--description", default="", help="free text for the manifest")
    p.add_argument("--license", default="unknown", help="license of the weights (SPDX id)")
    p.add_argument("--origin", help="where the weights come from (default: the source)")
    p.add_argument(
        "--preprocess",
        metavar="MODULE:FN",
        help="preprocess hook (exports package or omni_edge.hooks)",
    )
    p.add_argument("--postprocess", metavar="MODULE:FN", help="postprocess hook (likewise)")
    p.add_argument(
        "--consumes",
        metavar="TYPES",
        help="payload types an input item may be, comma-separated (e.g. text)",
    )
    p.add_argument(
        "--produces",
        metavar="TYPES",
        help="payload types an output item may be (e.g. 'tensor<float32>[384]')",
    )
    p.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a manifest metadata entry (repeatable)",
    )


def _add_sample_arguments(p: argparse.ArgumentParser) -> None:
    """The reference and calibration inputs, and how the int8 graph is quantized."""
    p.add_argument(
        "--inputs", metavar="NPZ", help="onnx: the reference inputs (one array per graph input)"
    )
    p.add_argument(
        "--calibration",
        action="append",
        default=[],
        metavar="NPZ",
        help="onnx: more calibration inputs, one .npz each (repeatable)",
    )
    p.add_argument(
        "--calibration-text",
        metavar="FILE",
        help="transformers: calibration sentences, one per line (the first is the reference input)",
    )
    p.add_argument(
        "--int8-activations",
        choices=["uint8", "uint16"],
        default=None,
        help="int8: the activations' type (default uint8; uint16 keeps more of their range)",
    )
    p.add_argument(
        "--int8-nodes",
        metavar="PREFIXES",
        help="int8: quantize only the nodes whose names start with these comma-separated prefixes "
        "(e.g. /dec/), leaving the rest fp32 (default: every node the quantizer takes)",
    )


def _list(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _metadata(items: list[str]) -> JsonObject:
    out: JsonObject = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError.single(
                f"--metadata {item}", "not KEY=VALUE", "write e.g. --metadata language=en"
            )
        try:
            out[key.strip()] = (
                yaml.safe_load(value) if value.strip() else ""
            )  # 384 is a number, en a string
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


class _Steps:
    """The export's phases on stderr: a spinner with the elapsed time on a terminal, a line each otherwise."""

    def __init__(self, quiet: bool) -> None:
        from orchestrator.core.console import make_console

        self._console = make_console(stderr=True)
        self._quiet = quiet
        self._status: Any = None
        self._current: str | None = None
        self._t = time.perf_counter()

    def __call__(self, what: str) -> None:
        self._finish()
        self._current, self._t = what, time.perf_counter()
        if self._quiet:
            return
        if self._console.is_terminal:
            if self._status is None:
                self._status = self._console.status(what)
                self._status.start()
            else:
                self._status.update(what)

    def _finish(self) -> None:
        if self._current is not None and not self._quiet:
            self._console.print(f"  {self._current} … {time.perf_counter() - self._t:.1f} s")
        self._current = None

    def close(self, ok: bool) -> None:
        if ok:
            self._finish()
        if self._status is not None:
            self._status.stop()


EXPORT_NEEDS = {
    "torch": ("torch", "onnx", "numpy", "onnxruntime"),
    "transformers": ("torch", "transformers", "safetensors", "onnx", "numpy", "onnxruntime"),
    "onnx": ("onnx", "numpy", "onnxruntime"),
}
"""What each source is read with; every artifact is validated in an ONNX Runtime session."""


def needs(args: argparse.Namespace) -> tuple[str, ...]:
    """The packages ``--from``'s source is read and validated with (``EXPORT_NEEDS``)."""
    return EXPORT_NEEDS[args.source]


def run(args: argparse.Namespace) -> int:
    from orchestrator.commands.exits import EXIT_OK
    from orchestrator.exporter.build import export

    req = _request(args)
    steps = _Steps(quiet=args.json)
    ok = False
    try:
        result = export(req, steps)
        ok = True
    finally:
        steps.close(ok)
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    _print_result(result)
    return EXIT_OK


def _request(args: argparse.Namespace) -> ExportRequest:
    """The export the flags ask for; a ``ConfigError`` for flags that do not fit together,
    before the model is loaded."""
    from orchestrator.exporter.build import ExportRequest
    from orchestrator.exporter.sources import DEFAULT_OPSET, TORCH_MAX_OPSET, check_opset

    if args.opset is not None and args.source == "onnx":
        raise ConfigError.single(
            "--opset", "an ONNX source keeps its own opset", "leave --opset out"
        )
    if (
        args.opset is not None
    ):  # before the model is loaded (--opset 0 was the default opset, silently)
        check_opset(args.opset, where="--opset", highest=TORCH_MAX_OPSET)
    precisions = tuple(_list(args.precision) or ())
    scheme = _int8_scheme(args, precisions)
    return ExportRequest(
        source=args.source,
        location=args.location,
        out=Path(args.out),
        precisions=precisions,
        opset=DEFAULT_OPSET if args.opset is None else args.opset,
        name=args.name,
        version=args.artifact_version,
        description=args.description,
        license=args.license,
        origin=args.origin,
        preprocess=args.preprocess,
        postprocess=args.postprocess,
        consumes=_list(args.consumes),
        produces=_list(args.produces),
        metadata=_metadata(args.metadata),
        inputs_npz=args.inputs,
        calibration_npz=list(args.calibration),
        calibration_text=args.calibration_text,
        force=args.force,
        int8=scheme,
        command=shlex.join(["omni-edge", "export", *sys.argv[2:]])
        if sys.argv[1:2] == ["export"]
        else "",
    )


def _int8_scheme(args: argparse.Namespace, precisions: tuple[str, ...]) -> Int8Scheme:
    """How the int8 graph is quantized (``--int8-activations``, ``--int8-nodes``); the
    flags are refused when ``--precision`` has no int8."""
    from orchestrator.exporter.build import Int8Scheme

    if not (args.int8_activations or args.int8_nodes):
        return Int8Scheme()
    if "int8" not in precisions:
        flag = "--int8-activations" if args.int8_activations else "--int8-nodes"
        raise ConfigError.single(
            flag,
            "only shapes the int8 graph, and --precision has no int8",
            "add int8 to --precision (e.g. --precision fp32,int8) or leave the flag out",
        )
    nodes = tuple(_list(args.int8_nodes) or ())
    if args.int8_nodes is not None and not nodes:
        raise ConfigError.single("--int8-nodes", "names no prefix", "give e.g. --int8-nodes /dec/")
    return Int8Scheme(activations=args.int8_activations or "uint8", nodes=nodes)


def _print_result(result: ExportResult) -> None:
    """The human summary: the artifact's tensors, each precision's error and the tolerance."""
    from rich.table import Table

    from orchestrator.core.console import make_console
    from orchestrator.core.units import fmt_bytes

    console = make_console()
    console.print(f"wrote {result.out} ({result.name}) in {result.seconds:.1f} s")
    for group, tensors in (("input", result.inputs), ("output", result.outputs)):
        for t in tensors:
            shape = ", ".join(str(d) for d in t["shape"])
            console.print(f"  {group:<6} {t['name']:<18} {t['dtype']:<8} [{shape}]", markup=False)
    console.print("each precision on the CPU EP: worst error vs fp32 and the reference")
    table = Table(box=None, pad_edge=False)
    for col in ("precision", "size", "rel L2", "max abs", "cosine", "suggested L2/abs/cos"):
        table.add_column(col, justify="left" if col == "precision" else "right")
    for p, m in result.precisions.items():
        s = m["suggested"]
        table.add_row(
            p,
            fmt_bytes(m["bytes"]),
            f"{m['rel_l2']:.2g}",
            f"{m['max_abs']:.2g}",
            f"{m['cosine']:.6f}",
            f"{s['rel_l2']:g}/{s['max_abs']:g}/{s['cosine_min']:g}",
        )
    console.print(table)
    tol = result.tolerance
    console.print(
        f"manifest tolerance (the loosest): rel_l2 {tol['rel_l2']:g}, max_abs {tol['max_abs']:g}, "
        f"cosine_min {tol['cosine_min']:g}"
    )
    console.print("validated: onnx.checker, manifest, hooks, every precision's gates (CPU EP)")
