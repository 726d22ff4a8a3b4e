"""``echo``: a weightless stage kind, the test suite's stand-in for a decoder and a voice.

``mode: words`` answers a prompt word by word like a decoder (``reply``, when set, is
the answer to every prompt; ``delay_s`` between words; a ``{"prompt"}`` or ``{"messages"}`` request is answered for its
prompt or its last user message; its ``request_stats`` count words the way a
decoder counts tokens: ``prompt_tokens`` over every message, ``tokens`` out);
``mode: tone`` turns each text chunk into a short sine wave like a TTS.

A ``words`` stage given a scripted prompt, ``{"script": [delta, ...],
"gate_file": path}``, yields exactly those deltas instead; with a
``gate_file`` it holds the last delta back until that file exists (at most
``GATE_TIMEOUT_S``), so a test can make "the text is not finished before
the caller has seen X" true by construction rather than by timing; the stage's own
``gate_file`` does the same for every reply's last output item (below). ``work_s`` is
a fixed work time per output item, spent (asleep, no CPU) under a runner-wide
semaphore of ``work_slots``: one runner then serves at most
``work_slots / work_s`` items per second however many requests it holds, like
an engine at its batch limit (what stage replicas are measured against).
``hold_bytes`` is memory
the runner really allocates at load (so measured peaks are real),
``fail_load`` makes ``load()`` raise, ``load_imports`` are modules ``load()``
imports (two loads whose imports cross: tests/orchestrator/runtime/test_device_actor_imports.py),
``loading_file`` is a file ``load()`` creates as it begins (before its ``load_s``), so a
test can see that a load is under way instead of guessing it from a sleep, and with a
``load_gate_file`` ``load()`` then waits for that file (at most ``GATE_TIMEOUT_S``; its
``load_info["gate"]`` says "opened" or "timed out"), so a test decides when the load ends;
``loaded_file`` is created as ``load()`` ends (its ``hold_bytes`` allocated): two stages'
loads chained through these files overlap by construction.
A stage with a ``gate_file`` holds its last output item of every request until that
file exists (at most ``gate_timeout_s``), creating ``waiting_file`` when it starts to
wait: what a test of two real ``omni-edge run`` processes orders them by (both runs
mid-reply, then one let finish, then the other). ``load_waiting_file`` is written with the
process id when ``load()`` begins (a test kills that process mid-load), and while
``crash_file`` exists ``load()`` kills its own process (a crash loop, by construction).

With ``load_stamps`` (a directory) ``load()`` writes when it began and ended there
(``<stage>.start``, ``<stage>.end``: ``time.perf_counter()``, the machine's monotonic clock,
comparable between processes on Linux); with ``load_meet`` it also waits, after its start,
until each named stage's load has begun (at most ``GATE_TIMEOUT_S``, then it fails): two
loads that meet can only both finish when they ran at the same time.

Registered by this distribution's entry point (``echo =
"omni_edge_testkinds.echo:EchoKind"``), not by importing this module.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from orchestrator.core.ledger import Reservation
from orchestrator.core.plan import StagePlan
from orchestrator.core.profile import Route
from orchestrator.core.units import MiB
from stages.base import ArtifactInfo, StageConfig, StageKind, StageRunner

SAMPLE_RATE = 16000
REPLY = "First sentence is here. The second one follows, a little longer! Is this the third?"
GATE_TIMEOUT_S = 30.0
"""How long a scripted prompt's last delta (or a load) waits for its gate file; past it the
delta is sent anyway (the load ends), so the test that opens the gate fails instead of hanging."""


class EchoConfig(StageConfig):
    """A weightless stage for runtime tests."""

    kind: Literal["echo"] = Field(description="Always 'echo'.")
    mode: Literal["words", "tone"] = Field("words", description="words: a decoder; tone: a TTS.")
    delay_s: float = Field(0.0, ge=0, description="Pause before each output item.")
    work_s: float = Field(
        0.0,
        ge=0,
        description="Work time of each output item, taken in one of the runner's work_slots: "
        "a runner serves at most work_slots / work_s items per second (0: no work time).",
    )
    work_slots: int = Field(
        1,
        ge=1,
        description="Output items the runner works on at once, over all its requests "
        "(an engine's batch limit).",
    )
    reply: str | None = Field(
        None, description="words mode: this reply instead of 'You said <prompt>. ' + REPLY."
    )
    hold_bytes: int = Field(0, ge=0, description="Bytes allocated (and touched) at load.")
    fail_load: bool = Field(False, description="Make load() raise.")
    load_s: float = Field(0.0, ge=0, description="Seconds load() takes.")
    loading_file: str | None = Field(
        None, description="A file load() creates as it begins: a test's proof it is inside load()."
    )
    load_gate_file: str | None = Field(
        None, description="A file load() waits for (at most GATE_TIMEOUT_S) before it ends."
    )
    loaded_file: str | None = Field(
        None, description="A file load() creates as it ends, its hold_bytes allocated."
    )
    load_imports: list[str] = Field(
        default_factory=list, description="Modules load() imports, in order."
    )
    gate_file: str | None = Field(
        None, description="Hold each request's last output item until this file exists."
    )
    waiting_file: str | None = Field(
        None, description="Created when the stage starts waiting at gate_file."
    )
    gate_timeout_s: float = Field(
        GATE_TIMEOUT_S, gt=0, description="The longest wait at gate_file; then the item goes."
    )
    load_waiting_file: str | None = Field(
        None,
        description="Written with the process id when load() begins (a test kills the process "
        "while it loads).",
    )
    crash_file: str | None = Field(
        None,
        description="While this file exists, load() kills its own process with SIGKILL (a driver "
        "that crashes the process at every load: a crash loop).",
    )
    load_stamps: str | None = Field(
        None, description="A directory where load() writes its start and end stamps."
    )
    load_meet: list[str] = Field(
        default_factory=list,
        description="Stages whose loads this one waits to see begun (their start stamps in "
        "load_stamps) before it ends; it fails if one has not begun within GATE_TIMEOUT_S.",
    )


class EchoRunner(StageRunner):
    def __init__(self, plan: StagePlan, cfg: EchoConfig) -> None:
        self.plan, self.cfg = plan, cfg
        self.held: np.ndarray | None = None
        self.load_info: dict[str, Any] = {}
        self.counted: dict[str, dict[str, int]] = {}
        self.slots = asyncio.Semaphore(cfg.work_slots)
        self.working = 0
        self.work_peak = 0  # most items in work at once: at most work_slots
        self.worked = 0  # items that took their work time
        self.spans: dict[str, list[tuple[float, float]]] = {}

    async def _work(self, request_id: str | None = None) -> None:
        """Spend ``work_s`` on one output item in one of the runner's slots; for ``request_id``,
        its span (``time.perf_counter()`` at its start and end) goes to its ``request_stats``."""
        if not self.cfg.work_s:
            return
        async with self.slots:
            self.working += 1
            self.work_peak = max(self.work_peak, self.working)
            start = time.perf_counter()
            try:
                await asyncio.sleep(self.cfg.work_s)
            finally:
                self.working -= 1
            self.worked += 1
            if request_id is not None:
                self.spans.setdefault(request_id, []).append((start, time.perf_counter()))

    def load(self) -> None:
        if self.cfg.load_waiting_file is not None:
            Path(self.cfg.load_waiting_file).write_text(str(os.getpid()))
        if self.cfg.crash_file is not None and Path(self.cfg.crash_file).exists():
            os.kill(os.getpid(), signal.SIGKILL)
        stamps = Path(self.cfg.load_stamps) if self.cfg.load_stamps else None
        if stamps is not None:
            (stamps / f"{self.cfg.name}.start").write_text(repr(time.perf_counter()))
            self._meet(stamps)
        self._load()
        if stamps is not None:
            (stamps / f"{self.cfg.name}.end").write_text(repr(time.perf_counter()))

    def _meet(self, stamps: Path) -> None:
        deadline = time.monotonic() + GATE_TIMEOUT_S
        for other in self.cfg.load_meet:
            while not (stamps / f"{other}.start").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"echo stage {self.cfg.name!r}: {other!r}'s load did not begin while "
                        f"this one waited {GATE_TIMEOUT_S:g} s"
                    )
                time.sleep(0.01)

    def _load(self) -> None:
        if self.cfg.loading_file:
            Path(self.cfg.loading_file).touch()
        gate = None
        if self.cfg.load_gate_file:
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while not (opened := Path(self.cfg.load_gate_file).exists()):
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.01)
            gate = "opened" if opened else "timed out"
        time.sleep(self.cfg.load_s)
        for module in self.cfg.load_imports:
            importlib.import_module(module)
        if self.cfg.fail_load:
            raise RuntimeError("echo stage told to fail its load")
        if self.cfg.hold_bytes:
            self.held = np.ones(self.cfg.hold_bytes, dtype=np.uint8)
        self.load_info = {"mode": self.cfg.mode, "held": self.cfg.hold_bytes}
        if gate is not None:
            self.load_info["gate"] = gate
        if self.cfg.loaded_file:
            Path(self.cfg.loaded_file).touch()

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        if self.cfg.mode == "words":
            items = [i async for i in inputs]
            if len(items) == 1 and isinstance(items[0], dict) and "script" in items[0]:
                async for delta in self._scripted(items[0]):
                    yield delta
                return
            prompt = " ".join(_prompt_text(i) for i in items)
            said = self.cfg.reply if self.cfg.reply is not None else f"You said {prompt}. {REPLY}"
            words = said.split(" ")
            counted = {"prompt_tokens": _words_in(items), "tokens": 0}
            self.counted[request_id] = counted
            for i, w in enumerate(words):
                await asyncio.sleep(self.cfg.delay_s)
                await self._work()
                counted["tokens"] += 1
                if i == len(words) - 1:
                    await self._gate()
                yield w if i == 0 else " " + w
            return
        held: dict[str, Any] | None = None  # with a gate: each item goes once the next is made
        async for chunk in inputs:
            await asyncio.sleep(self.cfg.delay_s)
            await self._work(request_id)
            n = max(1, len(str(chunk))) * SAMPLE_RATE // 50  # 20 ms per character
            t = np.arange(n, dtype=np.float32) / SAMPLE_RATE
            item = {
                "audio": (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32),
                "sample_rate": SAMPLE_RATE,
                "text": str(chunk),
            }
            if self.cfg.gate_file is None:
                yield item
                continue
            if held is not None:
                yield held
            held = item
        if held is not None:
            await self._gate()
            yield held

    async def _gate(self) -> None:
        """Wait for the config's ``gate_file`` (none: go on), saying so in ``waiting_file``."""
        if self.cfg.gate_file is None:
            return
        if self.cfg.waiting_file is not None:
            Path(self.cfg.waiting_file).touch()
        gate = Path(self.cfg.gate_file)
        deadline = time.monotonic() + self.cfg.gate_timeout_s
        while not gate.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def _scripted(self, prompt: dict[str, Any]) -> AsyncIterator[str]:
        script = [str(d) for d in prompt["script"]]
        gate = Path(prompt["gate_file"]) if prompt.get("gate_file") else None
        for i, delta in enumerate(script):
            await asyncio.sleep(self.cfg.delay_s)
            await self._work()
            if gate is not None and i == len(script) - 1:
                deadline = time.monotonic() + GATE_TIMEOUT_S
                while not gate.exists() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            yield delta

    def request_stats(self, request_id: str) -> dict[str, Any]:
        """A words stage's "tokens" (words, like a decoder's usage): every word of every
        message in, words out; a tone stage's ``work_spans`` (each item's work time, on this
        machine's monotonic clock), when it has a ``work_s``. Popped: asked once."""
        stats = dict(self.counted.pop(request_id, {}))
        spans = self.spans.pop(request_id, None)
        if spans:
            stats["work_spans"] = [list(span) for span in spans]
        return stats

    def close(self) -> None:
        self.held = None


