"""Two stages loading at once in one device actor never import their runners' shared
modules concurrently: a first import of numpy in two threads at once failed a
fresh-clone CI run with Python's ``_DeadlockError``. The actor imports each kind's
``runner_imports`` one stage at a time before that stage's load."""

from __future__ import annotations

import asyncio
import sys
from typing import ClassVar

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
    assert {"tests.helpers.slow_imports.mod_a", "tests.helpers.slow_imports.mod_b"} <= set(sys.modules)
    spans = sorted((start, end) for _, start, end in SPANS)
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], f"the two imports overlapped: {spans}"


def test_every_kind_names_what_its_runners_share() -> None:
    assert "numpy" in StageKind.runner_imports
    for kind in (ExportedGraphKind, AsrKind, VadKind):
        assert {"numpy", "onnxruntime"} <= set(kind.runner_imports), kind.kind
