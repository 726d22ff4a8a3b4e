"""The runtime half of ``ar_decode``: vLLM run in this process, streaming text deltas.

:class:`VllmRunner` carries out an admitted ``ar_decode`` placement:

* ``load()`` resolves the model (a GGUF is converted once into a cached
  safetensors checkpoint, see ``stages.ar_decode.model_cache``) and starts a vLLM
  ``LLMEngine`` with the plan's ``engine_kwargs`` — the absolute
  ``kv_cache_memory_bytes``, ``gpu_memory_utilization``, request limits,
  ``enforce_eager``, ``dtype`` — and nothing else.
* The engine runs **in this process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
  on the CPU backend that starts several times faster than with a spawned
  EngineCore and decodes faster on a small machine (docs/runtime.md). ``AsyncLLM`` always spawns an
  EngineCore process, so the in-process engine is driven step-wise instead:
  one thread owns the engine and calls ``step()`` while any request is
  unfinished; requests and aborts reach it through a command queue (the
  engine is not thread-safe), and each step's deltas are handed to the
  request's asyncio queue on its own event loop.
* ``stream(request_id, inputs)`` takes a prompt (a string, or a dict with
  ``prompt`` or ``messages`` and optional ``sampling`` overrides), applies the
  chat template (with the stage's ``system_prompt``) and yields text deltas.
  Several requests may be in flight; each is its own vLLM request, batched by
  the engine up to ``max_num_seqs``. Closing the iterator early aborts the
  request in the engine.
* ``measured_peak_bytes()``: see :meth:`VllmRunner.measured_peak_bytes`.

Environment: the CPU backend's threads are the plan's ``cpu_threads``, as
``OMP_NUM_THREADS`` before torch is imported: the device actor is created with it
(``ArDecodeKind.actor_env``), ``load()`` sets it when torch is not imported yet,
and otherwise sizes torch's pool with ``torch.set_num_threads`` before the engine
starts (vLLM's CPU worker refuses that call once it has bound its threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import StageFailed
from orchestrator.core.memory import RssMeter
from stages.ar_decode.engines.base import NO_TELEMETRY_ENV, QUIET_ENV
from stages.ar_decode.model_cache import resolve_model
from stages.ar_decode.prompt import check_length, encode, request_parts
from stages.base import StageRunner

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from stages.base import StageConfig

log = logging.getLogger(__name__)

CPU_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""The engine in this process (docs/runtime.md). Its threads are the plan's
``cpu_threads`` (``OMP_NUM_THREADS``, through ``ArDecodeKind.actor_env``): the
planner's share of the host's cores (``orchestrator.core.cpu_threads``)."""
_END = object()


@dataclass
class _Request:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any]
    submitted: float
    prompt_tokens: int
    first_token: float | None = None
    finished: float | None = None
    tokens: int = 0
    finish_reason: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)


ENGINE_FAILED_CODE = "engine_failed"
ENGINE_STOPPED = (
    "its vLLM engine stopped after a failed step (code engine_failed; the cause is in the "
    "server's log); restart the server"
)


