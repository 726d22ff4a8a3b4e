"""Exported artifacts (contract ``omni-edge.export/1``): a directory with a manifest.

An exported stage is data: a directory holding ``manifest.yaml``, one ONNX
file per precision (or a ``package://`` location inside an installed PyPI
package), and the reference inputs the numeric gate runs. See
``docs/exported-artifacts.md``.

Guarantees:

* ``load_artifact`` reads only the manifest and checks that every file it
  names exists inside the artifact directory once links are resolved (inside
  the package's directory for ``package://`` graphs), and that its hooks are
  allowed (a function of the ``exports`` package that its module declares
  with :func:`artifact_hook`, or a ``omni_edge.hooks`` entry point) and exist
  (their modules are imported); every problem becomes a ``ConfigError``
  entry (where → what → how to fix).
* Reference data (``.npz``) is read with numpy, imported only then.

What an ONNX graph says about itself (node counts, initializer bytes, the
opset) is ``stages.exported_graph.graph_stats``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import io
import logging
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator

from orchestrator.core.errors import ConfigError, Problem
from orchestrator.core.fileio import file_sha256
from orchestrator.core.packages import (
    PACKAGE_SCHEME,
    resolve_package_location,
    split_package_location,
)
from orchestrator.core.units import parse_bytes
from orchestrator.core.validation import Strict, problems_from_validation, read_document
from stages.payloads import parse_payloads

log = logging.getLogger(__name__)

EXPORT_FORMAT = "omni-edge.export/1"
MANIFEST_NAME = "manifest.yaml"

Precision = Literal["fp32", "fp16", "bf16", "int8", "int4"]
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8", "int4")
"""fp32/fp16/bf16: float graphs; int8: QDQ (or QOperator) int8; int4: weight-only
int4 (MatMulNBits). The vocabulary grows compatibly; a name never changes meaning."""

TensorDType = Literal[
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint64",
    "uint32",
    "uint16",
    "uint8",
    "bool",
    "string",
]

DEFAULT_MIN_EP_COVERAGE = 0.5
"""At 0.5 or more, most of the graph's nodes run where the plan says they run.
Below that the CPU does most of the work and every partition boundary adds a
host↔device copy, so the placement would be a CPU placement in disguise: plan
it on the CPU explicitly instead."""

_ENTRY_POINT = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class Source(Strict):
    """Where the graph came from, so a user can judge and reproduce it."""

    origin: str = Field(
        description="Where the graph was obtained: a URL, a PyPI package and version, or an export script."
    )
    license: str = Field(description="License of the weights/graph (SPDX id where there is one).")
    notes: str = Field(
        "", description="Anything else a user should know: training data, who exported it and how."
    )


class TensorSpec(Strict):
    """One graph input or output as the manifest promises it."""

    name: str = Field(min_length=1, description="Tensor name exactly as in the ONNX graph.")
    dtype: TensorDType = Field(description="Element type (numpy spelling: float32, int64, ...).")
    shape: list[int | str] = Field(
        description="Dimensions; a string names a dynamic axis (e.g. batch, phonemes), an int is fixed."
    )


class Reference(Strict):
    """The data the numeric gate runs."""

    inputs: str = Field(
        description="An .npz file in the artifact directory, one array per graph input name."
    )
    outputs: str | None = Field(
        None,
        description="Optional .npz of expected outputs (e.g. from the exporting framework). When present it is the reference; otherwise the CPU EP running the fp32 graph is.",
    )


class Tolerance(Strict):
    """How close the target's outputs must be to the reference (all three must hold)."""

    rel_l2: float = Field(
        1e-3, ge=0, description="Largest allowed ||target − ref||₂ / ||ref||₂ per output."
    )
    max_abs: float = Field(
        1e-3, ge=0, description="Largest allowed |target − ref| for any element."
    )
    cosine_min: float = Field(
        0.999,
        ge=-1,
        le=1,
        description="Smallest allowed cosine similarity between target and reference, per output.",
    )


