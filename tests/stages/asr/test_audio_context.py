"""``audio_context``: ``full`` (30 s windows) or ``fit`` (the encoder on the segment's length).

The frame count ``fit`` picks is a pure rule (tested on lengths, not on speech); the plan
carries the setting (engine kwargs, ``omni-edge plan`` and ``--json``); ``fit`` on an
encoder that takes 3000 frames only — a manifest without ``variable_frames``, or a stale
graph under the new manifest — is exit 2 naming the stage, the field and the rebuild; the
fit runner feeds the encoder the fitted frames and the decoder the full 1500 positions.
Nothing here asserts what the model transcribes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from orchestrator.config import parse_config
from orchestrator.core.errors import ConfigError
from orchestrator.planner import plan_pipeline
from stages.asr import runner as asr_runner
from stages.asr.runner import fit_frames
from stages.registry import get_kind
from tests.helpers.graphs import REPO
from tests.stages.asr.test_kind import PROFILE, asr_stage, profile

RATE = 16000


@pytest.mark.parametrize(
    ("seconds", "frames"),
    [
        (0.0, 100),  # nothing: the shortest window, 1 s
        (0.3, 100),  # 0.8 s → 1 s
        (2.04, 300),  # 2.54 s → 3 s
        (2.5, 300),  # 3.0 s exactly: no rounding up
        (2.51, 400),  # 3.01 s → 4 s
        (29.4, 3000),  # 29.9 s → 30 s
        (29.9, 3000),  # 30.4 s → 31 s: never past the 30 s window
    ],
)
def test_fit_rounds_the_segment_plus_the_margin_up_to_whole_seconds(
    seconds: float, frames: int
) -> None:
    assert fit_frames(round(seconds * RATE), RATE, 100, 100, 3000, margin_s=0.5, min_s=1) == frames


def test_the_rules_bounds_come_from_the_manifest_and_the_frames_stay_even() -> None:
    assert (
        fit_frames(RATE, RATE, 100, 500, 3000, margin_s=0.5, min_s=1) == 500
    )  # min_frames above the rule
    assert (
        fit_frames(RATE, RATE, 100, 100, 3000, margin_s=0.5, min_s=4) == 400
    )  # min_s above the segment
    assert fit_frames(RATE, RATE, 51, 2, 3000, margin_s=0.5, min_s=1) == 102  # 2 s x 51 = 102
    assert (
        fit_frames(RATE, RATE, 49, 2, 3000, margin_s=0.5, min_s=3) == 148
    )  # 3 s x 49 = 147 → even
    assert fit_frames(60 * RATE, RATE, 100, 100, 2999, margin_s=0.5, min_s=1) == 2998
    assert (asr_runner.FIT_MARGIN_S, asr_runner.FIT_MIN_S) == (0.5, 1)  # what docs/asr.md measured


def _plan_kwargs(graphs: dict[str, Path], tmp_path: Path, **extra: Any) -> dict[str, Any]:
    config = parse_config(
        {"name": "p", "stages": [asr_stage(graphs, **extra)]}, where="t.yaml", base_dir=tmp_path
    )
    plan = plan_pipeline(config, profile(), runtime=False)
    assert plan.admitted
    return plan.stage("asr").engine_kwargs


def test_the_plan_carries_the_setting(whisper_graphs: dict[str, Path], tmp_path: Path) -> None:
    assert (
        _plan_kwargs(whisper_graphs, tmp_path)["audio_context"] == "full"
    )  # the default: Whisper as trained
    assert _plan_kwargs(whisper_graphs, tmp_path, audio_context="fit")["audio_context"] == "fit"
    with pytest.raises(ConfigError) as err:
        parse_config(
            {"name": "p", "stages": [asr_stage(whisper_graphs, audio_context="short")]},
            where="t.yaml",
            base_dir=tmp_path,
        )
    assert [p.where for p in err.value.problems] == ["t.yaml: stages[0].audio_context"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
    )


def _write(tmp_path: Path, graphs: dict[str, Path], **extra: Any) -> tuple[Path, Path]:
    config = tmp_path / "asr.yaml"
    config.write_text(yaml.safe_dump({"name": "p", "stages": [asr_stage(graphs, **extra)]}))
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    return config, prof


def test_omni_edge_plan_shows_the_setting(whisper_graphs: dict[str, Path], tmp_path: Path) -> None:
    config, prof = _write(tmp_path, whisper_graphs, audio_context="fit")
    shown = _cli("plan", str(config), "--profile", str(prof))
    assert shown.returncode == 0, shown.stderr
    assert "audio_context=fit" in shown.stdout
    done = _cli("plan", str(config), "--profile", str(prof), "--json")
    assert done.returncode == 0, done.stderr
    (stage,) = json.loads(done.stdout)["stages"]
    assert stage["engine_kwargs"]["audio_context"] == "fit"


def _fixed_frames_graph(src: Path, dst: Path) -> None:
    """The encoder graph with its frame axis fixed at 3000: what version 1.0 built."""
    import onnx

    model = onnx.load(str(src))
    dim = model.graph.input[0].type.tensor_type.shape.dim[2]
    dim.ClearField("dim_param")
    dim.dim_value = 3000
    onnx.save(model, str(dst))


@pytest.mark.parametrize("case", ["fixed-frame manifest", "stale graph"])
def test_fit_on_an_encoder_of_3000_frames_only_is_exit_2_naming_the_field_and_the_rebuild(
    whisper_graphs: dict[str, Path],
    tmp_path: Path,
    case: str,
) -> None:
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    manifest = yaml.safe_load((whisper_graphs["encoder"] / "manifest.yaml").read_text())
    for name in ("reference_inputs.npz", "reference_outputs.npz"):
        shutil.copy(whisper_graphs["encoder"] / name, encoder)
    if case == "fixed-frame manifest":  # version 1.0's manifest: 3000 frames, no variable_frames
        shutil.copy(whisper_graphs["encoder"] / "fp32.onnx", encoder)
        manifest["version"] = "1.0.0"
        manifest["inputs"][0]["shape"] = ["batch", 80, 3000]
        for key in ("variable_frames", "frames_per_second", "min_frames", "max_frames"):
            manifest["metadata"].pop(key)
        what = "does not declare metadata.variable_frames: true"
    else:  # the new manifest over a graph built before it
        _fixed_frames_graph(whisper_graphs["encoder"] / "fp32.onnx", encoder / "fp32.onnx")
        what = "takes 'input_features' with 3000 frames only"
    (encoder / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    graphs = {"encoder": encoder, "decoder": whisper_graphs["decoder"]}
    config, prof = _write(tmp_path, graphs, audio_context="fit")
    done = _cli("plan", str(config), "--profile", str(prof))
    assert done.returncode == 2, done.stdout
    assert "stages.asr.audio_context" in done.stderr and what in done.stderr
    assert (
        "python -m exports.whisper_asr build" in done.stderr
        and "audio_context: full" in done.stderr
    )
    assert "Traceback" not in done.stderr
    full, _ = _write(tmp_path, graphs)  # the same graphs under full: planned as before
    assert _cli("plan", str(full), "--profile", str(prof)).returncode == 0


@pytest.mark.slow
@pytest.mark.ort
def test_the_fit_runner_feeds_the_encoder_the_fitted_frames_and_the_decoder_1500_positions(
    whisper_graphs: dict[str, Path],
    tmp_path: Path,
) -> None:
    """A 2.2 s item: the encoder sees fit_frames of it (300 frames); every decoder step sees
    the cut's 150 positions and the silent tail's 1350. Under full: 3000 and 1500."""
    seen: dict[str, list[Any]] = {"full": [], "fit": []}
    samples = (0.1 * np.sin(2 * np.pi * 220 * np.arange(round(2.2 * RATE)) / RATE)).astype(
        np.float32
    )
    for setting in ("full", "fit"):
        config = parse_config(
            {
                "name": "p",
                "stages": [asr_stage(whisper_graphs, audio_context=setting, max_new_tokens=2)],
            },
            where="t.yaml",
            base_dir=tmp_path,
        )
        plan = plan_pipeline(config, profile(), runtime=False)
        r: Any = get_kind("asr").runner(plan.stage("asr"), config.stage("asr"))
        r.load()
        try:
            run = r._host.run

            def recording(
                handle: int,
                feeds: dict[str, Any],
                _run: Any = run,
                _seen: list[Any] = seen[setting],
                _r: Any = r,
            ) -> Any:
                graph = "encoder" if handle == _r._handles["encoder"] else "decoder"
                _seen.append(
                    (
                        graph,
                        (
                            feeds.get("input_features")
                            if graph == "encoder"
                            else feeds["cross_key"]
                        ).shape,
                    )
                )
                return _run(handle, feeds)

            r._host.run = recording
            assert isinstance(r.transcribe({"audio": samples, "sample_rate": RATE}), str)
        finally:
            r.close()
    frames = fit_frames(len(samples), RATE, 100, 100, 3000)
    assert frames == 300
    assert seen["fit"][0] == ("encoder", (1, 80, frames))
    assert seen["full"][0] == ("encoder", (1, 80, 3000))
    for setting in ("full", "fit"):
        steps = seen[setting][1:]
        assert steps and {s for s in steps} == {("decoder", (4, 1, 6, 1500, 64))}
