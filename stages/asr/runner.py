"""The runtime half of ``asr``: audio segments in, one transcript per segment out.

:class:`AsrRunner` opens the plan's two session specs (encoder, decoder
step) in one session host of the placement's route — this interpreter or the
route's worker (``orchestrator.ort.sessions``), exactly as an
``exported_graph`` stage opens its one (:class:`~stages.ort_runner.OrtRunner`).
A route worker is recycled at the stage's budget between windows, never in the
middle of one: a window's encoder run and its decoding loop are one ``_unit``
(the loop feeds each step's cache back, and OpenVINO meets a new cache shape at
every step); and only at a calibrated budget (``recycles_at_estimate``).

Per audio item: resample to the
encoder's rate with soxr, cut into windows (30 s for Whisper), run the
encoder's preprocess hook (log-mel) and the encoder once per window, then
decode greedily with the decoder step and its KV cache, and turn the tokens
into text with the decoder's postprocess hook.

What the decoding loop reads from the decoder's manifest ``metadata``:
``prompt`` (token ids fed first), ``end_of_text``, ``suppress_tokens`` and
``begin_suppress_tokens`` (never emitted; the second at the first step only);
every id above ``end_of_text`` (special and timestamp tokens) is never
emitted either. The cache's empty shape comes from the ``past_key`` input.

``audio_context`` (the plan's engine kwargs): ``full`` feeds the encoder 30 s
windows (3000 log-mel frames, the speech then padding), as Whisper was trained.
``fit`` runs the encoder on the same features cut to :func:`fit_frames` of the
window — its length plus ``FIT_MARGIN_S``, rounded up to whole seconds, at least
``FIT_MIN_S`` (whisper.cpp's ``audio_ctx``; the hook is asked for those frames only, the
item's ``frames``, and Whisper's computes no more) — and hands the decoder the 1500
positions it was trained on: the encoder's outputs for the cut, then those of a
silent 30 s window (computed once at ``load()``) for the rest. Fed the cut alone,
the decoder repeats the transcript until ``max_new_tokens`` on most short
questions (docs/asr.md has the measurement); with the silent tail it stops as on
a full window. The window's features are offset so their floor (the padding's
level) is the tail's, ``SILENCE_LEVEL``: a constant offset of Whisper's log-mel is
a change of gain, so this only evens the loudness across the splice. The
encoder's manifest says how many frames a second holds and the bounds
(``metadata.frames_per_second``, ``min_frames``, ``max_frames``).

Guarantees: one string per input item, in order (after a non-empty one, starting
with a space: text items are deltas); each window yields at most
``max_new_tokens`` tokens; a bad item (not ``{"audio": 1-D samples,
"sample_rate": int > 0}``) fails the request with ``StageFailed`` naming the
stage, the device and what was wrong.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.core.errors import StageFailed
from stages.audio_items import Cancelled, mono_audio, resample
from stages.exported_graph.artifact import ExportedArtifact
from stages.ort_runner import OrtRunner, route_for

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.ort.sessions import ResolvedRoute

__all__ = ["AsrRunner", "fit_frames", "route_for"]

FIT_MARGIN_S = 0.5
"""Seconds of the padding the encoder still sees after the speech under ``fit`` (before
rounding up to whole seconds). On the 22 held-out questions of bench/voice_latency.py
(docs/asr.md) margins 0 and 1 s gave the same words up to one near-tie; half a second
keeps the speech's last syllable away from the cut whatever the VAD's padding."""
FIT_MIN_S = 1
"""The shortest window ``fit`` runs, in seconds: no question is shorter, and 1 s (100
frames) is the encoder manifest's ``min_frames``."""
SILENCE_LEVEL = -0.75
"""The floor of the log-mel features (the padding's value) of the silent tail ``fit``
splices after the cut, and to which each window's features are offset. Whisper's
features are ``(max(log10 mel, peak - 8) + 4) / 4``, so the floor is ``peak / 4 - 1``:
-0.66 to -0.86 on the Piper-spoken questions; the words came out the same with the
tail computed at each window's own floor and at this one (docs/asr.md)."""


def fit_frames(
    samples: int,
    rate: int,
    frames_per_second: int,
    min_frames: int,
    max_frames: int,
    margin_s: float = FIT_MARGIN_S,
    min_s: float = FIT_MIN_S,
) -> int:
    """The encoder frames ``fit`` runs for a window of ``samples`` at ``rate`` Hz: its length
    plus ``margin_s``, rounded up to whole seconds (so at most 30 different shapes ever reach
    the EP), at least ``min_s`` seconds and ``min_frames``, at most ``max_frames``; even (the
    encoder's second convolution has stride 2)."""
    seconds = max(math.ceil(samples / rate + margin_s), math.ceil(min_s))
    frames = max(seconds * frames_per_second, min_frames)
    frames = min(frames + frames % 2, max_frames)
    return frames - frames % 2


