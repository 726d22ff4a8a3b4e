"""Hardware profile (contract ``omni-edge.profile/1``): devices, pools, routes.

A profile is what the planner plans against. ``omni-edge probe`` writes one
for this machine; ``configs/profiles/`` holds recorded ones for machines that
cannot exist here, so the planner and the ledger are tested against any
machine from this one (the equivalent of tinygrad's NULL device).

Pools are derived, never stored: each GPU's VRAM is ``vram:gpu:N``; CPU, iGPU
and NPU draw on ``host_ram``, whose capacity is what is *available*, capped by
a cgroup/WSL limit when there is one. An iGPU's shared-memory cap is a child
pool of ``host_ram``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, PrivateAttr, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from orchestrator.core.backends import BACKENDS
from orchestrator.core.engines import backend_names as engine_backend_names
from orchestrator.core.errors import ConfigError
from orchestrator.core.units import fmt_bytes
from orchestrator.core.validation import Strict as _Strict
from orchestrator.core.validation import printable, problems_from_validation, refusal

PROFILE_FORMAT = "omni-edge.profile/1"
CLUSTER_FORMAT = "omni-edge.cluster/1"
"""A cluster profile: one profile per node, each named (docs/cluster.md)."""

DeviceKind = Literal["cpu", "gpu", "igpu", "npu"]


def backend_vocabulary() -> tuple[str, ...]:
    """Every backend name a device may list, from the tables: the decode engines' backends
    (``orchestrator.core.engines``), then the ONNX Runtime backends (``orchestrator.core.backends``)."""
    return (*engine_backend_names(), *BACKENDS)


def _known_backend(name: str) -> str:
    """``name`` when a table names it (:func:`backend_vocabulary`); else the error a closed set
    of names gives."""
    known = backend_vocabulary()
    if name not in known:
        shown = [repr(k) for k in known]
        raise PydanticCustomError(
            "literal_error",
            "Input should be {expected}",
            {"expected": f"{', '.join(shown[:-1])} or {shown[-1]}"},
        )
    return name


Backend = Annotated[str, AfterValidator(_known_backend)]
"""A backend name a device may list: a decode engine's (llama.cpp's, vLLM's, transformers': the
rows of ``orchestrator.core.engines``) for checkpoints, and the ONNX Runtime backends of
``orchestrator.core.backends`` (their one table) for exported graphs."""

HOST_RAM = "host_ram"
"""The pool the CPU, iGPUs and NPUs draw on: this machine's RAM (in a cluster
profile, each node's: ``NODE/host_ram``, see :func:`node_pool`)."""
NODE_NAME_PATTERN = r"[A-Za-z][A-Za-z0-9_-]{0,31}"
"""A node's name in a cluster profile: the prefix of its devices (``desktop/gpu:0``),
its pools (``desktop/host_ram``) and its routes, and part of its Ray resource."""
THIS_PROCESS: Final = "this-process"
"""The route (its default name, and its kind) that runs work in this interpreter."""


MAX_MEMORY_BYTES = 2**50
"""1 PiB: more than any one memory a machine this tool plans for has. A larger
figure in a profile is a typo (or an attack on the arithmetic), refused at load."""
MAX_CPU_CORES = 4096
"""Linux's largest default CONFIG_NR_CPUS (x86-64 MAXSMP is 8192, distributions ship
4096 or fewer here); more logical CPUs in a profile is a typo."""


MAX_LABEL = 200
"""The longest machine, device, vendor, CPU or route name a profile may give: above the
longest recorded (124 characters, a profile's own name), far below what would fill
every table the CLI prints."""

Label = Annotated[str, AfterValidator(lambda v: printable(v, MAX_LABEL))]
"""A name a profile gives, printed in plans and tables: no control characters, at most MAX_LABEL."""


