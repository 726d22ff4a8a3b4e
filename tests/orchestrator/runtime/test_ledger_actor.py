"""The ledger actor's protocol, without Ray (the actor runs these methods one at a time)."""

from __future__ import annotations

from orchestrator.core.ledger import PIPELINE_HOLDER, Reservation
from orchestrator.core.units import MiB
from orchestrator.runtime.ledger_actor import LedgerService


def r(
    purpose: str, n: int, lifetime: str = "session", pool: str = "host_ram", evidence: str = "E"
) -> dict:
    return Reservation(pool, purpose, n * MiB, lifetime, evidence).to_dict()  # type: ignore[arg-type]


def service() -> LedgerService:
    return LedgerService(
        [
            {"id": "shared:igpu:0", "capacity_bytes": 300 * MiB, "parent": "host_ram"},
            {"id": "host_ram", "capacity_bytes": 1000 * MiB, "parent": None},
        ]
    )


def test_admit_is_all_or_nothing_and_names_the_shortfall() -> None:
    s = service()
    assert s.admit("a", [r("weights", 600), r("load_transient", 100, "load")]) == {
        "ok": True,
        "shortfalls": [],
    }
    answer = s.admit("b", [r("weights", 300), r("kv", 200)])
    assert not answer["ok"]
    refused = answer["shortfalls"]
    assert refused and refused[0]["pool"] == "host_ram"
    assert (
        refused[0]["over_by"] == (700 + 500 - 1000) * MiB
    )  # a's 600 + 100 excess over steady, b's 500
    assert refused[0]["contributors"] == {"a": 700 * MiB, "b": 500 * MiB}
    assert s.holders() == ["a"]  # b holds nothing


def test_child_pool_counts_against_its_parent() -> None:
    s = service()
    assert s.admit("igpu-stage", [r("weights", 250, pool="shared:igpu:0")])["ok"]
    refused = s.admit("cpu-stage", [r("weights", 800)])["shortfalls"]
    assert refused[0]["pool"] == "host_ram"


def test_load_release_then_report_then_release_all() -> None:
    s = service()
    s.admit("a", [r("weights", 600), r("load_transient", 100, "load")])
    assert s.release("a", "load") == 100 * MiB
    s.report("a", {"measured_peak_bytes": 550 * MiB, "budget_bytes": 700 * MiB, "evidence": "M"})
    snap = s.snapshot()
    assert snap["held_bytes"] == 600 * MiB and snap["measured"]["a"]["evidence"] == "M"
    assert s.release("a") == 600 * MiB
    assert s.snapshot()["held_bytes"] == 0


def test_replace_swaps_an_estimate_for_a_measurement_atomically() -> None:
    s = service()
    s.admit(PIPELINE_HOLDER, [r("ray_runtime", 900), r("safety_margin", 50)])
    assert s.replace(PIPELINE_HOLDER, "ray_runtime", r("ray_runtime", 500, evidence="M"))["ok"]
    held = {x["purpose"]: x for x in s.snapshot()["holders"][PIPELINE_HOLDER]}
    assert held["ray_runtime"]["bytes"] == 500 * MiB and held["ray_runtime"]["evidence"] == "M"
    refused = s.replace(PIPELINE_HOLDER, "ray_runtime", r("ray_runtime", 2000, evidence="M"))
    assert not refused["ok"] and refused["shortfalls"][0]["pool"] == "host_ram"
    held = {x["purpose"]: x for x in s.snapshot()["holders"][PIPELINE_HOLDER]}
    assert held["ray_runtime"]["bytes"] == 500 * MiB  # the old one stays


def test_replace_swaps_only_the_reservation_on_its_own_pool() -> None:
    """On a cluster Ray is measured per node: each node's figure replaces that node's
    estimate and leaves the other nodes' alone."""
    s = LedgerService(
        [
            {"id": "head/host_ram", "capacity_bytes": 1000 * MiB, "parent": None},
            {"id": "second/host_ram", "capacity_bytes": 1000 * MiB, "parent": None},
        ]
    )
    s.admit(
        PIPELINE_HOLDER,
        [
            r("ray_runtime", 900, pool="head/host_ram"),
            r("ray_runtime", 900, pool="second/host_ram"),
        ],
    )
    measured = r("ray_runtime", 300, pool="second/host_ram", evidence="M")
    assert s.replace(PIPELINE_HOLDER, "ray_runtime", measured)["ok"]
    held = {x["pool"]: x for x in s.snapshot()["holders"][PIPELINE_HOLDER]}
    assert (
        held["second/host_ram"]["bytes"] == 300 * MiB and held["second/host_ram"]["evidence"] == "M"
    )
    assert held["head/host_ram"]["bytes"] == 900 * MiB and held["head/host_ram"]["evidence"] == "E"


def test_retake_holds_a_restarted_stage_once_however_often_it_is_tried() -> None:
    """A restart takes the dead actor's holders again: after a release, after none (an attempt
    that died with them held), twice in a row: always the plan's reservations, never twice."""
    s = service()
    plan = [r("weights", 400), r("load_transient", 100, "load")]
    s.admit("voice", plan)
    s.release("voice", "load")
    held = s.snapshot()["held_bytes"]
    s.release("voice")  # its actor died
    assert s.retake([("voice", plan)])["ok"]
    assert s.snapshot()["held_bytes"] == held + 100 * MiB  # loading again: the transient too
    assert s.retake([("voice", plan)])["ok"]  # an attempt that died holding it, tried again
    assert s.snapshot()["held_bytes"] == held + 100 * MiB
    s.release("voice", "load")
    assert s.snapshot()["held_bytes"] == held and s.holders() == ["voice"]
    assert [e["event"] for e in s.events if e["holder"] == "voice"].count("retake") == 2


def test_retake_is_all_or_nothing_and_keeps_what_was_held_when_refused() -> None:
    s = service()
    s.admit("thinker", [r("weights", 500)])
    s.admit("voice", [r("weights", 100)])
    answer = s.retake([("voice", [r("weights", 300)]), ("asr", [r("weights", 300)])])
    assert not answer["ok"] and answer["shortfalls"][0]["pool"] == "host_ram"
    assert s.holders() == ["thinker", "voice"] and s.snapshot()["held_bytes"] == 600 * MiB
    assert s.retake([("voice", [r("weights", 200)]), ("asr", [r("weights", 200)])])["ok"]
    assert s.snapshot()["held_bytes"] == 900 * MiB
