"""The planner's contract: codes, figures and remedies a user reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

from orchestrator.config import load_config
from orchestrator.core.errors import RefusalCode
from orchestrator.core.plan import PipelinePlan
from orchestrator.core.units import GiB, MiB
from orchestrator.planner import plan_pipeline
from tests.helpers import REPO
from tests.helpers.checkpoints import llama_config, write_checkpoint
from tests.helpers.profiles import make_profile

RTX5090 = {
    "id": "gpu:0",
    "kind": "gpu",
    "name": "NVIDIA GeForce RTX 5090 Laptop GPU",
    "vendor": "nvidia",
    "memory_bytes": 24 * GiB,
    "compute_capability": "12.0",
    "backends": ["vllm-cuda", "ort-cuda"],
}
RTX4090 = {**RTX5090, "name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9"}


def config(
    tmp_path: Path,
    model: Path | str,
    devices: str = "[gpu:0, cpu]",
    max_model_len: int = 4096,
    extra: str = "",
) -> Path:
    p = tmp_path / "pipeline.yaml"
    p.write_text(f"""name: t
stages:
  - name: thinker
    kind: ar_decode
    model: {model}
    devices: {devices}
    max_model_len: {max_model_len}
    final_output: true
{extra}""")
    return p


def int8_checkpoint(tmp_path: Path) -> Path:
    cfg = llama_config(
        quantization_config={
            "quant_method": "compressed-tensors",
            "config_groups": {
                "group_0": {
                    "weights": {"num_bits": 8, "type": "int"},
                    "input_activations": {"num_bits": 8, "type": "int"},
                }
            },
        }
    )
    tensors = {f"model.layers.{i}.mlp.weight": ("I8", [1024, 1024]) for i in range(4)}
    return write_checkpoint(tmp_path / "int8", cfg, tensors)


def test_int8_on_compute_capability_12_is_refused_and_the_cpu_admits_it(tmp_path):
    plan = plan_pipeline(
        load_config(config(tmp_path, int8_checkpoint(tmp_path))), make_profile(RTX5090)
    )
    stage = plan.stage("thinker")
    assert plan.admitted and stage.device == "cpu" and stage.backend == "vllm-cpu"
    [refusal] = [r for r in stage.refusals if r.device == "gpu:0"]
    assert refusal.code == RefusalCode.WEIGHT_FORMAT_UNSUPPORTED
    assert "int8" in refusal.message and "compute capability 12.0" in refusal.message
    assert "scaled_mm" in refusal.message
    assert "fp8" in refusal.remedy and "bf16" in refusal.remedy


def test_int8_on_ada_runs_on_the_gpu(tmp_path):
    plan = plan_pipeline(
        load_config(config(tmp_path, int8_checkpoint(tmp_path))), make_profile(RTX4090)
    )
    assert plan.stage("thinker").device == "gpu:0"
    assert plan.stage("thinker").refusals == ()


def test_weights_fit_but_weights_plus_kv_do_not(tmp_path):
    # 4 GiB of bf16 weights, 32 layers × 8 KV heads × 128 × 2 × 2 = 128 KiB per token
    cfg = llama_config(layers=32, hidden=4096, heads=32, kv_heads=8, max_position_embeddings=131072)
    ckpt = write_checkpoint(
        tmp_path / "big", cfg, {f"w{i}": ("BF16", [1024, 1024]) for i in range(2048)}, files=8
    )
    profile = make_profile({**RTX4090, "memory_bytes": 8 * GiB})
    plan = plan_pipeline(
        load_config(config(tmp_path, ckpt, devices="[gpu:0]", max_model_len=32768)), profile
    )
    assert not plan.admitted
    [refusal] = plan.stage("thinker").refusals
    assert refusal.code == RefusalCode.BUDGET_EXCEEDS_DEVICE
    assert "vram:gpu:0" in refusal.message
    assert "weights 4.00 GiB" in refusal.message and "kv_cache 4.00 GiB" in refusal.message
    fits = int(re.search(r"max_model_len (\d+) \(instead of 32768\)", refusal.remedy).group(1))
    assert "never shortens a context on its own" in refusal.remedy
    # the remedy's figure really fits, and 16 tokens more does not
    ok = plan_pipeline(
        load_config(config(tmp_path, ckpt, devices="[gpu:0]", max_model_len=fits)), profile
    )
    assert ok.admitted
    too_long = plan_pipeline(
        load_config(config(tmp_path, ckpt, devices="[gpu:0]", max_model_len=fits + 16)), profile
    )
    assert not too_long.admitted
    # budgets never exceed the pool in an admitted plan
    pool = next(p for p in ok.pools if p.id == "vram:gpu:0")
    assert pool.peak_bytes <= pool.capacity_bytes


def test_preference_order_and_mask(tmp_path, tiny_checkpoint):
    cfg = load_config(config(tmp_path, tiny_checkpoint))
    profile = make_profile(RTX4090)
    assert plan_pipeline(cfg, profile).stage("thinker").device == "gpu:0"
    masked = plan_pipeline(cfg, profile, mask=frozenset({"gpu"}))
    stage = masked.stage("thinker")
    assert stage.device == "cpu"
    assert (
        stage.refusals[0].code == RefusalCode.NO_RUNNABLE_DEVICE
        and "--mask" in stage.refusals[0].message
    )


def test_unreachable_route_is_refused_with_its_remedy(tmp_path, tiny_checkpoint):
    gpu = {**RTX4090, "route": "windows-host"}
    profile = make_profile(
        gpu,
        routes=[
            {"name": "this-process"},
            {
                "name": "windows-host",
                "kind": "host-process",
                "reachable": False,
                "reason": "no interop from this container",
                "remedy": "run omni-edge natively on Windows",
            },
        ],
    )
    stage = plan_pipeline(load_config(config(tmp_path, tiny_checkpoint)), profile).stage("thinker")
    assert stage.device == "cpu"
    [r] = stage.refusals
    assert r.code == RefusalCode.DEVICE_UNREACHABLE
    assert (
        "no interop from this container" in r.message
        and r.remedy == "run omni-edge natively on Windows"
    )


def test_qwen3_with_mixed_sliding_layers_is_refused_everywhere(tmp_path):
    cfg = llama_config(
        layers=4,
        model_type="qwen3",
        sliding_window=128,
        use_sliding_window=True,
        max_window_layers=2,
    )
    ckpt = write_checkpoint(tmp_path / "q", cfg, {"w": ("BF16", [64, 64])})
    plan = plan_pipeline(load_config(config(tmp_path, ckpt)), make_profile(RTX4090))
    assert not plan.admitted
    codes = {(r.device, r.code) for r in plan.stage("thinker").refusals}
    assert codes == {
        ("gpu:0", RefusalCode.MODEL_ARCHITECTURE_UNSUPPORTED),
        ("cpu", RefusalCode.MODEL_ARCHITECTURE_UNSUPPORTED),
    }
    assert (
        "Sliding window for some but all layers is not supported"
        in plan.stage("thinker").refusals[0].message
    )


def test_plans_from_index_metadata_alone_and_engine_kwargs_follow_the_plan(tmp_path):
    model = REPO / "configs" / "models" / "llama-3.2-1b-instruct"
    assert not list(model.glob("*.safetensors"))  # no weights: metadata only
    plan = plan_pipeline(
        load_config(config(tmp_path, model, max_model_len=8192)), make_profile(RTX5090)
    )
    stage = plan.stage("thinker")
    assert stage.device == "gpu:0" and stage.backend == "vllm-cuda"
    weights = next(r for r in stage.reservations if r.purpose == "weights")
    assert (weights.bytes, weights.evidence) == (2471628800, "D")
    kv = next(r for r in stage.reservations if r.purpose == "kv_cache")
    assert kv.bytes == 16 * 2 * 8 * 64 * 2 * 8192
    kw = stage.engine_kwargs
    assert kw["kv_cache_memory_bytes"] == kv.bytes
    assert kw["max_model_len"] == 8192 and kw["enforce_eager"] is True
    vram = [r for r in stage.reservations if r.pool == "vram:gpu:0"]
    budget = max(
        sum(r.bytes for r in vram if r.lifetime != "load"),
        sum(
            r.bytes for r in vram if r.lifetime == "load" or (r.lifetime == "session" and r.at_load)
        ),
    )
    assert kw["gpu_memory_utilization"] >= budget / (24 * GiB)
    assert kw["gpu_memory_utilization"] < budget / (24 * GiB) + 0.011
    # the GPU stage's host process is charged to host RAM, not VRAM
    assert any(r.pool == "host_ram" and r.purpose == "host_process" for r in stage.reservations)


def test_plan_is_deterministic_and_round_trips(tmp_path, tiny_checkpoint):
    cfg = load_config(config(tmp_path, tiny_checkpoint))
    profile = make_profile(RTX4090)
    a, b = plan_pipeline(cfg, profile).to_json(), plan_pipeline(cfg, profile).to_json()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert PipelinePlan.from_json(json.loads(json.dumps(a))).to_json() == a


def test_host_ram_capacity_is_available_capped_by_the_wsl_limit(tmp_path, tiny_checkpoint):
    profile = make_profile(ram_available=20 * GiB, ram_limit=12 * GiB)
    plan = plan_pipeline(load_config(config(tmp_path, tiny_checkpoint, devices="[cpu]")), profile)
    host = next(p for p in plan.pools if p.id == "host_ram")
    assert host.capacity_bytes == 12 * GiB
    assert host.contributors["thinker"] > 1 * GiB  # engine runtime is charged
    assert host.contributors["(pipeline)"] == 512 * MiB * 2 + int(0.9 * GiB)


def test_digest_is_recorded_only_when_asked(tmp_path, tiny_checkpoint):
    import hashlib

    plain = plan_pipeline(
        load_config(config(tmp_path, tiny_checkpoint, devices="[cpu]")), make_profile()
    )
    assert plain.stage("thinker").artifact["manifest"]["digest"] is None
    asked = plan_pipeline(
        load_config(config(tmp_path, tiny_checkpoint, devices="[cpu]", extra="    digest: true\n")),
        make_profile(),
    )
    expected = (
        "sha256:" + hashlib.sha256((tiny_checkpoint / "model.safetensors").read_bytes()).hexdigest()
    )
    assert asked.stage("thinker").artifact["manifest"]["digest"] == expected
