"""The runtime half of ``vad``: audio in, speech segments out, the Silero graph run window by window.

:class:`VadRunner` opens the plan's session spec in the placement's route
(this interpreter or the route's worker, ``orchestrator.ort.sessions``), as an
``exported_graph`` stage opens its one (:class:`~stages.ort_runner.OrtRunner`:
a route worker is recycled at the stage's budget, between items: each item's
windows are one ``_unit``). Per request (the items are consecutive
pieces of one recording, at one sample rate):

1. each item is resampled to the graph's rate (``metadata.sample_rate``, 16 kHz)
   with a streaming soxr resampler, so pieces join without seams;
2. cut into windows of ``metadata.chunk_samples`` (512: 32 ms); each call feeds
   ``input`` = the previous window's last ``metadata.context_samples`` (64) samples
   followed by the window, ``sr`` (a 0-d int64) and ``state`` (the previous call's
   ``stateN``; zeros at the start of the request), and reads ``output`` (the speech
   probability);
3. the probabilities go to a :class:`~stages.vad.segments.Segmenter` (the stage's
   thresholds and durations, ``engine_kwargs["segments"]``), and each segment it
   closes is yielded at once, cut from the samples as they came in (the input's
   own rate, not the graph's): ``{"audio": float32 mono, "sample_rate": rate}``;
4. at the end the last partial window is padded with zeros and scored, and
   speech still open is closed at the last sample.

Guarantees: segments in order, not overlapping, each at most ``max_segment_s``
long; audio without speech is refused (``BadRequest`` naming the stage, the
seconds heard and the highest speech probability: nothing downstream answers an
empty prompt), or with ``no_speech: nothing`` yields no item; ``request_stats`` says how much
was heard, how many windows were scored and segments kept, and the speech
seconds. A bad item (not audio, not mono, another rate than the request's first
item) fails the request with ``StageFailed`` naming the stage and device.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import soxr

from orchestrator.core.errors import BadRequest, StageFailed
from stages.audio_items import RESAMPLE_BLOCK_SAMPLES, Cancelled, mono_audio
from stages.exported_graph.artifact import ExportedArtifact
from stages.ort_runner import OrtRunner, route_for
from stages.vad.segments import Segmenter, SegmentRules

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.ort.sessions import ResolvedRoute

__all__ = ["VadRunner", "route_for"]


class Segment(TypedDict):
    """One speech segment as the stage yields it: an audio item at the input's own rate."""

    audio: np.ndarray
    sample_rate: int


class VadStats(TypedDict):
    """A request's figures on the stage: seconds heard, windows scored, segments kept and
    their speech seconds."""

    heard_s: float
    windows: int
    segments: int
    speech_s: float


