"""Whether the llama.cpp build a route has recorded (llama-cpp-python) can run on a device.

A llama.cpp build is compiled for a set of CPU extensions (``GGML_NATIVE=OFF`` with AVX2, or
AVX-512 where the building CPU had it): on a CPU without one of them its first kernel dies of
SIGILL. The route probe (``orchestrator.ort.worker_probe.engine_build``, running the engine row's
``build_probe``) asks the build in a child process and the profile records what
``llama_print_system_info()`` says it was built with (``Route.llama_cpp``); here those features
are compared with the CPU's own flags (``Device.isa``, from ``/proc/cpuinfo``). Pure functions
over what the profile holds: tests feed any CPU's flags in. ``orchestrator.probe.engines`` asks
them for every engine found by its build.
"""

from __future__ import annotations

from orchestrator.core.profile import Device, LlamaCppBuild

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
    """Why ``build`` cannot drive ``device`` (a CPU), or None when it can."""
    why = build.error or isa_problem(build, device)
    return f"{build.label} cannot run on {device.id}: {why}" if why else None


def vulkan_problem(build: LlamaCppBuild) -> str | None:
    """Why ``build`` cannot drive an iGPU or GPU (through Vulkan), or None when it can."""
    if build.error:
        return f"{build.label} cannot run here: {build.error}"
    if not build.gpu_offload:
        return f"{build.label} has no GPU offload (llama_supports_gpu_offload() is false: built without Vulkan)"
    return None
