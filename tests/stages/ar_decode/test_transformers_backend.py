"""The ``transformers`` backend of ``ar_decode`` and the tiny Omni checkpoints it runs.

* the checkpoints: transformers' real Omni classes and config layout, scaled down, with the
  project's tokenizer and a README stating the scale-down;
* planning: vLLM refuses an Omni sub-model by name (``model_stage_unsupported``), transformers
  takes it, with its own weights from the safetensors headers and the KV arithmetic of its
  config; a plain decoder stays on vLLM unless its config names transformers; quantized
  weights are refused on transformers; the probe offers it where torch and transformers are;
* parity (the one place a test compares model outputs: both sides are computed here, from
  the same weights, greedy, fp32): the runners' thinker tokens and talker codes against
  transformers' own end-to-end ``generate()``, for both models;
* cancellation: a talker request closed after its first code stops its generation."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from exports import omni_tiny
from orchestrator.config import load_config
from orchestrator.core import errors
from orchestrator.core.errors import RefusalCode
from orchestrator.core.profile import Device, load_profile
from orchestrator.planner import plan_pipeline
from stages.ar_decode.checkpoint import read_safetensors_header
from stages.ar_decode.engines import engine_for
from stages.payloads import untag
from stages.registry import get_kind
from tests.helpers import REPO
from tests.helpers.omni_reference import reference, torch_threads

CPU_PROFILE = REPO / "configs/profiles/cpu-only-linux.json"
CONFIGS = {
    "qwen2_5": REPO / "configs/examples/qwen2_5-omni-tiny.yaml",
    "qwen3": REPO / "configs/examples/qwen3-omni-tiny.yaml",
}
DIRS = {"qwen2_5": omni_tiny.QWEN2_5_OMNI_DIR, "qwen3": omni_tiny.QWEN3_OMNI_DIR}
PROMPT = "Hello there"


@pytest.fixture(scope="module", autouse=True)
def tiny_checkpoints() -> None:
    """What scripts/bootstrap.sh builds (kept when present: ~3 s when not), and the token2wav
    graphs qwen2_5-omni-tiny.yaml plans (kept when exported from the checkpoint as it is: ~30 s when not)."""
    from exports import qwen2_5_omni_token2wav

    omni_tiny.ensure_built()
    qwen2_5_omni_token2wav.ensure_built()


# ---- the checkpoints ------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["qwen2_5", "qwen3"])
def test_the_tiny_checkpoint_is_the_real_architecture_scaled_down(model: str) -> None:
    from transformers import AutoTokenizer

    d = DIRS[model]
    config = json.loads((d / "config.json").read_text())
    vocoder = "token2wav_config" if model == "qwen2_5" else "code2wav_config"
    assert config["model_type"] == {"qwen2_5": "qwen2_5_omni", "qwen3": "qwen3_omni_moe"}[model]
    assert {"thinker_config", "talker_config", vocoder} <= set(config)
    text = config["thinker_config"]["text_config"]
    assert (text["hidden_size"], text["num_hidden_layers"], text["vocab_size"]) == (
        64,
        2,
        omni_tiny.TEXT_VOCAB,
    )
    if model == "qwen3":
        assert (text["num_experts"], text["num_experts_per_tok"]) == (4, 2)
        assert config["talker_config"]["num_code_groups"] == omni_tiny.Q3_CODE_GROUPS
    size = sum(p.stat().st_size for p in d.glob("*.safetensors"))
    assert 0 < size <= 100 * 1024 * 1024
    names = set().union(*(read_safetensors_header(p) for p in d.glob("*.safetensors")))
    assert "thinker.model.embed_tokens.weight" in names and any(
        n.startswith("talker.") for n in names
    )
    readme = (d / "README.md").read_text()
    assert "never the quality" in readme and "| real | tiny |" in readme
    for what, real, tiny in omni_tiny.SCALE_DOWN[d.name]:
        assert f"| {what} | {real} | {tiny} |" in readme
    tok = AutoTokenizer.from_pretrained(d)
    assert len(tok) <= omni_tiny.TEXT_VOCAB
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True
    )
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    t = omni_tiny.TOKEN
    assert ids == [
        t["<|im_start|>"],
        t["user"],
        10,
        72,
        105,
        t["<|im_end|>"],
        10,
        t["<|im_start|>"],
        t["assistant"],
        10,
    ]
    assert tok.decode([228, 189, 160, 229, 165, 189]) == "你好"  # UTF-8 bytes are tokens


def test_a_present_checkpoint_is_kept_and_a_forced_build_is_the_same_bytes(tmp_path: Path) -> None:
    rows = omni_tiny.ensure_built()
    assert [r.get("skipped") for r in rows] == ["present", "present"]
    t0 = time.perf_counter()
    built = omni_tiny.build_qwen3_omni(tmp_path / "q3")
    print(
        f"qwen3-omni-tiny built in {time.perf_counter() - t0:.1f} s: {built['parameters']:,} parameters, "
        f"{built['bytes']:,} bytes"
    )
    assert (tmp_path / "q3/model.safetensors").read_bytes() == (
        omni_tiny.QWEN3_OMNI_DIR / "model.safetensors"
    ).read_bytes()
    assert not [
        p for p in tmp_path.iterdir() if p.name.startswith(".")
    ]  # no temporary directory left


# ---- planning -------------------------------------------------------------------------------


def _sub_model_bytes(d: Path, prefix: str, extra: tuple[str, ...] = ()) -> int:
    total = 0
    for f in d.glob("*.safetensors"):
        for name, meta in read_safetensors_header(f).items():
            if name != "__metadata__" and (name.startswith(prefix) or name in extra):
                total += meta["data_offsets"][1] - meta["data_offsets"][0]
    return total


@pytest.mark.parametrize("model", ["qwen2_5", "qwen3"])
def test_vllm_refuses_an_omni_sub_model_by_name_and_transformers_takes_it(model: str) -> None:
    plan = plan_pipeline(load_config(CONFIGS[model]), load_profile(CPU_PROFILE))
    assert plan.admitted
    doc = {s["name"]: s for s in plan.to_json()["stages"]}
    for name in ("thinker", "talker"):
        s = doc[name]
        assert (s["device"], s["backend"]) == ("cpu", "transformers-cpu")
        refusal = next(r for r in s["refusals"] if r["code"] == RefusalCode.MODEL_STAGE_UNSUPPORTED)
        assert refusal["device"] == "cpu" and f"model_stage {name}: vllm-cpu" in refusal["message"]
        assert f"list transformers-cpu in stages.{name}.backends" in refusal["remedy"]
        assert s["engine_kwargs"]["model_stage"] == name
        # thinker and talker share torch's pool in the CPU actor: one budget (2 cores: torch's 1, the voice's 1)
        assert (s["cpu_threads"], s["cpu_threads_from"]) == (1, "plan")
    assert "hidden states" in doc["thinker"]["refusals"][-1]["message"]
    # KV per token: layers × 2 (K, V) × KV heads × head_dim × 4 bytes (fp32)
    assert doc["thinker"]["kv_cache"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 4 == 512
    assert doc["talker"]["kv_cache"]["bytes_per_token"] == 2 * 2 * 1 * 16 * 4 == 256
    weights = {
        n: next(r for r in doc[n]["reservations"] if r["purpose"] == "weights")
        for n in ("thinker", "talker")
    }
    d = DIRS[model]
    assert (
        weights["thinker"]["bytes"] == _sub_model_bytes(d, "thinker.")
        and weights["thinker"]["evidence"] == "D"
    )
    assert weights["talker"]["bytes"] == _sub_model_bytes(
        d, "talker.", ("thinker.model.embed_tokens.weight",)
    )
    whole = sum(f.stat().st_size for f in d.glob("*.safetensors"))
    assert weights["talker"]["bytes"] < weights["thinker"]["bytes"] < whole


def test_a_plain_decoder_stays_on_vllm_unless_its_config_names_transformers(tmp_path: Path) -> None:
    model = REPO / "configs/models/smollm2-135m-instruct"
    stage = f"{{name: thinker, kind: ar_decode, model: {model}, devices: [cpu], max_model_len: 2048, final_output: true"
    (tmp_path / "a.yaml").write_text(f"name: a\nstages:\n  - {stage}}}\n")
    (tmp_path / "b.yaml").write_text(
        f"name: b\nstages:\n  - {stage}, backends: [transformers-cpu]}}\n"
    )
    profile = load_profile(CPU_PROFILE)
    plain = plan_pipeline(load_config(tmp_path / "a.yaml"), profile).stage("thinker")
    assert plain.backend == "vllm-cpu" and "transformers" not in json.dumps(plain.to_dict())
    named = plan_pipeline(load_config(tmp_path / "b.yaml"), profile).stage("thinker")
    assert named.admitted and named.backend == "transformers-cpu"
    acts = next(r for r in named.reservations if r.purpose == "activations")
    assert "the last position's logits" in acts.note


def test_quantized_weights_are_refused_on_transformers() -> None:
    cpu = load_profile(CPU_PROFILE).device("cpu")
    assert cpu is not None
    transformers = engine_for("transformers-cpu")
    assert transformers.format_refusal("transformers-cpu", cpu, "bf16") is None
    why = transformers.format_refusal("transformers-cpu", cpu, "awq-4bit")
    assert why is not None and "unquantized weights (fp32, bf16, fp16) only" in why


def test_the_probe_offers_transformers_on_this_cpu() -> None:
    from orchestrator.probe.engines import found_here

    offered = set(found_here(Device(id="cpu", kind="cpu", name="this CPU")))
    assert "transformers-cpu" in offered


# ---- parity with transformers' own generate(), and cancellation -----------------------------


async def _items(*items: Any) -> AsyncIterator[Any]:
    for item in items:
        yield item


@pytest.fixture(scope="module")
def runners() -> Iterator[dict[str, Any]]:
    """Each model's thinker and talker runner, loaded in this process as a device actor would."""
    kind = get_kind("ar_decode")
    profile = load_profile(CPU_PROFILE)
    out: dict[str, Any] = {}
    for model, path in CONFIGS.items():
        config = load_config(path)
        plan = plan_pipeline(config, profile)
        for name in ("thinker", "talker"):
            runner = kind.runner(plan.stage(name), config.stage(name))
            runner.load()
            out[f"{model}.{name}"] = runner
    yield out
    for runner in out.values():
        runner.close()