class Host(_Strict):
    os: Literal["linux", "windows", "macos"] = Field(
        description="Operating system of this process."
    )
    wsl: bool = Field(False, description="True when this process runs inside WSL2.")
    cpu_name: Label = Field("", description="CPU model string, informational.")
    ram_total_bytes: int = Field(
        ge=0, le=MAX_MEMORY_BYTES, description="Physical RAM visible to this process."
    )
    ram_available_bytes: int = Field(
        ge=0,
        le=MAX_MEMORY_BYTES,
        description="RAM available now (not total): what plans on host_ram draw from.",
    )
    ram_limit_bytes: int | None = Field(
        None,
        ge=0,
        le=MAX_MEMORY_BYTES,
        description="A cgroup or WSL memory limit below physical RAM, or null.",
    )
    cpu_cores: int | None = Field(
        None,
        ge=1,
        le=MAX_CPU_CORES,
        description="Logical CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota "
        "(what the planner splits among CPU stages as threads); null when not known (profiles recorded before "
        "it was probed): engines then pick their own thread counts.",
    )

    @model_validator(mode="after")
    def _available_within_total(self) -> Host:
        if self.ram_available_bytes > self.ram_total_bytes:
            raise refusal(
                f"ram_available_bytes ({fmt_bytes(self.ram_available_bytes)}) is more than ram_total_bytes "
                f"({fmt_bytes(self.ram_total_bytes)}): plans would draw on RAM the machine does not have",
                "give at most ram_total_bytes as available (omni-edge probe --save FILE records both from the machine)",
            )
        return self


class Device(_Strict):
    id: str = Field(
        pattern=r"^(" + NODE_NAME_PATTERN + r"/)?(cpu|gpu:\d+|igpu:\d+|npu:\d+)$",
        description="Stable id: cpu, gpu:N, igpu:N or npu:N (NODE/gpu:0 in a cluster profile).",
    )
    kind: DeviceKind = Field(description="What sort of compute this is.")
    name: Label = Field(description="Marketing name, e.g. 'NVIDIA GeForce RTX 5090 Laptop GPU'.")
    vendor: Label = Field("", description="nvidia, amd, intel, qualcomm, ...")
    memory_bytes: int | None = Field(
        None,
        ge=0,
        le=MAX_MEMORY_BYTES,
        description="A discrete GPU's own VRAM; null for devices on host RAM.",
    )
    shared_memory_bytes: int | None = Field(
        None,
        ge=0,
        le=MAX_MEMORY_BYTES,
        description="An iGPU's cap on how much host RAM it may map; null when uncapped.",
    )
    compute_capability: str | None = Field(
        None, pattern=r"^\d+\.\d+$", description="NVIDIA compute capability, e.g. '12.0'."
    )
    isa: list[str] = Field(
        default_factory=list, description="CPU ISA extensions (avx2, avx512f, amx, ...)."
    )
    backends: list[Backend] = Field(
        default_factory=list, description="Backends that can drive this device, best first."
    )
    route: str = Field(THIS_PROCESS, description="Name of the route (see routes) that reaches it.")
    backend_routes: dict[str, str] = Field(
        default_factory=dict,
        description="Route per backend where it differs from `route` (e.g. ort-openvino through a venv that has onnxruntime-openvino).",
    )
    source: str = Field("", description="Where these figures come from (a spec sheet, a probe).")

    @property
    def node(self) -> str | None:
        """The node of a cluster profile this device is on (its id's prefix); None on one machine."""
        return self.id.rsplit("/", 1)[0] if "/" in self.id else None

    @property
    def local_id(self) -> str:
        """The id on its own node: ``desktop/gpu:0`` → ``gpu:0`` (single-node ids unchanged)."""
        return self.id.rsplit("/", 1)[-1]

    def route_for(self, backend: str) -> str:
        """The route that drives this device with ``backend``."""
        return self.backend_routes.get(backend, self.route)

    @property
    def pool(self) -> str:
        """The memory pool this device's reservations land in (its node's, in a cluster)."""
        if self.kind == "gpu":
            local = f"vram:{self.local_id}"
        elif self.kind == "igpu" and self.shared_memory_bytes is not None:
            local = f"shared:{self.local_id}"
        else:
            local = HOST_RAM
        return node_pool(self.node, local)


