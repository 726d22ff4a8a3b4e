"""What one request's stream on a stage counts, and the closing message that carries it.

:class:`Tally` counts a stream's outputs as they leave the runner (items, characters, audio
seconds, each output's latency from its input) and :func:`timed` the time spent waiting for
inputs, so a stage's busy time excludes waiting on its producer. :class:`StageStats` is the
stream's closing message, ``("stats", StageStats)``: the figures, and the absolute stamps
(:class:`Stamps`) the runtime's first-audio trace reads and no record keeps.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from orchestrator.runtime.hop import FirstChunk, Stamps
from stages.payloads import Item

NO_STAMPS: Stamps = {"emitted": [], "first_fed": None, "first_taken": None, "runner": None}
"""What the runtime holds before a stage's stream has closed."""


@dataclass(frozen=True)
class StageStats:
    """The closing message of a stage's stream, ``("stats", StageStats)``: the figures of
    one request on this stage (``items``, ``first_output_s``, ``duration_s``, ``busy_s``,
    then ``chars``, ``item_latency_s``, ``audio_s``, ``real_time_factor`` where they apply,
    then the runner's ``request_stats``) and the stamps kept apart from them. Sent by
    :meth:`DeviceActor.stream`, read by ``pump._StagePump.read``; it pickles across Ray."""

    figures: dict[str, object]
    stamps: Stamps
    first: FirstChunk | None = None
    """The direct mode: the first chunk of this stage's sentence input, as its producer's
    router released it (``feed(first=...)``), for the first-audio trace."""


@dataclass
class Tally:
    """What one request's stream on a stage counts as its outputs leave the runner."""

    waited: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    """Filled by ``timed``: seconds spent waiting for inputs, when the last and the first
    input were handed over."""
    emitted: list[float] = field(default_factory=list)
    """When each output left the runner (``time.perf_counter``): the trace's stamps."""
    latencies: list[float] = field(default_factory=list)
    first: float | None = None
    items: int = 0
    chars: int = 0
    audio_s: float = 0.0

    def count(self, item: Item, t0: float) -> None:
        now = time.perf_counter()
        self.emitted.append(now)
        if self.first is None:
            self.first = now - t0
        if self.waited[1]:
            self.latencies.append(now - self.waited[1])
        self.items += 1
        if isinstance(item, str):
            self.chars += len(item)
        elif isinstance(item, dict) and "audio" in item:
            rate = item.get("sample_rate")
            if isinstance(rate, int | float) and rate:
                self.audio_s += float(getattr(item["audio"], "size", 0)) / float(rate)

    def figures(self, duration: float, fed_items: bool) -> dict[str, object]:
        """The request's figures on the stage (``StageStats.figures``, before the runner's own);
        ``fed_items``: its inputs were fed one by one (not the request's ``initial``)."""
        stats: dict[str, object] = {
            "items": self.items,
            "first_output_s": _r(self.first),
            "duration_s": _r(duration),
            "busy_s": _r(max(0.0, duration - self.waited[0])),
        }
        if self.chars:
            stats["chars"] = self.chars
        if self.latencies and fed_items:
            # Per output: seconds from its input being handed over to the output
            # (for a 1:1 stage such as a TTS, the time it took to speak that chunk).
            stats["item_latency_s"] = [round(x, 4) for x in self.latencies]
        if self.audio_s:
            stats["audio_s"] = round(self.audio_s, 3)
            stats["real_time_factor"] = round(max(0.0, duration - self.waited[0]) / self.audio_s, 4)
        return stats


async def timed(items: AsyncIterator[Item], waited: list[float]) -> AsyncIterator[Item]:
    """Pass items through, adding the time spent waiting for each to ``waited[0]``
    (so a stage's busy time excludes waiting on its producer); ``waited[1]`` is
    when the last item was handed over, ``waited[2]`` when the first was."""
    while True:
        t = time.perf_counter()
        try:
            item = await items.__anext__()
        except StopAsyncIteration:
            waited[0] += time.perf_counter() - t
            return
        waited[1] = time.perf_counter()
        waited[0] += waited[1] - t
        if not waited[2]:
            waited[2] = waited[1]
        yield item


async def from_list(items: list[Item]) -> AsyncIterator[Item]:
    for item in items:
        yield item


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
