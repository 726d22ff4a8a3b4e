"""The first-audio trace: where the time goes between the token that ends a reply's
first sentence and the first samples of the stage that speaks it.

For every edge whose consumer takes text as sentences (``text_input ==
"sentences"``), the runtime notes, per request, when the first chunk went through
each step; the consumer's ``done`` figures carry the result as
``first_chunk_hop`` (docs/runtime.md, "From a sentence to its first samples").
Stamps are ``time.perf_counter()`` readings taken in the driver, the device
actors and the consumer's runner: one clock on one machine (Linux's
``CLOCK_MONOTONIC``, shared by every process), so the trace is made only when the
two stages run on the same node (``same_clock``); across nodes the clocks are
not comparable and the hop is left out.

The steps, in order (each in seconds; they add up to ``total_s``):

* ``to_driver``: the producer's actor yielded the token that carries the
  sentence's last character → the router read it: in the producer's own actor
  in the direct mode (``runtime.STREAMING``, about 0), in the driver in the
  relay (Ray's streaming generator); ``held``, ``chunk`` and ``feed`` are
  stamped where the router runs;
* ``held``: that token reached the driver → the one that let the chunker decide
  the sentence had ended arrived (the next token, ``stages.text_chunks``; the end
  of the stream for a reply of one sentence);
* ``chunk``: that token's arrival → the chunker released the sentence;
* ``feed``: released → the consumer's actor received it (``DeviceActor.feed``);
* ``queued``: received → the consumer's runner took it from its input queue;
* ``dispatch``: taken → the runner began on it (its loop, the hand-off to a thread);
* ``preprocess``: the artifact's preprocess hook (the Piper voice: espeak-ng);
* ``session_bridge``: the session call less the session's own run time (the
  route worker's pipe both ways, the recycle check);
* ``session_run``: the session's ``run`` as the route measured it;
* ``postprocess``: the postprocess hook;
* ``to_yield``: the runner's output → its actor yielded it;
* ``to_driver_audio``: the actor yielded it → the driver read it.

A consumer whose runner reports no stamps (not an exported graph) gets
``in_stage`` (taken → yielded) in place of the runner's five steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypedDict

RUNNER_STEPS = (
    "dispatch",
    "preprocess",
    "session_bridge",
    "session_run",
    "postprocess",
    "to_yield",
)
STEPS = ("to_driver", "held", "chunk", "feed", "queued", *RUNNER_STEPS, "to_driver_audio")
"""The hop's steps in order (the module docstring says what each is)."""


@dataclass
class FirstChunk:
    """The producer's side of one edge's first chunk, as its pump saw it."""

    producer: str
    token_index: int
    """The producer's output that carried the sentence's last character (0-based)."""
    release_index: int | None
    """The output whose arrival released the sentence; None when the stream's end did."""
    token_arrived: float
    release_arrived: float
    released: float
    at_end: bool = False
    token_emitted: float | None = None
    """When the producer's actor yielded output ``token_index`` (from its ``stamps``)."""


class EdgeTrace:
    """One sentence edge's text as the pump fed it, until its first chunk is released."""

    def __init__(self, producer: str) -> None:
        self.producer = producer
        self._ends: list[tuple[int, int]] = []  # (output index, characters fed up to and with it)
        self.first: FirstChunk | None = None

    @property
    def open(self) -> bool:
        return self.first is None

    def fed(self, index: int, text: str) -> None:
        """Output ``index`` of the producer added ``text`` to the chunker."""
        total = self._ends[-1][1] if self._ends else 0
        self._ends.append((index, total + len(text)))

    def released(
        self, pending_chars: int, arrived: list[float], *, at_end: bool = False
    ) -> FirstChunk:
        """The chunker just released the first chunk, ``pending_chars`` left in it after the
        cut; ``arrived``: when each producer output reached the driver. Returns the record."""
        now = time.perf_counter()
        total = self._ends[-1][1] if self._ends else 0
        cut = total - pending_chars  # just past the sentence's last character
        token = next(
            (i for i, end in self._ends if end >= cut), self._ends[-1][0] if self._ends else 0
        )
        release = None if at_end or not self._ends else self._ends[-1][0]
        self.first = FirstChunk(
            self.producer,
            token,
            release,
            arrived[token] if token < len(arrived) else now,
            arrived[release] if release is not None else now,
            now,
            at_end=at_end,
        )
        self._ends = []
        return self.first


def same_clock(producer_device: str | None, consumer_device: str | None) -> bool:
    """Whether two stages' stamps can be compared: both on this machine or on one node
    (a cluster's device ids are ``node/device``). Takes device ids or actor keys (a replica's
    ``node/device#k``): the node is what precedes the last ``/``."""
    return (producer_device or "").rpartition("/")[0] == (consumer_device or "").rpartition("/")[0]


class Stamps(TypedDict):
    """Absolute stamps on the device's monotonic clock (``time.perf_counter``), for the
    runtime's first-audio trace (``hop.first_chunk_hop``); they never reach a record."""

    emitted: list[float]
    """When each output left the runner."""
    first_fed: float | None
    """When the request's first input was handed to this stage (None: it took ``initial``)."""
    first_taken: float | None
    """When the runner first took an input (None: never)."""
    runner: dict[str, float] | None
    """The runner's own ``stamps`` entry of ``request_stats`` (when each step of the request's
    first item ended), as it gave it."""


def first_chunk_hop(
    first: FirstChunk, stamps: Stamps, voice_arrived: float, t0: float
) -> dict[str, object] | None:
    """``first_chunk_hop``: the steps (``STEPS``) from the producer's first sentence to the
    consumer's first output reaching the driver, and where they sit on the request's clock
    (``t0``: when it was submitted). None when a stamp is missing (the consumer yielded
    nothing, or its first output came before its first input, as a stage that speaks
    without being fed does)."""
    fed, taken = stamps.get("first_fed"), stamps.get("first_taken")
    emitted = stamps.get("emitted") or []
    if first.token_emitted is None or fed is None or taken is None or not emitted:
        return None
    out = emitted[0]
    steps: dict[str, float] = {
        "to_driver": first.token_arrived - first.token_emitted,
        "held": first.release_arrived - first.token_arrived,
        "chunk": first.released - first.release_arrived,
        "feed": fed - first.released,
        "queued": taken - fed,
    }
    runner = stamps.get("runner") or {}
    if all(k in runner for k in ("dispatched", "started", "preprocessed", "ran", "postprocessed")):
        run_s = float(runner.get("run_s") or 0.0)
        steps.update(
            {
                "dispatch": runner["started"] - taken,
                "preprocess": runner["preprocessed"] - runner["started"],
                "session_bridge": runner["ran"] - runner["preprocessed"] - run_s,
                "session_run": run_s,
                "postprocess": runner["postprocessed"] - runner["ran"],
                "to_yield": out - runner["postprocessed"],
            }
        )
    else:
        steps["in_stage"] = out - taken
    steps["to_driver_audio"] = voice_arrived - out
    return {
        "from": first.producer,
        "token_index": first.token_index,
        "released_by": "end of stream" if first.at_end else f"output {first.release_index}",
        "sentence_token_s": _r(first.token_arrived - t0),
        "first_sentence_s": _r(first.released - t0),
        "first_output_s": _r(voice_arrived - t0),
        "total_s": _r(voice_arrived - first.token_emitted),
        "steps_s": {k: _r(v) for k, v in steps.items()},
    }


def _r(x: float) -> float:
    return round(x, 5)