class VllmRunner(StageRunner):
    """An ``ar_decode`` stage on vLLM, in this process (see the module docstring)."""

    def __init__(self, stage_plan: StagePlan, stage: StageConfig) -> None:
        self.plan = stage_plan
        self.stage = stage
        self.device = stage_plan.device or "?"
        self.load_info: dict[str, Any] = {}
        self._engine: Any = None
        self._tokenizer: Any = None
        self._commands: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._requests: dict[str, _Request] = {}
        self._done: dict[str, dict[str, Any]] = {}
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None
        self._meter = RssMeter()
        self._resident = 0
        self._busy_growth = 0
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------
    def load(self) -> None:
        """Start the engine. Raises ``StageFailed`` (stage, device, cause) when it cannot."""
        t0 = time.perf_counter()
        self._meter.start()
        try:
            threads = self.plan.cpu_threads if self.plan.backend == "vllm-cpu" else None
            if threads is not None and "torch" not in sys.modules:
                os.environ.setdefault(
                    "OMP_NUM_THREADS", str(threads)
                )  # OpenMP reads it when torch loads
            os.environ.update(CPU_ENGINE_ENV)
            for key, value in QUIET_ENV.items():
                os.environ.setdefault(key, value)
            os.environ.update(NO_TELEMETRY_ENV)  # not left to an inherited setting
            from vllm.engine.arg_utils import EngineArgs
            from vllm.v1.engine.llm_engine import LLMEngine

            if threads is not None:
                # torch was imported before (another stage in this actor, or a test's process):
                # its pool is sized already, so size it now; vLLM's CPU worker forbids it later
                import torch

                torch.set_num_threads(threads)

            t_import = time.perf_counter()
            kwargs = dict(self.plan.engine_kwargs)
            dtype = kwargs.get("dtype")
            kwargs["model"] = str(
                resolve_model(kwargs["model"], dtype=dtype if dtype not in (None, "auto") else None)
            )
            kwargs.setdefault("disable_log_stats", True)
            t_model = time.perf_counter()
            self._engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
            self._tokenizer = self._engine.get_tokenizer()
            t_engine = time.perf_counter()
        except Exception as exc:
            self._meter.stop()
            self._engine = None
            _cleanup_vllm()
            raise StageFailed(
                self.plan.name,
                self.device,
                f"vLLM engine did not start: {type(exc).__name__}: {exc}",
            ) from exc
        self._thread = threading.Thread(
            target=self._loop, name=f"vllm-{self.plan.name}", daemon=True
        )
        self._thread.start()
        self._meter.stop()
        self._resident = self._meter.growth
        self.load_info = {
            "model_dir": kwargs["model"],
            "import_s": round(t_import - t0, 3),
            "model_resolve_s": round(t_model - t_import, 3),
            "engine_start_s": round(t_engine - t_model, 3),
            "load_s": round(t_engine - t0, 3),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": _torch_threads(),
            "in_process": True,
            "load_peak_growth_bytes": self._meter.peak_growth,
            "resident_growth_bytes": self._resident,
        }
        log.info(
            "%s: vLLM engine started in %.1f s (%s)",
            self.plan.name,
            t_engine - t_model,
            kwargs["model"],
        )

    def close(self) -> None:
        """Stop the step thread, fail what is still in flight, and shut the engine down."""
        if self._thread is not None:
            self._commands.put(("stop",))
            self._thread.join(timeout=30)
            self._thread = None
        self._fail_all(StageFailed(self.plan.name, self.device, "the stage was closed"))
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                engine.engine_core.shutdown()
            except Exception:  # pragma: no cover - best effort at teardown
                log.debug("engine shutdown raised", exc_info=True)
            del engine
            _cleanup_vllm()

    def measured_peak_bytes(self) -> int | None:
        """RSS growth of this process attributable to the stage (evidence M).

        ``max(load peak, resident + busiest request window)``, where

        * *load peak*: the highest RSS sampled (every 10 ms) during ``load()``
          above the RSS just before it — imports of torch/vLLM when this
          stage is the first to import them, the checkpoint read, the KV cache
          allocation and the engine's warm-up;
        * *resident*: RSS right after ``load()`` above that same baseline;
        * *busiest request window*: the largest RSS rise measured around
          engine steps from the moment the engine went from idle to busy, to
          when it was idle again (activations, sampler buffers, Python
          objects). Another stage in the same process that allocates during
          such a window is counted too, so this is an upper bound.
        """
        if not self.load_info:
            return None
        return max(self._meter.peak_growth, self._resident + self._busy_growth)

    # -- requests ----------------------------------------------------------------
    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[str]:
        """Text deltas for the prompt read from ``inputs`` (see the module docstring)."""
        if self._engine is None:
            raise StageFailed(
                self.plan.name, self.device, "stream() before load() or after close()"
            )
        if self._failed is not None:
            raise StageFailed(self.plan.name, self.device, ENGINE_STOPPED, ENGINE_FAILED_CODE)
        items = [item async for item in inputs]
        prompt_ids, params = self._prepare(items)
        loop = asyncio.get_running_loop()
        req = _Request(loop, asyncio.Queue(), time.perf_counter(), len(prompt_ids))
        with self._lock:
            if request_id in self._requests:
                raise StageFailed(
                    self.plan.name, self.device, f"request id {request_id!r} is already in flight"
                )
            self._requests[request_id] = req
        self._commands.put(("add", request_id, prompt_ids, params))
        finished = False
        try:
            while True:
                item = await req.queue.get()
                if item is _END:
                    finished = True
                    break
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished:
                self._commands.put(("abort", request_id))
            with self._lock:
                self._requests.pop(request_id, None)
            self._done[request_id] = self._stats(req)

    def request_stats(self, request_id: str) -> dict[str, Any]:
        """Tokens and timings of a finished request (popped: asked once)."""
        return self._done.pop(request_id, {})

    def health(self) -> dict[str, str] | None:
        """None while the engine serves; ``{"code", "message"}`` once a step failed and its
        thread stopped (every later request fails: only a restart brings it back). The
        exception itself is in the log, not here: its text is no client's business."""
        if self._failed is None:
            return None
        return {"code": ENGINE_FAILED_CODE, "message": ENGINE_STOPPED}

    def _prepare(self, items: list[Any]) -> tuple[list[int], Any]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        messages, sampling = request_parts(self.stage, items)
        prompt_ids = encode(self._tokenizer, messages)
        check_length(self.stage, len(prompt_ids), sampling)
        params = SamplingParams(
            temperature=sampling.get("temperature", 1.0),
            top_p=sampling.get("top_p", 1.0),
            top_k=max(int(sampling.get("top_k", 0)), 0),
            max_tokens=sampling.get("max_tokens", 16),
            min_tokens=sampling.get("min_tokens", 0),
            seed=sampling.get("seed"),
            repetition_penalty=sampling.get("repetition_penalty", 1.0),
            output_kind=RequestOutputKind.DELTA,
        )
        return list(prompt_ids), params

    def _stats(self, req: _Request) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_tokens": req.prompt_tokens,
            "tokens": req.tokens,
            "finish_reason": req.finish_reason,
        }
        if req.first_token is not None:
            out["ttft_s"] = round(req.first_token - req.submitted, 4)
            end = req.finished or time.perf_counter()
            if req.tokens > 1 and end > req.first_token:
                out["decode_tokens_per_s"] = round((req.tokens - 1) / (end - req.first_token), 2)
        return out

    # -- the engine thread ---------------------------------------------------------
    def _loop(self) -> None:
        engine = self._engine
        busy = False
        while True:
            try:
                cmd = self._commands.get(block=not engine.has_unfinished_requests())
            except queue.Empty:
                cmd = None
            while cmd is not None:
                if cmd[0] == "stop":
                    return
                try:
                    if cmd[0] == "add":
                        _, rid, prompt_ids, params = cmd
                        engine.add_request(rid, {"prompt_token_ids": prompt_ids}, params)
                    elif cmd[0] == "abort":
                        engine.abort_request([cmd[1]])
                except Exception as exc:
                    if cmd[0] == "add":
                        self._deliver(
                            cmd[1],
                            StageFailed(
                                self.plan.name,
                                self.device,
                                f"vLLM refused request {cmd[1]}: {type(exc).__name__}: {exc}",
                            ),
                        )
                    else:  # pragma: no cover
                        log.debug("abort of %s raised", cmd[1], exc_info=True)
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = None
            if not engine.has_unfinished_requests():
                if busy:
                    busy = False
                    self._busy_growth = max(self._busy_growth, self._meter.window_growth)
                continue
            if not busy:
                busy = True
                self._meter.rebase()
            try:
                outputs = engine.step()
            except Exception as exc:
                self._failed = exc
                log.exception("%s: engine step failed", self.plan.name)
                self._fail_all(
                    StageFailed(self.plan.name, self.device, ENGINE_STOPPED, ENGINE_FAILED_CODE)
                )
                return
            self._meter.sample()
            now = time.perf_counter()
            for out in outputs:
                req = self._requests.get(out.request_id)
                if req is None:
                    continue
                completion = out.outputs[0]
                n = len(completion.token_ids)
                if n and req.first_token is None:
                    req.first_token = now
                req.tokens += n
                if completion.text:
                    self._deliver(out.request_id, completion.text)
                if out.finished:
                    req.finished = now
                    req.finish_reason = completion.finish_reason
                    self._deliver(out.request_id, _END)

    def _deliver(self, request_id: str, item: Any) -> None:
        req = self._requests.get(request_id)
        if req is not None:
            # RuntimeError: the request's event loop is gone, nobody is listening.
            with contextlib.suppress(RuntimeError):
                req.loop.call_soon_threadsafe(req.queue.put_nowait, item)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            ids = list(self._requests)
        for rid in ids:
            self._deliver(rid, error)


def _cleanup_vllm() -> None:
    """Tear down the process-wide state an in-process engine leaves (its
    single-rank torch.distributed group), so a later engine in this process
    can start."""
    if "vllm" not in sys.modules:
        return
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:  # pragma: no cover - best effort at teardown
        log.debug("vLLM distributed cleanup raised", exc_info=True)


def _torch_threads() -> int | None:
    """torch's intra-op threads in this process (None before torch is imported)."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else None
