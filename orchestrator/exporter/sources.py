"""What ``omni-edge export`` exports from: one fp32 ONNX graph and its data per source.

Three sources, each to an :class:`Exported` (the fp32 graph written in a work
directory, the reference inputs, the calibration set, and the exporting
framework's outputs on the reference inputs where there is a framework):

* ``torch`` — ``pkg.module:factory``. The factory takes no arguments and returns
  either a pair ``(module, inputs)`` or a mapping with

  ==================  ========  =====================================================
  key                 required  meaning
  ==================  ========  =====================================================
  ``module``          yes       a ``torch.nn.Module`` (put in ``eval()`` mode here)
  ``inputs``          yes       ``{name: tensor}``: the example inputs; they become the
                                reference inputs. Names that are ``forward``'s parameter
                                names are passed in its order, otherwise in this order.
  ``outputs``         no        output names (default ``output`` or ``output_0``, …)
  ``dynamic_axes``    no        ``{name: {axis: "axis_name"}}`` as ``torch.onnx.export``
  ``calibration``     no        a list of ``{name: tensor}`` like ``inputs`` (int8's
                                calibration set and the tolerance measurement); default
                                the example inputs alone
  ==================  ========  =====================================================

* ``transformers`` — a model directory (or ``package://pkg/dir``) with its
  tokenizer; the graph is the base model's ``last_hidden_state`` over
  ``input_ids``/``attention_mask``/``token_type_ids`` (those the tokenizer gives),
  dynamic in batch and tokens; the calibration set is a few sentences, one at a
  time, the first one the reference.
* ``onnx`` — an existing graph and an ``.npz`` of reference inputs (plus optional
  calibration ``.npz`` files); no framework, so no framework outputs.

torch, transformers, onnx and numpy are imported inside the functions: the
command's parser never pays for them.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import ConfigError
from orchestrator.core.packages import is_package_location, resolve_package_location
from stages.ar_decode.remote_code import refuse_remote_code

if TYPE_CHECKING:
    import numpy as np
    import torch

MIN_OPSET = 13
"""The lowest opset written or accepted: int8 QDQ per-channel (QuantizeLinear's
``axis``) and ORT's float16 converter need 13."""
TORCH_MAX_OPSET = 20
"""The highest opset torch's TorchScript exporter writes (``dynamo=False``: no onnxscript needed)."""
DEFAULT_OPSET = 17

CALIBRATION_SENTENCES = (
    "The quick brown fox jumps over the lazy dog, and every placement is checked.",
    "What is the weather like in Berlin today?",
    "Exported graphs run on the CPU, the integrated GPU or the NPU.",
    "Please remind me to call my sister at six.",
    "A short one.",
    "Large language models predict the next token from everything before it, one step at a time.",
    "Hello!",
    "The numeric gate compares each output with the reference before a stage is placed.",
)
"""The transformers source's default calibration text (English, mixed lengths)."""

_FACTORY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Exported:
    """One source, exported: the fp32 graph and what to check it with."""

    graph: Path
    """The fp32 ONNX file in the work directory."""
    input_names: list[str]
    output_names: list[str]
    reference_inputs: dict[str, np.ndarray]
    calibration: list[dict[str, np.ndarray]]
    """Feed dicts; the first one is the reference inputs."""
    framework_outputs: dict[str, np.ndarray] | None
    """The exporting framework's outputs on the reference inputs (None for an ONNX source)."""
    origin: str
    opset: int
    notes: list[str] = field(default_factory=list)


Step = Callable[[str], None]


def _no_step(_: str) -> None:
    return None


# ---- torch ------------------------------------------------------------------------------


def check_opset(opset: int, *, where: str, highest: int) -> None:
    if not MIN_OPSET <= opset <= highest:
        raise ConfigError.single(
            where,
            f"opset {opset} is not supported here: the exporter writes opsets {MIN_OPSET} to {highest}",
            f"pass --opset between {MIN_OPSET} and {highest} (default {DEFAULT_OPSET}); {MIN_OPSET} is the "
            "lowest that int8 QDQ (per-channel) and the float16 converter accept",
        )