class PrecisionTolerance(Strict):
    """One precision's own tolerance: each field it gives replaces ``tolerance``'s for that
    precision's graph; a field it leaves out is ``tolerance``'s."""

    rel_l2: float | None = Field(
        None,
        ge=0,
        description="This precision's largest allowed rel L2 (default: tolerance.rel_l2).",
    )
    max_abs: float | None = Field(
        None,
        ge=0,
        description="This precision's largest allowed |target − ref| (default: tolerance.max_abs).",
    )
    cosine_min: float | None = Field(
        None,
        ge=-1,
        le=1,
        description="This precision's smallest allowed cosine (default: tolerance.cosine_min).",
    )


class NotExported(Strict):
    """A graph that is not here yet: its sizes come from metadata, so the stage is planned
    (weights shown) and refused on every device with ``no_exported_graph`` until exported."""

    weight_bytes: int = Field(
        ge=0, description="Bytes of the weights the graph will hold, from metadata."
    )
    evidence: Literal["D", "E"] = Field(
        description="D: read from a file (an index, headers); E: computed."
    )
    note: str = Field(min_length=1, description="Where weight_bytes comes from.")
    remedy: str = Field(min_length=1, description="How to export the graph.")


class ExportManifest(Strict):
    """``manifest.yaml`` of an exported artifact (contract ``omni-edge.export/1``)."""

    format: Literal["omni-edge.export/1"] = Field(
        description="Format tag; must be omni-edge.export/1."
    )
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
        description="Artifact name, shown in plans and evidence.",
    )
    version: str = Field(min_length=1, description="Version of this artifact (not of the format).")
    description: str = Field("", description="Free text for humans.")
    source: Source = Field(description="Where the graph came from and under which license.")
    precisions: dict[Precision, str] = Field(
        min_length=1,
        description="Precision → ONNX file: a path relative to the artifact directory, or package://<importable_package>/<path> inside an installed package.",
    )
    inputs: list[TensorSpec] = Field(
        min_length=1, description="Graph inputs, in the graph's order."
    )
    outputs: list[TensorSpec] = Field(
        min_length=1, description="Graph outputs, in the graph's order."
    )
    reference: Reference = Field(
        description="Reference inputs (and optionally outputs) for the numeric gate."
    )
    tolerance: Tolerance = Field(
        default_factory=Tolerance,
        description="Numeric gate tolerance of every precision without its own in tolerances.",
    )
    tolerances: dict[Precision, PrecisionTolerance] = Field(
        default_factory=dict,
        description="Per precision, its own numeric gate tolerance (fields left out fall back to tolerance); "
        "each key must be a precision this manifest lists.",
    )
    min_ep_coverage: float = Field(
        DEFAULT_MIN_EP_COVERAGE,
        ge=0,
        le=1,
        description="Fraction of the graph's nodes the target EP must take (after ORT's graph optimizations). Default 0.5: below it the CPU does most of the work.",
    )
    preprocess: str | None = Field(
        None,
        pattern=_ENTRY_POINT,
        description="module:function turning one input item into the graph's input arrays; called as fn(item, artifact).",
    )
    postprocess: str | None = Field(
        None,
        pattern=_ENTRY_POINT,
        description="module:function turning the graph's outputs (name → array) into one output item; called as fn(outputs, artifact).",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Free map for the hooks and for humans (sample_rate, voice config, ...).",
    )
    activation_bytes: int | None = Field(
        None,
        ge=0,
        description="Peak bytes of one inference's intermediate tensors for the largest item the preprocess hook "
        "produces, as measured by the artifact's author (e.g. '320MiB'); default max(64 MiB, half the weights).",
    )
    activation_note: str = Field(
        "", description="Where activation_bytes comes from (what was measured, on what input)."
    )
    not_exported: NotExported | None = Field(
        None,
        description="Set when the graph is not exported yet: precisions and reference name the files it will "
        "have, which need not exist; the stage is planned from these sizes and refused with no_exported_graph.",
    )
    consumes: list[str] | None = Field(
        None,
        min_length=1,
        description="Payload types one input item may be (stages.payloads: text, audio@16000, tensor<float32>[seq,896], ...); default: any.",
    )
    produces: list[str] | None = Field(
        None,
        min_length=1,
        description="Payload types one output item may be (same spelling); default: any.",
    )

    @field_validator("consumes", "produces")
    @classmethod
    def _payloads(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            parse_payloads(value)  # PayloadSpecError is a ValueError: reported where → what
        return value

    @field_validator("activation_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        return None if value is None else parse_bytes(value)

    @field_validator("precisions")
    @classmethod
    def _locations(cls, value: dict[str, str]) -> dict[str, str]:
        for precision, location in value.items():
            _check_location(location, f"precisions.{precision}")
        return value

    @model_validator(mode="after")
    def _check(self) -> ExportManifest:
        _check_location(self.reference.inputs, "reference.inputs", package_ok=False)
        if not self.reference.inputs.endswith(".npz"):
            raise ValueError(
                f"reference.inputs must be an .npz file, got {self.reference.inputs!r}"
            )
        if self.reference.outputs is not None:
            _check_location(self.reference.outputs, "reference.outputs", package_ok=False)
            if not self.reference.outputs.endswith(".npz"):
                raise ValueError(
                    f"reference.outputs must be an .npz file, got {self.reference.outputs!r}"
                )
        if "fp32" not in self.precisions and self.reference.outputs is None:
            raise ValueError(
                "the numeric gate needs a reference: add an fp32 graph to precisions "
                "(the CPU EP runs it as the reference) or reference.outputs (recorded expected outputs)"
            )
        stray = [p for p in self.tolerances if p not in self.precisions]
        if stray:
            raise ValueError(
                f"tolerances names {', '.join(stray)}, which precisions does not list "
                f"(it lists {', '.join(self.precisions)}); a tolerance belongs to a graph the artifact has"
            )
        for group in ("inputs", "outputs"):
            names = [t.name for t in getattr(self, group)]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{group} names must be unique; repeated: {', '.join(dupes)}")
        return self

    def tolerance_for(self, precision: str) -> Tolerance:
        """The tolerance the numeric gate applies to ``precision``'s graph: its own entry in
        ``tolerances``, field by field, over ``tolerance``."""
        own = self.tolerances.get(precision)  # type: ignore[call-overload]
        if own is None:
            return self.tolerance
        return self.tolerance.model_copy(
            update={k: v for k, v in own.model_dump().items() if v is not None}
        )


def _check_location(location: str, field_name: str, *, package_ok: bool = True) -> None:
    """A location stays inside the artifact: relative, no ``..``; or package://pkg/path."""
    if location.startswith(PACKAGE_SCHEME):
        if not package_ok:
            raise ValueError(
                f"{field_name}: package:// locations are only allowed for graphs, got {location!r}"
            )
        try:
            _package, inner = split_package_location(location)
        except ValueError as exc:
            raise ValueError(f"{field_name}: {exc}") from None
        check_relative(inner, field_name)
        return
    check_relative(location, field_name)


def check_relative(path: str, field_name: str) -> None:
    p = Path(path)
    if p.is_absolute() or path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        raise ValueError(
            f"{field_name}: {path!r} is absolute; locations are relative to the artifact directory"
        )
    if ".." in p.parts or ".." in Path(path.replace("\\", "/")).parts:
        raise ValueError(f"{field_name}: {path!r} climbs out of the artifact directory with '..'")


# ---- the artifact ---------------------------------------------------------------


@dataclass(frozen=True)
class ExportedArtifact:
    """A loaded manifest and the directory it lives in; files are resolved, not read."""

    dir: Path
    manifest: ExportManifest

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def metadata(self) -> dict[str, Any]:
        return self.manifest.metadata

    def resolve(self, location: str) -> Path:
        """A manifest location as an absolute path (``package://`` resolved without importing)."""
        if location.startswith(PACKAGE_SCHEME):
            return resolve_package_location(location)
        return (self.dir / location).resolve()

    def file(self, location: Any, where: str) -> Path:
        """A file (or directory) the manifest names besides its graphs and references — a
        hook's ``metadata`` file (:data:`METADATA_FILES`) — confined as they are
        (:func:`confined_file`); ``ConfigError`` at ``where``."""
        return confined_file(self.dir, location, where)

    def graph_path(self, precision: str) -> Path:
        try:
            location = self.manifest.precisions[precision]  # type: ignore[index]
        except KeyError:
            raise KeyError(
                f"artifact {self.name!r} has no {precision} graph (it has {', '.join(self.manifest.precisions)})"
            ) from None
        return self.resolve(location)

    def reference_inputs(self) -> dict[str, Any]:
        """The reference input arrays (imports numpy)."""
        return _load_npz(self.resolve(self.manifest.reference.inputs))

    def reference_outputs(self) -> dict[str, Any] | None:
        if self.manifest.reference.outputs is None:
            return None
        return _load_npz(self.resolve(self.manifest.reference.outputs))

    def reference_digest(self) -> str:
        """sha256 over the reference file(s): evidence is keyed by what the gate ran."""
        files = [self.manifest.reference.inputs]
        if self.manifest.reference.outputs:
            files.append(self.manifest.reference.outputs)
        h = hashlib.sha256()
        for f in files:
            h.update(f.encode())
            h.update(bytes.fromhex(file_sha256(self.resolve(f))))
        return h.hexdigest()

    def feed_problems(self) -> list[Problem]:
        """Why an item the manifest ``consumes`` could never feed the graph as it is, when no
        preprocess hook makes the feeds (``runner.feeds_for`` then feeds the item itself):
        an item that is no tensor (text, audio, token ids, an event); one array (a tensor
        whose dtype or shape is given) into a graph of several inputs; an array of another
        dtype, rank or fixed size than the graph's one input. What only an item can say (a
        mapping's names) is checked per item. Read at plan time (``describe``)."""
        m = self.manifest
        if m.preprocess is not None or not m.consumes:
            return []
        where = f"{self.dir / MANIFEST_NAME}: consumes"
        names = ", ".join(t.name for t in m.inputs)
        problems = []
        for t in parse_payloads(m.consumes):
            what = None
            if t.kind != "tensor":
                what = (
                    f"{t} items cannot feed the graph as they are (it takes {names}), and there is no preprocess "
                    "hook: without one an item is the graph's feeds, a numpy array or a mapping of arrays"
                )
                fix = "add a preprocess hook that turns the item into the graph's inputs, or consume tensors"
            elif (t.dtype is not None or t.shape is not None) and len(m.inputs) != 1:
                what = f"{t} is one array and the graph takes {len(m.inputs)} inputs ({names}): a bare array feeds a graph of one input"
                fix = "consume `tensor` (a mapping of named arrays) or add a preprocess hook"
            elif t.dtype is not None and t.dtype != m.inputs[0].dtype:
                what = f"{t} is {t.dtype} and the graph's input {m.inputs[0].name!r} is {m.inputs[0].dtype}"
                fix = "consume what the graph takes, or convert in a preprocess hook"
            elif t.shape is not None and not _fits(t.shape, m.inputs[0].shape):
                what = f"{t} does not fit the graph's input {m.inputs[0].name!r} of shape {m.inputs[0].shape}"
                fix = "consume what the graph takes, or reshape in a preprocess hook"
            if what is not None:
                problems.append(Problem(where, what, fix))
        return problems

    def hook(self, which: Literal["preprocess", "postprocess"]) -> Callable[..., Any] | None:
        """Import and return a hook, or None when the manifest declares none.

        Only modules of the shipped artifacts' package (``exports``) or hooks
        registered under the ``omni_edge.hooks`` entry-point group are imported,
        and a function of ``exports`` must be declared (:func:`artifact_hook`);
        anything else (``os:system``, ``exports.sentence_encoder:build``) is a
        ``ConfigError`` naming the manifest key."""
        target = getattr(self.manifest, which)
        if target is None:
            return None
        return resolve_hook(target, f"{self.dir / MANIFEST_NAME}: {which}")


def _fits(axes: tuple[str, ...], shape: list[int | str]) -> bool:
    """A payload's axes against a graph input's: the same rank, the same size wherever both are fixed."""
    return len(axes) == len(shape) and all(
        not (a.isdigit() and isinstance(b, int)) or int(a) == b
        for a, b in zip(axes, shape, strict=True)
    )


def load_artifact(path: str | Path) -> ExportedArtifact:
    """Read and check an artifact directory's manifest (no graph, no numpy).

    Raises ``ConfigError`` naming the manifest field for unknown keys, bad
    values, locations that leave the directory, and files that do not exist.
    """
    d = _artifact_dir(path)
    manifest_path = d / MANIFEST_NAME
    where = str(manifest_path)
    manifest = _read_manifest(manifest_path)
    artifact = ExportedArtifact(d, manifest)
    if manifest.not_exported is not None:
        return artifact  # the graph and its reference are not here, by declaration
    problems = [
        *_precision_problems(artifact, where),
        *_hook_problems(manifest, where),
        *_reference_problems(artifact, where),
    ]
    problems += [] if problems else _metadata_file_problems(artifact, where)
    if problems:
        raise ConfigError(problems)
    return artifact


def _artifact_dir(path: str | Path) -> Path:
    """The artifact directory ``path`` names (a ``package://`` location resolved);
    ``ConfigError`` when it is no directory or holds no manifest."""
    d = Path(path)
    if str(path).startswith(PACKAGE_SCHEME):
        d = resolve_package_location(str(path))
    d = d.resolve()
    if not d.is_dir():
        raise ConfigError.single(
            str(d),
            "the artifact directory does not exist",
            f"point `artifact` at a directory holding {MANIFEST_NAME}",
        )
    if not (d / MANIFEST_NAME).is_file():
        raise ConfigError.single(
            str(d),
            f"no {MANIFEST_NAME} in the artifact directory",
            f"add {MANIFEST_NAME} (see docs/exported-artifacts.md)",
        )
    return d


def _read_manifest(manifest_path: Path) -> ExportManifest:
    """The manifest, validated; ``ConfigError`` naming the field for an unknown export format
    or a value the schema refuses."""
    data = read_document(manifest_path)
    where = str(manifest_path)
    if isinstance(data, dict) and data.get("format") not in (None, EXPORT_FORMAT):
        raise ConfigError.single(
            f"{where}: format",
            f"unknown export format {data.get('format')!r}",
            f"this version reads {EXPORT_FORMAT!r}",
        )
    try:
        return ExportManifest.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, where, ExportManifest)) from None


