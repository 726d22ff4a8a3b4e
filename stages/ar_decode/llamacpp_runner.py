"""Placeholder for the llama.cpp runner (issue 21; the helper "lcpp-runner" writes the real one).

Only the class the kind's ``runner()`` names exists here, so planning can name it; a merge
keeps the runner helper's file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from stages.base import StageConfig, StageRunner

if TYPE_CHECKING:
    from orchestrator.plan import StagePlan


class LlamaCppRunner(StageRunner):
    """An ``ar_decode`` stage on llama.cpp (llama-cpp-python): not written yet in this branch."""

    def __init__(self, stage_plan: StagePlan, stage: StageConfig) -> None:
        self.plan = stage_plan
        self.stage = stage

    def load(self) -> None:
        raise NotImplementedError("the llama.cpp runner is the lcpp-runner branch's")

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        raise NotImplementedError("the llama.cpp runner is the lcpp-runner branch's")
        yield  # pragma: no cover - makes this an async generator
