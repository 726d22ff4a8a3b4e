"""Qwen2.5-Omni's talker as an ar_decode stage (``model_stage: talker``): its KV cache from
``talker_config``, its weights (which the partial index does not list) from its decoder's
shape, the payload types of an Omni checkpoint's sub-models, and the example configs
imported from vLLM-Omni planned for the recorded RTX 5090 laptop (WSL2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.core.errors import ConfigError
from orchestrator.core.profile import load_profile
from orchestrator.planner import plan_pipeline
from stages.ar_decode.kv import decoder_weight_params, kv_budget, text_config
from stages.registry import get_kind
from tests.helpers import REPO

MODEL = REPO / "configs/models/qwen2.5-omni-3b"
WSL = REPO / "configs/profiles/strix-point-rtx5090-wsl.json"


def talker_cfg() -> dict:
    return text_config(json.loads((MODEL / "config.json").read_text()), "talker")


def test_talker_kv_comes_from_talker_config() -> None:
    kv = kv_budget(talker_cfg(), max_model_len=32768)
    # 24 layers × 2 (K, V) × 2 KV heads × head_dim 64 × 2 bytes (bf16)
    assert kv.bytes_per_token == 24 * 2 * 2 * 64 * 2 == 12288
    assert kv.bytes_total == 12288 * 32768


def test_talker_weights_from_its_decoder_shape() -> None:
    hidden, heads, kv_heads, hd, inter, vocab, emb, layers = 896, 14, 2, 64, 4864, 8448, 2048, 24
    per_layer = (
        (hidden * heads * hd + heads * hd)
        + 2 * (hidden * kv_heads * hd + kv_heads * hd)
        + heads * hd * hidden
        + 3 * hidden * inter
        + 2 * hidden
    )
    by_hand = vocab * emb + (emb * hidden + hidden) + layers * per_layer + hidden + hidden * vocab
    assert decoder_weight_params(talker_cfg()) == by_hand == 384_604_928


def write(tmp_path: Path, stages: str) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(f"name: p\nstages:\n{stages}")
    return p


THINKER = f"""  - {{name: thinker, kind: ar_decode, model: {MODEL}, model_stage: thinker, devices: [gpu:0],
     max_model_len: 4096, final_output: true, final_output_type: text}}
"""


def test_the_talker_takes_the_thinkers_hidden_states_and_yields_codec_codes(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            THINKER
            + f"""  - {{name: talker, kind: ar_decode, model: {MODEL}, model_stage: talker,
     inputs: [thinker], devices: [gpu:0], max_model_len: 4096, final_output: true, final_output_type: token_ids}}
""",
        )
    )
    ports = get_kind("ar_decode").ports(cfg.stage("talker"))
    assert [str(t) for t in ports.consumes] == ["tensor:hidden_states", "text"]
    assert [str(t) for t in ports.produces] == ["token_ids"]
    assert [str(t) for t in get_kind("ar_decode").ports(cfg.stage("thinker")).produces] == [
        "text",
        "tensor:hidden_states",
    ]


def test_codec_codes_do_not_feed_a_text_stage(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(
            write(
                tmp_path,
                THINKER
                + f"""  - {{name: talker, kind: ar_decode, model: {MODEL}, model_stage: talker,
     inputs: [thinker], devices: [gpu:0], max_model_len: 4096}}
  - {{name: echo, kind: ar_decode, model: {MODEL}, inputs: [talker], devices: [gpu:0], max_model_len: 4096,
     final_output: true}}
""",
            )
        )
    assert (
        "talker (ar_decode) produces token_ids, and echo (ar_decode) consumes text: token_ids is not text"
        in str(exc.value)
    )


def test_the_one_gpu_import_places_thinker_and_talker_on_the_rtx_5090_and_refuses_code2wav() -> (
    None
):
    plan = plan_pipeline(
        load_config(REPO / "configs/examples/qwen2_5-omni-3b-one-gpu.yaml"), load_profile(WSL)
    )
    doc = plan.to_json()
    stages = {s["name"]: s for s in doc["stages"]}
    assert stages["thinker"]["admitted"] and stages["talker"]["admitted"]
    assert stages["talker"]["kv_cache"]["bytes_per_token"] == 12288
    weights = next(r for r in stages["talker"]["reservations"] if r["purpose"] == "weights")
    assert (weights["bytes"], weights["evidence"]) == (384_604_928 * 2, "E")
    # code2wav: sizes from metadata, no graph to run — refused with the code, the number, the remedy
    assert not plan.admitted and not stages["code2wav"]["admitted"]
    refusal = stages["code2wav"]["refusals"][0]
    assert refusal["code"] == "no_exported_graph"
    assert (
        "1.67 GiB" in refusal["message"] and "export Qwen2.5-Omni's token2wav" in refusal["remedy"]
    )


def test_the_faithful_import_refuses_the_talker_on_a_second_gpu_no_profile_has() -> None:
    plan = plan_pipeline(
        load_config(REPO / "configs/examples/qwen2_5-omni-3b-vllm-omni.yaml"), load_profile(WSL)
    )
    assert not plan.admitted
    doc = json.dumps(plan.to_json())
    assert "no_runnable_device" in doc and "has no gpu:1" in doc
