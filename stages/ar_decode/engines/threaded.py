"""One engine thread behind asyncio streams: the plumbing every decode engine's runner shares.

A decode engine — vLLM's in-process ``LLMEngine``, a llama.cpp context, a transformers model —
is not thread-safe and blocks while it computes. :class:`ThreadedEngineRunner` gives it one
thread that owns it; requests reach that thread through a command queue, and what it produces
reaches each request's asyncio queue on the request's own event loop (:class:`EngineRequest`).
The base owns what is the same for every engine:

* the thread and its commands (``("stop",)`` ends it; ``("abort", request)`` when a stream is
  closed early; the engine's own commands besides), taken one at a time or, while the engine is
  busy, all that are queued (:meth:`ThreadedEngineRunner._take`);
* the requests in flight and their cancellation: a stream closed before its end marks its
  request aborted (``finish_reason`` ``abort``, its ``cancel`` event set), tells the engine and
  waits (at most ``RELEASE_WAIT_S``) until the engine has let go of it (``released``): once the
  stream is closed, the engine works on the request no more and the next one does not wait
  behind it;
* the finished requests' figures (``request_stats``: tokens, time to first token, decode rate,
  and what the engine adds), asked once each;
* the engine's end: whatever escapes the thread stops the stage in the open — ``health()`` says
  ``engine_failed``, every request in flight gets the failure and every later one is refused
  with it, never a thread gone quiet with requests waiting on it;
* the memory meter (evidence M): ``measured_peak_bytes()`` is ``max(load peak, resident +
  busiest request window)``, a window running from the engine going busy to idle again.

An engine's runner keeps only what is its own: ``load()`` (ending with
:meth:`~ThreadedEngineRunner._started`), :meth:`~ThreadedEngineRunner._accept` (the request
read and checked, and the command that submits it), :meth:`~ThreadedEngineRunner._serve_engine`
(the thread's loop: vLLM's steps, llama.cpp's batch scheduler, transformers' generate jobs) and
:meth:`~ThreadedEngineRunner._release` (freeing the engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.core.errors import StageFailed
from orchestrator.core.memory import RssMeter
from stages.base import StageHealth, StageRunner

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from stages.base import StageConfig

log = logging.getLogger(__name__)

END = object()
"""What a request's queue gets after its last item."""
ENGINE_FAILED_CODE = "engine_failed"
"""``health()``'s code once the engine thread stopped (only a restart brings it back)."""
JOIN_TIMEOUT_S = 30.0
"""How long ``close()`` waits for the engine thread to take its stop."""
RELEASE_WAIT_S = 5.0
"""How long a stream closed early waits for the engine to let go of its request (one step, or
one generation's stopping check, in practice); past it the stream ends anyway and says so in the
log."""


@dataclass(eq=False)
class EngineRequest:
    """One request between its stream (on its event loop) and the engine thread."""

    rid: str
    loop: asyncio.AbstractEventLoop
    submitted: float
    prompt_tokens: int = 0
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    first_token: float | None = None
    finished: float | None = None
    tokens: int = 0
    finish_reason: str | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set when its stream was closed early (or the stage closes): the engine stops on it."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The engine's own figures for the request's stats."""
    on_close: list[Callable[[], object]] = field(default_factory=list)
    """Called when its stream ends, however it ends."""
    released: threading.Event = field(default_factory=threading.Event)
    """Set by the engine thread once it works on the request no more: ended, aborted, failed."""

    def put(self, item: Any) -> None:
        """Hand ``item`` to the stream (from any thread)."""
        # RuntimeError: the request's event loop is gone, nobody is listening.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def produced(self, n: int = 1, now: float | None = None) -> None:
        """``n`` tokens produced (at ``now``): the first of them stamps the time to first token."""
        if n and self.first_token is None:
            self.first_token = now if now is not None else time.perf_counter()
        self.tokens += n

    def end(self, reason: str | None, now: float | None = None) -> None:
        """The request is done (``reason``: ``stop``, ``length``): its stream ends."""
        self.finished = now if now is not None else time.perf_counter()
        self.finish_reason = reason
        self.put(END)
        self.released.set()


