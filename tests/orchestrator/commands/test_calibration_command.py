"""`omni-edge calibration show|reset`: a budget's history and forgetting it (calibration that converges).

The store is written by the test (what a run records, with the keys a plan of
configs/voice-assistant.yaml looks up on the recorded laptop profile), so the
figures are the test's own; `reset` is checked by what the next plan does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import calibration as cal
from orchestrator.cli import main
from orchestrator.core.profile import HardwareProfile, load_profile
from orchestrator.core.units import MiB
from tests.orchestrator.test_calibration_profile import (
    PROFILE,
    THINKER_PEAK,
    plan,
    record_measurements,
)

VOICE_RUNS = [  # (budget the run had, its peak), MiB: a recycled voice converging
    (1526, 1190),
    (1345, 1301),
    (1345, 1299),
]


@pytest.fixture
def profile() -> HardwareProfile:
    return load_profile(str(PROFILE))


@pytest.fixture
def store(tmp_path: Path, private_cache: Path, profile: HardwareProfile) -> cal.CalibrationStore:
    s = cal.CalibrationStore(tmp_path / "store")
    record_measurements(s, profile)  # voice-assistant/thinker and (ray_runtime)
    voice = cal.Key(
        "stage",
        {"kind": "exported_graph", "device": "cpu", "backend": "ort-openvino"},
        label="voice-assistant-voice",
        pipeline="voice-assistant",
        stage="voice",
    )
    for i, (budget, peak) in enumerate(VOICE_RUNS):
        s.record(
            voice,
            cal.sample(
                run=f"r{i}",
                peak=peak * MiB,
                budget=budget * MiB,
                calibrated=i > 0,
                resident=400 * MiB,
                where="vm:cpu",
                worker={
                    "recycle_limit_bytes": budget * MiB - 30 * MiB,
                    "call_rise_bytes": 150 * MiB,
                    "worker_recycles": 2,
                    "worker_calls": 60,
                    "retained_bytes": 700 * MiB,
                    "fresh_bytes": 400 * MiB,
                },
            ),
        )
    return s


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["calibration", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_show_lists_every_entry_in_80_columns_and_as_json(
    store: cal.CalibrationStore, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, "--store", str(store.root), "show")
    assert code == 0
    assert all(len(line) <= 80 for line in out.splitlines() if str(store.root) not in line), out
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.startswith(("voice", "("))
    }
    assert set(rows) == {"voice-assistant/thinker", "voice-assistant/voice", "(ray_runtime)"}
    assert rows["voice-assistant/voice"][1:4] == ["cpu", "ort-openvino", "3"]
    assert (
        " ".join(rows["voice-assistant/voice"][4:]) == "1.31 GiB 1.27 GiB"
    )  # the last budget, the largest peak
    code, out, _ = cli(capsys, "--store", str(store.root), "show", "--json")
    doc = json.loads(out)
    assert (
        code == 0
        and doc["format"] == "omni-edge.calibration-store/1"
        and doc["store"] == str(store.root)
    )
    by_name = {e["name"]: e for e in doc["entries"]}
    assert by_name["voice-assistant/thinker"]["samples"][0]["peak_bytes"] == THINKER_PEAK
    assert [s["budget_bytes"] // MiB for s in by_name["voice-assistant/voice"]["samples"]] == [
        b for b, _ in VOICE_RUNS
    ]


def test_show_stage_prints_the_budgets_history(
    store: cal.CalibrationStore, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(
        capsys, "--store", str(store.root), "show", "voice"
    )  # a stage name one pipeline has
    assert code == 0
    assert all(len(line) <= 80 for line in out.splitlines() if str(store.root) not in line), out
    assert out.splitlines()[0] == "voice-assistant/voice on cpu (ort-openvino)"
    history = [line.split() for line in out.splitlines() if line[:3].strip().isdigit()]
    # run number, date, time, budget (2), peak (2), resident (2), rise (2), recycles, flags
    assert [(r[0], " ".join(r[3:5]), " ".join(r[5:7]), r[11], r[12:]) for r in history] == [
        ("1", "1.49 GiB", "1.16 GiB", "2", []),
        ("2", "1.31 GiB", "1.27 GiB", "2", ["cal"]),
        ("3", "1.31 GiB", "1.27 GiB", "2", ["cal"]),
    ]
    assert " ".join(history[0][9:11]) == "150.0 MiB"  # the largest rise of one call
    code, out, _ = cli(
        capsys, "--store", str(store.root), "show", "voice-assistant/voice", "--json"
    )
    doc = json.loads(out)
    assert [e["name"] for e in doc["entries"]] == ["voice-assistant/voice"]
    assert [s["worker_recycles"] for s in doc["entries"][0]["samples"]] == [2, 2, 2]


def test_reset_a_stage_makes_its_next_plan_budget_from_metadata(
    store: cal.CalibrationStore, profile: HardwareProfile, capsys: pytest.CaptureFixture[str]
) -> None:
    assert plan(profile, cal.CalibrationStore(store.root)).stage("thinker").calibration is not None
    code, out, _ = cli(
        capsys, "--store", str(store.root), "reset", "voice-assistant/thinker", "--json"
    )
    doc = json.loads(out)
    assert code == 0 and len(doc["removed"]) == 1 and "voice-assistant-thinker" in doc["removed"][0]
    assert not Path(doc["removed"][0]).exists()
    after = plan(profile, cal.CalibrationStore(store.root))
    assert after.stage("thinker").calibration is None  # from metadata again
    names = {e.stage for e in cal.CalibrationStore(store.root).entries()[0]}
    assert names == {"voice", "(ray_runtime)"}  # the others are kept
    code, out, _ = cli(capsys, "--store", str(store.root), "reset", "--all", "--yes")
    assert code == 0 and out.startswith("removed 2 entries (every entry)")
    assert cal.CalibrationStore(store.root).entries() == ([], [])


def test_reset_all_also_removes_an_entry_that_is_not_trusted(
    store: cal.CalibrationStore, capsys: pytest.CaptureFixture[str]
) -> None:
    # an entry cut short (a crash before writes were durable): its name and its first bytes
    # say what it is, so `reset --all` removes it with the others
    whole = next(store.root.glob("voice-assistant-voice-*.json")).read_bytes()
    (store.root / "broken-0123456789abcdef.json").write_bytes(whole[:300])
    code, out, _ = cli(capsys, "--store", str(store.root), "show")
    assert code == 0 and "ignored broken-0123456789abcdef.json: unreadable" in out
    code, out, _ = cli(capsys, "--store", str(store.root), "reset", "--all", "--json", "--yes")
    assert code == 0 and len(json.loads(out)["removed"]) == 4
    assert not list(store.root.glob("*.json"))


@pytest.mark.parametrize(
    ("argv", "where", "what", "fix"),
    [
        (
            ["show", "talker"],
            "calibration show talker",
            "no entry in the measurement store",
            "name a stage as `omni-edge calibration show` lists it",
        ),
        (
            ["reset", "voice-assistant/talker"],
            "calibration reset voice-assistant/talker",
            "it holds (ray_runtime), voice-assistant/thinker, voice-assistant/voice",
            "PIPELINE/STAGE",
        ),
        (
            ["reset", "x" * 10_000],
            "calibration reset xxxxxxxx",
            "no entry",
            "omni-edge calibration show",
        ),
        (["reset"], "calibration reset", "give a STAGE or --all", "calibration reset --all"),
        (
            ["reset", "voice", "--all"],
            "calibration reset",
            "not both",
            "calibration reset PIPELINE/STAGE",
        ),
    ],
)
def test_a_bad_stage_name_is_bad_input_and_removes_nothing(
    store: cal.CalibrationStore,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    where: str,
    what: str,
    fix: str,
) -> None:
    before = sorted(p.name for p in store.root.glob("*.json"))
    code, out, err = cli(capsys, "--store", str(store.root), *argv)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0] == "error: the input cannot be used:"
    assert lines[1].strip().startswith(where) and what in lines[1]
    assert lines[2].strip().startswith("how to fix:") and fix in lines[2]
    assert "Traceback" not in err and all(len(line) <= 400 for line in lines)
    assert sorted(p.name for p in store.root.glob("*.json")) == before


def test_a_stage_name_several_pipelines_have_must_be_named_with_its_pipeline(
    store: cal.CalibrationStore, capsys: pytest.CaptureFixture[str]
) -> None:
    other = cal.Key(
        "stage",
        {"kind": "echo", "device": "cpu"},
        label="other-voice",
        pipeline="other",
        stage="voice",
    )
    store.record(
        other, cal.sample(run="r0", peak=100 * MiB, budget=None, calibrated=False, where="vm")
    )
    code, _, err = cli(capsys, "--store", str(store.root), "reset", "voice")
    assert (
        code == 2 and "2 pipelines have a stage 'voice': other/voice, voice-assistant/voice" in err
    )
    code, out, _ = cli(capsys, "--store", str(store.root), "reset", "other/voice")
    assert code == 0 and out.startswith("removed 1 entry (other/voice)")
