"""scripts/bootstrap.sh's llama.cpp build flags: named from the CPU's instruction sets, never
native, AMX always off, AVX-512 only with the whole family ggml's kernels use; the wheel's cache
folder is keyed by them. Other CPUs are shown through OMNI_EDGE_CPU_FLAGS (/proc/cpuinfo's flags)."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import REPO

ZEN3 = "fpu sse sse2 sse4_1 sse4_2 avx avx2 fma f16c bmi2"
"""An AMD Zen 3's vector flags: AVX2, no AVX-512."""
SAPPHIRE_RAPIDS = (
    ZEN3
    + " avx_vnni avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi avx512_vnni avx512_bf16"
    " amx_tile amx_int8 amx_bf16"
)
"""An Intel Xeon with AVX-512 and AMX (the CPU whose native build segfaulted)."""


def _dry_run(flags: str) -> dict[str, str]:
    out = subprocess.run(
        ["bash", "scripts/bootstrap.sh", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "OMNI_EDGE_CPU_FLAGS": flags},
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("llama.cpp:"))
    args = next(x for x in out.splitlines() if x.strip().startswith("CMAKE_ARGS="))
    opts = dict(a[2:].split("=", 1) for a in args.split("=", 1)[1].split())
    return {"line": line, **opts}


@pytest.mark.parametrize("flags", [ZEN3, SAPPHIRE_RAPIDS, "fpu sse sse2"])
def test_never_native_and_never_amx(flags: str) -> None:
    opts = _dry_run(flags)
    assert opts["GGML_NATIVE"] == "OFF"
    assert (opts["GGML_AMX_TILE"], opts["GGML_AMX_INT8"], opts["GGML_AMX_BF16"]) == (
        "OFF",
        "OFF",
        "OFF",
    )


def test_an_avx2_cpu_gets_an_avx2_build_without_avx512() -> None:
    opts = _dry_run(ZEN3)
    assert (opts["GGML_AVX2"], opts["GGML_FMA"], opts["GGML_F16C"]) == ("ON", "ON", "ON")
    assert opts["GGML_AVX512"] == opts["GGML_AVX512_VNNI"] == opts["GGML_AVX512_BF16"] == "OFF"
    assert opts["line"].split("built for ")[1].startswith("sse42-avx-avx2-fma-f16c-bmi2 ")


def test_an_avx512_cpu_gets_avx512_and_its_extensions() -> None:
    opts = _dry_run(SAPPHIRE_RAPIDS)
    assert (
        opts["GGML_AVX512"]
        == opts["GGML_AVX512_VNNI"]
        == opts["GGML_AVX512_BF16"]
        == opts["GGML_AVX_VNNI"]
        == "ON"
    )
    assert "-avx512-avx512-vbmi-avx512-vnni-avx512-bf16 " in opts["line"]


def test_avx512f_alone_is_not_enough_for_ggmls_avx512_kernels() -> None:
    opts = _dry_run(ZEN3 + " avx512f")  # no BW/VL/DQ/CD: an early AVX-512 CPU (Knights Landing)
    assert opts["GGML_AVX512"] == "OFF"


def test_another_cpu_tier_is_another_wheel_folder() -> None:
    zen3, spr = _dry_run(ZEN3)["line"], _dry_run(SAPPHIRE_RAPIDS)["line"]
    folder = lambda line: line.rsplit("(", 1)[1]  # noqa: E731
    assert folder(zen3) != folder(spr)
    assert "/nonexistent/.cache/omni-edge/wheels/llama-cpp-python-" in folder(zen3)
