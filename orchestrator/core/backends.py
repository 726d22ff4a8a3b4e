"""ONNX Runtime backends as data: one row per backend — the one place their names live.

Everything that differs between DirectML, VitisAI, QNN, OpenVINO, CUDA and the
CPU EP lives in the table below (in the manner of Olive's ``ExecutionProvider``
and ``DEVICE_TO_EXECUTION_PROVIDERS``): the backend's name, its EP, where the
EP comes from, which devices it drives, the provider and session options a
session gets on each kind of device, what the EP holds besides the weights,
and which precisions it runs (each with its reason). The profile's backend
names, the probe's EP → backend and device → backend mappings and the
``exported_graph`` stage kind all derive from it; code elsewhere reads rows and
never branches on a vendor.

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
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from orchestrator.core import option_rules
from orchestrator.core.errors import ConfigError
from orchestrator.core.option_rules import OptionKind
from orchestrator.core.settings import ep_cache_dir
from orchestrator.core.units import MiB

OrtBackendName = Literal["ort-vitisai", "ort-qnn", "ort-dml", "ort-openvino", "ort-cuda", "ort-cpu"]
"""The ONNX Runtime backends, in the order the table lists them (the NPU EPs
first, the CPU EP last). A row of :data:`BACKENDS` exists for each, and only
for these (checked below)."""

CPU_EP = "CPUExecutionProvider"

RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"
"""Session config key (ONNX Runtime >= 1.24) that makes the session remember
which EP took which node, read back with ``get_provider_graph_assignment_info()``."""
DISABLE_CPU_FALLBACK = "session.disable_cpu_ep_fallback"
"""Session config key: fail session creation instead of giving nodes to the CPU EP."""


@dataclass(frozen=True)
class PrecisionRule:
    """Whether a backend runs graphs at ``precision`` (on ``device_kinds``), and why."""

    precision: str
    supported: bool
    reason: str
    device_kinds: tuple[str, ...] = ()
    """Empty: any device kind the backend drives."""


ORT_DEVICE_TYPES: dict[str, str] = {"cpu": "CPU", "gpu": "GPU", "igpu": "GPU", "npu": "NPU"}
"""Device kind → the ``OrtHardwareDeviceType`` name ``get_ep_devices()`` reports for it."""


@dataclass(frozen=True)
class PrecisionHint:
    """How a session tells its EP the precision to compute at, so that no device default decides it.

    OpenVINO picks an inference precision per device when it is told none: bf16
    on a CPU with AMX-BF16, f16 on its GPU (and NPU) plugin. An fp32 graph then
    runs at bf16 or f16 without a word: silero-vad-op18 at "fp32" through the
    OpenVINO plugin EP measured rel L2 6.2e-2 against the CPU EP on a Xeon with
    AMX-BF16, 2.5e-7 with the hint f32. The planned precision is a promise, so
    every session of such a backend asks for it: :func:`session_spec` writes
    ``{DEVICE: {property: value}}`` into the provider option ``option`` (JSON),
    where the plan shows it. A user's own ``option`` in the stage config is
    kept; the hint is added to it unless it names the property itself.
    """

    option: str
    """The provider option that carries it (OpenVINO's ``load_config``: JSON, device name → properties)."""
    property: str
    """The property that sets the precision (OpenVINO's ``INFERENCE_PRECISION_HINT``)."""
    values: dict[str, dict[str, str]]
    """Device kind (``*``: any other) → the plan's precision → the property's value."""

    def value(self, device_kind: str, precision: str) -> str | None:
        for kind in (device_kind, "*"):
            if precision in self.values.get(kind, {}):
                return self.values[kind][precision]
        return None


@dataclass(frozen=True)
class PluginEp:
    """An EP that ships as a plugin library in a package of its own (ONNX Runtime >= 1.22).

    Installing the package is not enough: the route that opens sessions must
    register the library (``onnxruntime.register_execution_provider_library``)
    before ``get_ep_devices()`` lists the EP's devices, and a session takes the
    EP through ``SessionOptions.add_provider_for_devices`` — the EP never
    appears in ``get_available_providers()``. The route worker does both
    (``orchestrator/ort/worker.py``); this row says where the library is.
    """

    package: str
    """The PyPI distribution (``pip install <package>`` next to the plain ``onnxruntime``)."""
    module: str
    """Its import name; ``module.get_library_path()`` names the library when it has one."""
    library: str
    """The library's file stem inside the package (``lib<stem>.so`` / ``<stem>.dll``),
    looked for when the module has no ``get_library_path()``."""
    registration: str
    """The name the library is registered under (any name; one per process)."""
    min_version: int = 0
    """The first major version that is a plugin (``onnxruntime-qnn`` 1.x was a full build)."""
    option_paths: dict[str, str] = field(default_factory=dict)
    """Provider option → the module's function that returns a file inside the
    package, used when the option names a bare file (``backend_path: QnnHtp.dll``)."""
    device_type: str = ""
    """``CPU``/``GPU``/``NPU``: the only type of device a session takes from it (empty: any)."""
    select_by: dict[str, str] = field(default_factory=dict)
    """Provider option → ``ep_metadata`` key: the option picks the EP device
    (case-insensitive prefix of that metadata value) and is not passed to the EP,
    whose device the selection already fixes (OpenVINO's ``device_type`` → ``ov_device``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "module": self.module,
            "library": self.library,
            "registration": self.registration,
            "min_version": self.min_version,
            "option_paths": dict(self.option_paths),
            "select_by": dict(self.select_by),
            "device_type": self.device_type,
        }


@dataclass(frozen=True)
class OrtBackend:
    """How one ``ort-*`` backend opens a session, and what it costs besides weights."""

    backend: OrtBackendName
    ep: str
    """The execution provider's registered name."""
    install: str
    """How a user gets this EP into an interpreter (the remedy for an unreachable route)."""
    drives: dict[str, tuple[str, ...]]
    """The devices it drives: device kind (``cpu``, ``gpu``, ``igpu``, ``npu``) →
    the vendors whose devices of that kind it drives (empty: any vendor)."""
    provider_options: dict[str, dict[str, str]]
    """Per device kind (``cpu``, ``gpu``, ``igpu``, ``npu``; ``*`` for any)."""
    precisions: tuple[PrecisionRule, ...]
    """Which precisions it runs on which kind of device, each with its reason."""
    session_options: dict[str, Any] = field(default_factory=dict)
    """Attributes set on ``onnxruntime.SessionOptions`` (``execution_mode`` by name)."""
    precision_options: dict[str, dict[str, str]] = field(default_factory=dict)
    """Extra provider options when the graph is at a given precision."""
    cache_options: tuple[str, ...] = ()
    """Options that only say where compiled blobs go; left out of evidence keys."""
    workspace_fixed: int = 0
    workspace_weight_copies: float = 0.0
    workspace_reason: str = ""
    """Why the EP's own memory is ``fixed + copies × weights`` (evidence E)."""
    plugins: tuple[PluginEp, ...] = ()
    """Packages that ship this EP as a plugin library (besides any onnxruntime build that has it built in)."""
    precision_hint: PrecisionHint | None = None
    """How a session asks for the plan's precision (an EP that otherwise picks one per device)."""
    options: dict[str, OptionKind] = field(default_factory=dict)
    """The provider options a stage config (``provider_options.<backend>``) or the user's
    settings may give, each with its kind (:data:`OptionKind`); every other one is refused."""

    def drives_device(self, kind: str, vendor: str) -> bool:
        """Whether this backend can drive a device of ``kind`` made by ``vendor``."""
        vendors = self.drives.get(kind)
        return vendors is not None and (not vendors or vendor in vendors)


_TABLE: tuple[OrtBackend, ...] = (
    OrtBackend(
        backend="ort-vitisai",
        ep="VitisAIExecutionProvider",
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
)

BACKENDS: dict[str, OrtBackend] = {row.backend: row for row in _TABLE}
"""The table, by backend name, in :data:`OrtBackendName`'s order."""
if tuple(BACKENDS) != get_args(OrtBackendName):  # pragma: no cover - a table edit gone wrong
    raise AssertionError(
        f"the rows {tuple(BACKENDS)} do not match OrtBackendName {get_args(OrtBackendName)}"
    )

EP_BACKENDS: dict[str, OrtBackendName] = {row.ep: row.backend for row in _TABLE}
"""Execution provider name → backend name."""

PLUGIN_EPS: tuple[tuple[str, PluginEp], ...] = tuple(
    (row.ep, p) for row in _TABLE for p in row.plugins
)
"""(EP name, plugin package) for every plugin EP the table knows."""


def plugin_wire(ep: str | None = None) -> list[dict[str, Any]]:
    """The plugin EPs (all, or those of ``ep``) as the route worker takes them: ``probe``
    registers every one installed, ``open`` the target EP's when the route's
    onnxruntime does not have it built in."""
    return [{"ep": name, **p.to_dict()} for name, p in PLUGIN_EPS if ep is None or name == ep]


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


PATH_OPTIONS = frozenset(
    name
    for row in _TABLE
    for name, kind in row.options.items()
    if kind in ("cache_dir", "user_file")
)
"""Provider options whose values are local paths (translated for host-process routes)."""


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


OPENVINO_THREADS_OPTION = "num_of_threads"
"""The OpenVINO EP's provider option for its own CPU plugin's threads (ONNX Runtime's
intra-op threads only run the nodes left to the CPU EP)."""


def with_cpu_threads(spec: dict[str, Any], threads: int | None) -> dict[str, Any]:
    """A session spec (its wire form, ``SessionSpec.to_dict``) whose session runs ``threads``
    CPU threads: ONNX Runtime's ``intra_op_num_threads`` (the calling thread and threads − 1
    workers), one inter-op thread, and the OpenVINO EP's own ``num_of_threads`` where it runs
    on the CPU. ``threads`` None: the spec unchanged (ONNX Runtime's default: a thread per
    core). The spec passed in is not changed."""
    if threads is None:
        return spec
    out = SessionSpec.from_dict(spec)
    options = {**out.session_options, "intra_op_num_threads": threads, "inter_op_num_threads": 1}
    provider_options = [dict(o) for o in out.provider_options]
    for i, ep in enumerate(out.providers):
        if ep == "OpenVINOExecutionProvider" and provider_options[i].get(
            "device_type", ""
        ).upper().startswith("CPU"):
            provider_options[i][OPENVINO_THREADS_OPTION] = str(threads)
    return SessionSpec(
        out.graph, out.providers, provider_options, options, out.session_config
    ).to_dict()


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
