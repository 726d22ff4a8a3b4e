"""A signal whose exception was swallowed on the way still stops the reply (``stream_reply``).

A handler's exception can be swallowed on the way (``common._received``: raised while a
Cython module was being imported, "Exception ignored"); the reply would then go on to its end.
Here the handler's work is done by hand — the signal noted, no exception raised — against a
reply that never ends by construction."""

from __future__ import annotations

import asyncio
import signal
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.commands import common
from orchestrator.runtime.events import TextDelta
from tests.helpers.waiting import NEVER_HANGS_S


class _EndlessPipeline:
    """A pipeline whose reply is a word every 10 ms, forever; the test's hook runs after the first."""

    def __init__(self, after_first: Any) -> None:
        self.runtime = SimpleNamespace(stages=[])
        self.after_first = after_first

    async def stream(self, request: Any) -> Any:
        n = 0
        while True:
            yield TextDelta("thinker", f" w{n}", "r", 0.0)
            if n == 0:
                self.after_first()
            n += 1
            await asyncio.sleep(0.01)


def _reply(signum: int) -> None:
    from orchestrator.core.console import make_console

    def swallowed() -> None:
        common._received.append(signum)  # what the handler does before its lost raise

    pipeline = _EndlessPipeline(swallowed)
    asyncio.run(
        asyncio.wait_for(
            common.stream_reply(pipeline, None, "p", make_console()),  # type: ignore[arg-type]
            NEVER_HANGS_S,
        )
    )


@pytest.fixture(autouse=True)
def _no_signals_noted() -> Any:
    common._received.clear()
    yield
    common._received.clear()


def test_a_lost_sigint_stops_the_reply_as_ctrl_c() -> None:
    with pytest.raises(KeyboardInterrupt) as info:
        _reply(signal.SIGINT)
    assert not isinstance(info.value, common.Interrupted)


def test_a_lost_sigterm_stops_the_reply_naming_it() -> None:
    with pytest.raises(common.Interrupted) as info:
        _reply(signal.SIGTERM)
    assert info.value.signum == signal.SIGTERM
