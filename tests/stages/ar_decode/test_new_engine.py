"""A new decode engine is one module and one table row: the test suite's echo engine
(``omni_edge_testkinds.echo_engine``), added through the engine table and the engine registry
and touching nothing else, is a backend a profile lists, plans with its own reservations and
settings, and runs on Ray in a device actor it reaches with the kind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import parse_config
from orchestrator.core import engines as table
from orchestrator.core.profile import parse_profile
from orchestrator.core.units import GiB
from orchestrator.planner import plan_pipeline
from orchestrator.runtime.events import collect
from orchestrator.runtime.runtime import Runtime
from stages.ar_decode import engines as registry
from stages.registry import get_kind
from stages.requests import as_request
from tests.helpers.checkpoints import llama_config, write_checkpoint

pytestmark = pytest.mark.ray

echo_engine = pytest.importorskip(
    "omni_edge_testkinds.echo_engine", reason="the test plugins' distribution is not installed"
)

PROMPT = "every engine is one module and one row"


@pytest.fixture
def echo() -> Iterator[None]:
    table.register(echo_engine.ROW)
    registry.register(echo_engine.EchoEngine())
    try:
        yield
    finally:
        registry.unregister("echo")
        table.unregister("echo")


def _pipeline(tmp_path: Path) -> tuple[Any, Any]:
    model = write_checkpoint(
        tmp_path / "model",
        llama_config(),
        {"model.embed_tokens.weight": ("BF16", [1000, 64]), "lm_head.weight": ("BF16", [1000, 64])},
    )
    config = parse_config(
        {
            "name": "echoed",
            "stages": [
                {
                    "name": "thinker",
                    "kind": "ar_decode",
                    "model": str(model),
                    "devices": ["cpu"],
                    "backends": ["echo-cpu"],
                    "max_model_len": 64,
                    "sampling": {"max_tokens": 5},
                    "final_output": True,
                }
            ],
        },
        where="echoed.yaml",
        base_dir=tmp_path,
    )
    profile = parse_profile(
        {
            "format": "omni-edge.profile/1",
            "name": "a machine with the echo engine",
            "host": {"os": "linux", "ram_total_bytes": 32 * GiB, "ram_available_bytes": 16 * GiB},
            "devices": [
                {"id": "cpu", "kind": "cpu", "name": "CPU", "backends": ["echo-cpu", "ort-cpu"]}
            ],
            "routes": [{"name": "this-process"}],
        }
    )
    return config, profile


def test_a_profile_lists_its_backend_only_once_its_row_is_in_the_table(tmp_path: Path) -> None:
    from orchestrator.core.errors import ConfigError

    with pytest.raises(ConfigError, match="got 'echo-cpu'"):
        _pipeline(tmp_path)


def test_an_engine_added_through_the_table_plans_and_runs_on_ray(
    echo: None, ray_cluster: Any, tmp_path: Path
) -> None:
    config, profile = _pipeline(tmp_path)
    assert get_kind("ar_decode").backends[-1] == "echo-cpu"
    plan = plan_pipeline(config, profile)
    stage = plan.stage("thinker")
    assert (stage.admitted, stage.device, stage.backend) == (True, "cpu", "echo-cpu")
    assert [(r.purpose, r.bytes) for r in stage.reservations] == [
        ("backend_workspace", echo_engine.WORKSPACE_BYTES)
    ]
    assert stage.engine_kwargs == {"model": str(tmp_path / "model"), "max_model_len": 64}

    rt = Runtime(plan, config)
    rt.start()
    try:

        async def main() -> Any:
            events = [e async for e in rt.stream(as_request(PROMPT), request_id="r1")]
            return collect("r1", PROMPT, events, 0.0)

        result = asyncio.run(main())
    finally:
        rt.close()
    # max_tokens 5 of the prompt's 8 words, each a token, handed back by the engine thread
    assert result.text == " ".join(PROMPT.split()[:5])
    done = result.stages["thinker"]
    assert (done["tokens"], done["finish_reason"], done["prompt_tokens"]) == (5, "length", 8)
