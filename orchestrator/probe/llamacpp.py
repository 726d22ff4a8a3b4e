"""Whether the llama.cpp build a route has (llama-cpp-python) can run on a device.

A llama.cpp build is compiled for a set of CPU extensions (``GGML_NATIVE=OFF`` with AVX2, or
AVX-512 where the building CPU had it): on a CPU without one of them its first kernel dies of
SIGILL. The route probe (``orchestrator.ort.worker.llama_cpp_build``) asks the build in a child
process and records what ``llama_print_system_info()`` says it was built with; here those
features are compared with the CPU's own flags (``Device.isa``, from ``/proc/cpuinfo``). Pure
functions over what the profile holds: tests feed any CPU's flags in.
"""

from __future__ import annotations

from orchestrator.core.profile import Device, HardwareProfile, LlamaCppBuild, Route

LLAMACPP_ISA = {
    "SSE3": "sse3",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX_VNNI": "avx_vnni",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
    "NEON": "neon",
    "DOTPROD": "dotprod",
    "MATMUL_INT8": "i8mm",
    "SVE": "sve",
}
"""``llama_print_system_info()``'s CPU feature names (ggml-cpu's ``ggml_backend_cpu_get_features``,
reported when the build was compiled with them) → the ``Device.isa`` name of the CPU flag each
needs (``orchestrator.probe.host.ISA_FLAGS``). Build options that are not instructions (OPENMP,
LLAMAFILE, REPACK) are not listed: they run on any CPU."""

LLAMACPP_CPU = "llamacpp-cpu"
LLAMACPP_VULKAN = "llamacpp-vulkan"
BACKENDS = (LLAMACPP_CPU, LLAMACPP_VULKAN)
"""``stages.ar_decode.kind.LLAMACPP_BACKENDS`` as the planner names them (the planner may not import
the kind's module, which imports vLLM's runner; a test holds the two equal)."""


def missing_isa(features: list[str], cpu_isa: list[str]) -> list[str]:
    """The build's features (``LLAMACPP_ISA`` names) whose instructions ``cpu_isa`` lacks, in the
    build's order. Empty when ``cpu_isa`` is empty: a profile that lists no flags says nothing."""
    if not cpu_isa:
        return []
    have = set(cpu_isa)
    return [f for f in features if f in LLAMACPP_ISA and LLAMACPP_ISA[f] not in have]


def isa_problem(build: LlamaCppBuild, device: Device) -> str | None:
    """The instructions ``build`` was compiled for that ``device`` (a CPU) lacks, as a sentence; None
    when it has them all (or its profile lists no flags)."""
    lacking = missing_isa(build.features, device.isa)
    if not lacking:
        return None
    flags = ", ".join(LLAMACPP_ISA[f] for f in lacking)
    return (
        f"built with {', '.join(lacking)} (llama_print_system_info), and this CPU ({device.name}) lacks "
        f"{flags}: its first kernel would die of SIGILL"
    )


def cpu_problem(build: LlamaCppBuild, device: Device) -> str | None:
    """Why ``build`` cannot drive ``device`` (a CPU) with llamacpp-cpu, or None when it can."""
    why = build.error or isa_problem(build, device)
    return f"{build.label} cannot run on {device.id}: {why}" if why else None


def vulkan_problem(build: LlamaCppBuild) -> str | None:
    """Why ``build`` cannot drive an iGPU or GPU with llamacpp-vulkan, or None when it can."""
    if build.error:
        return f"{build.label} cannot run here: {build.error}"
    if not build.gpu_offload:
        return f"{build.label} has no GPU offload (llama_supports_gpu_offload() is false: built without Vulkan)"
    return None


def route_build(
    profile: HardwareProfile, device: Device, backend: str
) -> tuple[Route | None, LlamaCppBuild | None]:
    """The route that drives ``device`` with ``backend`` and the llama.cpp build it recorded."""
    route = profile.route(device.route_for(backend))
    return route, (route.llama_cpp if route is not None else None)


def unavailable(profile: HardwareProfile, device: Device, backend: str) -> str | None:
    """Why the profile does not offer llama.cpp ``backend`` on ``device`` when the route's probe
    recorded a build that cannot drive it; None when no build is recorded there (not installed,
    or a profile recorded before builds were probed) or the build can."""
    route, build = route_build(profile, device, backend)
    if route is None or build is None:
        return None
    problem = cpu_problem(build, device) if backend == LLAMACPP_CPU else vulkan_problem(build)
    return (
        f"route {route.name!r} ({route.python or 'this interpreter'}): {problem}"
        if problem
        else None
    )