def load_factory(spec: str) -> Callable[[], Any]:
    """The callable a ``pkg.module:factory`` spec names, or a ``ConfigError`` saying why not."""
    where = f"--from torch {spec}"
    if not _FACTORY.match(spec):
        raise ConfigError.single(
            where,
            "not a factory spec",
            "write pkg.module:factory (a module importable here and a function in it)",
        )
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError.single(
            where,
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc}",
            "install the package that provides it, or run from the directory that holds it",
        ) from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ConfigError.single(
            where, f"module {module_name!r} has no callable {attr!r}", "fix the name after the ':'"
        )
    return fn


def _factory_result(value: Any, spec: str) -> dict[str, Any]:
    import torch

    where = f"--from torch {spec}"
    contract = (
        "return (module, {name: tensor}) or {'module': ..., 'inputs': {...}} with optional 'outputs', "
        "'dynamic_axes', 'calibration' (docs/export.md)"
    )
    if isinstance(value, tuple) and len(value) == 2:
        value = {"module": value[0], "inputs": value[1]}
    if not isinstance(value, dict) or "module" not in value or "inputs" not in value:
        raise ConfigError.single(
            where,
            f"the factory returned {type(value).__name__}, not a module and its inputs",
            contract,
        )
    unknown = sorted(set(value) - {"module", "inputs", "outputs", "dynamic_axes", "calibration"})
    if unknown:
        raise ConfigError.single(
            where, f"the factory returned unknown keys: {', '.join(unknown)}", contract
        )
    if not isinstance(value["module"], torch.nn.Module):
        raise ConfigError.single(
            where,
            f"'module' is a {type(value['module']).__name__}, not a torch.nn.Module",
            contract,
        )
    for key, feeds in [
        ("inputs", value["inputs"]),
        *((f"calibration[{i}]", c) for i, c in enumerate(value.get("calibration") or [])),
    ]:
        if (
            not isinstance(feeds, dict)
            or not feeds
            or not all(isinstance(t, torch.Tensor) for t in feeds.values())
        ):
            raise ConfigError.single(
                where, f"{key!r} is not a non-empty {{name: torch.Tensor}} mapping", contract
            )
        if key != "inputs" and list(feeds) != list(value["inputs"]):
            raise ConfigError.single(
                where,
                f"{key} has inputs {list(feeds)}, the example has {list(value['inputs'])}",
                "give every calibration entry the same names as 'inputs'",
            )
    return value


def _forward_order(module: Any, names: list[str]) -> list[str]:
    """``names`` in ``forward``'s parameter order when they all are its parameters."""
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return names
    return sorted(names, key=params.index) if all(n in params for n in names) else names


def _torch_export(
    module: Any,
    feeds: dict[str, torch.Tensor],
    path: Path,
    outputs: list[str],
    axes: dict[str, dict[int, str]],
    opset: int,
    where: str,
) -> None:
    import torch

    tmp = path.with_suffix(".onnx.tmp")
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # tracer warnings (shape-dependent Python values are traced)
            torch.onnx.export(
                module,
                tuple(feeds.values()),
                str(tmp),
                input_names=list(feeds),
                output_names=outputs,
                dynamic_axes=axes or None,
                opset_version=opset,
                dynamo=False,
                do_constant_folding=True,
            )
    except Exception as exc:
        raise ConfigError.single(
            where,
            f"torch.onnx.export failed: {type(exc).__name__}: {str(exc).strip()[:600]}",
            "make the module traceable (no data-dependent Python control flow), or export it "
            "yourself and use --from onnx",
        ) from None
    tmp.replace(path)


def _framework_outputs(
    module: Any, feeds: dict[str, torch.Tensor], names: list[str] | None
) -> tuple[list[str], dict[str, np.ndarray]]:
    import torch

    with torch.no_grad():
        out = module(*feeds.values())
    if isinstance(out, torch.Tensor):
        out = (out,)
    elif hasattr(out, "to_tuple"):
        out = out.to_tuple()
    values = [o for o in out if isinstance(o, torch.Tensor)]
    if names is None:
        names = ["output"] if len(values) == 1 else [f"output_{i}" for i in range(len(values))]
    if len(names) != len(values):
        raise ConfigError.single(
            "outputs", f"{len(names)} output names for {len(values)} outputs", "name every output"
        )
    return names, {n: v.detach().cpu().numpy() for n, v in zip(names, values, strict=True)}


