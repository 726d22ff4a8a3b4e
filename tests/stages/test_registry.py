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
from orchestrator.core.errors import ConfigError
from orchestrator.core.units import MiB
from orchestrator.planner import plan_pipeline
from stages import registry
from stages.registry import ENTRY_POINT_GROUP, get_kind, known_kinds, register
from tests.helpers import REPO
from tests.helpers.profiles import make_profile

pytest.importorskip(
    "omni_edge_testkinds", reason="the test kinds' plugin is missing: run scripts/bootstrap.sh"
)


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
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["cls"] == "omni_edge_testkinds.echo:EchoKind"
    assert "echo" in out["known"]
    assert (
        "stages.registry: loading stage kind 'echo' from omni_edge_testkinds.echo:EchoKind"
        in done.stderr
    )


def test_a_config_naming_the_plugin_kind_is_validated_by_its_model_and_planned(
    tmp_path: Path,
) -> None:
    doc = {
        "name": "echo-plan",
        "stages": [
            {
                "name": "thinker",
                "kind": "echo",
                "mode": "words",
                "hold_bytes": 32 * MiB,
                "devices": ["npu:0", "cpu"],
                "final_output": True,
                "final_output_type": "text",
            },
            {
                "name": "voice",
                "kind": "echo",
                "mode": "tone",
                "inputs": ["thinker"],
                "devices": ["cpu"],
                "final_output": True,
                "final_output_type": "audio",
            },
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

    monkeypatch.setattr(
        registry, "_kinds", dict(registry._kinds)
    )  # leave the process's registry as it was
    instance = Registered()
    register(instance)
    assert get_kind("echo_registered_by_hand") is instance
    assert "echo_registered_by_hand" in known_kinds()
    with pytest.raises(KeyError):
        get_kind("no_such_kind")


# ---- a broken plugin (tests/plugins/omni_edge_brokenplugin) ------------------------------


def _broken_installed() -> bool:
    return any(ep.name == "broken_import" for ep in entry_points(group=ENTRY_POINT_GROUP))


needs_broken = pytest.mark.skipif(
    not _broken_installed(), reason="the broken test plugin is missing: run scripts/bootstrap.sh"
)


@needs_broken
def test_a_plugin_that_fails_to_import_is_reported_by_name_when_its_kind_is_asked_for(
    tmp_path: Path,
) -> None:
    """In a fresh interpreter: the config names the broken kind; the error names the entry
    point, the distribution and the exception; the load and the failure are logged."""
    code = (
        "import json, logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr, format='%(name)s: %(message)s')\n"
        "from orchestrator.core.errors import ConfigError\n"
        "from orchestrator.config import parse_config\n"
        "from stages.registry import plugin_failures\n"
        "doc = {'name': 'b', 'stages': [{'name': 's', 'kind': 'broken_import', 'final_output': True,\n"
        "       'final_output_type': 'text'}]}\n"
        "try:\n"
        "    parse_config(doc, where='b.yaml', base_dir=__import__('pathlib').Path('.'))\n"
        "except ConfigError as exc:\n"
        "    print(json.dumps({'problems': [[p.where, p.what, p.fix] for p in exc.problems],\n"
        "                      'failures': [f.to_dict() for f in plugin_failures()]}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    ((where, what, fix),) = out["problems"]
    assert where == "entry point omni_edge.stage_kinds:broken_import"
    assert "omni_edge_brokenplugin.needs_missing:BrokenKind" in what
    assert "(from omni-edge-brokenplugin 0.1.0)" in what
    assert "ModuleNotFoundError: No module named 'omni_edge_no_such_dependency'" in what
    assert "pip uninstall omni-edge-brokenplugin" in fix
    assert [f["name"] for f in out["failures"]] == ["broken_import"]  # echo and the rest untouched
    assert (
        "stages.registry: loading stage kind 'broken_import' from "
        "omni_edge_brokenplugin.needs_missing:BrokenKind (omni-edge-brokenplugin 0.1.0)"
    ) in done.stderr


@needs_broken
def test_a_broken_plugin_does_not_stop_another_plugins_kind_from_loading() -> None:
    code = (
        "import json\n"
        "from stages.registry import get_kind, plugin_failures\n"
        "kind = get_kind('echo')\n"
        "print(json.dumps({'kind': kind.kind, 'failures': len(plugin_failures())}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"kind": "echo", "failures": 0}


@needs_broken
def test_survey_lists_every_kind_and_each_broken_entry_point_with_its_error() -> None:
    found = registry.survey()
    assert {"ar_decode", "exported_graph", "asr", "vad", "echo", "join_echo"} <= set(found.kinds)
    by_name = {f.name: f for f in found.failures}
    assert by_name["broken_import"].error.startswith(
        "ModuleNotFoundError: No module named 'omni_edge_no_such_dependency'"
    )
    assert by_name["not_a_kind"].error == "TypeError: it is a NotAKind, not a stages.base.StageKind"
    assert by_name["broken_hook"].group == "omni_edge.hooks"
    assert (
        by_name["broken_hook"].error
        == "RuntimeError: the broken hook's module raises on import, on purpose"
    )
    assert all(f.distribution == "omni-edge-brokenplugin 0.1.0" for f in found.failures)
    echo = registry.origin("echo")
    assert echo is not None and echo.describe() == "omni-edge-testkinds 0.1.0 (entry point)"
    vad = registry.origin("vad")
    assert vad is not None and vad.describe() == "built in"
    with pytest.raises(ConfigError):  # asked again: the same report, not a KeyError
        get_kind("not_a_kind")


@needs_broken
def test_a_hook_whose_module_raises_on_import_is_reported_by_name_not_as_a_traceback(
    tmp_path: Path,
) -> None:
    import shutil

    from stages.exported_graph.artifact import load_artifact

    shutil.copytree(REPO / "exports" / "silero-vad-op18", tmp_path / "a")
    manifest = tmp_path / "a" / "manifest.yaml"
    manifest.write_text(
        manifest.read_text().replace(
            "\nprecisions:",
            '\npreprocess: "omni_edge_brokenplugin.broken_hook:preprocess"\nprecisions:',
            1,
        )
    )
    with pytest.raises(ConfigError) as caught:
        load_artifact(tmp_path / "a")
    ((where, what, fix),) = [(p.where, p.what, p.fix) for p in caught.value.problems]
    assert where == f"{manifest}: preprocess"
    assert what == (
        "the hook 'omni_edge_brokenplugin.broken_hook:preprocess' cannot be loaded: RuntimeError: the "
        "broken hook's module raises on import, on purpose (from entry point omni_edge.hooks:broken_hook "
        "of omni-edge-brokenplugin 0.1.0)"
    )
    assert "uninstall the package" in fix
