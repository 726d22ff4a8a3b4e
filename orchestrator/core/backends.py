"""ONNX Runtime backends as data: one row per backend — the one place their names live.

Everything that differs between DirectML, VitisAI, QNN, OpenVINO, CUDA and the
CPU EP lives in the table below (in the manner of Olive's ``ExecutionProvider``
and ``DEVICE_TO_EXECUTION_PROVIDERS``; what a row holds is declared in
``orchestrator.core.ep_rows``): the backend's name, its EP, where the EP comes
from (the onnxruntime build that has it built in, the extra that installs it,
the plugin packages that ship it, the route venvs it lives in), which devices
it drives, the provider and session options a session gets on each kind of
device, what the EP holds besides the weights and keeps per new shape, its own
CPU threads, its own coverage report, and which precisions it runs (each with
its reason). The profile's backend names, the probe's EP → backend and device →
backend mappings, the ONNX Runtime stage kinds, the builds one environment may
hold (``orchestrator.core.ort_builds``), the coverage gate and the run record
all derive from it; code elsewhere reads rows and never branches on a vendor.
An EP that lives outside this repository (or a test's) is one more row,
added with :func:`register`.

This module imports nothing heavier than the bottom layer (no onnxruntime):
the planner and the profile read it.

Provider-option values may hold three placeholders, filled per placement by
:func:`session_spec`: ``{device_index}`` (the N of ``gpu:N``), ``{cache_dir}``
(this backend's compile cache under the omni-edge cache) and ``{cache_key}``
(artifact name, precision and graph digest, so a changed graph never reuses a
stale compiled blob).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from orchestrator.core import option_rules
from orchestrator.core.ep_rows import (
    CoverageReport,
    CpuThreads,
    OrtBackend,
    PluginEp,
    PrecisionHint,
    PrecisionRule,
    ShapeMemory,
)
from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import ep_cache_dir
from orchestrator.core.units import MiB

OrtBackendName = Literal["ort-vitisai", "ort-qnn", "ort-dml", "ort-openvino", "ort-cuda", "ort-cpu"]
"""The built-in ONNX Runtime backends, in the order the table lists them (the NPU EPs
first, the CPU EP last). A row of :data:`BACKENDS` exists for each (checked below);
a row :func:`register` adds later follows them."""

CPU_EP = "CPUExecutionProvider"

RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"
"""Session config key (ONNX Runtime >= 1.24) that makes the session remember
which EP took which node, read back with ``get_provider_graph_assignment_info()``."""
DISABLE_CPU_FALLBACK = "session.disable_cpu_ep_fallback"
"""Session config key: fail session creation instead of giving nodes to the CPU EP."""


ORT_DEVICE_TYPES: dict[str, str] = {"cpu": "CPU", "gpu": "GPU", "igpu": "GPU", "npu": "NPU"}
"""Device kind → the ``OrtHardwareDeviceType`` name ``get_ep_devices()`` reports for it."""


OPENVINO_RETAINED_PER_ITEM = 12 * MiB
"""What OpenVINO's CPU plugin keeps, per item, for a graph whose output shape is
computed from the data (a dimension no input has: the Piper voice's ``samples``,
set by durations it samples): every item brings shapes it has not seen, and the
plugin keeps memory for each. Measured here (onnxruntime-openvino 1.24.1, the
voice's route worker, one call at a time, 40-200 character sentences with the
voice's own scales): 838 MiB after 6 items, 1.68 GiB after 60, 2.53 GiB after
150 — about 12 MiB an item with no plateau; with fixed durations (scales 0, 1,
0) the same worker stays at 838 MiB. The ONNX Runtime CPU EP does not grow."""
OPENVINO_ITEM_HORIZON = 64
"""Items the estimate covers (64 x 12 MiB = 768 MiB; the curve above puts 64 items of
up to 200 characters at about 1.7 GiB, the estimate at 1.49 GiB for the voice):
more than a calibration run of bench/calibration.py speaks (three prompts, each
alone and four at once; its worker measured 1.19-1.27 GiB). Beyond it the route
worker is recycled before it passes its budget (stages/exported_graph/runner.py),
and calibration keeps this growth in the budget on top of what the worker needs
(resident + one call's rise), never the peak the recycling produced
(docs/calibration.md, "A worker recycled at its budget")."""


_TABLE: list[OrtBackend] = [
    OrtBackend(
        backend="ort-vitisai",
        ep="VitisAIExecutionProvider",
        distribution="onnxruntime-vitisai",
        build_install="the Ryzen AI software's installer (Windows)",
        install=(
            "install AMD Ryzen AI Software (its environment carries the VitisAI EP build of "
            "onnxruntime; it is not on PyPI) and run natively on Windows or through its python.exe"
        ),
        drives={"npu": ("amd",)},
        provider_options={
            "*": {
                "cache_dir": "{cache_dir}",
                "cache_key": "{cache_key}",
                # Write the compiled model and vitisai_ep_report.json to cache_dir, where
                # the coverage gate reads the report.
                "enable_cache_file_io_in_mem": "0",
            }
        },
        precisions=(
            PrecisionRule(
                "int8", True, "the XDNA NPU compiles QDQ int8 graphs (A8W8/A16W8 from AMD Quark)"
            ),
            PrecisionRule("bf16", True, "XDNA 2 NPUs (Strix/Krackan) compile bf16 graphs"),
            PrecisionRule(
                "fp32",
                False,
                "the XDNA NPU has no fp32 datapath: fp32 nodes stay on the CPU (quantize to QDQ int8 with Quark, or export bf16)",
            ),
            PrecisionRule(
                "fp16",
                False,
                "the VitisAI EP does not compile fp16 graphs for the NPU (export QDQ int8 or bf16)",
            ),
            PrecisionRule(
                "int4",
                False,
                "weight-only int4 runs through AMD's LLM flow, not the VitisAI EP's graph compiler",
            ),
        ),
        cache_options=("cache_dir", "cache_key", "enable_cache_file_io_in_mem"),
        # The EP can claim nodes and run them on its own CPU path: its report's device split
        # is the coverage (deviceStat names the accelerator NPU, DPU, IPU or AIE).
        coverage_report=CoverageReport(
            file="vitisai_ep_report.json",
            accelerators=("NPU", "DPU", "IPU", "AIE"),
            env="XLNX_ONNX_EP_REPORT_FILE",
        ),
        options={
            "cache_dir": "cache_dir",
            "cache_key": "value",
            "enable_cache_file_io_in_mem": "value",
            "config_file": "user_file",
            "xclbin": "user_file",
        },
        workspace_fixed=256 * MiB,
        workspace_weight_copies=1.0,
        workspace_reason=(
            "the compiled NPU model keeps a packed copy of the weights in host RAM shared with "
            "the NPU, plus the EP runtime (~256 MiB)"
        ),
    ),
    OrtBackend(
        backend="ort-qnn",
        ep="QNNExecutionProvider",
        distribution="onnxruntime-qnn",
        extra="qnn",
        build_install="pip install 'omni-edge[qnn]' (Windows; 2.x is a plugin EP on top of onnxruntime)",
        install=(
            "pip install onnxruntime onnxruntime-qnn numpy (or 'omni-edge[qnn]'; Windows on Snapdragon, "
            "Python for ARM64) into the interpreter of the route that opens the sessions (this one, or a venv "
            "named as the route); onnxruntime-qnn 2.x is a plugin EP: omni-edge registers its library there "
            "(onnxruntime_qnn.get_library_path()), and `omni-edge probe` must then list a "
            "QNNExecutionProvider NPU under that route's EP devices"
        ),
        drives={"npu": ("qualcomm",)},
        provider_options={
            "*": {"backend_path": "QnnHtp.dll", "htp_performance_mode": "high_performance"}
        },
        precision_options={
            # HTP has no fp32 datapath; with this flag an fp32 graph runs in fp16.
            "fp32": {"enable_htp_fp16_precision": "1"},
        },
        options={
            "backend_path": "user_file",
            "htp_performance_mode": "value",
            "enable_htp_fp16_precision": "value",
            "htp_graph_finalization_optimization_mode": "value",
            "htp_arch": "value",
            "soc_model": "value",
            "device_id": "value",
            "vtcm_mb": "value",
            "qnn_context_priority": "value",
        },
        precisions=(
            PrecisionRule(
                "int8",
                True,
                "HTP runs QDQ graphs (uint8/uint16 activations, int8 weights) natively",
            ),
            PrecisionRule("fp16", True, "HTP v73+ (Snapdragon X Elite) runs fp16"),
            PrecisionRule(
                "fp32",
                True,
                "HTP runs an fp32 graph in fp16 (enable_htp_fp16_precision=1); the numeric gate decides whether that is close enough",
            ),
            PrecisionRule("bf16", False, "HTP has no bf16 datapath"),
            PrecisionRule(
                "int4",
                False,
                "MatMulNBits (weight-only int4) is a contrib op the QNN EP does not take; use QDQ int8/int16",
            ),
        ),
        workspace_fixed=128 * MiB,
        workspace_weight_copies=1.0,
        workspace_reason=(
            "the HTP context binary holds its own prepared copy of the weights, plus the QNN "
            "runtime's buffers (~128 MiB)"
        ),
        plugins=(
            PluginEp(
                package="onnxruntime-qnn",
                module="onnxruntime_qnn",
                library="onnxruntime_providers_qnn",
                registration="onnxruntime-qnn",
                min_version=2,
                device_type="NPU",
                option_paths={"backend_path": "get_qnn_htp_path"},
            ),
        ),
    ),
    OrtBackend(
        backend="ort-dml",
        ep="DmlExecutionProvider",
        distribution="onnxruntime-directml",
        extra="directml",
        build_install="pip install 'omni-edge[directml]' (Windows)",
        install="pip install onnxruntime-directml numpy (Windows only; run natively or through a Windows-side python.exe)",
        # Any D3D12 adapter: discrete and integrated GPUs of every vendor, and NPUs
        # that expose a compute-only adapter.
        drives={"gpu": (), "igpu": (), "npu": ()},
        provider_options={
            # minimum_power picks the integrated adapter, high_performance the discrete one
            # (DXGI's own preference order), so no fragile adapter index is needed.
            "igpu": {"device_filter": "gpu", "performance_preference": "minimum_power"},
            "gpu": {"device_filter": "gpu", "performance_preference": "high_performance"},
            "npu": {"device_filter": "npu"},
        },
        precisions=(
            PrecisionRule("fp32", True, "DirectML runs fp32 on any D3D12 GPU"),
            PrecisionRule("fp16", True, "DirectML runs fp16 natively; the usual choice on iGPUs"),
            PrecisionRule(
                "int8", True, "DirectML has QuantizeLinear/DequantizeLinear and QLinear operators"
            ),
            PrecisionRule(
                "int4",
                True,
                "MatMulNBits has a DirectML kernel (the int4 LLM path of onnxruntime-genai)",
            ),
            PrecisionRule("bf16", False, "DirectML has no bf16 tensor type"),
        ),
        # The DirectML EP documents both as required: it does not support memory
        # patterns or parallel execution.
        session_options={"enable_mem_pattern": False, "execution_mode": "sequential"},
        options={"device_filter": "value", "performance_preference": "value", "device_id": "value"},
        workspace_fixed=128 * MiB,
        workspace_weight_copies=1.0,
        workspace_reason=(
            "DirectML uploads every initializer into a D3D12 resource (on an iGPU that is host "
            "RAM again, so the weights are held twice) plus ~128 MiB of descriptor heaps and "
            "command allocators"
        ),
    ),
    OrtBackend(
        backend="ort-openvino",
        ep="OpenVINOExecutionProvider",
        distribution="onnxruntime-openvino",
        extra="openvino",
        # onnxruntime-openvino replaces the onnxruntime module: its own venv, found by name
        route_venvs=(("openvino-venv", "openvino"), ("ep-openvino", "ep-openvino")),
        install=(
            "onnxruntime-openvino replaces the onnxruntime module, so give it its own "
            "environment: python -m venv .venvs/openvino && .venvs/openvino/bin/pip install "
            "onnxruntime-openvino numpy; or, on an Intel machine, the plugin EP next to the plain "
            "onnxruntime: pip install onnxruntime-ep-openvino (registered by omni-edge in the route; "
            "`omni-edge probe` must list an OpenVINOExecutionProvider device)"
        ),
        # The CPU plugin runs on any x86 CPU; the GPU and NPU plugins drive Intel's.
        drives={"cpu": (), "gpu": ("intel",), "igpu": ("intel",), "npu": ("intel",)},
        provider_options={
            "cpu": {"device_type": "CPU"},
            # GPU and NPU compiles are slow; OpenVINO caches the compiled blob in cache_dir.
            "igpu": {"device_type": "GPU", "cache_dir": "{cache_dir}"},
            "gpu": {"device_type": "GPU", "cache_dir": "{cache_dir}"},
            "npu": {"device_type": "NPU", "cache_dir": "{cache_dir}"},
        },
        precision_hint=PrecisionHint(
            # OpenVINO's own property, through load_config: the plugin EP ignores the
            # `precision` provider option ("set it via the load_config as
            # INFERENCE_PRECISION_HINT"), the built-in EP (>= 1.23) reads both, and the
            # ONNX Runtime docs deprecate `precision` in favour of load_config.
            option="load_config",
            property="INFERENCE_PRECISION_HINT",
            values={
                # A QDQ int8 (or int4) graph computes what it does not quantize in fp32,
                # as the CPU EP's reference does.
                "*": {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "int8": "f32", "int4": "f32"},
                # f16 is the NPU plugin's only inference precision: asked for by name.
                "npu": {"fp32": "f16", "fp16": "f16", "int8": "f16"},
            },
        ),
        precisions=(
            PrecisionRule(
                "fp32",
                True,
                "the CPU and GPU plugins run fp32 when asked to (INFERENCE_PRECISION_HINT f32 in load_config; unasked, the CPU plugin computes in bf16 on a CPU with AMX-BF16 and the GPU plugin in f16)",
                ("cpu", "gpu", "igpu"),
            ),
            PrecisionRule(
                "fp32",
                True,
                "the NPU plugin computes fp32 graphs in fp16, its only precision (asked for: INFERENCE_PRECISION_HINT f16); the numeric gate decides whether that is close enough",
                ("npu",),
            ),
            PrecisionRule(
                "fp16", True, "OpenVINO runs fp16 graphs on every device (upconverted on the CPU)"
            ),
            PrecisionRule("int8", True, "OpenVINO turns QDQ int8 into its low-precision kernels"),
            PrecisionRule(
                "bf16", True, "the CPU plugin runs bf16 (native with AMX/AVX512-BF16)", ("cpu",)
            ),
            PrecisionRule(
                "bf16", False, "the GPU and NPU plugins have no bf16 path", ("gpu", "igpu", "npu")
            ),
            PrecisionRule(
                "int4",
                False,
                "MatMulNBits is not taken by the OpenVINO EP's graph partitioner in general; export QDQ int8",
            ),
        ),
        cache_options=("cache_dir",),
        options={
            "device_type": "value",
            "precision": "value",
            "num_of_threads": "value",
            "num_streams": "value",
            "model_priority": "value",
            "enable_qdq_optimizer": "value",
            "disable_dynamic_shapes": "value",
            "enable_opencl_throttling": "value",
            "cache_dir": "cache_dir",
            "load_config": "ov_config",
        },
        workspace_fixed=320 * MiB,
        workspace_weight_copies=1.0,
        shape_memory=ShapeMemory(
            per_item=OPENVINO_RETAINED_PER_ITEM,
            per_item_name="OPENVINO_RETAINED_PER_ITEM",
            items=OPENVINO_ITEM_HORIZON,
            items_name="OPENVINO_ITEM_HORIZON",
            who="OpenVINO",
        ),
        # The CPU plugin runs its own threads: ONNX Runtime's intra-op threads only run the
        # nodes left to the CPU EP.
        cpu_threads=CpuThreads(option="num_of_threads", when=("device_type", "CPU")),
        workspace_reason=(
            "OpenVINO compiles the graph into its own plugin model with its own copy of the "
            "weights; opening the piper voice (60 MiB of weights) with device_type CPU added "
            "354 MiB of RSS here"
        ),
        plugins=(
            PluginEp(
                package="onnxruntime-ep-openvino",
                module="onnxruntime_ep_openvino",
                library="onnxruntime_providers_openvino_plugin",
                registration="onnxruntime-ep-openvino",
                select_by={"device_type": "ov_device"},
            ),
        ),
    ),
    OrtBackend(
        backend="ort-cuda",
        ep="CUDAExecutionProvider",
        distribution="onnxruntime-gpu",
        extra="cuda",
        install="pip install onnxruntime-gpu numpy (with a CUDA 12 driver)",
        drives={"gpu": ("nvidia",)},
        provider_options={"*": {"device_id": "{device_index}"}},
        options={
            "device_id": "value",
            "gpu_mem_limit": "value",
            "arena_extend_strategy": "value",
            "cudnn_conv_algo_search": "value",
            "do_copy_in_default_stream": "value",
            "enable_cuda_graph": "value",
            "use_tf32": "value",
            "prefer_nhwc": "value",
        },
        precisions=(
            PrecisionRule("fp32", True, "cuDNN/cuBLAS fp32 (TF32 where allowed)"),
            PrecisionRule("fp16", True, "fp16 tensor-core kernels"),
            PrecisionRule("bf16", True, "bf16 kernels for the common ops (Ampere and newer)"),
            PrecisionRule("int8", True, "QDQ graphs run (dequantized around unsupported ops)"),
            PrecisionRule("int4", True, "MatMulNBits has a CUDA kernel"),
        ),
        workspace_fixed=512 * MiB,
        workspace_reason=(
            "the CUDA context plus cuBLAS/cuDNN handles and their workspaces take "
            "300–500 MiB of VRAM on recent drivers before the first tensor"
        ),
    ),
    OrtBackend(
        backend="ort-cpu",
        ep=CPU_EP,
        distribution="onnxruntime",
        extra="cpu",
        install="pip install onnxruntime numpy",
        drives={"cpu": ()},
        provider_options={"*": {}},
        precisions=(
            PrecisionRule("fp32", True, "MLAS kernels cover the whole ONNX opset in fp32"),
            PrecisionRule(
                "fp16",
                True,
                "the CPU EP has fp16 kernels for the common ops; an op without one fails session creation, which the coverage gate reports",
            ),
            PrecisionRule(
                "bf16",
                True,
                "the CPU EP runs bf16 graphs where it has kernels (AVX512-BF16/AMX fast, otherwise emulated)",
            ),
            PrecisionRule("int8", True, "QDQ and QOperator int8 run through MLAS int8 GEMMs"),
            PrecisionRule("int4", True, "weight-only int4 (MatMulNBits) has a CPU kernel"),
        ),
        workspace_fixed=32 * MiB,
        workspace_reason=(
            "the CPU EP computes on the weights in place; its arena and thread pool came to "
            "~30 MiB over the weights when the piper voice was opened here"
        ),
    ),
]

BACKENDS: dict[str, OrtBackend] = {}
"""The table, by backend name, in its order (:data:`OrtBackendName`'s, then the rows
:func:`register` added)."""
EP_BACKENDS: dict[str, str] = {}
"""Execution provider name → backend name."""
PATH_OPTIONS: set[str] = set()
"""Provider options whose values are local paths (translated for host-process routes)."""


def _derive() -> None:
    """Fill the views above from the table (in place: modules hold them by name)."""
    BACKENDS.clear()
    BACKENDS.update({row.backend: row for row in _TABLE})
    EP_BACKENDS.clear()
    EP_BACKENDS.update({row.ep: row.backend for row in _TABLE})
    PATH_OPTIONS.clear()
    PATH_OPTIONS.update(
        name
        for row in _TABLE
        for name, kind in row.options.items()
        if kind in ("cache_dir", "user_file")
    )


_derive()
if tuple(BACKENDS) != get_args(OrtBackendName):  # pragma: no cover - a table edit gone wrong
    raise AssertionError(
        f"the rows {tuple(BACKENDS)} do not match OrtBackendName {get_args(OrtBackendName)}"
    )


def rows() -> tuple[OrtBackend, ...]:
    """Every row, in table order."""
    return tuple(_TABLE)


def register(row: OrtBackend) -> None:
    """Add an EP's row after the others (an EP that lives outside this repository, or a
    test's); its backend name and its EP must be new. Every reader of the table follows it:
    the backend names a profile may list, the probe's EP → backend mapping, the ONNX Runtime
    stage kinds' backends, the builds an environment may hold (``ort_builds``)."""
    clash = [
        f"{what} {value!r} is already the table's"
        for what, value, taken in (
            ("backend", row.backend, BACKENDS),
            ("EP", row.ep, EP_BACKENDS),
        )
        if value in taken
    ]
    if clash:
        raise ValueError(f"ONNX Runtime backend {row.backend!r}: {'; '.join(clash)}")
    _TABLE.append(row)
    _derive()


def unregister(name: str) -> None:
    """Remove a registered row (a test's, when it is done); the built-in rows stay."""
    if name in get_args(OrtBackendName):
        raise ValueError(f"{name!r} is a built-in row")
    _TABLE[:] = [r for r in _TABLE if r.backend != name]
    _derive()


def row_for_ep(ep: str) -> OrtBackend | None:
    """The row of the execution provider ``ep`` (its registered name), or None."""
    name = EP_BACKENDS.get(ep)
    return BACKENDS[name] if name is not None else None


def _known_backend(name: str) -> str:
    """``name`` when it is a row's; else the error a closed set of names gives."""
    if name not in BACKENDS:
        shown = [repr(k) for k in BACKENDS]
        raise PydanticCustomError(
            "literal_error",
            "Input should be {expected}",
            {"expected": f"{', '.join(shown[:-1])} or {shown[-1]}"},
        )
    return name


OrtBackendKey = Annotated[str, AfterValidator(_known_backend)]
"""An ONNX Runtime backend's name in a config (a row's, registered ones included)."""


class TableBackends:
    """The table's backend names, read when asked: the ``backends`` of the ONNX Runtime stage
    kinds (on the class or an instance), so that a row registered later is among them."""

    def __get__(self, obj: object, owner: type | None = None) -> tuple[str, ...]:
        return tuple(BACKENDS)


def plugin_wire(ep: str | None = None) -> list[dict[str, Any]]:
    """The plugin EPs (all, or those of ``ep``) as the route worker takes them: ``probe``
    registers every one installed, ``open`` the target EP's when the route's
    onnxruntime does not have it built in."""
    return [
        {"ep": row.ep, **p.to_dict()}
        for row in _TABLE
        for p in row.plugins
        if ep is None or row.ep == ep
    ]


def backend(name: str) -> OrtBackend:
    """The row for ``name``; ``KeyError`` names the known backends."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise KeyError(
            f"{name!r} is not an ONNX Runtime backend (known: {', '.join(BACKENDS)})"
        ) from None


def config_option_problem(backend_name: str, option: str, value: Any) -> tuple[str, str] | None:
    """(what, how to fix) when a pipeline config may not give ``backend_name`` the provider
    option ``option`` = ``value``, by its row's allow-list (``option_rules.config_problem``)."""
    return option_rules.config_problem(backend(backend_name), option, value)


def user_options(backend_name: str) -> dict[str, str]:
    """The provider options the user's settings give ``backend_name`` (``option_rules.user_options``)."""
    return option_rules.user_options(backend_name, BACKENDS)


def backends_for_device(kind: str, vendor: str, eps: list[str] | tuple[str, ...]) -> list[str]:
    """The backends among ``eps`` (execution provider names, in the order an
    interpreter listed them) that drive a device of ``kind`` made by ``vendor``."""
    out: list[str] = []
    for ep in eps:
        name = EP_BACKENDS.get(ep)
        if name is not None and BACKENDS[name].drives_device(kind, vendor) and name not in out:
            out.append(name)
    return out


def precision_rule(backend_name: str, device_kind: str, precision: str) -> PrecisionRule | None:
    """The rule for one backend × device kind × precision, or None when the table is silent."""
    for rule in backend(backend_name).precisions:
        if rule.precision == precision and (
            not rule.device_kinds or device_kind in rule.device_kinds
        ):
            return rule
    return None


def runnable_precisions(backend_name: str, device_kind: str) -> list[str]:
    """Precisions this backend runs on this kind of device, in table order."""
    out: list[str] = []
    for rule in backend(backend_name).precisions:
        if (
            rule.supported
            and (not rule.device_kinds or device_kind in rule.device_kinds)
            and rule.precision not in out
        ):
            out.append(rule.precision)
    return out


def workspace_bytes(backend_name: str, weight_bytes: int) -> int:
    row = backend(backend_name)
    return row.workspace_fixed + int(row.workspace_weight_copies * weight_bytes)


@dataclass(frozen=True)
class SessionSpec:
    """Everything a worker needs to open one session (plain data; crosses processes)."""

    graph: str
    providers: list[str]
    provider_options: list[dict[str, str]]
    session_options: dict[str, Any]
    session_config: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "providers": list(self.providers),
            "provider_options": [dict(o) for o in self.provider_options],
            "session_options": dict(self.session_options),
            "session_config": dict(self.session_config),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SessionSpec:
        return cls(
            graph=str(d["graph"]),
            providers=list(d["providers"]),
            provider_options=[dict(o) for o in d["provider_options"]],
            session_options=dict(d.get("session_options", {})),
            session_config=dict(d.get("session_config", {})),
        )

    def with_config(self, **entries: str) -> SessionSpec:
        return SessionSpec(
            self.graph,
            self.providers,
            self.provider_options,
            self.session_options,
            {**self.session_config, **entries},
        )


SPINNING_ENV = "OMNI_EDGE_ORT_SPINNING"
"""Set to 1: sessions with planned threads keep ONNX Runtime's default, spinning thread pools
(for a benchmark that compares the two; ``with_cpu_threads``)."""
NOT_SPINNING = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}
"""ONNX Runtime's thread pools spin (busy-wait) after each parallel section by default; where
the planner split the cores among stages, that spinning takes the time of the stage beside it
(a decoder whose next token waits). Off where threads are planned: on the 2-core machine the
voice conversation's first audio came sooner without it (docs/benchmarks.md)."""


def with_cpu_threads(spec: dict[str, Any], threads: int | None) -> dict[str, Any]:
    """A session spec (its wire form, ``SessionSpec.to_dict``) whose session runs ``threads``
    CPU threads: ONNX Runtime's ``intra_op_num_threads`` (the calling thread and threads − 1
    workers), one inter-op thread, thread pools that do not spin between calls
    (:data:`NOT_SPINNING`, unless ``OMNI_EDGE_ORT_SPINNING=1``), and an EP's own threads where
    its row says how (``cpu_threads``: OpenVINO's ``num_of_threads`` where it runs on the CPU).
    ``threads`` None: the spec unchanged (ONNX Runtime's default: a thread per core). The spec
    passed in is not changed."""
    if threads is None:
        return spec
    out = SessionSpec.from_dict(spec)
    options = {**out.session_options, "intra_op_num_threads": threads, "inter_op_num_threads": 1}
    provider_options = [dict(o) for o in out.provider_options]
    for i, ep in enumerate(out.providers):
        row = row_for_ep(ep)
        own = row.cpu_threads if row is not None else None
        if own is not None:
            option, prefix = own.when
            if provider_options[i].get(option, "").upper().startswith(prefix.upper()):
                provider_options[i][own.option] = str(threads)
    spinning = os.environ.get(SPINNING_ENV) == "1"
    config = {**({} if spinning else NOT_SPINNING), **out.session_config}
    return SessionSpec(out.graph, out.providers, provider_options, options, config).to_dict()


def session_spec(
    backend_name: str,
    *,
    graph: str,
    device_kind: str,
    device_id: str,
    precision: str,
    cache_key: str,
    overrides: dict[str, Any] | None = None,
    target_only: bool = False,
    cache_dir: str | None = None,
) -> SessionSpec:
    """The providers, provider options and session options for one placement.

    The target EP comes first; the CPU EP follows unless the target *is* the CPU
    EP or ``target_only`` is set, in which case ``session.disable_cpu_ep_fallback``
    makes ORT fail rather than hand nodes to the CPU. ``overrides`` (the stage
    config's ``provider_options`` for this backend, checked against the row's allow-list
    when the config was read: :func:`config_option_problem`) win over the table, and the
    user's own settings (:func:`user_options`) over both.
    """
    row = backend(backend_name)
    template = row.provider_options.get(device_kind, row.provider_options.get("*", {}))
    index = device_id.split(":", 1)[1] if ":" in device_id else "0"
    if cache_dir is None:
        cache_dir = str(ep_cache_dir(backend_name))
    values = {"device_index": index, "cache_dir": cache_dir, "cache_key": cache_key}
    options = {k: v.format(**values) for k, v in template.items()}
    options.update(row.precision_options.get(precision, {}))
    options.update({k: _option_str(v) for k, v in (overrides or {}).items()})
    options.update(user_options(backend_name))
    if row.precision_hint is not None:
        device_name = options.get("device_type") or ORT_DEVICE_TYPES.get(
            device_kind, device_kind.upper()
        )
        _add_precision_hint(options, row, device_name, device_kind, precision)
    providers = [row.ep]
    provider_options = [options]
    config: dict[str, str] = {}
    if row.ep != CPU_EP:
        if target_only:
            config[DISABLE_CPU_FALLBACK] = "1"
        else:
            providers.append(CPU_EP)
            provider_options.append({})
    return SessionSpec(graph, providers, provider_options, dict(row.session_options), config)


def keyed_options(backend_name: str, spec: SessionSpec) -> dict[str, Any]:
    """The part of a session spec that changes what runs (the evidence key's share).

    Cache locations are left out: moving the cache must not invalidate evidence.
    """
    row = backend(backend_name)
    return {
        "providers": list(spec.providers),
        "provider_options": [
            {k: v for k, v in sorted(opts.items()) if k not in row.cache_options}
            for opts in spec.provider_options
        ],
        "session_options": dict(sorted(spec.session_options.items())),
        "session_config": dict(sorted(spec.session_config.items())),
    }


def _add_precision_hint(
    options: dict[str, str], row: OrtBackend, device_name: str, device_kind: str, precision: str
) -> None:
    """Put ``row``'s precision hint for ``precision`` on ``device_name`` into ``options``,
    beside what a user's own value of that option holds (theirs wins for the property)."""
    hint = row.precision_hint
    assert hint is not None
    value = hint.value(device_kind, precision)
    if value is None:
        return
    given = options.get(hint.option)
    config: Any = {}
    if given:
        try:
            config = json.loads(given)
        except ValueError:
            config = None
        if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
            raise ConfigError.single(
                f"provider_options.{row.backend}.{hint.option}",
                f"{given[:80]!r} is not a JSON object of device names to properties, which {row.ep} takes "
                f"(and where the planned precision goes: {hint.property})",
                f'write it as JSON, e.g. \'{{"{device_name}": {{"{hint.property}": "{value}"}}}}\', or leave it out',
            )
    config.setdefault(device_name, {}).setdefault(hint.property, value)
    options[hint.option] = json.dumps(config, sort_keys=True)


def _option_str(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
