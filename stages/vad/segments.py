"""Speech segments from per-window speech probabilities, decided as the windows arrive.

:class:`Segmenter` is the decision half of the ``vad`` stage, in plain Python
(no numpy, no session): it is fed one probability per window of ``window``
samples and answers the segments it can close, as ``(start, end)`` sample
offsets at the VAD's rate. The rules are silero-vad's ``get_speech_timestamps``
made streaming:

* speech starts at the first window whose probability is at least
  ``threshold``;
* it ends where the probability first fell below ``neg_threshold`` (default
  ``threshold - 0.15``: hysteresis, so a word's soft consonant does not end
  it), once that silence has lasted ``min_silence`` samples — a pause; a
  window back at ``threshold`` or above before then cancels the pause;
* a segment shorter than ``min_speech`` samples (before padding) is dropped;
* each kept segment is padded by ``pad`` samples on both sides, never into
  the previous segment; the end pad is always available when the segment
  closes, since ``pad <= min_silence`` (checked here);
* speech longer than ``max_segment`` samples (padding included) is cut there,
  and the next segment starts where it was cut (no pad between the two: the
  samples are contiguous);
* :meth:`finish` closes speech still open when the input ends, at the last
  sample heard (or where its last pause began);
* :meth:`limit_pause` gives the current pause a limit of its own (at least
  ``pad``, at most ``min_silence``): a pause that lasted that long closes the
  segment exactly as one of ``min_silence`` would (same bounds), at once when it
  has already lasted that long; the limit ends with the pause (a window at
  ``threshold`` or above, or the segment closing). Semantic turn detection
  shortens the pause after an utterance it judged complete.

Guarantees: segments come out in order, do not overlap, lie within the
samples heard, and each is at most ``max_segment`` samples long.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SegmentRules:
    """The segmentation settings, in samples at the VAD's rate."""

    window: int
    threshold: float = 0.5
    neg_threshold: float | None = None
    min_speech: int = 0
    min_silence: int = 0
    pad: int = 0
    max_segment: int | None = None

    def __post_init__(self) -> None:
        if self.window <= 0:
            raise ValueError(f"window must be positive, got {self.window}")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must lie strictly between 0 and 1, got {self.threshold}")
        if not 0.0 <= self.low <= self.threshold:
            raise ValueError(f"neg_threshold must lie in [0, threshold], got {self.low}")
        if self.pad > self.min_silence:
            raise ValueError(
                f"the pad ({self.pad} samples) must not exceed min_silence ({self.min_silence}): "
                "the end pad is cut from the pause that closes a segment"
            )
        if self.max_segment is not None and self.max_segment < 2 * self.window + 2 * self.pad:
            raise ValueError(
                f"max_segment ({self.max_segment} samples) must hold two windows and both pads"
            )

    @property
    def low(self) -> float:
        """The probability below which a window counts as silence once speech started."""
        return (
            self.neg_threshold
            if self.neg_threshold is not None
            else max(self.threshold - 0.15, 0.01)
        )


