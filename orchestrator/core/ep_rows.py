"""What one row of the ONNX Runtime backend table says (``orchestrator.core.backends``).

An execution provider is one :class:`OrtBackend` row: its name and EP, where the EP comes
from (the onnxruntime build that has it built in, omni-edge's extra that installs that build,
the plugin packages that ship it), the devices it drives, the options its sessions get, the
precisions it runs, what it holds besides the weights and what it keeps per new shape, how
its sessions are told their CPU threads, and the report it writes of which device took which
node. Everything that reads an EP reads these fields; nothing outside the table names one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.option_rules import OptionKind


@dataclass(frozen=True)
class PrecisionRule:
    """Whether a backend runs graphs at ``precision`` (on ``device_kinds``), and why."""

    precision: str
    supported: bool
    reason: str
    device_kinds: tuple[str, ...] = ()
    """Empty: any device kind the backend drives."""


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
class CoverageReport:
    """A report the EP writes of which device took which node, read as the coverage instead of
    ONNX Runtime's own assignment (an EP that claims nodes and runs some on its own CPU path:
    VitisAI's ``vitisai_ep_report.json``).

    The route worker looks for ``file`` under the session's ``cache_dir``/``cache_key`` provider
    options (and for the file the ``env`` variable names) and summarises it as per-device node
    counts and the op types left on a CPU (``orchestrator.ort.worker.ep_report``; the report
    lists ``deviceStat`` entries ``{name, nodeNum}`` and ``nodeStat`` entries ``{opType,
    device}``); the coverage gate counts the nodes on the ``accelerators``
    (``orchestrator.verify.gates.coverage_from_report``).
    """

    file: str
    """The report's file name, under ``<cache_dir>/<cache_key>/``."""
    accelerators: tuple[str, ...]
    """The report's names for the accelerator (its nodes are the ones the EP took)."""
    env: str = ""
    """An environment variable the EP reads for the report's file name, when it has one."""

    @property
    def source(self) -> str:
        """How a coverage record names where it came from (``<file stem> (<path>)``)."""
        return self.file.rsplit(".", 1)[0]

    def wire(self) -> dict[str, str]:
        """What the route worker is told to look for (it is stdlib-only and holds no table)."""
        return {"file": self.file, "env": self.env}


@dataclass(frozen=True)
class ShapeMemory:
    """Memory an EP keeps for every input shape it has not seen before, which a graph whose
    output dimensions come from the data (a voice's samples, set by sampled durations) meets on
    every item: reserved as ``per_item`` bytes x ``items`` items (evidence E), the reservation's
    reason naming both figures by the constants that hold them."""

    per_item: int
    per_item_name: str
    """The constant that holds ``per_item`` (its docstring has the measurement), as the plan cites it."""
    items: int
    items_name: str
    """The constant that holds ``items``, as the plan cites it."""
    who: str
    """Who keeps it, as the reason says (``OpenVINO``)."""


@dataclass(frozen=True)
class CpuThreads:
    """A provider option that sets the EP's own CPU threads where its session runs on the CPU
    (OpenVINO's CPU plugin runs its own threads: ONNX Runtime's intra-op threads only run the
    nodes left to the CPU EP)."""

    option: str
    """The provider option that takes the thread count."""
    when: tuple[str, str]
    """``(provider option, prefix)``: the session runs on the CPU when that option's value
    starts with the prefix (case-insensitive)."""


@dataclass(frozen=True)
class OrtBackend:
    """How one ``ort-*`` backend opens a session, and what it costs besides weights."""

    backend: str
    """Its name (``ort-<ep>``), which profiles and stage configs list."""
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

    distribution: str | None = None
    """The PyPI distribution of the onnxruntime build that has this EP built in. Each such build
    installs the ``onnxruntime`` module, so an environment holds one
    (``orchestrator.core.ort_builds``); None: the EP comes only as a plugin package."""
    extra: str | None = None
    """omni-edge's extra that installs that build (``pip install 'omni-edge[<extra>]'``; the
    pyproject.toml extra of this name requires the distribution, which a test checks); None:
    the build is not on PyPI (``build_install`` says how it is had)."""
    build_install: str = ""
    """The line that installs the build where it says more than the extra's ``pip install`` (a
    platform, an installer): what the refusal of two builds in one environment offers."""
    coverage_report: CoverageReport | None = None
    """The EP's own report of which device took which node, read as the coverage where the EP
    wrote one (an EP that claims nodes and runs some on its own CPU path)."""
    shape_memory: ShapeMemory | None = None
    """What the EP keeps per new input shape, reserved for a graph whose output dimensions come
    from the data."""
    cpu_threads: CpuThreads | None = None
    """The provider option that sets the EP's own CPU threads, where it runs its own."""
    route_venvs: tuple[tuple[str, str], ...] = ()
    """``(route name, directory)`` of the interpreter routes ``omni-edge probe`` looks for
    inside each route directory (``<directory>/bin/python``): an EP whose build replaces the
    ``onnxruntime`` module lives in an environment of its own."""

    @property
    def plugin_since(self) -> int | None:
        """The major version from which ``distribution`` is a plugin EP package beside the
        plain ``onnxruntime`` rather than a build (``onnxruntime-qnn`` 2.x): its
        :class:`PluginEp`'s ``min_version``; None where the distribution is always a build."""
        return next(
            (
                p.min_version
                for p in self.plugins
                if p.package == self.distribution and p.min_version
            ),
            None,
        )

    @property
    def build_line(self) -> str:
        """How to install this EP's onnxruntime build: ``build_install``, else the extra's line."""
        return self.build_install or (
            f"pip install 'omni-edge[{self.extra}]'" if self.extra else ""
        )

    def drives_device(self, kind: str, vendor: str) -> bool:
        """Whether this backend can drive a device of ``kind`` made by ``vendor``."""
        vendors = self.drives.get(kind)
        return vendors is not None and (not vendors or vendor in vendors)