def _think(runner: Any, rid: str) -> tuple[str, list[dict[str, Any]]]:
    async def main() -> list[Any]:
        return [x async for x in runner.stream(rid, _items(PROMPT))]

    text, hidden = "", []
    for item in asyncio.run(main()):
        port, value = untag(item)
        if port == "hidden_states":
            hidden.append(value)
        else:
            assert port is None and isinstance(value, str)
            text += value
    return text, hidden


def _talk(
    runner: Any, rid: str, text: str, hidden: list[dict[str, Any]], *, first_only: bool = False
) -> list[Any]:
    joined = {"thinker.hidden_states": hidden, "thinker.text": [text]}

    async def main() -> list[Any]:
        out = []
        stream = runner.stream(rid, _items(joined))
        async for codes in stream:
            out.append(codes)
            if first_only:
                await stream.aclose()
                break
        return out

    return asyncio.run(main())


@pytest.mark.parametrize("model", ["qwen2_5", "qwen3"])
def test_thinker_tokens_and_talker_codes_match_transformers_generate(
    model: str, runners: dict[str, Any]
) -> None:
    thinker, talker = runners[f"{model}.thinker"], runners[f"{model}.talker"]
    text, hidden = _think(thinker, "r1")
    codes = _talk(talker, "r1", text, hidden)
    stages = load_config(CONFIGS[model])
    ref = reference(
        DIRS[model],
        PROMPT,
        threads=torch_threads([thinker.plan.to_dict(), talker.plan.to_dict()]),
        thinker_max=stages.stage("thinker").sampling.max_tokens,
        talker_max=stages.stage("talker").sampling.max_tokens,
        repetition_penalty=stages.stage("talker").sampling.repetition_penalty,
    )
    tokens = [int(h["next_token"][0]) for h in hidden]
    assert tokens == ref.tokens and text == ref.text
    assert codes == ref.codes and len(codes) > 0
    # the hand-over: the prompt's step, then one per fed token, each [tokens, thinker width] float32
    assert [int(t) for t in hidden[0]["token_ids"]] == ref.prompt_ids
    assert hidden[0]["hidden"].shape == hidden[0]["embeds"].shape == (len(ref.prompt_ids), 64)
    assert all(
        h["hidden"].shape == (1, 64) and str(h["hidden"].dtype) == "float32" for h in hidden[1:]
    )
    assert int(hidden[0]["layer"][0]) == (
        -1 if model == "qwen2_5" else 1
    )  # the layer the talker reads
    width = 1 if model == "qwen2_5" else omni_tiny.Q3_CODE_GROUPS
    assert {len(c) for c in codes} == {width}
    stats = talker.request_stats("r1")
    assert stats["hidden_states"]["width"] == 64 and stats["hidden_states"]["steps"] == len(hidden)
    assert stats["finish_reason"] in ("stop", "length") and stats["tokens"] == len(codes)
    assert thinker.request_stats("r1")["finish_reason"] == (
        "stop" if ref.tokens[-1] == omni_tiny.TOKEN["<|im_end|>"] else "length"
    )
    print(
        f"{model}: {len(tokens)} thinker tokens and {len(codes)} talker steps identical to transformers' generate()"
    )


