"""The planner's CPU thread split weighs each stage as its kind says (``StageKind.
cpu_thread_weight``), not by the kind's name: a plugin kind that declares a decoder's weight
gets a decoder's share. Planning only (the test kinds of ``tests/plugins``), no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import parse_config
from orchestrator.core.cpu_threads import DECODE_WEIGHT, OTHER_WEIGHT
from orchestrator.core.profile import parse_profile
from orchestrator.core.units import GiB
from orchestrator.planner import plan_pipeline
from stages.registry import get_kind

CORES = 9
"""Nine logical CPUs: eight for the stages (one is left to Ray and the OS), so a 2:1 split
is 5:3 and an even one 4:4 (``cpu_threads.split_cores``)."""


def _threads(tmp_path: Path) -> dict[str, int | None]:
    config = parse_config(
        {
            "name": "two-on-one-cpu",
            "stages": [
                {
                    "name": "a",
                    "kind": "echo",
                    "mode": "words",
                    "devices": ["cpu"],
                    "final_output": True,
                    "final_output_type": "text",
                },
                {
                    "name": "b",
                    "kind": "port_echo",
                    "mode": "source",
                    "devices": ["cpu"],
                    "final_output": True,
                    "final_output_type": "text",
                },
            ],
        },
        where="t.yaml",
        base_dir=tmp_path,
    )
    profile = parse_profile(
        {
            "format": "omni-edge.profile/1",
            "name": "nine cores",
            "host": {
                "os": "linux",
                "ram_total_bytes": 32 * GiB,
                "ram_available_bytes": 16 * GiB,
                "cpu_cores": CORES,
            },
            "devices": [{"id": "cpu", "kind": "cpu", "name": "cpu", "backends": ["ort-cpu"]}],
            "routes": [{"name": "this-process"}],
        }
    )
    plan = plan_pipeline(config, profile)
    assert plan.admitted
    return {s.name: s.cpu_threads for s in plan.stages}


def test_two_kinds_of_the_same_weight_split_the_cores_evenly(tmp_path: Path) -> None:
    assert get_kind("echo").cpu_thread_weight == get_kind("port_echo").cpu_thread_weight
    assert get_kind("echo").cpu_thread_weight == OTHER_WEIGHT
    assert _threads(tmp_path) == {"a": 4, "b": 4}


def test_a_kind_that_weighs_as_a_decoder_gets_a_decoder_s_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type(get_kind("echo")), "cpu_thread_weight", DECODE_WEIGHT)
    assert _threads(tmp_path) == {"a": 5, "b": 3}
    assert get_kind("ar_decode").cpu_thread_weight == DECODE_WEIGHT  # the built-in decoder