class VadRunner(OrtRunner):
    """Silero VAD window by window with its state; segments cut at pauses."""

    def __init__(
        self, stage_plan: StagePlan, artifact: ExportedArtifact, route: ResolvedRoute
    ) -> None:
        super().__init__(stage_plan, route)
        self.artifact = artifact
        meta = artifact.metadata
        try:
            self.rate = int(meta["sample_rate"])
            self.window = int(meta["chunk_samples"])
            self.context = int(meta["context_samples"])
        except (KeyError, TypeError, ValueError) as exc:
            self._fail(
                f"{artifact.dir}/manifest.yaml: metadata needs sample_rate, chunk_samples and context_samples "
                f"({type(exc).__name__}: {exc})"
            )
        state = next((i for i in artifact.manifest.inputs if i.name == "state"), None)
        if state is None:
            self._fail(f"{artifact.dir}/manifest.yaml: no 'state' input")
        self.state_shape = tuple(d if isinstance(d, int) else 1 for d in state.shape)
        s = dict(stage_plan.engine_kwargs.get("segments") or {})
        ms = self.rate // 1000
        self.rules = SegmentRules(
            window=self.window,
            threshold=float(s.get("threshold", 0.5)),
            neg_threshold=s.get("neg_threshold"),
            min_speech=int(s.get("min_speech_ms", 250)) * ms,
            min_silence=int(s.get("min_silence_ms", 400)) * ms,
            pad=int(s.get("speech_pad_ms", 100)) * ms,
            max_segment=int(float(s.get("max_segment_s", 30.0)) * self.rate),
        )
        self.no_speech = str(s.get("no_speech", "refuse"))
        self._handle: int | None = None
        self._stats: dict[str, VadStats] = {}

    def load(self) -> None:
        """Open the session in the route, and score one window of silence (the first run's
        allocations); then a route worker is recycled at the stage's budget."""
        specs = self._session_specs()
        with self._loading():
            opened = self._open(specs)["session"]
            self.load_info, self._handle = dict(opened), opened["handle"]
            Windows(self).score(np.zeros(self.window, dtype=np.float32))
        self._recycle_at_budget()

    def run_window(self, window: Any, context: Any, state: Any) -> tuple[float, Any]:
        """One call of the graph: (speech probability, next state)."""
        if self._handle is None:
            self._fail("run before load()")
        feeds = {
            "input": np.concatenate([context, window])[np.newaxis, :].astype(
                np.float32, copy=False
            ),
            "sr": np.array(self.rate, dtype=np.int64),
            "state": state,
        }
        out = self._host.run(self._handle, feeds)["outputs"]
        return float(np.asarray(out["output"]).reshape(-1)[0]), out["stateN"]

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """One audio item per speech segment, each yielded as soon as its pause is heard."""
        cut = Cutter(self)
        try:
            async for item in inputs:
                samples, rate = self._samples(item, cut.source_rate)
                for segment in await asyncio.to_thread(self._in_unit, cut.feed, samples, rate):
                    yield segment
            for segment in await asyncio.to_thread(self._in_unit, cut.finish):
                yield segment
        except StageFailed:
            raise
        except Exception as exc:
            raise self._failed(exc, f"request {request_id}: ") from exc
        finally:  # cancelled or closed early: the thread still scoring stops at its next block
            cut.cancel.set()
        if cut.segments or self.no_speech != "refuse":
            self._stats[request_id] = cut.stats()
        else:
            heard = cut.received / float(cut.source_rate or 1)
            raise BadRequest.single(
                f"request (stage {self.plan.name}, kind vad)",
                f"no speech was heard in {heard:.2f} s of audio (the highest speech probability of its "
                f"{cut.windows.count} windows was {cut.top:.2f}; speech starts at {self.rules.threshold:g})",
                "record the question again, closer to the microphone; or lower the stage's threshold",
            )

    def _in_unit(self, work: Callable[..., list[Segment]], *args: Any) -> list[Segment]:
        """One item's windows in one route worker: recycled before or after them, never between."""
        with self._unit():
            return work(*args)

    def request_stats(self, request_id: str) -> dict[str, object]:
        """Seconds heard, windows scored, segments kept and their speech seconds (popped: asked once);
        ``worker_recycles`` for a route worker."""
        return {**self._stats.pop(request_id, {}), **self._worker_figures()}

    def _samples(self, item: Any, rate_so_far: int | None) -> tuple[Any, int]:
        try:
            samples, rate = mono_audio(item, "a vad stage")
        except ValueError as exc:
            self._fail(str(exc))
        if rate_so_far is not None and rate != rate_so_far:
            self._fail(
                f"the items of one request are one recording: {rate} Hz after {rate_so_far} Hz"
            )
        return samples, rate

    def close(self) -> None:
        super().close()
        self._handle = None


class Windows:
    """The graph's side of one request: samples at the graph's rate → one probability per window."""

    def __init__(self, runner: VadRunner) -> None:
        self.runner = runner
        self.pending = np.zeros(0, dtype=np.float32)
        self.context = np.zeros(runner.context, dtype=np.float32)
        self.state = np.zeros(runner.state_shape, dtype=np.float32)
        self.count = 0

    def score(self, window: Any) -> float:
        prob, self.state = self.runner.run_window(window, self.context, self.state)
        self.context = window[-self.runner.context :] if self.runner.context else self.context
        self.count += 1
        return prob

    def feed(self, samples: Any) -> list[float]:
        """Scores of every whole window the samples complete."""
        w = self.runner.window
        self.pending = np.concatenate([self.pending, samples.astype(np.float32, copy=False)])
        whole = len(self.pending) // w
        probs = [self.score(self.pending[i * w : (i + 1) * w]) for i in range(whole)]
        self.pending = self.pending[whole * w :]
        return probs

    def flush(self) -> list[float]:
        """The last partial window, padded with zeros (none when nothing is left)."""
        if not len(self.pending):
            return []
        window = np.zeros(self.runner.window, dtype=np.float32)
        window[: len(self.pending)] = self.pending
        self.pending = np.zeros(0, dtype=np.float32)
        return [self.score(window)]