def test_a_talker_request_closed_after_its_first_code_stops_generating(
    runners: dict[str, Any],
) -> None:
    thinker, talker = runners["qwen2_5.thinker"], runners["qwen2_5.talker"]
    configured = talker.stage
    try:
        _cancel_mid_talker(thinker, talker)
    finally:
        talker.stage = configured


def _cancel_mid_talker(thinker: Any, talker: Any) -> None:
    long = talker.stage.sampling.model_copy(update={"min_tokens": 600, "max_tokens": 600})
    talker.stage = talker.stage.model_copy(
        update={"sampling": long}
    )  # 600 codes: long by construction
    text, hidden = _think(thinker, "c1")
    first = _talk(talker, "c1", text, hidden, first_only=True)
    assert len(first) == 1
    assert talker.request_stats("c1")["finish_reason"] == "abort"
    deadline = time.monotonic() + 60
    while (
        talker._gen_lock.locked()
    ):  # the generation thread gives the model back once it sees the cancel
        assert time.monotonic() < deadline
        time.sleep(0.01)
    talker.stage = talker.stage.model_copy(
        update={"sampling": long.model_copy(update={"min_tokens": 2, "max_tokens": 4})}
    )
    assert len(_talk(talker, "c2", text, hidden)) == 4
    after = talker.request_stats("c2")
    assert after["waited_for_previous"] is False
    assert after["aborted_before"]["requests"] == 1 and after["aborted_before"]["last_tokens"] < 600