class AsrRunner(OrtRunner):
    """Encoder + greedy KV-cache decoding, both sessions in the placement's route."""

    recycles_at_estimate = False
    """The estimate sits below one window's work in a route worker: on OpenVINO (its planned
    1248 MiB on configs/profiles/cpu-only-linux.json) a fresh worker holds 485 MiB and one
    window's decode rises 1.1-1.25 GiB (a new cache shape every step), so recycled at it the
    worker was replaced before every window, 2-9x slower, its peak no lower (docs/asr.md). A
    calibrated budget counts the window's rise (``call_rise_bytes``), so the worker is recycled
    at that one only."""

    def __init__(
        self, stage_plan: StagePlan, artifacts: dict[str, ExportedArtifact], route: ResolvedRoute
    ) -> None:
        super().__init__(stage_plan, route)
        self.encoder, self.decoder = artifacts["encoder"], artifacts["decoder"]
        pre, text = self.encoder.hook("preprocess"), self.decoder.hook("postprocess")
        if pre is None or text is None:
            self._fail(
                "the encoder's manifest needs a preprocess hook (audio → features) and the decoder's a "
                "postprocess hook (token ids → text)"
            )
        self._pre: Callable[..., Any] = pre
        self._text: Callable[..., Any] = text
        meta = self.decoder.metadata
        try:
            self.prompt = [int(t) for t in meta["prompt"]]
            self.end = int(meta["end_of_text"])
            suppress, begin = list(meta["suppress_tokens"]), list(meta["begin_suppress_tokens"])
        except (KeyError, TypeError, ValueError) as exc:
            self._fail(
                f"{self.decoder.dir}/manifest.yaml: metadata needs prompt, end_of_text, suppress_tokens and "
                f"begin_suppress_tokens ({type(exc).__name__}: {exc})"
            )
        self.rate = int(self.encoder.metadata.get("sample_rate", 16000))
        self.window = int(self.encoder.metadata.get("window_seconds", 30)) * self.rate
        self.max_new_tokens = int(stage_plan.engine_kwargs.get("max_new_tokens", 224))
        self.audio_context = str(stage_plan.engine_kwargs.get("audio_context", "full"))
        self.fit_margin_s, self.fit_min_s = FIT_MARGIN_S, float(FIT_MIN_S)
        self.silence: dict[str, Any] = {}
        self.silent_tail = True
        """Under fit, splice the silent window's outputs after the cut (False: the cut alone,
        whisper.cpp's audio_ctx; bench/asr_context.py --no-silent-tail measures it)."""
        if self.audio_context == "fit":
            enc = self.encoder.metadata
            if (
                enc.get("variable_frames") is not True
            ):  # planning refuses this first (stages.asr.kind.fit_problem)
                self._fail(
                    f"audio_context fit: {self.encoder.dir}/manifest.yaml does not declare "
                    "metadata.variable_frames: true; rebuild: python -m exports.whisper_asr build"
                )
            self.frames_per_second = int(enc.get("frames_per_second", 100))
            self.frame_bounds = (int(enc.get("min_frames", 2)), int(enc.get("max_frames", 3000)))
            self.features = self.encoder.manifest.inputs[0].name
            self.mel_bins = int(self.encoder.manifest.inputs[0].shape[1])
        vocab = next(int(o.shape[-1]) for o in self.decoder.manifest.outputs if o.name == "logits")
        self.suppress = np.zeros(vocab, dtype=bool)
        self.suppress[self.end + 1 :] = True
        self.suppress[suppress] = True
        self.begin_suppress = begin
        past = next(i for i in self.decoder.manifest.inputs if i.name == "past_key")
        self.empty_cache_shape = tuple(
            d if isinstance(d, int) else (1 if d == "batch" else 0) for d in past.shape
        )

    def load(self) -> None:
        """Open the encoder's then the decoder's session in the route; load the tokenizer and
        the feature extractor (the hooks' first calls); then a route worker is recycled at the
        stage's budget."""
        specs = self._session_specs("encoder", "decoder")
        with self._loading():
            self.load_info = dict(self._open(specs))
            self._detokenize(
                []
            )  # the tokenizer and the feature extractor load now, not on the first request
            self._pre(
                {"audio": np.zeros(self.rate // 10, dtype=np.float32), "sample_rate": self.rate},
                self.encoder,
            )
            if (
                self.audio_context == "fit"
            ):  # the silent window's cross keys/values, spliced after every cut
                silent = np.full(
                    (1, self.mel_bins, self.frame_bounds[1]), SILENCE_LEVEL, dtype=np.float32
                )
                self.silence = self._host.run(self._handles["encoder"], {self.features: silent})[
                    "outputs"
                ]
        self._recycle_at_budget()

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

    def frames_for(self, samples: int) -> int | None:
        """The encoder frames for a window of ``samples`` (at the encoder's rate); None under
        ``full`` (the preprocess hook's 30 s window as it is)."""
        if self.audio_context != "fit":
            return None
        return fit_frames(
            samples,
            self.rate,
            self.frames_per_second,
            *self.frame_bounds,
            margin_s=self.fit_margin_s,
            min_s=self.fit_min_s,
        )

    def _window(self, samples: Any) -> str:
        """One window's text: its encoder run and decoding loop in one route worker (``_unit``)."""
        with self._unit():
            return self._detokenize(self._decode_window(samples))

    def decode_tokens(
        self, item: Any, prefix: Sequence[int] = (), cancel: threading.Event | None = None
    ) -> list[int]:
        """The greedy token ids of one audio item of at most one window (a speech segment), the
        first ones ``prefix`` (forced: what earlier passes on the same growing segment committed,
        ``stages.asr.streaming``); ``text`` turns them into the transcript. ``StageFailed`` for a
        bad item or one longer than a window; ``Cancelled`` once ``cancel`` is set (checked
        before the encoder and before each decoder step)."""
        if not self._handles:
            self._fail("run before load()")
        samples, rate = self._samples(item)
        samples = resample(samples, rate, self.rate, cancel)
        if len(samples) > self.window:
            self._fail(
                f"{len(samples) / self.rate:.1f} s of audio: a pass decodes one window of "
                f"{self.window // self.rate} s at most"
            )
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled before the encoder")
        with self._unit():
            return self._decode_window(samples, prefix, cancel)

    def text(self, tokens: Sequence[int]) -> str:
        """The transcript of ``tokens`` (the decoder's postprocess hook: special tokens dropped,
        stripped)."""
        return self._detokenize(list(tokens))

    def word_starts(self, tokens: Sequence[int]) -> frozenset[int]:
        """The indices of the tokens that begin a word (the text of the tokens up to and with
        one holds one more whitespace-separated word than without it)."""
        starts, words = set(), 0
        for k in range(1, len(tokens) + 1):
            now = len(self._detokenize(list(tokens[:k])).split())
            if now > words:
                starts.add(k - 1)
            words = now
        return frozenset(starts)

    def _decode_window(
        self, samples: Any, prefix: Sequence[int] = (), cancel: threading.Event | None = None
    ) -> list[int]:
        frames = self.frames_for(len(samples))
        item = {"audio": samples, "sample_rate": self.rate}
        if frames is not None and frames < self.frame_bounds[1]:
            item["frames"] = frames  # a hook that reads it computes only these (the cut below)
        feeds = self._pre(item, self.encoder)
        if frames is None or frames >= self.frame_bounds[1]:
            encoded = self._host.run(self._handles["encoder"], feeds)["outputs"]
            return self._greedy(encoded["cross_key"], encoded["cross_value"], prefix, cancel)
        features = feeds[self.features]
        feeds[self.features] = np.ascontiguousarray(
            features[..., :frames] + (SILENCE_LEVEL - features.min())
        )
        encoded = self._host.run(self._handles["encoder"], feeds)["outputs"]
        if not self.silent_tail:
            return self._greedy(encoded["cross_key"], encoded["cross_value"], prefix, cancel)
        key, value = (
            np.concatenate([encoded[n], self.silence[n][..., frames // 2 :, :]], axis=-2)
            for n in ("cross_key", "cross_value")
        )
        return self._greedy(key, value, prefix, cancel)

    def _greedy(
        self,
        cross_key: Any,
        cross_value: Any,
        prefix: Sequence[int] = (),
        cancel: threading.Event | None = None,
    ) -> list[int]:
        """Greedy token ids after the prompt, without the end token; the first ones are
        ``prefix`` (forced: fed with the prompt in the first step, as if decoded). A set
        ``cancel`` stops it before the next step (``Cancelled``)."""
        empty = np.zeros(self.empty_cache_shape, dtype=np.float32)
        tokens: list[int] = [int(t) for t in prefix][: self.max_new_tokens]
        feeds = {
            "input_ids": np.array([self.prompt + tokens], dtype=np.int64),
            "cross_key": cross_key,
            "cross_value": cross_value,
            "past_key": empty,
            "past_value": empty,
        }
        while len(tokens) < self.max_new_tokens:
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"cancelled after {len(tokens)} tokens")
            out = self._host.run(self._handles["decoder"], feeds)["outputs"]
            scores = np.where(self.suppress, -np.inf, out["logits"][0])
            if not tokens:
                scores[self.begin_suppress] = -np.inf
            token = int(np.argmax(scores))
            if token == self.end:
                break
            tokens.append(token)
            feeds.update(
                input_ids=np.array([[token]], dtype=np.int64),
                past_key=out["present_key"],
                past_value=out["present_value"],
            )
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
                    raise self._failed(exc, f"request {request_id}: ") from exc
                yield f" {text}" if said and text else text
                said = said or bool(text)
        finally:  # cancelled or closed early: the thread still transcribing stops at its next block
            cancel.set()

    def request_stats(self, request_id: str) -> dict[str, object]:
        """``worker_recycles`` for a route worker (``OrtRunner``); nothing in this process."""
        return self._worker_figures()