def _words_in(items: list[Any]) -> int:
    """Words of a request: its prompt, or every message of it (system and history too)."""
    n = 0
    for item in items:
        if isinstance(item, dict) and "messages" in item:
            n += sum(
                len(str(m.get("content", "")).split())
                for m in item["messages"]
                if isinstance(m, dict)
            )
        else:
            n += len(_prompt_text(item).split())
    return n


def _prompt_text(item: Any) -> str:
    """What a decoder would answer: a dict request's ``prompt``, or its last user message."""
    if isinstance(item, dict) and ("prompt" in item or "messages" in item):
        if "prompt" in item:
            return str(item["prompt"])
        users = [
            m.get("content", "")
            for m in item["messages"]
            if isinstance(m, dict) and m.get("role") == "user"
        ]
        return str(users[-1]) if users else ""
    return str(item)


class EchoKind(StageKind):
    kind = "echo"
    config_model = EchoConfig
    backends = ("ort-cpu",)

    def describe(self, stage: StageConfig) -> ArtifactInfo:
        return ArtifactInfo("exported", "<none>", 0, "fp32")

    def check(self, stage: StageConfig, info: ArtifactInfo, device: Any, backend: str) -> list[Any]:
        return []

    def reservations(
        self, stage: StageConfig, info: ArtifactInfo, device: Any, backend: str, pool: str
    ) -> list[Reservation]:
        assert isinstance(stage, EchoConfig)
        return [
            Reservation(
                pool,
                "weights",
                max(stage.hold_bytes, 1 * MiB),
                "session",
                "D",
                "what the echo stage holds",
            ),
            Reservation(pool, "load_transient", 16 * MiB, "load", "E", "freed after load"),
        ]

    def runner(
        self, stage_plan: StagePlan, stage: StageConfig, route: Route | None = None
    ) -> StageRunner:
        assert isinstance(stage, EchoConfig)
        return EchoRunner(stage_plan, stage)
