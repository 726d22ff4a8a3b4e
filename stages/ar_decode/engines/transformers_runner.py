"""The ``transformers`` backend of ``ar_decode``: a decoder run by transformers' own ``generate()``.

vLLM runs a decoder-only text model; it cannot hand an Omni thinker's hidden
states on, nor run the talker that reads them. :class:`TransformersRunner` runs
what vLLM cannot, in this process, on the CPU (``transformers-cpu``, with the
plan's thread count) or an NVIDIA GPU (``transformers-cuda``):

* a plain causal LM (``AutoModelForCausalLM``) or an Omni **thinker**
  (``model_stage: thinker``: the Omni class loaded with ``enable_audio_output``
  off, so only the thinker's weights are read): text deltas on the ``text``
  port, and — for a thinker — one item per forward step on the
  ``hidden_states`` port (:func:`handover_item`): the token ids that step fed,
  their input embeddings and their hidden states at the layer the talker reads
  (Qwen2.5-Omni: the last; Qwen3-Omni: ``talker_config.accept_hidden_layer``),
  and the token it sampled. That is what transformers' Omni ``generate()``
  (and vLLM-Omni's thinker2talker) hands the talker: the embeddings and hidden
  states of the prompt and of every generated token that was fed back.
* an Omni **talker** (``model_stage: talker``): only the talker's weights and
  the thinker's token-embedding table (which the talker's text-side inputs go
  through) are read from the checkpoint; its joined input (the thinker's
  ``hidden_states`` and ``text``) is turned into the talker's inputs exactly as
  the model's own ``generate()`` does (:mod:`stages.ar_decode.omni`), and codec
  codes stream out as ``token_ids``: one code per item for Qwen2.5-Omni, one
  frame of ``num_code_groups`` codes (the talker's first codebook, then its
  code predictor's) per item for Qwen3-Omni.

Decoding is ``generate()`` itself, one job per request run on the engine thread of
:class:`~stages.ar_decode.engines.threaded.ThreadedEngineRunner` (which owns the
thread, the queues, cancellation, stats and health), with a streamer for the
sampled tokens and a forward hook for each step's hidden states or codes:
greedy when ``temperature`` is 0, else sampling with ``top_p``/``top_k``;
``min_tokens`` (``min_new_tokens``), ``repetition_penalty``, a ``seed``
(``torch.manual_seed`` before the request; one request decodes at a time, so
the seed decides it), and a stopping criterion that ends the request when its
consumer goes away (cancellation). Finish reasons are vLLM's: ``stop``
(end-of-sequence), ``length`` (``max_tokens``), ``abort`` (cancelled).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import BadRequest, StageFailed
from stages.ar_decode import omni, omni_talker
from stages.ar_decode.engines.base import QUIET_ENV
from stages.ar_decode.engines.threaded import EngineRequest, ThreadedEngineRunner
from stages.ar_decode.model_cache import resolve_model
from stages.ar_decode.prompt import check_length, encode, request_parts
from stages.payloads import on_port, split_input

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from stages.base import StageConfig
    from stages.requests import Sampling

log = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
Job = Callable[[], None]
"""One request's generation, run on the engine thread."""


@dataclass(eq=False)
class _Request(EngineRequest):
    first_input: float | None = None
    """When a streaming talker's first hidden state arrived."""