def _precision_problems(artifact: ExportedArtifact, where: str) -> list[Problem]:
    """Each precision's graph: a location that resolves, to a file that exists inside the
    artifact directory (a ``package://`` location may point into its package)."""
    d = artifact.dir
    problems: list[Problem] = []
    for precision, location in artifact.manifest.precisions.items():
        try:
            p = artifact.resolve(location)
        except ConfigError as exc:
            problems.extend(
                Problem(f"{where}: precisions.{precision}", q.what, q.fix) for q in exc.problems
            )
            continue
        if not p.is_file():
            problems.append(
                Problem(
                    f"{where}: precisions.{precision}",
                    f"{location} does not exist (looked at {p})",
                    "export the graph there or fix the path",
                )
            )
        elif not location.startswith(PACKAGE_SCHEME) and not inside(p, d):
            problems.append(
                Problem(
                    f"{where}: precisions.{precision}",
                    f"{location} resolves to {p}, outside the artifact directory {d} (a symlink?)",
                    "copy the graph into the artifact directory instead of linking to it",
                )
            )
    return problems


def _hook_problems(manifest: ExportManifest, where: str) -> list[Problem]:
    """The pre/post-processing hooks the manifest names, each one a hook it may import."""
    problems: list[Problem] = []
    for which in ("preprocess", "postprocess"):
        target = getattr(manifest, which)
        if target is not None:
            try:
                resolve_hook(target, f"{where}: {which}")
            except ConfigError as exc:
                problems.extend(exc.problems)
    return problems


