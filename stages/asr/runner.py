"""The runtime half of ``asr``: audio segments in, one transcript per segment out.

:class:`AsrRunner` opens the plan's two session specs (encoder, decoder
step) in one session host of the placement's route — this interpreter or the
route's worker (``orchestrator.ort.sessions``), exactly as an
``exported_graph`` stage opens its one. Per audio item: resample to the
encoder's rate with soxr, cut into windows (30 s for Whisper), run the
encoder's preprocess hook (log-mel) and the encoder once per window, then
decode greedily with the decoder step and its KV cache, and turn the tokens
into text with the decoder's postprocess hook.

What the decoding loop reads from the decoder's manifest ``metadata``:
``prompt`` (token ids fed first), ``end_of_text``, ``suppress_tokens`` and
``begin_suppress_tokens`` (never emitted; the second at the first step only);
every id above ``end_of_text`` (special and timestamp tokens) is never
emitted either. The cache's empty shape comes from the ``past_key`` input.

Guarantees: one string per input item, in order (after a non-empty one, starting
with a space: text items are deltas); each window yields at most
``max_new_tokens`` tokens; a bad item (not ``{"audio": 1-D samples,
"sample_rate": int > 0}``) fails the request with ``StageFailed`` naming the
stage, the device and what was wrong.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from orchestrator.errors import StageFailed
from orchestrator.ort.backends import with_cpu_threads
from orchestrator.ort.sessions import ResolvedRoute, open_sessions
from stages.audio_items import Cancelled, mono_audio, resample
from stages.base import StageRunner
from stages.exported_graph.artifact import ExportedArtifact
from stages.exported_graph.runner import route_for

if TYPE_CHECKING:
    from orchestrator.plan import StagePlan

__all__ = ["AsrRunner", "route_for"]


class AsrRunner(StageRunner):
    """Encoder + greedy KV-cache decoding, both sessions in the placement's route."""

    def __init__(self, stage_plan: StagePlan, artifacts: dict[str, ExportedArtifact], route: ResolvedRoute) -> None:
        self.plan = stage_plan
        self.route = route
        self.encoder, self.decoder = artifacts["encoder"], artifacts["decoder"]
        pre, text = self.encoder.hook("preprocess"), self.decoder.hook("postprocess")
        if pre is None or text is None:
            self._fail("the encoder's manifest needs a preprocess hook (audio → features) and the decoder's a "
                       "postprocess hook (token ids → text)")
        self._pre: Callable[..., Any] = pre
        self._text: Callable[..., Any] = text
        meta = self.decoder.metadata
        try:
            self.prompt = [int(t) for t in meta["prompt"]]
            self.end = int(meta["end_of_text"])
            suppress, begin = list(meta["suppress_tokens"]), list(meta["begin_suppress_tokens"])
        except (KeyError, TypeError, ValueError) as exc:
            self._fail(f"{self.decoder.dir}/manifest.yaml: metadata needs prompt, end_of_text, suppress_tokens and "
                       f"begin_suppress_tokens ({type(exc).__name__}: {exc})")
        self.rate = int(self.encoder.metadata.get("sample_rate", 16000))
        self.window = int(self.encoder.metadata.get("window_seconds", 30)) * self.rate
        self.max_new_tokens = int(stage_plan.engine_kwargs.get("max_new_tokens", 224))
        vocab = next(int(o.shape[-1]) for o in self.decoder.manifest.outputs if o.name == "logits")
        self.suppress = np.zeros(vocab, dtype=bool)
        self.suppress[self.end + 1 :] = True
        self.suppress[suppress] = True
        self.begin_suppress = begin
        past = next(i for i in self.decoder.manifest.inputs if i.name == "past_key")
        self.empty_cache_shape = tuple(d if isinstance(d, int) else (1 if d == "batch" else 0) for d in past.shape)
        self._host: Any = None
        self._handles: dict[str, int] = {}
        self.load_info: dict[str, Any] = {}

    def _fail(self, why: str) -> NoReturn:
        raise StageFailed(self.plan.name, self.plan.device or "?", why)

    def load(self) -> None:
        """Open the encoder's then the decoder's session in the route; load the tokenizer and
        the feature extractor (the hooks' first calls)."""
        specs = {g: dict((self.plan.engine_kwargs.get(g) or {}).get("session") or {}) for g in ("encoder", "decoder")}
        if not all(specs.values()):
            self._fail("the plan carries no session spec for the encoder and the decoder (was it admitted?)")
        try:
            self._host = open_sessions(self.route)
            for graph, spec in specs.items():
                self.load_info[graph] = self._host.open(with_cpu_threads(spec, self.plan.cpu_threads), record=True)
                self._handles[graph] = self.load_info[graph]["handle"]
            self._detokenize([])  # the tokenizer and the feature extractor load now, not on the first request
            self._pre({"audio": np.zeros(self.rate // 10, dtype=np.float32), "sample_rate": self.rate}, self.encoder)
        except Exception as exc:
            self.close()
            raise StageFailed(self.plan.name, self.plan.device or "?", f"{type(exc).__name__}: {exc}") from exc

    def transcribe(self, item: Any, cancel: threading.Event | None = None) -> str:
        """The text of one audio item, its windows' texts joined by a space. Resampled in
        blocks; a set ``cancel`` (its request was cancelled) stops the work between blocks
        and between windows (``Cancelled``)."""
        if not self._handles:
            self._fail("run before load()")
        samples, rate = self._samples(item)
        samples = resample(samples, rate, self.rate, cancel)
        texts = []
        for i in range(0, len(samples), self.window):
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"cancelled before window {i // self.window}")
            texts.append(self._window(samples[i : i + self.window]))
        return " ".join(t for t in texts if t)

    def _samples(self, item: Any) -> tuple[Any, int]:
        try:
            return mono_audio(item, "an asr stage")
        except ValueError as exc:
            self._fail(str(exc))

    def _window(self, samples: Any) -> str:
        feeds = self._pre({"audio": samples, "sample_rate": self.rate}, self.encoder)
        encoded = self._host.run(self._handles["encoder"], feeds)["outputs"]
        return self._detokenize(self._greedy(encoded["cross_key"], encoded["cross_value"]))

    def _greedy(self, cross_key: Any, cross_value: Any) -> list[int]:
        """Greedy token ids after the prompt, without the end token."""
        empty = np.zeros(self.empty_cache_shape, dtype=np.float32)
        feeds = {"input_ids": np.array([self.prompt], dtype=np.int64), "cross_key": cross_key,
                 "cross_value": cross_value, "past_key": empty, "past_value": empty}
        tokens: list[int] = []
        while len(tokens) < self.max_new_tokens:
            out = self._host.run(self._handles["decoder"], feeds)["outputs"]
            scores = np.where(self.suppress, -np.inf, out["logits"][0])
            if not tokens:
                scores[self.begin_suppress] = -np.inf
            token = int(np.argmax(scores))
            if token == self.end:
                break
            tokens.append(token)
            feeds.update(input_ids=np.array([[token]], dtype=np.int64),
                         past_key=out["present_key"], past_value=out["present_value"])
        return tokens

    def _detokenize(self, tokens: list[int]) -> str:
        return str(self._text({"tokens": np.asarray(tokens, dtype=np.int64)}, self.decoder)).strip()

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """One text item per audio item. Text items are deltas (the runtime and the next
        stage join them as they are), so a transcript after a non-empty one starts with a
        space: the joined deltas read as one text."""
        said = False
        cancel = threading.Event()
        try:
            async for item in inputs:
                try:
                    text = await asyncio.to_thread(self.transcribe, item, cancel)
                except StageFailed:
                    raise
                except Exception as exc:
                    raise StageFailed(self.plan.name, self.plan.device or "?",
                                      f"request {request_id}: {type(exc).__name__}: {exc}") from exc
                yield f" {text}" if said and text else text
                said = said or bool(text)
        finally:  # cancelled or closed early: the thread still transcribing stops at its next block
            cancel.set()

    def close(self) -> None:
        if self._host is not None:
            for handle in self._handles.values():
                self._host.close(handle)
            self._host.shutdown()
        self._host, self._handles = None, {}
