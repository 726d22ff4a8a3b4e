"""The measurement store (orchestrator/calibration.py): round trip, corruption, keys,
the margin's arithmetic and near-match scaling."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from orchestrator import calibration as cal
from orchestrator.core.ledger import RETAINED_GROWTH, Reservation, holder_peak
from orchestrator.core.units import GiB, MiB

POOL = "host_ram"


def key(max_model_len: int = 2048, artifact: str = "a" * 64) -> cal.Key:
    return cal.Key(
        "stage",
        {"kind": "ar_decode", "artifact": artifact, "backend": "vllm-cpu", "device": "cpu"},
        {"max_model_len": max_model_len, "max_num_seqs": 2},
        label="p-thinker",
    )


def metadata(kv: int = 90 * MiB) -> list[Reservation]:
    """An ar_decode stage's reservations as its kind plans them (weights D, the rest E)."""
    return [
        Reservation(POOL, "weights", 256 * MiB, "session", "D"),
        Reservation(POOL, "kv_cache", kv, "session", "E", at_load=False),
        Reservation(POOL, "activations", 27 * MiB, "request", "E"),
        Reservation(POOL, "backend_workspace", 1 * GiB, "session", "E"),
        Reservation(POOL, "load_transient", 256 * MiB, "load", "E"),
    ]


def sample(
    run: str,
    peak: int,
    *,
    budget: int | None = None,
    calibrated: bool = False,
    upper: bool = False,
    load: int | None = None,
    steady: int | None = None,
) -> dict:
    return cal.sample(
        run=run,
        peak=peak,
        budget=budget,
        calibrated=calibrated,
        upper_bound=upper,
        load=load,
        steady=steady,
        where="test:cpu",
    )


@pytest.fixture
def store(tmp_path: Path) -> cal.CalibrationStore:
    return cal.CalibrationStore(tmp_path / "cal")


def test_the_store_is_under_the_env_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cal.CALIBRATION_ENV, str(tmp_path / "x"))
    assert cal.CalibrationStore().root == tmp_path / "x"
    monkeypatch.delenv(cal.CALIBRATION_ENV)
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))
    assert cal.CalibrationStore().root == tmp_path / "cache" / "calibration"


def test_round_trip_and_one_sample_per_run(store: cal.CalibrationStore) -> None:
    k = key()
    store.record(k, sample("r1", 1000 * MiB), metadata())
    store.record(k, sample("r2", 1010 * MiB))
    store.record(
        k, sample("r2", 1020 * MiB)
    )  # the same run (a server's later recording) replaces its sample
    entry = store.load(k)
    assert entry is not None
    assert [s["run"] for s in entry.samples] == ["r1", "r2"]
    assert [s["peak_bytes"] for s in entry.samples] == [1000 * MiB, 1020 * MiB]
    assert [r.purpose for r in entry.basis] == [
        r.purpose for r in metadata()
    ]  # kept when a later run gives none
    doc = json.loads(store.path(k).read_text())
    assert (
        doc["format"] == cal.CALIBRATION_FORMAT
        and doc["key"]["measure_version"] == cal.MEASURE_VERSION
    )
    assert store.load(key(max_model_len=4096)) is None  # another key: no exact match


def test_the_largest_peak_survives_trimming(store: cal.CalibrationStore) -> None:
    k = key()
    store.record(k, sample("big", 2 * GiB))
    for i in range(cal.MAX_SAMPLES + 5):
        store.record(k, sample(f"r{i}", 1 * GiB))
    entry = store.load(k)
    assert entry is not None and len(entry.samples) == cal.MAX_SAMPLES
    assert max(s["peak_bytes"] for s in entry.samples) == 2 * GiB


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda doc: "{not json",
        lambda doc: json.dumps({**doc, "format": "omni-edge.calibration/0"}),
        lambda doc: json.dumps({**doc, "samples": [{**doc["samples"][0], "peak_bytes": -5}]}),
        lambda doc: json.dumps(
            {**doc, "samples": [{**doc["samples"][0], "over_budget": True}]}
        ),  # contradicts its figures
        lambda doc: json.dumps(
            {**doc, "samples": [{**doc["samples"][0], "load_bytes": 10 * GiB}]}
        ),  # part above peak
        lambda doc: json.dumps(
            {**doc, "key": {**doc["key"], "scaling": {"max_model_len": 8192}}}
        ),  # key tampered
        lambda doc: json.dumps({**doc, "samples": []}),
        lambda doc: json.dumps(
            {
                **doc,
                "basis": [
                    {
                        "pool": POOL,
                        "purpose": "w",
                        "bytes": -1,
                        "lifetime": "session",
                        "evidence": "D",
                    }
                ],
            }
        ),
    ],
)
def test_a_corrupt_or_inconsistent_entry_is_ignored_with_a_warning(
    store: cal.CalibrationStore, corrupt, caplog: pytest.LogCaptureFixture
) -> None:
    k = key()
    path = store.record(k, sample("r1", 1 * GiB, budget=2 * GiB))
    path.write_text(corrupt(json.loads(path.read_text())))
    fresh = cal.CalibrationStore(store.root)
    with caplog.at_level(logging.WARNING, logger="orchestrator.calibration"):
        assert fresh.load(k) is None
        assert cal.lookup(fresh, k, metadata()) is None
    assert fresh.problems and str(path) in fresh.problems[0] and "ignored" in fresh.problems[0]
    assert any("not trusted" in r.getMessage() for r in caplog.records)


