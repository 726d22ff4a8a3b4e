from __future__ import annotations

import pytest

from orchestrator.core.ledger import Ledger, Reservation
from orchestrator.core.units import GiB, MiB, fmt_bytes, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16GiB", 16 * GiB),
        ("512 MiB", 512 * MiB),
        ("8GB", 8 * 10**9),
        ("1.5GiB", int(1.5 * GiB)),
        ("1024", 1024),
        (7, 7),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["16 parsecs", "-1GiB", "", "GiB", -5, True])
def test_parse_bytes_rejects_with_accepted_forms(bad):
    with pytest.raises(ValueError) as exc:
        parse_bytes(bad)
    assert "byte" in str(exc.value)


def test_fmt_bytes():
    assert fmt_bytes(3 * GiB // 2) == "1.50 GiB"
    assert fmt_bytes(300 * MiB) == "300.0 MiB"


def r(pool, purpose, n, lifetime="session", at_load=True):
    return Reservation(pool, purpose, n, lifetime, "E", at_load=at_load)


def test_peak_is_max_of_load_path_and_steady_state_not_their_sum():
    ledger = Ledger()
    ledger.add_pool("host_ram", 10 * GiB)
    rs = [
        r("host_ram", "weights", 4 * GiB),
        r("host_ram", "load_transient", 2 * GiB, "load"),
        r("host_ram", "kv_cache", 3 * GiB, at_load=False),
    ]
    assert ledger.admit("llm", rs).ok
    peak, shares = ledger.peak("host_ram")
    # load path 4+2 = 6, steady 4+3 = 7: the peak is 7, not 9
    assert peak == 7 * GiB
    assert shares == {"llm": 7 * GiB}


def test_pool_peak_adds_steady_states_plus_the_largest_load_excess():
    ledger = Ledger()
    ledger.add_pool("host_ram", 100 * GiB)
    ledger.admit("a", [r("host_ram", "weights", 2 * GiB), r("host_ram", "t", 5 * GiB, "load")])
    ledger.admit("b", [r("host_ram", "weights", 3 * GiB), r("host_ram", "t", 1 * GiB, "load")])
    peak, shares = ledger.peak("host_ram")
    # steady 2 + 3, plus a's load excess 5 (larger than b's 1)
    assert peak == 10 * GiB
    assert shares == {"a": 7 * GiB, "b": 3 * GiB}


def test_admission_refuses_naming_contributors_and_holds_nothing():
    ledger = Ledger()
    ledger.add_pool("host_ram", 8 * GiB)
    assert ledger.admit("thinker", [r("host_ram", "weights", 5 * GiB)]).ok
    admission = ledger.admit("tts", [r("host_ram", "weights", 4 * GiB)])
    assert not admission.ok
    shortfalls = admission.shortfalls
    assert len(shortfalls) == 1
    sf = shortfalls[0]
    assert (sf.pool, sf.capacity, sf.peak, sf.over_by) == ("host_ram", 8 * GiB, 9 * GiB, 1 * GiB)
    assert sf.contributors == {"thinker": 5 * GiB, "tts": 4 * GiB}
    assert "tts" not in ledger.held
    assert ledger.held_bytes() == 5 * GiB


def test_child_pool_counts_against_parent():
    ledger = Ledger()
    ledger.add_pool("host_ram", 10 * GiB)
    ledger.add_pool("shared:igpu:0", 4 * GiB, parent="host_ram")
    ledger.admit("llm", [r("host_ram", "weights", 7 * GiB)])
    # fits the iGPU's own 4 GiB cap, but not what host RAM has left
    sfs = ledger.admit("vocoder", [r("shared:igpu:0", "weights", 3500 * MiB)]).shortfalls
    assert [s.pool for s in sfs] == ["host_ram"]
    # over the child's cap even though the parent would have room
    ledger2 = Ledger()
    ledger2.add_pool("host_ram", 100 * GiB)
    ledger2.add_pool("shared:igpu:0", 4 * GiB, parent="host_ram")
    assert [
        s.pool for s in ledger2.admit("v", [r("shared:igpu:0", "weights", 5 * GiB)]).shortfalls
    ] == ["shared:igpu:0"]


def test_an_admission_is_asked_whether_it_is_ok_never_for_its_truth():
    ledger = Ledger()
    ledger.add_pool("host_ram", GiB)
    admission = ledger.admit("s", [r("host_ram", "weights", 2 * GiB)])
    assert not admission.ok and admission.shortfalls[0].pool == "host_ram"
    with pytest.raises(TypeError, match=r"Admission\.ok"):
        bool(admission)


def test_release_by_lifetime_then_all():
    ledger = Ledger()
    ledger.add_pool("host_ram", 10 * GiB)
    ledger.admit("s", [r("host_ram", "weights", 1 * GiB), r("host_ram", "t", 2 * GiB, "load")])
    assert ledger.release("s", "load") == 2 * GiB
    assert ledger.held_bytes("host_ram") == 1 * GiB
    assert ledger.release("s") == 1 * GiB
    assert ledger.held_bytes() == 0
    assert ledger.held == {}


def test_reservation_rejects_non_int_bytes():
    with pytest.raises(ValueError, match="non-negative int"):
        Reservation("host_ram", "weights", "16GiB", "session", "D")  # type: ignore[arg-type]


def test_unknown_pool_is_an_error():
    ledger = Ledger()
    ledger.add_pool("host_ram", GiB)
    with pytest.raises(KeyError, match="vram:gpu:0"):
        ledger.admit("x", [r("vram:gpu:0", "weights", 1)])
