"""Pipeline config loading: strict keys, graph checks, where → what → how to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from orchestrator.config import load_config
from orchestrator.core.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


THINKER = """
  - name: thinker
    kind: ar_decode
    model: ckpt
    devices: [gpu:0, cpu]
    max_model_len: 1024
    final_output: true
"""


def test_loads_and_resolves_model_path_relative_to_config(tmp_path):
    cfg = load_config(write(tmp_path, "name: p\nstages:" + THINKER))
    stage = cfg.stage("thinker")
    assert stage.model == str((tmp_path / "ckpt").resolve())
    assert stage.devices == ["gpu:0", "cpu"]
    assert stage.inputs == ["request"]


def test_json_loads_through_the_same_path(tmp_path):
    p = write(
        tmp_path,
        '{"name": "p", "stages": [{"name": "t", "kind": "ar_decode", "model": "m", '
        '"devices": ["cpu"], "max_model_len": 512, "final_output": true}]}',
        "p.json",
    )
    assert load_config(p).stages[0].max_model_len == 512


def test_unknown_key_is_an_error_with_a_suggestion(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "name: p\nstages:" + THINKER + "    max_model_lenn: 5\n"))
    text = str(exc.value)
    assert "stages[0].max_model_lenn: unknown key 'max_model_lenn'" in text
    assert "did you mean 'max_model_len'" in text


def test_every_problem_is_reported_at_once(tmp_path):
    bad = """name: p
stages:
  - name: a
    kind: ar_decode
    model: m
    devices: [cpu]
    max_model_len: 4
  - name: b
    kind: warp_drive
    devices: [cpu]
"""
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, bad))
    text = str(exc.value)
    assert "stages[0].max_model_len" in text and "greater than or equal to 16" in text
    assert "stages[1].kind: unknown stage kind 'warp_drive'" in text
    assert "ar_decode" in text  # the fix lists the kinds that exist


def test_yaml_syntax_error_names_the_line(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "name: p\nstages:\n  - name: [unclosed\n"))
    assert "p.yaml:" in str(exc.value) and "not valid YAML" in str(exc.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "  - name: tts\n    kind: ar_decode\n    model: m\n    devices: [cpu]\n    max_model_len: 64\n    sampling: {max_tokens: 8}\n    inputs: [nobody]\n",
            "unknown input 'nobody'",
        ),
        (
            "  - name: thinker\n    kind: ar_decode\n    model: m\n    devices: [cpu]\n    max_model_len: 64\n    sampling: {max_tokens: 8}\n",
            "stage name 'thinker' is used more than once",
        ),
        (
            "  - name: x\n    kind: ar_decode\n    model: m\n    devices: [tpu:0]\n    max_model_len: 64\n    sampling: {max_tokens: 8}\n",
            "'tpu:0' is not a device id",
        ),
    ],
)
def test_graph_errors(tmp_path, extra, message):
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "name: p\nstages:" + THINKER + extra))
    assert message in str(exc.value)


def test_cycle_and_missing_final_output(tmp_path):
    cyc = """name: p
stages:
  - {name: a, kind: ar_decode, model: m, devices: [cpu], max_model_len: 64, sampling: {max_tokens: 8}, inputs: [b]}
  - {name: b, kind: ar_decode, model: m, devices: [cpu], max_model_len: 64, sampling: {max_tokens: 8}, inputs: [a]}
"""
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, cyc))
    text = str(exc.value)
    assert ("cycle" in text and "a → b → a" in text) or "b → a → b" in text
    assert "no stage has final_output: true" in text


def test_max_tokens_must_leave_room_for_the_prompt(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_config(
            write(tmp_path, "name: p\nstages:" + THINKER + "    sampling: {max_tokens: 4096}\n")
        )
    assert "sampling.max_tokens (4096) must be smaller than max_model_len (1024)" in str(exc.value)


def test_min_tokens_may_not_exceed_max_tokens(tmp_path):
    assert load_config(
        write(
            tmp_path,
            "name: p\nstages:" + THINKER + "    sampling: {min_tokens: 8, max_tokens: 8}\n",
        )
    )
    with pytest.raises(ConfigError) as exc:
        load_config(
            write(
                tmp_path,
                "name: p\nstages:" + THINKER + "    sampling: {min_tokens: 9, max_tokens: 8}\n",
            )
        )
    assert "sampling.min_tokens (9) must not exceed sampling.max_tokens (8)" in str(exc.value)


def test_a_vllm_omni_stage_args_file_is_refused_naming_the_importer(tmp_path):
    """config.py reads no vLLM-Omni spelling of its own (the importer is its one reader): a ``stage_args:``
    file, even one whose stages carry omni-edge's kind, is one problem that names the
    importer, the one reader of that format."""
    doc = """name: omni
stage_args:
  - stage_id: 0
    name: thinker
    kind: ar_decode
    model: m
    devices: [cpu]
    engine_args: {max_model_len: 2048, enforce_eager: true}
    final_output: true
    final_output_type: text
  - stage_id: 1
    name: talker
    kind: ar_decode
    model: m
    devices: [cpu]
    engine_args: {max_model_len: 1024}
    engine_input_source: [0]
    final_output: true