class EpDevice(_Strict):
    """One entry of ``onnxruntime.get_ep_devices()`` in a route: an EP paired with a device."""

    ep_name: str = Field(description="The execution provider, e.g. QNNExecutionProvider.")
    ep_vendor: str = Field("", description="Who made the EP.")
    device_type: str = Field(description="The hardware device's type: CPU, GPU or NPU.")
    vendor: str = Field("", description="The device's vendor as ONNX Runtime names it.")
    vendor_id: int = Field(
        0, ge=0, description="PCI-style vendor id (0x8086 Intel, 0x1002 AMD, ...)."
    )
    device_id: int = Field(0, ge=0, description="The vendor's device id.")
    ep_metadata: dict[str, str] = Field(
        default_factory=dict,
        description="The EP's own key/values for the device (OpenVINO: ov_device).",
    )
    device_metadata: dict[str, str] = Field(
        default_factory=dict,
        description="The device's key/values (Windows: Description, DxgiAdapterNumber, ...).",
    )


class PluginEpStatus(_Strict):
    """What registering one plugin EP package in a route gave."""

    package: str = Field(description="The PyPI distribution, e.g. onnxruntime-ep-openvino.")
    ep: str = Field(description="The EP it provides.")
    registration: str = Field(description="The name its library was registered under.")
    version: str | None = Field(None, description="Its installed version.")
    library: str | None = Field(None, description="The library registered.")
    status: Literal["registered", "not installed", "not a plugin", "unsupported", "failed"] = Field(
        description="registered; not installed; not a plugin (a version that is a full build); unsupported (onnxruntime < 1.22); failed."
    )
    error: str | None = Field(None, description="Why it is not registered.")
    devices: int = Field(0, ge=0, description="How many get_ep_devices() entries name its EP.")


class LlamaCppBuild(_Strict):
    """The llama.cpp build (llama-cpp-python) a route's interpreter has, as probing it found."""

    version: str | None = Field(None, description="llama-cpp-python's version.")
    system_info: str = Field(
        "",
        description="What llama_print_system_info() printed: the build's backends and CPU features.",
    )
    gpu_offload: bool = Field(
        False,
        description="llama_supports_gpu_offload(): the build drives a GPU (Vulkan, CUDA, Metal).",
    )
    error: str | None = Field(
        None, description="Why it cannot run here (killed by SIGILL, an import error), or null."
    )

    @property
    def features(self) -> list[str]:
        """The features ``system_info`` reports on (``NAME = 1``), in its order: SSE3, AVX2, AVX512, OPENMP, ..."""
        return [
            name
            for name, value in re.findall(r"([A-Za-z0-9_]+) = (\d+)", self.system_info)
            if value != "0"
        ]

    @property
    def label(self) -> str:
        """``llama-cpp-python 0.3.36 (AVX, AVX2, ...; no GPU offload)``: the build in one line."""
        isa = ", ".join(self.features) or "features unknown"
        return f"llama-cpp-python {self.version or '?'} ({isa}; {'GPU offload' if self.gpu_offload else 'no GPU offload'})"


class Route(_Strict):
    name: Label = Field(description="Route name referenced by devices[].route.")
    kind: Literal["this-process", "interpreter", "host-process"] = Field(
        THIS_PROCESS,
        description="this-process; another interpreter/venv on this OS; or a process across a boundary (WSL→Windows).",
    )
    python: str | None = Field(
        None,
        description="Interpreter path for 'interpreter'/'host-process' routes; relative to the profile file.",
    )
    reachable: bool = Field(True, description="Whether this process can drive the route's devices.")
    reason: str = Field("", description="Why the route is unreachable, or how it was established.")
    remedy: str = Field("", description="What to do to make it reachable.")
    providers: list[str] | None = Field(
        None, description="ONNX Runtime execution providers the route offers, when probed."
    )
    ort_version: str | None = Field(
        None, description="onnxruntime version in the route, when probed."
    )
    ep_devices: list[EpDevice] | None = Field(
        None,
        description="What onnxruntime.get_ep_devices() listed in the route (after registering plugin EPs), when probed.",
    )
    plugin_eps: list[PluginEpStatus] | None = Field(
        None,
        description="The plugin EP packages installed in the route and what registering each gave, when probed.",
    )
    llama_cpp: LlamaCppBuild | None = Field(
        None,
        description="The llama.cpp build (llama-cpp-python) in the route's interpreter, when probed and installed.",
    )