def test_an_entry_filed_under_another_key_is_not_trusted(store: cal.CalibrationStore) -> None:
    a, b = key(artifact="a" * 64), key(artifact="b" * 64)
    path = store.record(a, sample("r1", 1 * GiB))
    path.rename(store.path(b))  # a's measurements under b's name
    fresh = cal.CalibrationStore(store.root)
    assert fresh.load(b) is None and "not filed under its key" in fresh.problems[0]


def test_margin_arithmetic() -> None:
    one = cal.margin_for([1000 * MiB])
    assert one.bytes == 50 * MiB and "floor" in one.rule  # 5 % of the largest peak
    assert cal.margin_for([100 * MiB]).bytes == cal.MIN_MARGIN_BYTES  # never under 8 MiB
    spread = [
        1000 * MiB,
        1200 * MiB,
    ]  # mean 1100, stdev 100 MiB: up to mean + 2 x 100 MiB beats 5 % of 1200
    assert cal.margin_for(spread).bytes == 100 * MiB
    widened = cal.margin_for([1000 * MiB], overruns=1)
    assert widened.bytes == 100 * MiB and "overrun" in widened.rule  # +5 % per recent overrun
    settled = cal.margin_for([1000 * MiB] * 5, settled=True)
    assert settled.bytes == 30 * MiB and "tightened" in settled.rule


def test_exact_match_is_measured_evidence_never_below_the_largest_peak(
    store: cal.CalibrationStore,
) -> None:
    k = key()
    for i, peak in enumerate((1200 * MiB, 1210 * MiB, 1190 * MiB)):
        store.record(k, sample(f"r{i}", peak, load=peak - 50 * MiB), metadata())
    store.record(k, sample("bound", 5 * GiB, upper=True))  # an upper bound: kept, never trusted
    found = cal.lookup(store, k, metadata())
    assert found is not None
    reservations, c = found
    assert c.match == "exact" and c.evidence == "M"
    assert c.before_bytes == holder_peak(metadata()) and c.largest_peak_bytes == 1210 * MiB
    assert c.after_bytes == holder_peak(reservations) == 1210 * MiB + c.margin_bytes
    assert c.after_bytes >= c.largest_peak_bytes
    assert c.provenance["samples"] == 3 and c.provenance["upper_bounds_ignored"] == 1
    assert {r.evidence for r in reservations} == {"D", "M"}
    assert (
        next(r for r in reservations if r.purpose == "weights").bytes == 256 * MiB
    )  # data kept as it is


def test_only_upper_bounds_do_not_calibrate(store: cal.CalibrationStore) -> None:
    k = key()
    store.record(k, sample("r1", 100 * MiB, upper=True), metadata())
    assert cal.lookup(store, k, metadata()) is None