def test_a_hand_over_the_talker_cannot_read_is_refused_by_name(runners: dict[str, Any]) -> None:
    import numpy as np

    from orchestrator.core.errors import BadRequest

    talker = runners["qwen3.talker"]
    step = {
        "step": np.array([0]),
        "token_ids": np.arange(3, dtype=np.int64),
        "embeds": np.zeros((3, 32), np.float32),
        "hidden": np.zeros((3, 32), np.float32),
        "next_token": np.array([5]),
        "eos_token_ids": np.array([258]),
        "layer": np.array([1]),
    }
    with pytest.raises(BadRequest) as exc:
        _talk(talker, "w1", "x", [step])
    assert "hidden states are 32 wide; this talker reads 64" in str(exc.value)
    with pytest.raises(BadRequest) as exc:
        _talk(talker, "w2", "x", [{**step, "embeds": np.zeros((2, 32), np.float32)}])
    assert "thinker.hidden_states[0]" in str(exc.value) and "do not agree" in str(exc.value)
    with pytest.raises(BadRequest) as exc:
        _talk(talker, "w3", "x", ["not a hand-over"])
    assert "is str, not the thinker's hand-over" in str(exc.value)


def test_sampling_with_a_seed_repeats_and_min_tokens_holds_off_the_end(
    runners: dict[str, Any],
) -> None:
    thinker = runners["qwen3.thinker"]
    request = {
        "prompt": PROMPT,
        "sampling": {
            "temperature": 1.5,
            "top_k": 50,
            "seed": 7,
            "min_tokens": 20,
            "max_tokens": 20,
        },
    }

    def tokens(rid: str, req: dict[str, Any]) -> list[int]:
        async def main() -> list[Any]:
            return [x async for x in thinker.stream(rid, _items(req))]

        return [
            int(v["next_token"][0])
            for p, v in map(untag, asyncio.run(main()))
            if p == "hidden_states"
        ]

    first, again = tokens("s1", request), tokens("s2", request)
    other = tokens("s3", {**request, "sampling": {**request["sampling"], "seed": 8}})
    assert first == again and len(first) == 20 and other != first
    assert (
        omni_tiny.TOKEN["<|im_end|>"] not in first[:-1]
    )  # the end is not sampled before min_tokens
    stats = thinker.request_stats("s1")
    assert (stats["tokens"], stats["finish_reason"]) == (20, "length")