@dataclass(frozen=True)
class ClusterNode:
    """One node of a cluster profile: its name, its own profile (ids unqualified, as
    on that machine alone) and, when gathered live, its Ray node id and address."""

    name: str
    profile: HardwareProfile
    address: str = ""
    ray_node_id: str = ""


class HardwareProfile(_Strict):
    format: Literal["omni-edge.profile/1"] = Field(
        description="Format tag; must be omni-edge.profile/1."
    )
    name: Label = Field(description="Human name of the machine.")
    source: str = Field(
        "", description="Where the figures come from: 'probe <date>' or references."
    )
    host: Host = Field(description="The host OS and its RAM.")
    devices: list[Device] = Field(min_length=1, description="Every compute device, cpu first.")
    routes: list[Route] = Field(
        default_factory=lambda: [Route(name=THIS_PROCESS)],
        description="Ways this process can reach devices.",
    )

    @model_validator(mode="after")
    def _check(self) -> HardwareProfile:
        ids = [d.id for d in self.devices]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"device ids must be unique; repeated: {', '.join(dupes)}")
        names = {r.name for r in self.routes}
        for d in self.devices:
            for r in {d.route, *d.backend_routes.values()}:
                if r not in names:
                    raise ValueError(
                        f"device {d.id} names route {r!r}, which routes[] does not define "
                        f"(defined: {', '.join(sorted(names))})"
                    )
            if d.kind == "gpu" and d.memory_bytes is None:
                raise ValueError(f"device {d.id} is a discrete GPU and needs memory_bytes")
            if d.local_id.split(":")[0] != d.kind:
                raise ValueError(
                    f"device {d.id} has kind {d.kind!r}; the id prefix must match the kind"
                )
        return self

    _nodes: dict[str, ClusterNode] = PrivateAttr(default_factory=dict)
    """A cluster profile's nodes by name (:func:`build_cluster` sets it);
    empty for one machine."""

    # -- lookups -------------------------------------------------------------
    def device(self, device_id: str) -> Device | None:
        return next((d for d in self.devices if d.id == device_id), None)

    def route(self, name: str) -> Route | None:
        return next((r for r in self.routes if r.name == name), None)

    @property
    def nodes(self) -> dict[str, ClusterNode]:
        """A cluster profile's nodes, in profile order; empty for one machine."""
        return self._nodes

    @property
    def node_names(self) -> list[str]:
        """The nodes of a cluster profile in profile order; ``[]`` for one machine."""
        return list(self._nodes)

    @property
    def host_ram_capacity(self) -> int:
        """Bytes plans may draw from host RAM: available, capped by any limit.

        Windows RAM, a WSL quota and an iGPU share are limits on one memory,
        not three memories: the smallest applies, none are added.
        """
        cap = self.host.ram_available_bytes
        if self.host.ram_limit_bytes is not None:
            cap = min(cap, self.host.ram_limit_bytes)
        return cap


@dataclass(frozen=True)
class PoolSpec:
    """A memory pool a plan against a profile draws on (derived, never stored)."""

    id: str
    capacity: int
    parent: str | None
    note: str


def node_pool(node: str | None, pool: str) -> str:
    """``pool`` on ``node``: ``desktop/host_ram``; unchanged on one machine (``node`` None)."""
    return f"{node}/{pool}" if node else pool


def pool_node(pool: str) -> str | None:
    """The node a pool id is on (``desktop/vram:gpu:0`` → ``desktop``), or None."""
    return pool.split("/", 1)[0] if "/" in pool else None


def host_ram_pools(profile: HardwareProfile) -> list[str]:
    """Every ``host_ram`` pool: ``host_ram`` on one machine, ``NODE/host_ram`` per node of a cluster."""
    return [node_pool(n, HOST_RAM) for n in profile.node_names] or [HOST_RAM]