def test_overruns_widen_and_settled_runs_tighten(store: cal.CalibrationStore) -> None:
    k = key()
    store.record(k, sample("r0", 1000 * MiB), metadata())
    first = cal.lookup(store, k, metadata())
    assert first is not None
    budget = first[1].after_bytes  # 1050 MiB
    store.record(
        k, sample("r1", 1100 * MiB, budget=budget, calibrated=True)
    )  # drift: above its calibrated budget
    widened = cal.lookup(store, k, metadata())
    assert widened is not None
    assert widened[1].after_bytes > 1100 * MiB and widened[1].margin_bytes > first[1].margin_bytes
    assert widened[1].provenance["overruns_recent"] == 1
    # many runs far below budget: the margin narrows, but never below the largest peak seen
    for i in range(cal.WINDOW):
        store.record(k, sample(f"q{i}", 900 * MiB, budget=widened[1].after_bytes, calibrated=True))
    tight = cal.lookup(store, k, metadata())
    assert tight is not None
    assert tight[1].margin_bytes < widened[1].margin_bytes
    assert tight[1].after_bytes > 1100 * MiB  # the largest peak is still covered


def test_near_match_scales_the_measured_part_by_the_kinds_arithmetic(
    store: cal.CalibrationStore,
) -> None:
    measured_at = key(max_model_len=2048)
    store.record(measured_at, sample("r1", 1300 * MiB), metadata(kv=90 * MiB))
    wanted = key(max_model_len=4096)  # twice the context: the kind plans twice the KV cache
    found = cal.lookup(store, wanted, metadata(kv=180 * MiB))
    assert found is not None
    reservations, c = found
    assert c.match == "near" and c.evidence == "E"
    assert c.after_bytes == 1300 * MiB + 90 * MiB + c.margin_bytes
    assert (
        "max_model_len 2048→4096" in c.note and c.provenance["scaled_from"]["max_model_len"] == 2048
    )
    assert all(r.evidence in ("D", "E") for r in reservations)


def test_samples_are_checked_before_they_are_written(store: cal.CalibrationStore) -> None:
    bad = {**sample("r1", 1 * GiB), "over_budget": True}
    with pytest.raises(ValueError, match="over_budget"):
        store.record(key(), bad)
    assert not store.path(key()).exists()


def test_until_runs_show_a_spread_the_margin_covers_a_share_of_what_requests_brought(
    store: cal.CalibrationStore,
) -> None:
    k = key()
    # resident 100 MiB after the load, 700 MiB at the peak: requests brought 600 MiB
    store.record(
        k, sample("r1", 700 * MiB, steady=700 * MiB) | {"resident_bytes": 100 * MiB}, metadata()
    )
    found = cal.lookup(store, k, metadata())
    assert found is not None
    assert (
        found[1].margin_bytes == round(cal.REQUEST_PRIOR * 600 * MiB)
        and "requests" in found[1].margin_rule
    )
    for i in range(cal.SPREAD_SAMPLES):  # once runs show the spread, it decides
        store.record(
            k, sample(f"q{i}", 700 * MiB, steady=700 * MiB) | {"resident_bytes": 100 * MiB}
        )
    settled = cal.lookup(store, k, metadata())
    assert settled is not None and settled[1].margin_bytes == 35 * MiB  # 5 % of 700 MiB


def test_growth_a_run_cannot_show_is_kept_on_top_of_what_was_resident(
    store: cal.CalibrationStore,
) -> None:
    # A backend that keeps memory per new item shape (RETAINED_GROWTH, 768 MiB over its horizon)
    # measured after a short run: 400 MiB resident after the load, 620 MiB at the peak.
    growth = Reservation(POOL, RETAINED_GROWTH, 768 * MiB, "request", "E", at_load=False)
    k = key()
    store.record(
        k,
        sample("short", 620 * MiB, steady=620 * MiB) | {"resident_bytes": 400 * MiB},
        [*metadata(), growth],
    )
    found = cal.lookup(store, k, [*metadata(), growth])
    assert found is not None
    reservations, c = found
    assert (
        c.after_bytes == holder_peak(reservations) == 400 * MiB + 768 * MiB
    )  # not 620 MiB + margin
    assert RETAINED_GROWTH in next(r.note for r in reservations if r.evidence == "M")
    # without the growth reservation the same sample budgets the largest peak plus its margin
    plain = cal.lookup(store, k, metadata())
    assert plain is not None and plain[1].after_bytes == 620 * MiB + plain[1].margin_bytes
    # a run that saw more than the floor is budgeted from what it saw
    store.record(k, sample("long", 1300 * MiB, steady=1300 * MiB) | {"resident_bytes": 400 * MiB})
    longer = cal.lookup(store, k, [*metadata(), growth])
    assert longer is not None and longer[1].after_bytes == 1300 * MiB + longer[1].margin_bytes