class Cutter:
    """One request: the input's samples kept (at its own rate) until no segment can need them,
    resampled for the graph, scored, segmented, cut."""

    def __init__(self, runner: VadRunner, rules: SegmentRules | None = None) -> None:
        """``rules``: the segmentation settings, when not the stage's own (a realtime
        session's turn detection: its threshold, pause and padding)."""
        self.runner = runner
        self.windows = Windows(runner)
        self.segmenter = Segmenter(rules or runner.rules)
        self.source_rate: int | None = None
        self.resampler: Any = None
        self.kept = np.zeros(0, dtype=np.float32)
        self.kept_from = 0
        """Index (at the source rate) of ``kept[0]``."""
        self.received = 0
        """Samples received (at the source rate)."""
        self.graph_samples = 0
        """Samples handed to the graph (at its rate)."""
        self.segments: list[float] = []
        self.spans: list[tuple[int, int]] = []
        """Each emitted segment's bounds, in samples at the graph's rate (``Segmenter``'s)."""
        self.cancel = threading.Event()
        """Set when the request ends early: work in a thread stops at its next block."""
        self.top = 0.0
        """The highest speech probability scored so far."""

    def feed(self, samples: Any, rate: int) -> list[Segment]:
        """Segments the item's samples end, resampled and scored block by block
        (``RESAMPLE_BLOCK_SAMPLES``); ``Cancelled`` between blocks once ``cancel`` is set."""
        if self.source_rate is None:
            self.source_rate = rate
            if rate != self.runner.rate:
                self.resampler = soxr.ResampleStream(rate, self.runner.rate, 1, dtype="float32")
        out: list[Segment] = []
        for start in range(0, len(samples), RESAMPLE_BLOCK_SAMPLES):
            if self.cancel.is_set():
                raise Cancelled(f"cancelled after {self.received} samples")
            block = samples[start : start + RESAMPLE_BLOCK_SAMPLES]
            self.kept = np.concatenate([self.kept, block])
            self.received += len(block)
            out += self._score(
                self.resampler.resample_chunk(block) if self.resampler is not None else block
            )
        return out

    def finish(self) -> list[Segment]:
        out: list[Segment] = []
        if self.resampler is not None:
            out += self._score(
                self.resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
            )
        for prob in self.windows.flush():
            self.top = max(self.top, prob)
            out += self._cut(self.segmenter.push(prob))
        out += self._cut(self.segmenter.finish(self.graph_samples))
        return out

    def _score(self, graph_samples: Any) -> list[Segment]:
        graph_samples = np.asarray(graph_samples, dtype=np.float32).reshape(-1)
        self.graph_samples += len(graph_samples)
        out: list[Segment] = []
        for prob in self.windows.feed(graph_samples):
            self.top = max(self.top, prob)
            out += self._cut(self.segmenter.push(prob))
        self._trim()
        return out

    def _at_source(self, graph_index: int) -> int:
        assert self.source_rate is not None
        return min(round(graph_index * self.source_rate / self.runner.rate), self.received)

    def _cut(self, bounds: list[tuple[int, int]]) -> list[Segment]:
        out = []
        for start, end in bounds:
            item = self._item(start, end)
            if item is not None:
                self.segments.append(item["audio"].size / float(self.source_rate or 1))
                self.spans.append((start, end))
                out.append(item)
        return out

    def _item(self, start: int, end: int) -> Segment | None:
        a, b = self._at_source(start) - self.kept_from, self._at_source(end) - self.kept_from
        audio = self.kept[max(a, 0) : max(b, 0)].copy()
        return Segment(audio=audio, sample_rate=int(self.source_rate or 0)) if audio.size else None

    def limit_pause(self, samples: int) -> list[Segment]:
        """The current pause closes the segment after ``samples`` (at the graph's rate) of
        silence (``Segmenter.limit_pause``): the segment it closes now, cut, when it already has."""
        return self._cut(self.segmenter.limit_pause(samples))

    def audio(self, start: int, end: int) -> Segment | None:
        """The samples heard between the graph's indices ``start`` and ``end``, at the input's
        rate (None when none is kept): what a segment with these bounds would hold."""
        return self._item(start, end)

    def pending(self) -> tuple[tuple[int, int], Segment] | None:
        """The segment the current pause will close if no speech resumes (``Segmenter.pending``):
        its bounds and its audio, cut exactly as the closed segment will be."""
        span = self.segmenter.pending()
        if span is None:
            return None
        item = self._item(*span)
        return None if item is None else (span, item)

    def closing(self) -> tuple[tuple[int, int], Segment] | None:
        """The segment the current pause will close as soon as the pause begins
        (``Segmenter.closing``): its bounds and the audio of it heard so far (its end pad may
        still be on its way)."""
        span = self.segmenter.closing()
        if span is None:
            return None
        item = self._item(span[0], min(span[1], self.segmenter.heard))
        return None if item is None else (span, item)

    def seconds(self, start: int, end: int) -> float:
        """The length, at the input's rate, of the segment between the graph's indices ``start``
        and ``end`` once all of it is heard (what :meth:`audio` will then hold)."""
        rate = self.source_rate or self.runner.rate
        return (
            round(end * rate / self.runner.rate) - round(start * rate / self.runner.rate)
        ) / float(rate)

    def _trim(self) -> None:
        """Forget the samples no segment can start before: before the open segment, or
        (no speech open) before one pad's length behind the last window scored."""
        seg = self.segmenter
        keep_from = (
            seg.open_start
            if seg.open_start is not None
            else max(seg.heard - seg.rules.pad, seg.last_end)
        )
        drop = self._at_source(keep_from) - self.kept_from
        if drop > 0:
            self.kept = self.kept[drop:]
            self.kept_from += drop

    def stats(self) -> VadStats:
        heard = self.received / float(self.source_rate) if self.source_rate else 0.0
        return VadStats(
            heard_s=round(heard, 3),
            windows=self.windows.count,
            segments=len(self.segments),
            speech_s=round(sum(self.segments), 3),
        )