@contextlib.contextmanager
def _cwd_importable() -> Iterator[None]:
    """The working directory importable while a factory is loaded, called and exported (the
    user's own module may live there, as ``python -m`` would find it) — but after every
    installed package, so a ``numpy.py`` or ``torch.py`` there never replaces the real one,
    and off ``sys.path`` again afterwards, for the rest of the process."""
    here = str(Path.cwd())
    added = "" not in sys.path and here not in sys.path
    if added:
        sys.path.append(here)
    try:
        yield
    finally:
        if added and here in sys.path:
            sys.path.remove(here)


def from_torch(
    spec: str, work: Path, *, opset: int = DEFAULT_OPSET, step: Step = _no_step
) -> Exported:
    """Call the factory, export its module to ``work/fp32.onnx`` and record PyTorch's outputs
    (the working directory importable meanwhile, last: :func:`_cwd_importable`)."""
    with _cwd_importable():
        return _from_torch(spec, work, opset=opset, step=step)


def _from_torch(spec: str, work: Path, *, opset: int, step: Step) -> Exported:
    check_opset(opset, where="--opset", highest=TORCH_MAX_OPSET)
    factory = load_factory(spec)
    step("calling the factory")
    try:
        made = factory()
    except Exception as exc:
        raise ConfigError.single(
            f"--from torch {spec}",
            f"the factory raised {type(exc).__name__}: {exc}",
            "fix the factory; it is called with no arguments",
        ) from None
    value = _factory_result(made, spec)
    module = value["module"].eval()
    names = _forward_order(module, list(value["inputs"]))
    feeds = {n: value["inputs"][n] for n in names}
    calibration = [feeds, *({n: c[n] for n in names} for c in value.get("calibration") or [])]
    output_names, reference = _framework_outputs(module, feeds, value.get("outputs"))
    step(f"exporting with torch.onnx.export (opset {opset})")
    _torch_export(
        module,
        feeds,
        work / "fp32.onnx",
        output_names,
        value.get("dynamic_axes") or {},
        opset,
        f"--from torch {spec}",
    )
    return Exported(
        graph=work / "fp32.onnx",
        input_names=names,
        output_names=output_names,
        reference_inputs=_numpy(feeds),
        calibration=[_numpy(c) for c in calibration],
        framework_outputs=reference,
        origin=f"PyTorch module from {spec}, exported by omni-edge export",
        opset=opset,
    )