class ThreadedEngineRunner(StageRunner):
    """A decode engine on one thread of this process (see the module docstring)."""

    title: ClassVar[str]
    """The engine's name in messages (``vLLM``, ``llama.cpp``)."""
    stopped: ClassVar[str]
    """What a client is told once the engine stopped (the cause stays in the log)."""
    request_type: ClassVar[type[EngineRequest]] = EngineRequest
    """What :meth:`_new_request` makes: an engine that keeps more per request subclasses it."""

    def __init__(self, stage_plan: StagePlan, stage: StageConfig) -> None:
        self.plan = stage_plan
        self.stage = stage
        self.device = stage_plan.device or "?"
        self.load_info: dict[str, object] = {}
        self._commands: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._requests: dict[str, EngineRequest] = {}
        self._done: dict[str, dict[str, Any]] = {}
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None
        self._meter = RssMeter()
        self._resident = 0
        self._busy_growth = 0
        self._lock = threading.Lock()

    # -- what each engine does its own way -------------------------------------------
    @abstractmethod
    def _ready(self) -> bool:
        """Whether the engine is loaded (and not closed)."""

    @abstractmethod
    async def _accept(
        self, request_id: str, inputs: AsyncIterator[Any]
    ) -> tuple[EngineRequest, tuple[Any, ...]]:
        """The request read from ``inputs`` and checked (``BadRequest`` before it reaches the
        engine), and the command that hands it to the engine thread."""

    @abstractmethod
    def _serve_engine(self) -> None:
        """The engine thread's loop: returns on ``("stop",)``; an exception stops the engine."""

    def _release(self) -> None:
        """Free the engine, after the thread has stopped (``close``)."""

    # -- lifecycle -----------------------------------------------------------------
    def _started(self) -> None:
        """The end of a successful ``load()``: the engine thread runs, the load's meter stops."""
        self._thread = threading.Thread(
            target=self._run,
            name=f"{self.title.lower().replace('.', '')}-{self.plan.name}",
            daemon=True,
        )
        self._thread.start()
        self._meter.stop()
        self._resident = self._meter.growth

    def _run(self) -> None:
        try:
            self._serve_engine()
        except BaseException as exc:  # the thread's end: nothing may escape it unreported
            log.error("%s: the %s engine stopped", self.plan.name, self.title, exc_info=exc)
            self._engine_stopped(exc)

    def _engine_stopped(self, cause: BaseException) -> None:
        """The engine serves no more: ``health()`` says so, every request in flight fails."""
        self._failed = cause
        self._fail_all(StageFailed(self.plan.name, self.device, self.stopped, ENGINE_FAILED_CODE))

    def close(self) -> None:
        """Stop the engine thread (a generation in flight sees its request cancelled), fail
        what is still in flight, and free the engine."""
        if self._thread is not None:
            with self._lock:
                for req in self._requests.values():
                    req.cancel.set()
            self._commands.put(("stop",))
            self._thread.join(timeout=JOIN_TIMEOUT_S)
            self._thread = None
        self._fail_all(StageFailed(self.plan.name, self.device, "the stage was closed"))
        self._release()

    def measured_peak_bytes(self) -> int | None:
        """RSS growth of this process attributable to the stage (evidence M).

        ``max(load peak, resident + busiest request window)``, where

        * *load peak*: the highest RSS sampled during ``load()`` above the RSS just before
          it — the engine's imports when this stage is the first to import them, the weights
          read, the KV cache allocated, the engine's warm-up;
        * *resident*: RSS right after ``load()`` above that same baseline;
        * *busiest request window*: the largest RSS rise measured from the moment the engine
          went from idle to busy, to when it was idle again (activations, sampler buffers,
          Python objects). Another stage in the same process that allocates during such a
          window is counted too, so this is an upper bound.
        """
        if not self.load_info:
            return None
        return max(self._meter.peak_growth, self._resident + self._busy_growth)

    def request_stats(self, request_id: str) -> dict[str, object]:
        """Tokens and timings of a finished request (popped: asked once)."""
        return self._done.pop(request_id, {})

    def health(self) -> StageHealth | None:
        """None while the engine serves; ``{"code", "message"}`` once its thread stopped (every
        later request fails: only a restart brings it back). The exception itself is in the
        log, not here: its text is no client's business."""
        if self._failed is None:
            return None
        return StageHealth(code=ENGINE_FAILED_CODE, message=self.stopped)

    # -- the engine thread's side --------------------------------------------------
    def _take(self, block: bool) -> Iterator[tuple[Any, ...]]:
        """The queued commands: waiting for one when ``block`` (the engine is idle), then every
        one already queued."""
        try:
            cmd = self._commands.get(block=block)
        except queue.Empty:
            return
        while True:
            yield cmd
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _busy(self) -> None:
        """The engine went from idle to busy: a request window starts."""
        self._meter.rebase()

    def _idle(self) -> None:
        """The engine is idle again: the window's growth counts if it is the busiest."""
        self._busy_growth = max(self._busy_growth, self._meter.window_growth)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            reqs = list(self._requests.values())
        for req in reqs:
            req.put(error)
            req.released.set()

    # -- the stream's side ---------------------------------------------------------
    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """What the engine produces for the request read from ``inputs``. Closing the iterator
        early aborts the request in the engine."""
        if not self._ready():
            raise StageFailed(
                self.plan.name, self.device, "stream() before load() or after close()"
            )
        if self._failed is not None:
            raise StageFailed(self.plan.name, self.device, self.stopped, ENGINE_FAILED_CODE)
        req, command = await self._accept(request_id, inputs)
        with self._lock:
            if request_id in self._requests:
                raise StageFailed(
                    self.plan.name, self.device, f"request id {request_id!r} is already in flight"
                )
            self._requests[request_id] = req
        self._commands.put(command)
        if self._failed is not None:  # the thread stopped after the check above: nobody takes it
            req.put(StageFailed(self.plan.name, self.device, self.stopped, ENGINE_FAILED_CODE))
        finished = False
        try:
            while True:
                item = await req.queue.get()
                if item is END:
                    finished = True
                    break
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished:
                req.cancel.set()
                req.finish_reason = "abort"
                self._commands.put(("abort", req))
                await self._until_released(req)
            for callback in req.on_close:
                callback()
            with self._lock:
                self._requests.pop(request_id, None)
            self._done[request_id] = self._stats(req)

    async def _until_released(self, req: EngineRequest) -> None:
        """Wait (at most ``RELEASE_WAIT_S``) for the engine to let go of an aborted request; not
        at all once the engine thread has stopped (nobody would let go)."""
        if self._failed is not None or self._thread is None or req.released.is_set():
            return
        if not await asyncio.to_thread(req.released.wait, RELEASE_WAIT_S):
            log.warning(
                "%s: the engine still held request %s %.0f s after its abort",
                self.plan.name,
                req.rid,
                RELEASE_WAIT_S,
            )

    def _new_request(self, request_id: str, prompt_tokens: int = 0) -> EngineRequest:
        """A request submitted now, on this event loop."""
        return self.request_type(
            request_id, asyncio.get_running_loop(), time.perf_counter(), prompt_tokens
        )

    def _figures(self, req: EngineRequest) -> dict[str, object]:
        """The engine's own figures in a request's stats (default: the request's ``extra``)."""
        return dict(req.extra)

    def _stats(self, req: EngineRequest) -> dict[str, object]:
        out: dict[str, Any] = {
            "prompt_tokens": req.prompt_tokens,
            "tokens": req.tokens,
            "finish_reason": req.finish_reason,
            **self._figures(req),
        }
        if req.first_token is not None:
            out["ttft_s"] = round(req.first_token - req.submitted, 4)
            end = req.finished or time.perf_counter()
            if req.tokens > 1 and end > req.first_token:
                out["decode_tokens_per_s"] = round((req.tokens - 1) / (end - req.first_token), 2)
        return out
