"""Faults while a pipeline starts: each a named error within a bounded time, the
ledger as it was before, nothing left running."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import StageFailed
from orchestrator.runtime.runtime import Runtime
from tests.helpers.echo import echo_pipeline

pytestmark = pytest.mark.ray


def test_a_device_actor_killed_while_loading_is_named_and_the_ledger_is_as_before(ray_cluster: Any, tmp_path: Path) -> None:
    plan, config = echo_pipeline(tmp_path, voice={"load_s": 30.0}, voice_device="igpu:0")
    rt = Runtime(plan, config)
    failure: list[BaseException] = []
    ended = threading.Event()

    def start() -> None:
        try:
            rt.start()
        except BaseException as exc:
            failure.append(exc)
        finally:
            ended.set()

    threading.Thread(target=start, daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(label == "before load voice" for label, _ in rt.ledger_history):
        time.sleep(0.05)
    assert any(label == "before load voice" for label, _ in rt.ledger_history), "the voice stage never began to load"
    time.sleep(0.5)  # inside load(): the stage holds its reservations, load transient included
    rt.kill_device("igpu:0")
    killed = time.monotonic()
    assert ended.wait(10), "start() did not end after its device actor was killed mid-load"
    assert time.monotonic() - killed < 5.0
    assert len(failure) == 1 and isinstance(failure[0], StageFailed)
    e = failure[0]
    assert (e.stage, e.device) == ("voice", "igpu:0") and "died" in e.cause
    history = dict(rt.ledger_history)
    before, after = history["before load voice"], history["after failed load voice"]
    assert after["holders"] == before["holders"] and "voice" not in after["holders"]
    assert rt.final_ledger is not None and rt.final_ledger["held_bytes"] == 0
