"""Starting a pipeline: stages load in parallel exactly when the ledger admits their
loads together, one at a time otherwise; a failed load in a parallel wave leaves the
ledger at zero; the progress callback sees every stage through to loaded.

Assertions are on what the runtime records (``runtime.startup``, ``ledger_history``,
the ledger actor's events) and on when each load ran by the loads' own stamps (the echo
kind's ``load_stamps``: its start and end on the machine's monotonic clock): loads said to
run together are made to meet (``load_meet``: each waits until the other has begun, so
they can only finish if they overlapped), never a wall-clock bound."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import StageFailed
from orchestrator.core.ledger import PIPELINE_HOLDER, Reservation
from orchestrator.core.plan import PipelinePlan
from orchestrator.core.units import GiB, MiB
from orchestrator.runtime.ledger_actor import LedgerService
from orchestrator.runtime.runtime import Runtime
from orchestrator.runtime.startup import StageProgress
from tests.helpers.echo import echo_pipeline

pytestmark = pytest.mark.ray


def r(purpose: str, n: int, lifetime: str = "session") -> dict[str, Any]:
    return Reservation("host_ram", purpose, n * MiB, lifetime, "E").to_dict()  # type: ignore[arg-type]


# -- the ledger's answer, without Ray --------------------------------------------------
def test_loads_are_admitted_together_only_when_their_peaks_fit_at_once() -> None:
    s = LedgerService([{"id": "host_ram", "capacity_bytes": 1000 * MiB, "parent": None}])
    stage = [
        r("weights", 100),
        r("load_transient", 300, "load"),
    ]  # peak 400 while loading, 100 after
    # one at a time they fit (100 + 100 + one 300 transient = 500); at once they need 800
    assert s.admit_together([("a", stage), ("b", stage)])["admitted"] == ["a", "b"]
    assert s.held_bytes() == 800 * MiB


def test_a_batch_that_does_not_fit_at_once_is_admitted_one_stage_at_a_time() -> None:
    s = LedgerService([{"id": "host_ram", "capacity_bytes": 700 * MiB, "parent": None}])
    stage = [r("weights", 100), r("load_transient", 300, "load")]
    answer = s.admit_together([("a", stage), ("b", stage)])
    assert answer["admitted"] == ["a"]  # 800 at once > 700, a alone fits
    assert (
        answer["shortfalls"][0]["pool"] == "host_ram"
        and answer["shortfalls"][0]["over_by"] == 100 * MiB
    )
    s.release("a", "load")
    assert s.admit_together([("b", stage)])["admitted"] == ["b"]  # 100 + 400 after a's load


def test_a_first_stage_that_does_not_fit_alone_admits_nothing() -> None:
    s = LedgerService([{"id": "host_ram", "capacity_bytes": 300 * MiB, "parent": None}])
    answer = s.admit_together([("a", [r("weights", 400)]), ("b", [r("weights", 1)])])
    assert answer["admitted"] == [] and answer["shortfalls"][0]["over_by"] == 100 * MiB
    assert s.holders() == []


# -- the runtime -----------------------------------------------------------------------
def _with_transients(plan: PipelinePlan, transient: int) -> PipelinePlan:
    """Each stage's load transient set to ``transient`` bytes (the echo kind allocates
    none of it: only the ledger's arithmetic changes)."""
    stages = tuple(
        dataclasses.replace(
            s,
            reservations=tuple(
                dataclasses.replace(x, bytes=transient) if x.lifetime == "load" else x
                for x in s.reservations
            ),
        )
        for s in plan.stages
    )
    return dataclasses.replace(plan, stages=stages)


def _meeting(stamps: Path, **load: Any) -> dict[str, dict[str, Any]]:
    """The two echo stages' options: each load stamps itself in ``stamps`` and waits until the
    other's has begun."""
    stamps.mkdir(exist_ok=True)
    return {
        "thinker": {"load_stamps": str(stamps), "load_meet": ["voice"], **load},
        "voice": {"load_stamps": str(stamps), "load_meet": ["thinker"], **load},
    }


def _intervals(stamps: Path) -> dict[str, tuple[float, float]]:
    """Each stage's load, (start, end), from its own stamps."""
    return {
        name: (
            float((stamps / f"{name}.start").read_text()),
            float((stamps / f"{name}.end").read_text()),
        )
        for name in ("thinker", "voice")
    }


def _start(plan: PipelinePlan, config: Any) -> tuple[Runtime, list[StageProgress]]:
    seen: list[StageProgress] = []
    rt = Runtime(plan, config)
    rt.start(progress=seen.append)
    return rt, seen


def test_stages_the_ledger_admits_together_load_in_one_parallel_wave(
    ray_cluster: Any, tmp_path: Path
) -> None:
    plan, config = echo_pipeline(
        tmp_path, **_meeting(tmp_path / "stamps", load_s=0.3), voice_device="igpu:0"
    )
    rt, _ = _start(_with_transients(plan, 1 * GiB), config)  # 2 GiB at once, in 8 GiB
    try:
        assert rt.startup["load_waves"] == [["thinker", "voice"]]
        assert rt.startup["loads_parallel"] is True
        # the two device actors' loads overlapped: each began before the other ended (they met)
        loads = _intervals(tmp_path / "stamps")
        assert max(s for s, _ in loads.values()) < min(e for _, e in loads.values()), loads
        assert set(rt.startup["stage_load_s"]) == {"thinker", "voice"}
        # both admitted before either loaded: one snapshot before the wave, neither holding
        before = dict(rt.ledger_history)
        assert before["before load thinker"] is before["before load voice"]
        assert set(before["before load voice"]["holders"]) == {PIPELINE_HOLDER}
        assert set(rt.ledger_snapshot()["holders"]) == {PIPELINE_HOLDER, "thinker", "voice"}
    finally:
        rt.close()
    assert rt.final_ledger is not None and rt.final_ledger["held_bytes"] == 0


