"""Running through the host-process route (WSL2 → a Windows-side python.exe), end to end on Ray.

tests/orchestrator/ort/test_host_process_route.py shows a session and ``omni-edge
verify`` going through the route; this runs a pipeline: an ``exported_graph``
stage whose ``ort-cpu`` backend is routed to the stand-in ``python.exe``
(tests/helpers/hostproc.py: a Linux interpreter that opens only Windows-spelled
paths), planned and verified in this process, its session opened by the route
worker that the *device actor* starts.

The premise "inside WSL2" must hold in the device actor's process, where the
graph's path is translated (``ResolvedRoute.path_for_route``). On WSL2 every
process inherits ``WSL_DISTRO_NAME`` and finds ``wslpath``; here the Ray cluster
is shared by the test session and was started without it, so the test hands it
to the actor the way the product hands a device actor its environment: the
stage kind's ``actor_env`` (merged into Ray's ``runtime_env``). Without it the
actor's translation would refuse (tests/orchestrator/ort/test_host_process_route.py
shows that refusal). What this cannot show: WSL interop, the Windows file share,
and the DirectML/VitisAI EPs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import yaml

from orchestrator.api import Pipeline
from orchestrator.ort import hostproc, wire
from orchestrator.runtime.events import OutputItem
from stages.exported_graph.kind import ExportedGraphKind
from tests.helpers.graphs import GRAPHS, cpu_outputs, write_artifact
from tests.helpers.hostproc import (
    DISTRO,
    log_lines,
    standin_profile,
    standin_python,
    trust_standin,
)

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.ort]


def test_a_pipeline_runs_on_ray_through_the_host_process_route(
    ray_cluster: Any,
    tmp_path: Path,
    private_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # this process (plan, verify): inside WSL2 as translation sees it — a distribution, no wslpath
    monkeypatch.setenv("WSL_DISTRO_NAME", DISTRO)
    monkeypatch.setattr(hostproc.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr("orchestrator.verify.run.running_in_wsl", lambda: True)
    monkeypatch.setattr("orchestrator.planner.running_in_wsl", lambda: True)
    # the device actor's process: the same distribution, through the product's actor environment
    kind_env = ExportedGraphKind.actor_env
    monkeypatch.setattr(
        ExportedGraphKind,
        "actor_env",
        lambda self, sp: {**kind_env(self, sp), "WSL_DISTRO_NAME": DISTRO},
    )

    exe, log = standin_python(tmp_path)
    trust_standin(exe, monkeypatch)  # the user's settings name it: run may start it
    graph = write_artifact(tmp_path / "art", "full") / "fp32.onnx"
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "tiny-hostproc",
                "stages": [
                    {
                        "name": "net",
                        "kind": "exported_graph",
                        "artifact": "art",
                        "devices": ["cpu"],
                        "backends": ["ort-cpu"],
                        "final_output": True,
                        "final_output_type": "tensor",
                    }
                ],
            }
        )
    )
    profile = standin_profile(tmp_path / "profile.json", exe)

    pipeline = Pipeline.from_config(
        config, profile=profile, record=None, calibration=False, start=False
    )
    net = pipeline.plan.stage("net")
    assert (net.device, net.backend, net.route) == ("cpu", "ort-cpu", "windows-standin")
    assert (
        net.verification is not None and net.verification.status == "verified"
    )  # the gates ran through it
    assert pipeline.runtime.actor_envs["cpu"]["WSL_DISTRO_NAME"] == DISTRO
    log.write_text("")  # what follows is the run's alone: the route worker the device actor starts

    feeds = cast(dict[str, Any], GRAPHS["full"][1]())  # the artifact's reference input
    # a second input whose output differs: the output follows the input, not a cached answer
    other = {"x": np.random.RandomState(7).randn(3, feeds["x"].shape[1]).astype(np.float32)}

    async def outputs(prompt: dict[str, Any]) -> list[Any]:
        return [
            e.value
            async for e in pipeline.stream(prompt)
            if isinstance(e, OutputItem) and e.stage == "net"
        ]

    try:
        pipeline.start()
        got = [asyncio.run(outputs(feeds)), asyncio.run(outputs(other))]
        pipeline.run(feeds, record=tmp_path / "run.json")
    finally:
        pipeline.close()

    for prompt, out in zip((feeds, other), got, strict=True):
        expected = cpu_outputs(graph, prompt)
        assert len(out) == 1 and set(out[0]) == set(expected) == {"y"}
        assert out[0]["y"].shape == expected["y"].shape == (prompt["x"].shape[0], 16)
        assert np.array_equal(out[0]["y"], expected["y"])  # same build, same CPU: bit for bit

    lines = log_lines(log)
    assert lines[0]["argv"] == ["-I", "-c", wire.BOOTSTRAP]  # started as every route worker is
    opened = [line["graph"] for line in lines if "graph" in line]
    # the device actor handed the worker the Windows spelling of the graph, as wslpath -w writes it
    assert opened and set(opened) == {
        f"\\\\wsl.localhost\\{DISTRO}" + str(graph).replace("/", "\\")
    }

    record = json.loads((tmp_path / "run.json").read_text())
    rows = {r["stage"]: r for r in record["stages"]}
    assert (rows["net"]["device"], rows["net"]["backend"], rows["net"]["route"]) == (
        "cpu",
        "ort-cpu",
        "windows-standin",
    )