class TransformersRunner(ThreadedEngineRunner):
    """An ``ar_decode`` stage on transformers, in this process (see the module docstring)."""

    title = "transformers"
    request_type = _Request
    stopped = (
        "its transformers engine stopped (code engine_failed; the cause is in the server's "
        "log); restart the server"
    )

    def __init__(self, stage_plan: StagePlan, stage: StageConfig) -> None:
        super().__init__(stage_plan, stage)
        self.model_stage: str | None = getattr(stage, "model_stage", None)
        self._model: Any = None
        self._tokenizer: Any = None
        self._talker: omni_talker.Talker | None = None
        self._handover: omni.HandoverSpec | None = None
        self._torch_device = "cpu"
        self._gen_lock = threading.Lock()
        """Held while a generation runs (torch's threads are the process's: one at a time)."""
        self._aborted = 0
        self._aborted_tokens: int | None = None

    # -- lifecycle ---------------------------------------------------------------
    def load(self) -> None:
        """Load the weights the stage needs. Raises ``StageFailed`` (stage, device, cause) when it cannot."""
        t0 = time.perf_counter()
        self._meter.start()
        kwargs = dict(self.plan.engine_kwargs)
        try:
            for key, value in QUIET_ENV.items():
                os.environ.setdefault(key, value)
            import torch
            import transformers

            # a sub-model loaded from a whole checkpoint lists the others' tensors as unexpected,
            # one line each: the run's own report says what was loaded
            transformers.logging.set_verbosity_error()
            threads = self.plan.cpu_threads  # None off the CPU
            if threads is not None:
                torch.set_num_threads(
                    threads
                )  # the plan's share of the cores (orchestrator.core.cpu_threads)
            self._torch_device = str(kwargs.get("torch_device") or "cpu")
            dtype = getattr(torch, TORCH_DTYPES.get(str(kwargs.get("dtype")), "float32"))
            model_dir = resolve_model(
                kwargs["model"], dtype=str(kwargs.get("dtype")) if kwargs.get("dtype") else None
            )
            t_import = time.perf_counter()
            if self.model_stage == "talker":
                self._talker = omni_talker.load_talker(
                    Path(model_dir),
                    dtype=dtype,
                    device=self._torch_device,
                    speaker=getattr(self.stage, "speaker", None),
                )
            else:
                self._model, self._handover = omni.load_text_model(
                    Path(model_dir),
                    model_stage=self.model_stage,
                    dtype=dtype,
                    device=self._torch_device,
                )
                self._tokenizer = omni.tokenizer_for(str(model_dir))
            t_loaded = time.perf_counter()
        except Exception as exc:
            self._meter.stop()
            self._model = self._talker = None
            raise StageFailed(
                self.plan.name,
                self.device,
                f"transformers could not load {kwargs.get('model')}: {type(exc).__name__}: {exc}",
            ) from exc
        self._started()
        self.load_info = {
            "model_dir": str(model_dir),
            "model_stage": self.model_stage,
            "import_s": round(t_import - t0, 3),
            "load_s": round(t_loaded - t0, 3),
            "torch_threads": torch.get_num_threads(),
            "torch_device": self._torch_device,
            "in_process": True,
            "load_peak_growth_bytes": self._meter.peak_growth,
            "resident_growth_bytes": self._resident,
        }
        log.info("%s: transformers loaded %s in %.1f s", self.plan.name, model_dir, t_loaded - t0)

    def _release(self) -> None:
        self._model = self._talker = self._tokenizer = None

    def _ready(self) -> bool:
        return self._model is not None or self._talker is not None

    # -- requests ----------------------------------------------------------------
    async def _accept(
        self, request_id: str, inputs: AsyncIterator[Any]
    ) -> tuple[_Request, tuple[Any, ...]]:
        """A prompt's generation job (text deltas, and a thinker's hidden states), or a talker's
        on its joined input (codec codes); a streaming talker (``join: latest``) starts on the
        thinker's first steps, each joined item bringing the next."""
        req = self._new_request(request_id)
        assert isinstance(req, _Request)
        req.extra["waited_for_previous"] = self._gen_lock.locked()
        if self._talker is not None and getattr(self.stage, "join", None) == "latest":
            feed = omni.HandoverFeed(f"{self.plan.name}: thinker.hidden_states")
            job = self._talker_stream_job(
                req, feed, request_parts(self.stage, [{"prompt": "-"}])[1]
            )
            feeding = asyncio.create_task(self._feed(req, feed, inputs))
            req.on_close.append(feeding.cancel)  # a done task ignores it
            return req, ("job", req, job)
        items = [item async for item in inputs]
        if self._talker is not None:
            job = self._talker_job(req, items, request_parts(self.stage, [{"prompt": "-"}])[1])
        else:
            job = self._text_job(req, items)
        return req, ("job", req, job)

    async def _feed(
        self, req: _Request, feed: omni.HandoverFeed, inputs: AsyncIterator[Any]
    ) -> None:
        """Hand the joined items' hidden states to ``feed`` as they arrive; a malformed one fails the request."""
        try:
            async for joined in inputs:
                if isinstance(joined, dict) and not any(
                    split_input(str(k))[1] == "hidden_states" for k in joined
                ):
                    continue  # latest: the text arrived before any hidden state
                feed.add(joined[omni.hidden_key(self.stage, joined)])
                if req.first_input is None:
                    req.first_input = time.perf_counter()
        except asyncio.CancelledError:
            req.cancel.set()
            raise
        except (
            Exception
        ) as exc:  # handed to the request, which raises it (a BadRequest names the item)
            req.cancel.set()
            req.put(exc)
        finally:
            feed.finish()

    # -- the engine thread ---------------------------------------------------------
    def _serve_engine(self) -> None:
        """One generation at a time, in the order the jobs came (an abort is the request's
        ``cancel`` event, which the generation's stopping criterion reads)."""
        while True:
            for cmd in self._take(block=True):
                if cmd[0] == "stop":
                    return
                if cmd[0] == "job":
                    self._generate(cmd[1], cmd[2])

    def _generate(self, req: _Request, job: Job) -> None:
        try:
            self._generate_locked(req, job)
        finally:
            req.released.set()  # a stream closed early waits for this

    def _generate_locked(self, req: _Request, job: Job) -> None:
        # A request that arrived while another generated says so in its stats
        # (waited_for_previous); cancelled ones are counted (aborted_before).
        with self._gen_lock:
            if req.cancel.is_set():
                req.end(req.finish_reason)
                return
            self._busy()
            try:
                job()
            except BaseException as exc:  # handed to the request, which raises it in its own task
                log.exception("%s: generation failed", self.plan.name)
                req.put(
                    StageFailed(
                        self.plan.name,
                        self.device,
                        f"generation failed: {type(exc).__name__}: {exc}",
                    )
                )
                return
            finally:
                self._idle()
                if req.cancel.is_set():
                    self._aborted += 1
                    self._aborted_tokens = req.tokens
            req.end(req.finish_reason)

    def _text_job(self, req: _Request, items: list[Any]) -> Job:
        messages, sampling = request_parts(self.stage, items)
        prompt_ids = encode(self._tokenizer, messages)
        check_length(self.stage, len(prompt_ids), sampling)
        req.prompt_tokens = len(prompt_ids)
        model, spec, tokenizer = self._model, self._handover, self._tokenizer

        def job() -> None:
            detok = omni.Detokenizer(tokenizer)
            pending: dict[str, Any] = {}
            steps = [0]

            def on_step(fed_ids: Any, embeds: Any, hidden: Any) -> None:
                pending.update(step=steps[0], token_ids=fed_ids, embeds=embeds, hidden=hidden)
                steps[0] += 1

            def on_token(token: int) -> None:
                req.produced()
                if spec is not None and pending:
                    req.put(on_port("hidden_states", omni.handover_item(spec, pending, token)))
                    pending.clear()
                delta = detok.add(token)
                if delta:
                    req.put(delta)

            req.finish_reason = omni.generate_text(
                model,
                spec,
                prompt_ids,
                sampling,
                on_token=on_token,
                on_step=on_step if spec else None,
                cancel=req.cancel,
                device=self._torch_device,
            )
            tail = detok.flush()
            if tail:
                req.put(tail)

        return job

    def _talker_job(self, req: _Request, items: list[Any], sampling: Sampling) -> Job:
        talker = self._talker
        assert talker is not None
        handover = omni.joined_handover(self.stage, items)
        talker.check(handover)  # a hand-over of another width is refused here, before any work

        def job() -> None:
            def on_codes(codes: list[int]) -> None:
                req.produced()
                req.put(codes)

            req.prompt_tokens = handover.prompt_tokens
            req.extra["hidden_states"] = {
                "steps": len(handover.hidden),
                "tokens": sum(h.shape[0] for h in handover.hidden),
                "width": int(handover.hidden[0].shape[1]),
                "dtype": str(handover.hidden[0].dtype),
                "layer": handover.layer,
            }
            req.finish_reason = talker.generate(
                handover, sampling, on_codes=on_codes, cancel=req.cancel
            )

        return job

    def _talker_stream_job(self, req: _Request, feed: omni.HandoverFeed, sampling: Sampling) -> Job:
        talker = self._talker
        if not isinstance(talker, omni_talker.Qwen25Talker):
            raise BadRequest.single(
                f"stages.{self.plan.name}.join",
                "latest: this talker starts on its whole hand-over only",
                "use join: all",
            )

        def job() -> None:
            def on_codes(codes: list[int]) -> None:
                req.produced()
                req.put(codes)

            req.finish_reason = talker.generate_streaming(
                feed, sampling, on_codes=on_codes, cancel=req.cancel
            )
            req.prompt_tokens = len(feed.steps[0]["token_ids"]) if feed.steps else 0
            if feed.steps:
                req.extra["hidden_states"] = {
                    "steps": len(feed.steps),
                    "tokens": sum(int(s["hidden"].shape[0]) for s in feed.steps),
                    "width": int(feed.steps[0]["hidden"].shape[1]),
                    "dtype": str(feed.steps[0]["hidden"].dtype),
                    "layer": int(feed.steps[0]["layer"].reshape(-1)[0]),
                    "streamed": True,
                }
            if req.first_input is not None and req.first_token is not None:
                req.extra["first_code_after_first_step_s"] = round(
                    req.first_token - req.first_input, 4
                )

        return job

    def _figures(self, req: EngineRequest) -> dict[str, object]:
        return {
            "aborted_before": {"requests": self._aborted, "last_tokens": self._aborted_tokens},
            **req.extra,
        }


def check_talker_input(stage: Any, items: list[Any]) -> None:
    """``BadRequest`` when a talker is handed something other than its thinker's join."""
    omni.joined_handover(stage, items)


__all__ = ["BadRequest", "TransformersRunner", "check_talker_input"]
