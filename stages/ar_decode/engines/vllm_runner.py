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
  EngineCore process, so the in-process engine is driven step-wise instead, on
  the engine thread of :class:`~stages.ar_decode.engines.threaded.ThreadedEngineRunner`
  (which owns the thread, the command queue, cancellation, stats and health): it
  calls ``step()`` while any request is unfinished, and each step's deltas are
  handed to the request's asyncio queue on its own event loop.
* ``stream(request_id, inputs)`` takes a prompt (a string, or a dict with
  ``prompt`` or ``messages`` and optional ``sampling`` overrides), applies the
  chat template (with the stage's ``system_prompt``) and yields text deltas.
  Several requests may be in flight; each is its own vLLM request, batched by
  the engine up to ``max_num_seqs``. Closing the iterator early aborts the
  request in the engine.
* ``json_schema`` (``response_format``) and ``tool_call`` (``tools``): the grammar the
  llama.cpp runner decodes under (``tool_grammar.decode_grammar``), handed to vLLM's
  structured outputs (xgrammar compiles it), so a reply that ends is a document, or a
  call, valid for its schema. ``logprobs``: vLLM's own, each delta's tokens in the
  request's stats (``logprobs``) in the llama.cpp runner's shape
  (:mod:`~stages.ar_decode.engines.vllm_logprobs`), the end-of-generation token left out.
* ``measured_peak_bytes()``: see :meth:`ThreadedEngineRunner.measured_peak_bytes
  <stages.ar_decode.engines.threaded.ThreadedEngineRunner.measured_peak_bytes>`.

Environment: the CPU backend's threads are the plan's ``cpu_threads``, as
``OMP_NUM_THREADS`` before torch is imported: the device actor is created with it
(``VllmEngine.actor_env``), ``load()`` sets it when torch is not imported yet,
and otherwise sizes torch's pool with ``torch.set_num_threads`` before the engine
starts (vLLM's CPU worker refuses that call once it has bound its threads).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from orchestrator.core.errors import StageFailed
from stages.ar_decode.engines.base import NO_TELEMETRY_ENV, QUIET_ENV
from stages.ar_decode.engines.threaded import EngineRequest, ThreadedEngineRunner
from stages.ar_decode.engines.vllm_logprobs import VllmLogprobs
from stages.ar_decode.model_cache import resolve_model
from stages.ar_decode.prompt import check_length, encode, request_parts
from stages.ar_decode.tool_grammar import decode_grammar

log = logging.getLogger(__name__)

CPU_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""The engine in this process (docs/runtime.md). Its threads are the plan's
``cpu_threads`` (``OMP_NUM_THREADS``, through ``VllmEngine.actor_env``): the
planner's share of the host's cores (``orchestrator.core.cpu_threads``)."""


@dataclass(eq=False)
class VllmRequest(EngineRequest):
    """A vLLM request, and how many alternatives each of its tokens' log-probabilities has
    (None: none asked)."""

    top: int | None = None


class VllmRunner(ThreadedEngineRunner):
    """An ``ar_decode`` stage on vLLM, in this process (see the module docstring)."""

    title = "vLLM"
    request_type = VllmRequest
    stopped = (
        "its vLLM engine stopped after a failed step (code engine_failed; the cause is in the "
        "server's log); restart the server"
    )
    _engine: Any = None
    _tokenizer: Any = None
    _logprobs: VllmLogprobs | None = None

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
                _set_torch_threads(threads)

            t_import = time.perf_counter()
            kwargs = dict(self.plan.engine_kwargs)
            dtype = kwargs.get("dtype")
            kwargs["model"] = str(
                resolve_model(kwargs["model"], dtype=dtype if dtype not in (None, "auto") else None)
            )
            kwargs.setdefault("disable_log_stats", True)
            # never a checkpoint's own Python code, never pickled weights (.bin): the plan read
            # the safetensors headers, and config.json's auto_map was refused then
            kwargs["trust_remote_code"] = False
            kwargs.setdefault("load_format", "safetensors")
            t_model = time.perf_counter()
            self._engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
            self._tokenizer = self._engine.get_tokenizer()
            self._logprobs = VllmLogprobs(self._tokenizer)
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
        self._started()
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

    def _release(self) -> None:
        """Shut the engine down and tear down what it left in the process."""
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                engine.engine_core.shutdown()
            except Exception:  # pragma: no cover - best effort at teardown
                log.debug("engine shutdown raised", exc_info=True)
            del engine
            _cleanup_vllm()

    def _ready(self) -> bool:
        return self._engine is not None

    # -- requests ----------------------------------------------------------------
    async def _accept(
        self, request_id: str, inputs: AsyncIterator[Any]
    ) -> tuple[EngineRequest, tuple[Any, ...]]:
        """The prompt's token ids through the chat template and its sampling, as vLLM's."""
        prompt_ids, params = self._prepare([item async for item in inputs])
        req = self._new_request(request_id, len(prompt_ids))
        if params.logprobs is not None:
            assert isinstance(req, VllmRequest)
            req.top = params.logprobs
            req.extra["logprobs"] = []  # each delta's tokens appended (``_deliver``)
        return req, ("add", request_id, prompt_ids, params)

    def _prepare(self, items: list[Any]) -> tuple[list[int], Any]:
        """The prompt's token ids and vLLM's sampling of them: the request's own, a grammar of
        its tools or ``json_schema`` (``tool_grammar.decode_grammar``, the one llama.cpp decodes
        under, compiled by vLLM's structured-output backend) and its ``logprobs``."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        template = getattr(self._tokenizer, "chat_template", None)
        messages, sampling = request_parts(self.stage, items, template)
        prompt_ids = encode(self._tokenizer, messages)
        check_length(self.stage, len(prompt_ids), sampling)
        grammar = decode_grammar(sampling)  # checked here too: the actor's own request
        params = SamplingParams(
            temperature=sampling.get("temperature", 1.0),
            top_p=sampling.get("top_p", 1.0),
            top_k=max(int(sampling.get("top_k", 0)), 0),
            max_tokens=sampling.get("max_tokens", 16),
            min_tokens=sampling.get("min_tokens", 0),
            seed=sampling.get("seed"),
            repetition_penalty=sampling.get("repetition_penalty", 1.0),
            presence_penalty=sampling.get("presence_penalty", 0.0),
            frequency_penalty=sampling.get("frequency_penalty", 0.0),
            stop=list(sampling.get("stop") or ()) or None,
            structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar else None,
            logprobs=sampling.get("logprobs"),
            output_kind=RequestOutputKind.DELTA,
        )
        return list(prompt_ids), params

    # -- the engine thread ---------------------------------------------------------
    def _serve_engine(self) -> None:
        """Commands in (waiting for one while nothing is unfinished), then one ``step()`` and its
        outputs to their requests; a step that raises stops the engine (the base says so)."""
        engine = self._engine
        if self.plan.backend == "vllm-cpu":
            # OpenMP's thread count is per thread: this one steps the engine, so it gets torch's
            # pool's count (the plan's, set at load) — else the kernels it runs and vLLM's CPU
            # attention metadata disagree, and the step aborts
            import torch

            _set_torch_threads(self.plan.cpu_threads or torch.get_num_threads())
        busy = False
        while True:
            for cmd in self._take(block=not engine.has_unfinished_requests()):
                if cmd[0] == "stop":
                    return
                self._command(cmd)
            if not engine.has_unfinished_requests():
                if busy:
                    busy = False
                    self._idle()
                continue
            if not busy:
                busy = True
                self._busy()
            outputs = engine.step()
            self._meter.sample()
            self._deliver(outputs, time.perf_counter())

    def _command(self, cmd: tuple[Any, ...]) -> None:
        """``add`` (request id, prompt ids, sampling params) or ``abort`` (the request)."""
        try:
            if cmd[0] == "add":
                _, rid, prompt_ids, params = cmd
                self._engine.add_request(rid, {"prompt_token_ids": prompt_ids}, params)
            elif cmd[0] == "abort":
                self._engine.abort_request([cmd[1].rid])
                cmd[1].released.set()
        except Exception as exc:
            if cmd[0] != "add":  # pragma: no cover
                log.debug("abort of %s raised", cmd[1], exc_info=True)
                cmd[1].released.set()
                return
            req = self._requests.get(cmd[1])
            if req is not None:
                req.put(
                    StageFailed(
                        self.plan.name,
                        self.device,
                        f"vLLM refused request {cmd[1]}: {type(exc).__name__}: {exc}",
                    )
                )

    def _deliver(self, outputs: list[Any], now: float) -> None:
        """One step's outputs: each request's new text, and its end when it finished."""
        for out in outputs:
            req = self._requests.get(out.request_id)
            if req is None:
                continue
            completion = out.outputs[0]
            req.produced(len(completion.token_ids), now)
            if isinstance(req, VllmRequest) and req.top is not None and completion.logprobs:
                assert self._logprobs is not None
                ids = list(completion.token_ids)
                if out.finished and _ended_on_token(completion):
                    ids = ids[:-1]  # the end-of-generation token is not listed (as llama.cpp's)
                req.extra["logprobs"].extend(
                    self._logprobs.entries(ids, completion.logprobs, req.top)
                )
            if completion.text:
                req.put(completion.text)
            if out.finished:
                req.end(completion.finish_reason, now)


def _ended_on_token(completion: Any) -> bool:
    """Whether a finished completion's last token is the one that ended it (end-of-sequence, a
    stop token): vLLM keeps it in ``token_ids`` and leaves it out of the text; a stop string's
    end (``stop_reason`` the string) is a token of the reply."""
    return completion.finish_reason == "stop" and not isinstance(completion.stop_reason, str)


def _set_torch_threads(threads: int) -> None:
    """torch's intra-op threads (and this thread's OpenMP count) set to ``threads``, through
    torch's own binding: a vLLM CPU worker started earlier in this process (another stage, a
    test) replaced ``torch.set_num_threads`` with a no-op."""
    import torch

    torch._C.set_num_threads(threads)


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
