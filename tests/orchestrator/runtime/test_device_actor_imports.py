"""Two stages loading at once in one device actor never import concurrently: a first
import of numpy in two threads at once failed a fresh-clone CI run with Python's
``_DeadlockError``, and a vLLM engine starting while the Whisper stage loaded failed
``serve`` once in four with ``ImportError: cannot import name 'PreTrainedConfig' from
'transformers'``. The actor imports each kind's ``runner_imports`` one stage at a time
before that stage's load, and every import a load makes, whatever it imports, holds
one lock (``orchestrator.runtime.load_imports``)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from orchestrator.runtime.device_actor import DeviceActor
from stages.asr.kind import AsrKind
from stages.base import StageKind
from stages.exported_graph.kind import ExportedGraphKind
from stages.vad.kind import VadKind
from tests.helpers.slow_imports import SPANS


class _KindA:
    runner_imports: ClassVar[tuple[str, ...]] = ("tests.helpers.slow_imports.mod_a",)


class _KindB:
    runner_imports: ClassVar[tuple[str, ...]] = ("tests.helpers.slow_imports.mod_b",)


def test_runner_imports_run_one_stage_at_a_time() -> None:
    actor = DeviceActor("cpu", ledger=None)

    async def both() -> None:
        await asyncio.gather(actor._import_first(_KindA()), actor._import_first(_KindB()))

    asyncio.run(both())
    assert {"tests.helpers.slow_imports.mod_a", "tests.helpers.slow_imports.mod_b"} <= set(
        sys.modules
    )
    spans = sorted((start, end) for _, start, end in SPANS)
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], f"the two imports overlapped: {spans}"


def test_every_kind_names_what_its_runners_share() -> None:
    assert "numpy" in StageKind.runner_imports
    for kind in (ExportedGraphKind, AsrKind, VadKind):
        assert {"numpy", "onnxruntime"} <= set(kind.runner_imports), kind.kind


CROSSING = "tests.helpers.slow_imports.crossing"


@pytest.mark.ray
def test_two_loads_whose_imports_cross_both_load_in_one_actor(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """Two real loads in one device actor, whose imports cross by construction (one imports a
    package that imports its submodule, the other the submodule, which takes a name from the
    package: tests/helpers/slow_imports/marks.py); each alone works. Before the load-import
    lock one of them failed, every time: `cannot import name 'thing' from partially
    initialized module '…crossing.sub'`."""
    from orchestrator.runtime.runtime import Runtime
    from tests.helpers.echo import echo_pipeline

    plan, config = echo_pipeline(
        tmp_path,
        thinker={"load_imports": [CROSSING]},
        voice={"load_imports": ["tests.helpers.slow_imports.crossing_b"]},
    )
    rt = Runtime(plan, config)
    try:
        rt.start()  # raises StageFailed naming the stage whose import failed
        assert rt.startup["load_waves"] == [
            ["thinker", "voice"]
        ]  # one wave, one actor (both on cpu)
        assert rt.load_results["thinker"]["overlapped"] and rt.load_results["voice"]["overlapped"]
    finally:
        rt.close()
    assert rt.final_ledger is not None and rt.final_ledger["held_bytes"] == 0


def test_the_crossing_imports_work_from_either_end_in_one_thread() -> None:
    """What makes the test above fair: alone (no other load to wait for: the waits are off),
    the two imports succeed in either order."""
    import subprocess

    for first, second in ((CROSSING, f"{CROSSING}.sub"), (f"{CROSSING}.sub", CROSSING)):
        code = (
            "import importlib; from tests.helpers.slow_imports import marks; marks.TIMEOUT_S = 0; "
            f"importlib.import_module({first!r}); m = importlib.import_module({second!r}); print(m.thing)"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert done.stdout.strip() == "helper and thing", done.stderr[-2000:]
