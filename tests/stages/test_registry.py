"""Stage kinds by name: the built-ins, ``register()``, and plugins found through the
``omni_edge.stage_kinds`` entry point — the test kinds' own distribution
(tests/plugins/omni_edge_testkinds) being the worked example of a third kind."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from orchestrator.config import parse_config
from orchestrator.planner import plan_pipeline
from orchestrator.units import MiB
from stages import registry
from stages.registry import ENTRY_POINT_GROUP, get_kind, known_kinds, register
from tests.conftest import REPO, make_profile

pytest.importorskip("omni_edge_testkinds", reason="the test kinds' plugin is missing: run scripts/bootstrap.sh")


def test_the_echo_kind_is_offered_by_the_test_plugins_entry_point() -> None:
    (ep,) = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == "echo"]
    assert ep.value == "omni_edge_testkinds.echo:EchoKind"
    assert ep.dist is not None and ep.dist.name == "omni-edge-testkinds"
    assert {"ar_decode", "exported_graph", "echo"} <= set(known_kinds())


def test_a_fresh_interpreter_loads_the_echo_kind_from_the_entry_point_and_logs_it() -> None:
    """Nothing registers ``echo`` by hand: the first lookup of an unknown name loads the plugins."""
    code = (
        "import json, logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr, format='%(name)s: %(message)s')\n"
        "from stages.registry import get_kind, known_kinds\n"
        "kind = get_kind('echo')\n"
        "print(json.dumps({'cls': f'{type(kind).__module__}:{type(kind).__name__}', 'known': known_kinds()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["cls"] == "omni_edge_testkinds.echo:EchoKind"
    assert "echo" in out["known"]
    assert "stages.registry: loading stage kind 'echo' from omni_edge_testkinds.echo:EchoKind" in done.stderr


def test_a_config_naming_the_plugin_kind_is_validated_by_its_model_and_planned(tmp_path: Path) -> None:
    doc = {
        "name": "echo-plan",
        "stages": [
            {"name": "thinker", "kind": "echo", "mode": "words", "hold_bytes": 32 * MiB, "devices": ["npu:0", "cpu"],
             "final_output": True, "final_output_type": "text"},
            {"name": "voice", "kind": "echo", "mode": "tone", "inputs": ["thinker"], "devices": ["cpu"],
             "final_output": True, "final_output_type": "audio"},
        ],
    }
    config = parse_config(doc, where=str(tmp_path / "echo.yaml"), base_dir=tmp_path)
    assert type(config.stages[0]).__name__ == "EchoConfig"  # the plugin's own config model
    plan = plan_pipeline(config, make_profile())
    assert plan.admitted
    thinker = plan.stage("thinker")
    assert (thinker.device, thinker.backend, thinker.route) == ("cpu", "ort-cpu", "this-process")
    weights = [r for r in thinker.reservations if r.purpose == "weights"]
    assert [(r.pool, r.bytes) for r in weights] == [("host_ram", 32 * MiB)]
    assert plan.to_json()["stages"][1]["kind"] == "echo"


def test_register_puts_a_kind_instance_under_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_edge_testkinds.echo import EchoKind

    class Registered(EchoKind):
        kind = "echo_registered_by_hand"

    monkeypatch.setattr(registry, "_kinds", dict(registry._kinds))  # leave the process's registry as it was
    instance = Registered()
    register(instance)
    assert get_kind("echo_registered_by_hand") is instance
    assert "echo_registered_by_hand" in known_kinds()
    with pytest.raises(KeyError):
        get_kind("no_such_kind")