def _metadata_file_problems(artifact: ExportedArtifact, where: str) -> list[Problem]:
    """The ``metadata`` keys the manifest's hook modules read as files (their
    :data:`METADATA_FILES`): each confined to the artifact (``ExportedArtifact.file``) and there."""
    keys: set[str] = set()
    for target in (artifact.manifest.preprocess, artifact.manifest.postprocess):
        module = sys.modules.get((target or "").partition(":")[0])
        keys.update(getattr(module, METADATA_FILES, ()))
    problems: list[Problem] = []
    for key in sorted(k for k in keys if k in artifact.metadata):
        at = f"{where}: metadata.{key}"
        try:
            path = artifact.file(artifact.metadata[key], at)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        if not path.exists():
            problems.append(Problem(at, f"{path} does not exist", _FILE_FIX))
    return problems


def _reference_problems(artifact: ExportedArtifact, where: str) -> list[Problem]:
    """The reference inputs and outputs: files that exist inside the artifact directory."""
    d, manifest = artifact.dir, artifact.manifest
    problems: list[Problem] = []
    references = (
        ("reference.inputs", manifest.reference.inputs),
        ("reference.outputs", manifest.reference.outputs),
    )
    for field_name, ref_location in references:
        if ref_location is None:
            continue
        location = ref_location
        p = artifact.resolve(location)
        if not p.is_file():
            problems.append(
                Problem(
                    f"{where}: {field_name}",
                    f"{location} does not exist (looked at {p})",
                    "write the .npz there (see docs/exported-artifacts.md) or fix the path",
                )
            )
        elif not inside(p, d):
            problems.append(
                Problem(
                    f"{where}: {field_name}",
                    f"{location} resolves to {p}, outside the artifact directory (a symlink?)",
                    "keep reference files inside the artifact directory",
                )
            )
    return problems