"""
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    [problem] = exc.value.problems
    assert problem.where == f"{path}: stage_args"
    assert "this is a vLLM-Omni stage config" in problem.what
    assert f"omni-edge import vllm-omni {path} --model CHECKPOINT_DIR -o CONFIG" in problem.fix


def test_deploy_shaped_stages_without_kind_are_refused_naming_the_importer(tmp_path):
    doc = (
        "name: omni\nstages:\n  - {stage_id: 0, engine_args: {max_model_len: 2048}}\n"
        "  - {stage_id: 1, engine_input_source: [0], gpu_memory_utilization: 0.5}\n"
    )
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    [problem] = exc.value.problems
    assert problem.where == str(path)
    assert (
        "this is a vLLM-Omni stage config" in problem.what
        and "omni-edge import vllm-omni" in problem.fix
    )


def test_every_config_field_has_a_description():
    from orchestrator import config
    from orchestrator.core import profile
    from stages.registry import get_kind

    models: list[type[BaseModel]] = [
        config.PipelineConfig,
        config.StageConfig,
        profile.HardwareProfile,
        profile.Host,
        profile.Device,
        profile.Route,
    ]
    for name in ("ar_decode", "exported_graph"):
        models.append(get_kind(name).config_model)
    seen = set()
    while models:
        m = models.pop()
        if m in seen:
            continue
        seen.add(m)
        for field_name, info in m.model_fields.items():
            assert info.description, f"{m.__name__}.{field_name} has no description"
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                models.append(ann)


RESTART_STAGE = """
  - name: thinker
    kind: ar_decode
    model: ckpt
    devices: [gpu:0, cpu]
    max_model_len: 1024
    final_output: true
"""


@pytest.mark.parametrize(
    ("extra", "where", "what", "fix"),
    [
        (
            "restart: sometimes",
            "stages[0].restart",
            "'sometimes' is no restart policy",
            "restart: never, or restart: {max: 5, window_s: 600}",
        ),
        ("restart: 5", "stages[0].restart", "5 is no restart policy", "restart: never"),
        ("restart: {max: 0}", "stages[0].restart.max", "greater than or equal to 1", "limit"),
        ("restart: {max: 1001}", "stages[0].restart.max", "less than or equal to 1000", "limit"),
        ("restart: {max: true}", "stages[0].restart.max", "valid integer", "type"),
        ("restart: {window_s: .nan}", "stages[0].restart.window_s", "finite number", "correct"),
        ("restart: {maxx: 2}", "stages[0].restart.maxx", "unknown key", "did you mean 'max'"),
        (
            "restart: {backoff_s: 5, backoff_max_s: 1}",
            "stages[0].restart",
            "backoff_max_s (1 s) is shorter than backoff_s (5 s)",
            "make backoff_max_s at least backoff_s",
        ),
        (
            "on_device_loss: move",
            "stages[0].on_device_loss",
            "'fail' or 'fallback'",
            "use one of",
        ),
    ],
)
def test_a_bad_restart_policy_is_refused_naming_the_field(tmp_path, extra, where, what, fix):
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "name: p\nstages:" + RESTART_STAGE + f"    {extra}\n"))
    (problem,) = exc.value.problems
    assert problem.where.endswith(where) and what in problem.what and fix in problem.fix, problem


def test_a_fallback_needs_a_next_device(tmp_path):
    one = RESTART_STAGE.replace("devices: [gpu:0, cpu]", "devices: [cpu]")
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "name: p\nstages:" + one + "    on_device_loss: fallback\n"))
    (problem,) = exc.value.problems
    assert problem.where.endswith("stages[0]") and "needs a next device" in problem.what
    assert "list another device after it" in problem.fix


def test_restart_is_never_or_a_policy_with_the_defaults_filled_in(tmp_path):
    from stages.base import RestartConfig

    default = load_config(write(tmp_path, "name: p\nstages:" + RESTART_STAGE)).stage("thinker")
    assert default.restart == RestartConfig() and default.on_device_loss == "fail"
    assert (default.restart.max, default.restart.window_s) == (5, 600.0)
    never = load_config(
        write(tmp_path, "name: p\nstages:" + RESTART_STAGE + "    restart: never\n")
    ).stage("thinker")
    assert never.restart == "never" and never.restart_policy() is None
    set_ = load_config(
        write(
            tmp_path,
            "name: p\nstages:"
            + RESTART_STAGE
            + "    restart: {max: 2, window_s: 60}\n    on_device_loss: fallback\n",
        )
    ).stage("thinker")
    policy = set_.restart_policy()
    assert policy is not None and (policy.max, policy.window_s, policy.backoff_s) == (2, 60.0, 1.0)
    assert set_.on_device_loss == "fallback"
    # the back-off doubles after each death in the window, up to backoff_max_s
    assert [policy.backoff(n) for n in (1, 2, 3, 6, 40)] == [1.0, 2.0, 4.0, 30.0, 30.0]