def test_a_streaming_talker_starts_on_the_first_steps_and_gives_the_same_codes(
    runners: dict[str, Any],
) -> None:
    """join: latest — the talker starts on the thinker's first two steps (vLLM-Omni's async_chunk).
    The rest of the hand-over is held back until the first code has come: a talker that needed the
    whole hand-over would never produce it (the test would time out). Codes: those of the whole
    hand-over, and of transformers' generate()."""
    thinker, talker = runners["qwen2_5.thinker"], runners["qwen2_5.talker"]
    whole_stage = talker.stage
    text, hidden = _think(thinker, "l1")
    whole = _talk(talker, "l0", text, hidden)
    talker.stage = whole_stage.model_copy(update={"join": "latest"})
    first_code = asyncio.Event()

    async def latest() -> AsyncIterator[Any]:
        for i, step in enumerate(hidden):
            if i == 2:
                await asyncio.wait_for(first_code.wait(), timeout=60)
            yield {"thinker.hidden_states": step}
        yield {
            "thinker.hidden_states": hidden[-1],
            "thinker.text": text,
        }  # latest re-sends the newest step

    async def main() -> list[Any]:
        out = []
        async for codes in talker.stream("l1", latest()):
            out.append(codes)
            first_code.set()
        return out

    try:
        streamed = asyncio.run(main())
    finally:
        talker.stage = whole_stage
    assert streamed == whole and len(streamed) == 64
    stats = talker.request_stats("l1")
    assert stats["hidden_states"]["streamed"] is True and stats["hidden_states"]["steps"] == len(
        hidden
    )
    threads = torch_threads([thinker.plan.to_dict(), talker.plan.to_dict()])
    ref = reference(DIRS["qwen2_5"], PROMPT, threads=threads, thinker_max=24, talker_max=64)
    assert streamed == ref.codes


def test_a_talker_that_cannot_stream_refuses_join_latest_by_name(tmp_path: Path) -> None:
    doc = (
        CONFIGS["qwen3"]
        .read_text()
        .replace("join: all", "join: latest")
        .replace("../../exports", str(REPO / "exports"))
    )
    (tmp_path / "q3.yaml").write_text(doc)
    with pytest.raises(errors.ConfigError) as exc:
        plan_pipeline(load_config(tmp_path / "q3.yaml"), load_profile(CPU_PROFILE))
    assert "stages.talker.join" in str(exc.value) and "whole hand-over only" in str(exc.value)
    assert "use join: all" in str(exc.value)


def test_a_streaming_talker_refuses_a_step_out_of_order_by_name(runners: dict[str, Any]) -> None:
    from orchestrator.core.errors import BadRequest

    thinker, talker = runners["qwen2_5.thinker"], runners["qwen2_5.talker"]
    whole_stage = talker.stage
    _text, hidden = _think(thinker, "o1")
    talker.stage = whole_stage.model_copy(update={"join": "latest"})

    async def skipping() -> AsyncIterator[Any]:
        yield {"thinker.hidden_states": hidden[0]}
        yield {"thinker.hidden_states": hidden[2]}  # step 1 never came

    async def main() -> list[Any]:
        return [x async for x in talker.stream("o1", skipping())]

    try:
        with pytest.raises(BadRequest) as exc:
            asyncio.run(main())
    finally:
        talker.stage = whole_stage
    assert "thinker.hidden_states[1]: is step 2, not 1" in str(exc.value)