# ---- hooks ------------------------------------------------------------------------


HOOKS_ENTRY_POINT_GROUP = "omni_edge.hooks"
"""Where a distribution registers pre/post-processing hooks for its artifacts:
``[project.entry-points."omni_edge.hooks"] <name> = "module:function"``."""

SHIPPED_HOOKS_PACKAGE = "exports"
"""The package of the shipped artifacts; its hooks need no entry point, but each is
declared by its module (:func:`artifact_hook`)."""

METADATA_FILES = "METADATA_FILES"
"""The attribute of a hook's module that names the ``metadata`` keys it reads as file locations
(``exports.piper_voice``: ``("voice_config",)``): checked when the artifact is read, and read
through ``ExportedArtifact.file``, so a manifest cannot point a hook outside its artifact."""

_FILE_FIX = (
    "keep the file inside the artifact directory and name it relative to it (no '..', no "
    "absolute path, no link out), or as package://<package>/<path>"
)

HOOK_MARK = "__omni_edge_hook__"
"""The attribute :func:`artifact_hook` sets on a function it declares."""

_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def artifact_hook(fn: _Fn) -> _Fn:
    """Declare ``fn`` a hook that a manifest may name (``preprocess``/``postprocess``).

    A function of the ``exports`` package is a hook only when its module marks it
    with this decorator: the package also holds build scripts and helpers
    (``build``, ``export_args``, ``phonemize``), and a manifest — data a user may
    have downloaded — must not be able to call those by naming them."""
    setattr(fn, HOOK_MARK, True)
    return fn