def profile_pools(profile: HardwareProfile) -> list[PoolSpec]:
    """``host_ram`` (available, capped by any WSL/cgroup limit), ``vram:gpu:N`` per
    discrete GPU, and ``shared:igpu:N`` as a child of ``host_ram`` for an iGPU
    with a shared-memory cap. The one derivation the planner and the probe share."""
    if profile.nodes:  # a cluster: each node's pools, named for it; nothing is shared between nodes
        return [
            PoolSpec(
                node_pool(n.name, p.id),
                p.capacity,
                node_pool(n.name, p.parent) if p.parent else None,
                f"{p.note} on {n.name}",
            )
            for n in profile.nodes.values()
            for p in profile_pools(n.profile)
        ]
    host = profile.host
    note = "available host RAM"
    if host.ram_limit_bytes is not None and host.ram_limit_bytes < host.ram_available_bytes:
        note += " (capped by the WSL/cgroup limit)"
    out = [PoolSpec(HOST_RAM, profile.host_ram_capacity, None, note)]
    for d in profile.devices:
        if d.kind == "gpu" and d.memory_bytes is not None:
            out.append(PoolSpec(d.pool, d.memory_bytes, None, f"{d.name} VRAM"))
        elif d.pool != HOST_RAM and d.shared_memory_bytes is not None:
            out.append(
                PoolSpec(d.pool, d.shared_memory_bytes, HOST_RAM, f"{d.name} shared-memory cap")
            )
    return out