def test_two_stages_on_one_device_load_together_in_its_actor(
    ray_cluster: Any, tmp_path: Path
) -> None:
    plan, config = echo_pipeline(tmp_path, **_meeting(tmp_path / "stamps", load_s=0.5))  # on cpu
    rt, _ = _start(plan, config)
    try:
        assert rt.startup["load_waves"] == [["thinker", "voice"]]
        loads = _intervals(tmp_path / "stamps")
        assert max(s for s, _ in loads.values()) < min(e for _, e in loads.values()), loads
        assert rt.load_results["thinker"]["overlapped"] and rt.load_results["voice"]["overlapped"]
        for name in ("thinker", "voice"):  # each measured, and the method says the loads overlapped
            assert "at the same time" in rt.load_results[name]["measured"]["method"]
    finally:
        rt.close()
    assert rt.final_ledger is not None and rt.final_ledger["held_bytes"] == 0


def test_loads_the_ledger_would_not_hold_at_once_go_one_after_another(
    ray_cluster: Any, tmp_path: Path
) -> None:
    # Each stage's load transient is 4.5 GiB in 8 GiB: one at a time fits (beside Ray's
    # measured memory and the margin), two at once cannot.
    (tmp_path / "stamps").mkdir()
    stamped = {"load_stamps": str(tmp_path / "stamps")}
    plan, config = echo_pipeline(tmp_path, thinker=stamped, voice=stamped, voice_device="igpu:0")
    rt, seen = _start(_with_transients(plan, 4608 * MiB), config)
    try:
        assert rt.startup["load_waves"] == [["thinker"], ["voice"]]
        assert rt.startup["loads_parallel"] is False
        loads = _intervals(tmp_path / "stamps")  # the voice's load began after the thinker's ended
        assert loads["thinker"][1] < loads["voice"][0], loads
        history = dict(rt.ledger_history)
        assert (
            "thinker" in history["before load voice"]["holders"]
        )  # the voice waited for the thinker
        assert (
            not rt.load_results["thinker"]["overlapped"]
            and not rt.load_results["voice"]["overlapped"]
        )
        events = [
            e["holder"]
            for e in rt.ledger_snapshot()["events"]
            if e["event"] in ("admit", "release:load")
        ]
        assert events == [PIPELINE_HOLDER, "thinker", "thinker", "voice", "voice"]
    finally:
        rt.close()
    assert [(e.stage, e.state) for e in seen if e.state != "waiting"] == [
        ("thinker", "loading"),
        ("thinker", "loaded"),
        ("voice", "loading"),
        ("voice", "loaded"),
    ]


def test_a_failed_load_in_a_parallel_wave_is_named_and_leaves_the_ledger_at_zero(
    ray_cluster: Any, tmp_path: Path
) -> None:
    plan, config = echo_pipeline(
        tmp_path,
        thinker={"load_s": 0.5},
        voice={"fail_load": True, "load_s": 0.1},
        voice_device="igpu:0",
    )
    rt = Runtime(plan, config)
    seen: list[StageProgress] = []
    with pytest.raises(StageFailed) as info:
        rt.start(progress=seen.append)
    e = info.value
    assert (e.stage, e.device) == ("voice", "igpu:0") and "told to fail its load" in e.cause
    assert rt.startup["load_waves"] == [["thinker", "voice"]]
    history = dict(rt.ledger_history)
    after = history["after failed load voice"]
    assert "voice" not in after["holders"]
    assert (
        after["holders"] == history["before load voice"]["holders"]
    )  # the thinker, loaded beside it, closed
    assert rt.final_ledger is not None and rt.final_ledger["held_bytes"] == 0
    states = {(p.stage, p.state) for p in seen}
    assert ("voice", "failed") in states and ("thinker", "loaded") in states
    failed = next(p for p in seen if p.state == "failed")
    assert failed.cause is not None and "told to fail its load" in failed.cause


def test_the_progress_callback_sees_every_stage_waiting_loading_then_loaded(
    ray_cluster: Any, tmp_path: Path
) -> None:
    plan, config = echo_pipeline(tmp_path, voice_device="igpu:0")
    rt, seen = _start(plan, config)
    rt.close()
    for name, device in (("thinker", "cpu"), ("voice", "igpu:0")):
        mine = [p for p in seen if p.stage == name]
        assert [p.state for p in mine] == ["waiting", "loading", "loaded"]
        assert all(p.device == device for p in mine)
        assert mine[-1].seconds is not None and mine[-1].seconds >= 0


def test_pipeline_start_with_progress_prints_one_plain_line_per_change_off_a_terminal(
    ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.api import Pipeline

    plan, config = echo_pipeline(tmp_path, voice_device="igpu:0")
    from orchestrator.commands.progress import TerminalProgress

    with Pipeline(plan, config, record=None).start(progress=TerminalProgress()):
        pass
    lines = capsys.readouterr().err.splitlines()
    assert "… thinker: loading on cpu" in lines and "… voice: loading on igpu:0" in lines
    loaded = [line for line in lines if ": loaded on " in line]
    assert len(loaded) == 2 and all(line.endswith(" s") and len(line) <= 80 for line in loaded)
    assert not any("waiting" in line for line in lines)


def test_pipeline_start_without_progress_prints_nothing(
    ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.api import Pipeline

    plan, config = echo_pipeline(tmp_path)
    with Pipeline(plan, config, record=None).start():
        pass
    assert capsys.readouterr().err == ""