def declared_hooks(module: Any) -> list[str]:
    """The names of the functions ``module`` declares as hooks (:func:`artifact_hook`)."""
    return sorted(
        name for name, value in vars(module).items() if getattr(value, HOOK_MARK, None) is True
    )


_PROJECT_ROOT = Path(__file__).resolve().parents[2]


def registered_hooks() -> set[str]:
    """The ``module:function`` values registered under :data:`HOOKS_ENTRY_POINT_GROUP`."""
    return {ep.value.replace(" ", "") for ep in entry_points(group=HOOKS_ENTRY_POINT_GROUP)}


def _shipped(module_name: str) -> bool:
    """Whether ``module_name`` is in this project's own ``exports`` package (not one
    of the same name elsewhere on the path)."""
    if module_name.split(".")[0] != SHIPPED_HOOKS_PACKAGE:
        return False
    spec = importlib.util.find_spec(SHIPPED_HOOKS_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return any(Path(loc).resolve() == _PROJECT_ROOT / SHIPPED_HOOKS_PACKAGE for loc in locations)


def _hook_origin(target: str) -> str:
    """Where an allowed hook comes from: the shipped package, or which entry point of which distribution."""
    for ep in entry_points(group=HOOKS_ENTRY_POINT_GROUP):
        if ep.value.replace(" ", "") == target:
            dist = getattr(ep, "dist", None)
            return f"entry point {HOOKS_ENTRY_POINT_GROUP}:{ep.name}" + (
                f" of {dist.name} {dist.version}" if dist else ""
            )
    return f"the {SHIPPED_HOOKS_PACKAGE!r} package"


def resolve_hook(target: str, where: str) -> Callable[..., Any]:
    """The callable ``module:function`` names, when it is allowed and exists;
    else a ``ConfigError`` at ``where`` (the manifest key)."""
    module_name, _, attr = target.partition(":")
    if not _shipped(module_name) and target not in registered_hooks():
        raise ConfigError.single(
            where,
            f"the hook {target!r} is not allowed: hooks come from the {SHIPPED_HOOKS_PACKAGE!r} package "
            f"or from an entry point registered under {HOOKS_ENTRY_POINT_GROUP!r}",
            f"move the function into {SHIPPED_HOOKS_PACKAGE}/<module>.py, or register it in the distribution that "
            f'provides it: [project.entry-points."{HOOKS_ENTRY_POINT_GROUP}"] <name> = "{target}" '
            "(see docs/exported-artifacts.md)",
        )
    origin = _hook_origin(target)
    log.debug("loading hook %s from %s", target, origin)
    try:
        module = importlib.import_module(module_name)
    except (
        Exception
    ) as exc:  # not only ImportError: a module that raises while importing is reported too
        message = " ".join(str(exc).split())
        raise ConfigError.single(
            where,
            f"the hook {target!r} cannot be loaded: {type(exc).__name__}: {message} (from {origin})",
            "install what it needs, fix or uninstall the package that provides it, or fix the module:function name",
        ) from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ConfigError.single(
            where,
            f"the hook {target!r} cannot be loaded: module {module_name!r} has no {attr!r}",
            "fix the function name after the ':'",
        )
    if not callable(fn):
        raise ConfigError.single(where, f"{target!r} is not callable", "point it at a function")
    if target not in registered_hooks() and getattr(fn, HOOK_MARK, None) is not True:
        declared = declared_hooks(module)
        raise ConfigError.single(
            where,
            f"{target!r} is not declared as a hook: a function of the {SHIPPED_HOOKS_PACKAGE!r} package is a hook "
            f"only when its module marks it with @artifact_hook ({module_name} declares "
            f"{', '.join(declared) if declared else 'none'})",
            f"name a declared hook of {module_name}, or mark the function with @artifact_hook "
            "(stages.exported_graph.artifact) where it is defined (see docs/exported-artifacts.md)",
        )
    return fn


# ---- files ------------------------------------------------------------------------


def confined_file(root: Path, location: Any, where: str) -> Path:
    """``location`` as a path: a ``package://`` location inside its package, else relative to
    ``root``, without ``..``, resolving inside it (a symlink out is refused); ``ConfigError``
    at ``where`` otherwise."""
    if not isinstance(location, str) or not location:
        raise ConfigError.single(where, f"{location!r} is not a file location", _FILE_FIX)
    if location.startswith(PACKAGE_SCHEME):
        return resolve_package_location(location)
    try:
        check_relative(location, "")
    except ValueError as exc:
        raise ConfigError.single(where, str(exc).removeprefix(": "), _FILE_FIX) from None
    path = (root / location).resolve()
    if not inside(path, root):
        raise ConfigError.single(
            where,
            f"{location} resolves to {path}, outside the artifact directory {root} (a symlink?)",
            _FILE_FIX,
        )
    return path


def inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def save_npz(path: str | Path, arrays: dict[str, Any], *, deflate: bool = True) -> Path:
    """``numpy.savez`` with fixed zip timestamps, so the same arrays give the same bytes:
    ``numpy.savez`` stamps each member with the current time, and a reference file's
    sha256 is part of the evidence key, so a regenerated but identical reference must not
    look like new data. ``deflate=False`` stores the members uncompressed (the shipped
    Silero references were written that way; their bytes stay as they are)."""
    import numpy as np

    out = Path(path)
    method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(out, "w", compression=method) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arrays[name], order="C"), allow_pickle=False)
            zf.writestr(
                zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)),
                buf.getvalue(),
                compress_type=method,
            )
    return out


def _load_npz(path: Path) -> dict[str, Any]:
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