class Segmenter:
    """Feed probabilities one window at a time (:meth:`push`), then :meth:`finish`."""

    def __init__(self, rules: SegmentRules) -> None:
        self.rules = rules
        self.windows = 0
        """Windows pushed so far."""
        self.heard = 0
        """Samples the windows cover (``finish`` may say fewer: the last window's padding)."""
        self.last_end = 0
        """End of the last segment emitted: the next one's pad never reaches before it."""
        self._start: int | None = None
        """Padded start of the open segment, or None when no speech is open."""
        self._speech_start = 0
        self._pause: int | None = None
        """Where the current pause began, inside open speech."""
        self._limit: int | None = None
        """The current pause's own limit (``limit_pause``); None: ``min_silence``."""

    @property
    def open_start(self) -> int | None:
        """Padded start of the speech still open (samples before it are never emitted again)."""
        return self._start

    @property
    def open_speech(self) -> int:
        """Samples of speech in the open segment so far (up to where its current pause began);
        0 when none is open. Once it reaches ``min_speech`` the segment will be kept."""
        if self._start is None:
            return 0
        return (self._pause if self._pause is not None else self.heard) - self._speech_start

    @property
    def pause_start(self) -> int | None:
        """Where the open speech's current pause began (the end of speech so far), or None."""
        return self._pause if self._start is not None else None

    def pending(self) -> tuple[int, int] | None:
        """The segment the current pause will close if no speech resumes, once its end pad
        has been heard; None before that, with no pause, or when the speech is too short to
        keep. The bounds are exactly those :meth:`push` then emits (the pause's start plus the
        pad, within ``max_segment``), so work on the segment can start before the pause has
        lasted ``min_silence``: a realtime session's early response."""
        span = self.closing()
        if span is None or self._pause is None or self.heard - self._pause < self.rules.pad:
            return None
        return span

    def closing(self) -> tuple[int, int] | None:
        """The segment the current pause will close if no speech resumes, as soon as the pause
        begins (:meth:`pending` before its end pad is heard: a session with its own transcript
        of the speech needs no more of the audio); None with no pause, or when the speech is too
        short to keep."""
        span, pause = self.pause_span(), self._pause
        if span is None or pause is None or pause - self._speech_start < self.rules.min_speech:
            return None
        return span

    def pause_span(self) -> tuple[int, int] | None:
        """The bounds of the segment the current pause would close (its start, the pause's start
        plus the pad, within ``max_segment``), as soon as the pause begins; None with no pause.
        What the session transcribes and judges while it waits (``pending`` adds the pad heard
        and the speech long enough to keep)."""
        r = self.rules
        if self._start is None or self._pause is None or self._pause <= self._start:
            return None
        stop = self._pause + r.pad
        if r.max_segment is not None:
            stop = min(stop, self._start + r.max_segment)
        return (self._start, stop)

    @property
    def pause_limit(self) -> int:
        """Samples of silence that close the current pause: its own limit, else ``min_silence``."""
        return self.rules.min_silence if self._limit is None else self._limit

    def limit_pause(self, samples: int) -> list[tuple[int, int]]:
        """The current pause closes the segment once it has lasted ``samples`` (clamped to
        ``[pad, min_silence]``): the segment it closes now, when it already has; nothing when no
        pause is open. The bounds are those a pause of ``min_silence`` would give."""
        r = self.rules
        if self._start is None or self._pause is None:
            return []
        self._limit = min(max(samples, r.pad), r.min_silence)
        if self.heard - self._pause >= self._limit:
            return self._close(self._pause)
        return []

    def push(self, prob: float) -> list[tuple[int, int]]:
        """One window's speech probability; the segments this window closes."""
        r = self.rules
        pos = self.windows * r.window
        self.windows += 1
        self.heard = pos + r.window
        out: list[tuple[int, int]] = []
        if prob >= r.threshold:
            self._pause = self._limit = None
            if self._start is None:
                self._speech_start = pos
                self._start = max(pos - r.pad, self.last_end)
            elif r.max_segment is not None and self.heard - self._start >= r.max_segment:
                # too long: cut here, the rest continues as a new segment from this sample on
                end = self._start + r.max_segment
                out.append((self._start, end))
                self.last_end = end
                self._start = self._speech_start = end
            return out
        if self._start is not None and prob < r.low:
            if self._pause is None:
                self._pause = pos
            if self.heard - self._pause >= self.pause_limit:
                out += self._close(self._pause)
        if (
            self._start is not None
            and r.max_segment is not None
            and self.heard - self._start >= r.max_segment
        ):
            # too long, in a pause not yet long enough: end at the pause (or here), padded within the bound
            out += self._close(
                min(
                    self._pause if self._pause is not None else self.heard,
                    self._start + r.max_segment,
                )
            )
        return out

    def finish(self, total: int | None = None) -> list[tuple[int, int]]:
        """Close speech still open; ``total``: samples really heard (default: every window's)."""
        heard = self.heard if total is None else min(total, self.heard)
        self.heard = heard
        if self._start is None:
            return []
        end = self._pause if self._pause is not None else heard
        return self._close(min(end, heard))

    def _close(self, end: int) -> list[tuple[int, int]]:
        r = self.rules
        assert self._start is not None
        start, speech = self._start, end - self._speech_start
        self._start, self._pause, self._limit = None, None, None
        if speech < r.min_speech or end <= start:
            return []
        stop = min(end + r.pad, self.heard)
        if r.max_segment is not None:
            stop = min(stop, start + r.max_segment)
        self.last_end = stop
        return [(start, stop)]
