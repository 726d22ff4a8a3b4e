"""A direct-mode stream's final outputs, sent to the driver a few at a time.

In the direct mode (``runtime.STREAMING == "direct"``) a stage's actor hands every output to
its consumers' actors itself (``router.Router``) and sends the driver only its final outputs.
Each message of a Ray streaming generator costs CPU in both processes (a gRPC report from
this actor, its receipt in the driver's core worker): about 2 ms of the driver's CPU per
message on the project's 2-core VM, against a decoder's token every ~10 ms — time taken from
the decoder's own threads when they use every core (docs/runtime.md, "The data path").
So final outputs that come within :data:`FINAL_BATCH_S` of the last message sent wait for it
to pass and go together (``("outs", [item, ...])``).

Guarantees: the routing of every output to the consumers is done in the order the stage
yields them and as soon as it does (only the driver's copy waits); the first output's
``("first", None)`` goes at once, before any output, and the first final output at once too
(with any that came with it);
no final output waits more than :data:`FINAL_BATCH_S` (a timer, not the next output, sends
it), and none waits once the stage's stream has ended (the reply's last words, its last
audio, go as it ends); the stage's outputs keep their order; an error of the stage (or of
routing) is raised here after the outputs before it were sent; cancelling the stream cancels the routing task,
which closes the stage's generator.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

FINAL_BATCH_S = 0.05
"""The least time between two messages of final outputs to the driver (the first goes at once):
a decoder at 100 tokens/s sends about five tokens a message, and a reader sees text at most
50 ms later than it was made (20 updates a second). For 578 tokens of the llama.cpp stage at 2
threads, at 20 ms the driver spent 0.54–0.57 s of CPU and the actor's threads other than
llama.cpp's 0.55–0.56 s; at 50 ms, 0.19–0.20 s and 0.22–0.26 s (docs/benchmarks.md, "Fewer
messages to the driver, and the workers' priority")."""


async def routed_finals(
    outputs: AsyncIterator[Any],
    take: Callable[[Any], tuple[bool, Any, Awaitable[None]]],
    window_s: float = FINAL_BATCH_S,
) -> AsyncIterator[tuple[str, Any]]:
    """The driver's messages for one direct-mode stream: ``("first", None)`` once, then the final
    outputs as ``("out", item)`` or ``("outs", [item, ...])``. ``take(item)``, called for each
    output of ``outputs`` in order in a task of its own, returns ``(first, final, routing)``:
    whether it was the stream's first output, its payload when the driver gets it (None: not
    final), and the routing to its consumers, awaited before the next output is taken (the
    first mark and the payload are the driver's before that wait)."""
    finals: list[Any] = []
    ready = asyncio.Event()
    ended = asyncio.Event()  # the stage's stream is over; it also cuts a window's wait short
    state: dict[str, Any] = {"first": False, "error": None}

    async def route_all() -> None:
        try:
            async for item in outputs:
                first, final, routing = take(item)
                if first:
                    state["first"] = True
                    ready.set()
                if final is not None:
                    finals.append(final)
                    ready.set()
                await routing
        except BaseException as exc:  # the stream's own error, raised below; or its cancel
            state["error"] = exc
        finally:
            ended.set()
            ready.set()

    task = asyncio.create_task(route_all(), name="direct-stream-routing")
    sent_first, last = False, -window_s
    try:
        while True:
            await ready.wait()
            ready.clear()
            if state["first"] and not sent_first:
                sent_first = True
                yield ("first", None)
            if finals:
                wait = last + window_s - time.perf_counter()
                if wait > 0 and not ended.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(ended.wait(), wait)
                batch = finals[:]
                del finals[:]
                last = time.perf_counter()
                yield ("out", batch[0]) if len(batch) == 1 else ("outs", batch)
            if ended.is_set() and not finals:
                break
        if state["error"] is not None:
            raise state["error"]
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
