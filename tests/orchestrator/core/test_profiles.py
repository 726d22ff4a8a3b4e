"""The recorded hardware profiles and model metadata that ship in configs/.

Asserts what a user of `omni-edge plan --profile ...` would read: which
devices exist, which pool each draws on and its capacity, which routes
reach them and, where none does, the reason and the remedy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.commands.probe import pools_of
from orchestrator.core.errors import ConfigError
from orchestrator.core.profile import HOST_RAM, load_profile, parse_profile

REPO = Path(__file__).resolve().parents[3]
PROFILES = REPO / "configs" / "profiles"
MODELS = REPO / "configs" / "models"
GiB = 2**30

EXPECTED_DEVICES = {
    "strix-point-rtx5090-wsl.json": ["cpu", "gpu:0", "igpu:0", "npu:0"],
    "strix-point-rtx5090-wsl-hostproc.json": ["cpu", "gpu:0", "igpu:0", "npu:0"],
    "strix-point-rtx5090-windows.json": ["cpu", "gpu:0", "igpu:0", "npu:0"],
    "lunar-lake-32gb.json": ["cpu", "igpu:0", "npu:0"],
    "snapdragon-x-elite-32gb.json": ["cpu", "igpu:0", "npu:0"],
    "cpu-only-linux.json": ["cpu"],
}


def profile(name: str):
    return load_profile(PROFILES / name)


def reach(p, device_id: str, backend: str):
    """The route that drives ``device_id`` with ``backend``."""
    d = p.device(device_id)
    assert d is not None, f"{device_id} missing"
    assert backend in d.backends, f"{device_id} lacks {backend}: {d.backends}"
    r = p.route(d.route_for(backend))
    assert r is not None
    return r


# ---- every shipped profile ------------------------------------------------------


def test_the_shipped_set_is_exactly_the_expected_one():
    assert sorted(f.name for f in PROFILES.glob("*.json")) == sorted(EXPECTED_DEVICES)


@pytest.mark.parametrize("name", sorted(EXPECTED_DEVICES))
def test_profile_loads_with_the_intended_devices(name):
    p = profile(name)
    assert [d.id for d in p.devices] == EXPECTED_DEVICES[name]
    assert p.devices[0].kind == "cpu"
    assert p.source and all(d.source for d in p.devices), "every figure needs a source"


@pytest.mark.parametrize("name", sorted(EXPECTED_DEVICES))
def test_host_ram_capacity_is_available_capped_by_the_limit(name):
    h = profile(name).host
    expected = (
        h.ram_available_bytes
        if h.ram_limit_bytes is None
        else min(h.ram_available_bytes, h.ram_limit_bytes)
    )
    assert profile(name).host_ram_capacity == expected
    assert h.ram_available_bytes <= h.ram_total_bytes


@pytest.mark.parametrize("name", sorted(EXPECTED_DEVICES))
def test_unreachable_routes_say_why_and_what_to_do(name):
    for r in profile(name).routes:
        if not r.reachable:
            assert r.reason and r.remedy, f"{name}: route {r.name} needs a reason and a remedy"


@pytest.mark.parametrize("name", sorted(EXPECTED_DEVICES))
def test_pools_are_vram_per_gpu_host_ram_and_shared_children(name):
    p = profile(name)
    pools = {row.id: row for row in pools_of(p)}
    assert pools[HOST_RAM].capacity_bytes == p.host_ram_capacity
    for d in p.devices:
        if d.kind == "gpu":
            assert pools[f"vram:{d.id}"].capacity_bytes == d.memory_bytes
            assert pools[f"vram:{d.id}"].parent is None
        elif d.kind == "igpu" and d.shared_memory_bytes is not None:
            assert pools[f"shared:{d.id}"].parent == HOST_RAM
            assert pools[f"shared:{d.id}"].capacity_bytes == d.shared_memory_bytes
        else:
            assert d.pool == HOST_RAM


# ---- per machine ------------------------------------------------------------------


def test_wsl_profile_gpu_by_cuda_npu_and_igpu_unreachable():
    p = profile("strix-point-rtx5090-wsl.json")
    assert p.host.os == "linux" and p.host.wsl is True
    # WSL2's default VM size is 50% of the laptop's 32 GiB; that limit binds.
    assert p.host.ram_total_bytes == 32 * GiB
    assert p.host.ram_limit_bytes == 16 * GiB
    assert p.host_ram_capacity == 16 * GiB

    gpu = p.device("gpu:0")
    assert gpu.memory_bytes == 24 * GiB and gpu.compute_capability == "12.0"
    assert reach(p, "gpu:0", "vllm-cuda").reachable
    assert reach(p, "gpu:0", "ort-cuda").reachable

    npu_route = reach(p, "npu:0", "ort-vitisai")
    assert npu_route.reachable is False
    assert "WSL" in npu_route.reason
    assert "onnxruntime-vitisai" in npu_route.remedy and "Windows" in npu_route.remedy

    igpu_route = reach(p, "igpu:0", "ort-dml")
    assert igpu_route.reachable is False
    assert "DirectML" in igpu_route.reason and "WSL2" in igpu_route.reason


def test_windows_profile_vllm_routes_point_to_wsl2():
    p = profile("strix-point-rtx5090-windows.json")
    assert p.host.os == "windows" and p.host.wsl is False and p.host.ram_limit_bytes is None
    for device, backend in (("gpu:0", "vllm-cuda"), ("cpu", "vllm-cpu")):
        r = reach(p, device, backend)
        assert r.reachable is False
        assert "Windows" in r.reason and "WSL2" in r.remedy
    assert reach(p, "gpu:0", "ort-dml").reachable
    cuda = reach(p, "gpu:0", "ort-cuda")
    assert (
        cuda.reachable and cuda.kind == "interpreter" and "CUDAExecutionProvider" in cuda.providers
    )
    vitis = reach(p, "npu:0", "ort-vitisai")
    assert vitis.reachable and "VitisAIExecutionProvider" in vitis.providers
    assert reach(p, "igpu:0", "ort-dml").name == "this-process"


def test_lunar_lake_openvino_drives_igpu_and_npu():
    p = profile("lunar-lake-32gb.json")
    assert "avx512f" not in p.device("cpu").isa  # Lunar Lake has no AVX-512
    for dev in ("cpu", "igpu:0", "npu:0"):
        assert reach(p, dev, "ort-openvino").name == "this-process"
    dml = reach(p, "igpu:0", "ort-dml")
    assert dml.name == "dml-venv" and dml.kind == "interpreter"
    assert p.device("igpu:0").pool == "shared:igpu:0"


def test_snapdragon_npu_via_qnn():
    p = profile("snapdragon-x-elite-32gb.json")
    r = reach(p, "npu:0", "ort-qnn")
    assert r.reachable and "QNNExecutionProvider" in r.providers
    assert reach(p, "igpu:0", "ort-dml").reachable is False
    assert p.device("npu:0").vendor == "qualcomm"


def test_cpu_only_profile_reaches_openvino_through_its_venv():
    p = profile("cpu-only-linux.json")
    cpu = p.device("cpu")
    assert cpu.backends == ["vllm-cpu", "transformers-cpu", "ort-cpu", "ort-openvino"]
    r = reach(p, "cpu", "ort-openvino")
    # relative to the profile file, made absolute at load
    assert r.kind == "interpreter" and r.python == str(REPO / ".venvs/openvino/bin/python")
    # Relative to the profile file, the path lands on the repository's venv.
    assert (PROFILES / r.python).resolve() == (REPO / ".venvs/openvino/bin/python").resolve()
    assert p.host_ram_capacity == p.host.ram_available_bytes  # no limit recorded


# ---- invalid profiles fail with the place named ----------------------------------------


def _minimal() -> dict:
    return json.loads((PROFILES / "cpu-only-linux.json").read_text())


def test_unknown_key_is_named_with_its_place():
    data = _minimal()
    data["devices"][0]["colour"] = "red"
    with pytest.raises(ConfigError) as exc:
        parse_profile(data, where="my.json")
    msg = str(exc.value)
    assert "my.json: devices[0].colour" in msg and "unknown key 'colour'" in msg


def test_duplicate_device_id_is_refused():
    data = _minimal()
    data["devices"].append(dict(data["devices"][0]))
    with pytest.raises(ConfigError) as exc:
        parse_profile(data, where="dup.json")
    assert "dup.json" in str(exc.value) and "repeated: cpu" in str(exc.value)


def test_device_naming_an_undefined_route_is_refused():
    data = _minimal()
    data["devices"][0]["backend_routes"] = {"ort-openvino": "nowhere"}
    with pytest.raises(ConfigError) as exc:
        parse_profile(data, where="route.json")
    msg = str(exc.value)
    assert "route.json" in msg and "device cpu names route 'nowhere'" in msg
    assert "openvino-venv" in msg  # the routes that do exist are listed


def test_broken_json_names_file_line_and_column(tmp_path):
    f = tmp_path / "broken.json"
    f.write_text('{\n  "format": "omni-edge.profile/1",\n  "name": \n}\n')
    with pytest.raises(ConfigError) as exc:
        load_profile(f)
    assert f"{f}:4:1" in str(exc.value)


# ---- model metadata (configs/models) ------------------------------------------------------

# Hand-computed: layers × 2 (K and V) × kv_heads × head_dim × 2 bytes (bf16).
# See docs/models.md for the fields each number comes from.
KV_BYTES_PER_TOKEN = {
    "smollm2-135m-instruct": 30 * 2 * 3 * 64 * 2,  # 23_040; head_dim = 576 / 9
    "llama-3.2-1b-instruct": 16 * 2 * 8 * 64 * 2,  # 32_768
    "gemma-3-1b-it": 26 * 2 * 1 * 256 * 2,  # 26_624 flat; 4 global + 22 local (window 512)
    "qwen3-4b": 36 * 2 * 8 * 128 * 2,  # 147_456
    "qwen2.5-omni-3b": 36 * 2 * 2 * 128 * 2,  # 36_864; thinker text config, head_dim = 2048 / 16
    "qwen3-omni-30b-a3b": 48 * 2 * 4 * 128 * 2,  # 98_304; thinker text config, head_dim 128
}
# Exact bf16 weight bytes of the complete checkpoints (2 × parameter count,
# tied embeddings stored once); Qwen2.5-Omni's index is partial (thinker text
# decoder only) and checked separately.
TOTAL_SIZE = {
    "smollm2-135m-instruct": 269_030_016,
    "llama-3.2-1b-instruct": 2_471_628_800,
    "gemma-3-1b-it": 1_999_771_904,
    "qwen3-4b": 8_044_936_192,
    "qwen3-omni-30b-a3b": 70_519_637_090,  # the sum of its header-only shards (scripts/omni_model_headers.py)
}


def _text_config(cfg: dict) -> dict:
    return cfg["thinker_config"]["text_config"] if "thinker_config" in cfg else cfg


def test_the_model_set_is_the_documented_one():
    assert sorted(p.name for p in MODELS.iterdir() if p.is_dir()) == sorted(KV_BYTES_PER_TOKEN)


@pytest.mark.parametrize("model", sorted(KV_BYTES_PER_TOKEN))
def test_config_has_what_kv_arithmetic_needs(model):
    cfg = _text_config(json.loads((MODELS / model / "config.json").read_text()))
    layers = cfg["num_hidden_layers"]
    kv_heads = cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    assert layers * 2 * kv_heads * head_dim * 2 == KV_BYTES_PER_TOKEN[model]


@pytest.mark.parametrize("model", sorted(KV_BYTES_PER_TOKEN))
def test_index_maps_every_tensor_to_a_listed_shard(model):
    index = json.loads((MODELS / model / "model.safetensors.index.json").read_text())
    total = index["metadata"]["total_size"]
    shards = set(index["weight_map"].values())
    assert total > 0 and index["weight_map"]
    if len(shards) == 1:
        assert shards == {"model.safetensors"}
    else:
        n = len(shards)
        assert shards == {f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)}
    if model in TOTAL_SIZE:
        assert total == TOTAL_SIZE[model]


def test_gemma3_layout_is_five_local_to_one_global():
    cfg = json.loads((MODELS / "gemma-3-1b-it" / "config.json").read_text())
    assert cfg["sliding_window"] == 512 and cfg["sliding_window_pattern"] == 6
    global_layers = [
        i for i in range(cfg["num_hidden_layers"]) if (i + 1) % cfg["sliding_window_pattern"] == 0
    ]
    assert global_layers == [5, 11, 17, 23]


def test_omni_index_says_it_is_partial():
    index = json.loads((MODELS / "qwen2.5-omni-3b" / "model.safetensors.index.json").read_text())
    assert "thinker text decoder only" in index["metadata"]["omni_edge_partial"]
    assert all(name.startswith("thinker.") for name in index["weight_map"])
    # 36 layers × 12 tensors (q/k/v with biases) + embed + norm + lm_head
    assert len(index["weight_map"]) == 36 * 12 + 3