def _numpy(feeds: Mapping[str, torch.Tensor | np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() if hasattr(v, "detach") else v for k, v in feeds.items()}


# ---- transformers -----------------------------------------------------------------------


def resolve_model_dir(location: str) -> Path:
    where = f"--from transformers {location}"
    path = (
        resolve_package_location(location)
        if is_package_location(location)
        else Path(location).resolve()
    )
    if not (path / "config.json").is_file():
        raise ConfigError.single(
            where,
            f"{path} holds no config.json: not a transformers model directory",
            "point at the directory with config.json, the weights and the tokenizer files",
        )
    refuse_remote_code(path)  # before torch or transformers are imported
    return path


def from_transformers(
    location: str,
    work: Path,
    *,
    opset: int = DEFAULT_OPSET,
    sentences: tuple[str, ...] = CALIBRATION_SENTENCES,
    step: Step = _no_step,
) -> Exported:
    """The base model's ``last_hidden_state`` as a graph dynamic in batch and tokens."""
    check_opset(opset, where="--opset", highest=TORCH_MAX_OPSET)
    model_dir = resolve_model_dir(location)
    where = f"--from transformers {location}"
    step("loading the model and its tokenizer")
    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the export's own phases are the progress display
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
        model = AutoModel.from_pretrained(
            model_dir,
            dtype=torch.float32,
            attn_implementation="eager",
            trust_remote_code=False,
            use_safetensors=True,
        ).eval()
    except Exception as exc:
        raise ConfigError.single(
            where,
            f"transformers cannot load it: {type(exc).__name__}: {str(exc)[:400]}",
            "the directory needs config.json, the weights (safetensors) and the tokenizer files",
        ) from None

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(
            self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None
        ) -> Any:
            kwargs = {"attention_mask": attention_mask}
            if token_type_ids is not None:
                kwargs["token_type_ids"] = token_type_ids
            return self.model(input_ids=input_ids, **kwargs).last_hidden_state

    wrapper = LastHiddenState().eval()
    order = ["input_ids", "attention_mask", "token_type_ids"]

    def feeds_of(text: str) -> dict[str, torch.Tensor]:
        enc = tokenizer([text], return_tensors="pt")
        return {n: enc[n].to(torch.int64) for n in order if n in enc}

    calibration = [feeds_of(s) for s in sentences]
    feeds = calibration[0]
    if "input_ids" not in feeds:
        raise ConfigError.single(
            where, "the tokenizer gives no input_ids", "use a text model with a tokenizer"
        )
    _, reference = _framework_outputs(wrapper, feeds, ["last_hidden_state"])
    step(f"exporting with torch.onnx.export (opset {opset})")
    axes = {n: {0: "batch", 1: "tokens"} for n in [*feeds, "last_hidden_state"]}
    _torch_export(wrapper, feeds, work / "fp32.onnx", ["last_hidden_state"], axes, opset, where)
    return Exported(
        graph=work / "fp32.onnx",
        input_names=list(feeds),
        output_names=["last_hidden_state"],
        reference_inputs=_numpy(feeds),
        calibration=[_numpy(c) for c in calibration],
        framework_outputs=reference,
        opset=opset,
        origin=f"transformers {type(model).__name__} from {location}, exported by omni-edge export",
        notes=[
            f"reference input: the tokens of {sentences[0]!r}; calibration: {len(sentences)} sentences"
        ],
    )


def read_sentences(path: str) -> tuple[str, ...]:
    """Calibration sentences from a text file, one per non-empty line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError.single(
            f"--calibration-text {path}", f"cannot be read: {exc}", "give a UTF-8 text file"
        ) from None
    sentences = tuple(line.strip() for line in lines if line.strip())
    if not sentences:
        raise ConfigError.single(
            f"--calibration-text {path}", "holds no sentence", "write one sentence per line"
        )
    return sentences


# ---- onnx -------------------------------------------------------------------------------


def graph_opset(model: Any) -> int | None:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def from_onnx(
    file: str,
    work: Path,
    *,
    inputs: str | None,
    calibration: list[str] | None = None,
    step: Step = _no_step,
) -> Exported:
    """Copy an existing graph (its external data beside it is not supported: one file)."""
    import onnx

    where = f"--from onnx {file}"
    src = Path(file)
    if not src.is_file():
        raise ConfigError.single(where, "no such file", "point at an .onnx file")
    if inputs is None:
        raise ConfigError.single(
            where,
            "an ONNX source needs reference inputs",
            "pass --inputs FILE.npz (one array per graph input, named as the input)",
        )
    try:
        model = onnx.load(str(src), load_external_data=False)
    except Exception as exc:
        raise ConfigError.single(
            where, f"not a readable ONNX model: {type(exc).__name__}: {exc}", "export it again"
        ) from None
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        raise ConfigError.single(
            where,
            "the graph keeps its weights in external data files",
            "save it as one file (onnx.save(model, path, save_as_external_data=False)) first",
        )
    opset = graph_opset(model)
    highest = int(onnx.defs.onnx_opset_version())
    if opset is None or not MIN_OPSET <= opset <= highest:
        raise ConfigError.single(
            where,
            f"the graph's ai.onnx opset is {opset}; the exporter accepts {MIN_OPSET} to {highest}",
            "convert it first: onnx.version_converter.convert_version(model, 17)",
        )
    step("copying the graph")
    shutil.copyfile(src, work / "fp32.onnx")
    initializers = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    ref = _load_npz(inputs, names, "--inputs")
    cal = [ref, *(_load_npz(c, names, "--calibration") for c in calibration or [])]
    return Exported(
        graph=work / "fp32.onnx",
        input_names=names,
        output_names=[o.name for o in model.graph.output],
        reference_inputs=ref,
        calibration=cal,
        framework_outputs=None,
        opset=opset,
        origin=f"ONNX graph {src.name}, packaged by omni-edge export",
    )


def _load_npz(path: str, names: list[str], flag: str) -> dict[str, np.ndarray]:
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise ConfigError.single(
            f"{flag} {path}",
            f"not a readable .npz: {exc}",
            "write it with numpy.savez(path, **feeds)",
        ) from None
    missing, extra = [n for n in names if n not in arrays], sorted(set(arrays) - set(names))
    if missing or extra:
        raise ConfigError.single(
            f"{flag} {path}",
            f"arrays {sorted(arrays)} do not match the graph's inputs {names}",
            "one array per graph input, named as the input",
        )
    return {n: arrays[n] for n in names}