def load_profile(path: str | Path) -> HardwareProfile:
    """Read a profile file; every problem becomes a ``ConfigError`` entry."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError.single(
            str(p), "profile file not found", "check the path, or run `omni-edge probe --save FILE`"
        ) from None
    except IsADirectoryError:
        raise ConfigError.single(
            str(p),
            "this is a directory, not a profile file",
            "pass the profile's JSON file (omni-edge probe --save FILE writes one)",
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError.single(
            f"{p}: byte {exc.start}",
            "the file is not UTF-8 text (a profile is JSON)",
            "pass the JSON file omni-edge probe --save wrote",
        ) from None
    except OSError as exc:
        raise ConfigError.single(
            str(p),
            f"cannot read the profile: {exc.strerror or exc}",
            "make the file readable, or pass another profile",
        ) from None
    except RecursionError:
        raise ConfigError.single(
            str(p),
            "the JSON is nested too deeply to be a profile",
            "pass the JSON file omni-edge probe --save wrote",
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError.single(
            f"{p}:{exc.lineno}:{exc.colno}", f"not valid JSON: {exc.msg}", "fix the JSON syntax"
        ) from None
    if isinstance(data, dict) and data.get("format") == CLUSTER_FORMAT:
        return parse_cluster(data, where=str(p), base=p.resolve().parent)
    profile = parse_profile(data, where=str(p))
    # interpreter paths in a profile are relative to the profile file
    routes = []
    for r in profile.routes:
        if r.python and not Path(r.python).is_absolute() and "/" in r.python.replace("\\", "/"):
            # normpath, not resolve(): a venv's python is a symlink whose target
            # is the base interpreter, which is a different route
            r = r.model_copy(update={"python": os.path.normpath(p.resolve().parent / r.python)})
        routes.append(r)
    return profile.model_copy(update={"routes": routes})


def parse_profile(data: object, *, where: str = "<profile>") -> HardwareProfile:
    if not isinstance(data, dict):
        raise ConfigError.single(
            where,
            f"a profile is a JSON object, this file holds a {type(data).__name__}",
            "pass the JSON file omni-edge probe --save wrote (see docs/profile-format.md)",
        )
    if isinstance(data, dict) and data.get("format") not in (None, PROFILE_FORMAT, CLUSTER_FORMAT):
        raise ConfigError.single(
            f"{where}: format",
            f"unknown profile format {data.get('format')!r}",
            f"this version reads {PROFILE_FORMAT!r} (one machine) and {CLUSTER_FORMAT!r} (a cluster's nodes)",
        )
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, where)) from None


# -- cluster profiles ----------------------------------------------------------------


class ClusterNodeEntry(_Strict):
    name: str = Field(
        pattern=r"^" + NODE_NAME_PATTERN + r"$",
        description="The node's name: the prefix of its devices, pools and routes (desktop/gpu:0).",
    )
    profile: str | dict[str, Any] = Field(
        description="The node's omni-edge.profile/1: a path (relative to this file) or the profile itself."
    )
    address: str = Field(
        "", description="The node's address in the Ray cluster, when known (informational)."
    )
    ray_node_id: str = Field(
        "", description="The node's Ray node id when the profile was gathered live."
    )


class ClusterFile(_Strict):
    format: Literal["omni-edge.cluster/1"] = Field(
        description="Format tag; must be omni-edge.cluster/1."
    )
    name: str = Field(description="Human name of the cluster.")
    source: str = Field("", description="Where the node profiles come from.")
    nodes: list[ClusterNodeEntry] = Field(
        min_length=1, description="The nodes, in preference order (the head first)."
    )

    @model_validator(mode="after")
    def _unique(self) -> ClusterFile:
        names = [n.name for n in self.nodes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"node names must be unique; repeated: {', '.join(dupes)}")
        return self


def parse_cluster(
    data: object, *, where: str = "<cluster profile>", base: Path | None = None
) -> HardwareProfile:
    """A cluster file → one profile whose devices, routes and pools are qualified by node."""
    try:
        doc = ClusterFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, where)) from None
    nodes = []
    for i, entry in enumerate(doc.nodes):
        if isinstance(entry.profile, str):
            path = Path(entry.profile)
            if not path.is_absolute() and base is not None:
                path = base / path
            prof = load_profile(path)
            if prof.nodes:
                raise ConfigError.single(
                    f"{where}: nodes[{i}].profile",
                    f"{path} is itself a cluster profile",
                    "name one machine's profile (omni-edge probe --save FILE) per node",
                )
        else:
            prof = parse_profile(entry.profile, where=f"{where}: nodes[{i}].profile")
        nodes.append(ClusterNode(entry.name, prof, entry.address, entry.ray_node_id))
    return build_cluster(doc.name, nodes, source=doc.source)


def build_cluster(name: str, nodes: list[ClusterNode], *, source: str = "") -> HardwareProfile:
    """One profile of ``nodes`` (each with its own machine's profile): device ids, route
    names and pools qualified by node (``desktop/gpu:0``, ``desktop/this-process``,
    ``desktop/host_ram``); the first node's host stands for ``host``. What is per node
    (RAM, routes, reachability) stays in ``nodes``."""
    if not nodes:
        raise ConfigError.single(
            name, "a cluster profile needs at least one node", "list the nodes' profiles"
        )
    devices: list[Device] = []
    routes: list[Route] = []
    for n in nodes:
        q = f"{n.name}/"
        for d in n.profile.devices:
            devices.append(
                d.model_copy(
                    update={
                        "id": q + d.id,
                        "route": q + d.route,
                        "backend_routes": {b: q + r for b, r in d.backend_routes.items()},
                    }
                )
            )
        routes.extend(r.model_copy(update={"name": q + r.name}) for r in n.profile.routes)
    merged = HardwareProfile(
        format="omni-edge.profile/1",
        name=name,
        source=source or "; ".join(f"{n.name}: {n.profile.name}" for n in nodes),
        host=nodes[0].profile.host,
        devices=devices,
        routes=routes,
    )
    merged._nodes = {n.name: n for n in nodes}
    return merged


def cluster_document(profile: HardwareProfile) -> dict[str, Any]:
    """A cluster profile as an ``omni-edge.cluster/1`` file (each node's profile inline),
    which ``load_profile`` reads back."""
    return {
        "format": CLUSTER_FORMAT,
        "name": profile.name,
        "source": profile.source,
        "nodes": [
            {
                "name": n.name,
                "profile": n.profile.model_dump(mode="json"),
                "address": n.address,
                "ray_node_id": n.ray_node_id,
            }
            for n in profile.nodes.values()
        ],
    }
