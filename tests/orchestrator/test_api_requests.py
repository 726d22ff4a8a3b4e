"""Requests are checked before they reach a stage: a clear ``BadRequest`` naming the
limit (exit 2 on the command line, before Ray starts), never a ``StageFailed``
from inside the engine.

Uses the default pipeline's plan without starting it; the length check reads
the decode stage's own tokenizer from its prepared checkpoint (converted once
into the model cache; the first run of this module may take ~40 s for it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import Pipeline
from orchestrator.cli import main
from orchestrator.config import load_config
from orchestrator.core.errors import BadRequest, ConfigError
from orchestrator.core.units import GiB
from orchestrator.planner import plan_pipeline
from orchestrator.runtime.runtime import Runtime
from tests.helpers import REPO
from tests.helpers.profiles import make_profile

CONFIG = REPO / "configs" / "voice-assistant.yaml"
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    config = load_config(CONFIG)
    plan = plan_pipeline(config, make_profile(ram_available=16 * GiB))
    assert plan.admitted
    p = Pipeline(plan, config, record=None)
    p.prepare()
    return p


@pytest.fixture
def no_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Runtime) -> None:
        raise AssertionError("Ray was started for a request that should have been refused")

    monkeypatch.setattr(Runtime, "start", refuse)


@pytest.mark.parametrize(
    ("prompt", "where", "what"),
    [
        ("", "prompt", "empty"),
        ("   \n\t ", "prompt", "empty"),
        (42, "prompt", "int"),
        (None, "prompt", "None"),
        ({"prompt": 7}, "request.prompt", "int"),
        ({"prompt": "hi", "sampling": {"max_tokens": 0}}, "request.sampling.max_tokens", "0"),
        ({"prompt": "hi", "sampling": {"temperature": -1}}, "request.sampling.temperature", "-1"),
        (
            {"prompt": "hi", "sampling": {"temprature": 0.5}},
            "request.sampling.temprature",
            "not a sampling setting",
        ),
        # the config's sampling.max_tokens (96) is a cap, not only a default
        (
            {"prompt": "hi", "sampling": {"max_tokens": 97}},
            "request.sampling.max_tokens",
            "97 is over the config's sampling.max_tokens of 96",
        ),
        # bounded as vLLM's own server bounds them: past these the engine step fails, and the engine with it
        (
            {"prompt": "hi", "sampling": {"seed": 2**64}},
            "request.sampling.seed",
            "less than or equal to 9223372036854775807",
        ),
        (
            {"prompt": "hi", "sampling": {"seed": 2**63}},
            "request.sampling.seed",
            "less than or equal to 9223372036854775807",
        ),
        (
            {"prompt": "hi", "sampling": {"seed": -(2**63) - 1}},
            "request.sampling.seed",
            "greater than or equal to",
        ),
        (
            {"prompt": "hi", "sampling": {"temperature": 3.0}},
            "request.sampling.temperature",
            "less than or equal to 2",
        ),
        (
            {"prompt": "hi", "sampling": {"temperature": float("inf")}},
            "request.sampling.temperature",
            "finite",
        ),
        (
            {"prompt": "hi", "sampling": {"temperature": float("nan")}},
            "request.sampling.temperature",
            "finite",
        ),
        ({"prompt": "hi", "sampling": {"top_p": float("nan")}}, "request.sampling.top_p", "finite"),
        (
            {"prompt": "hi", "sampling": {"repetition_penalty": float("inf")}},
            "request.sampling.repetition_penalty",
            "finite",
        ),
        (
            {"prompt": "hi", "sampling": {"top_k": 2**31}},
            "request.sampling.top_k",
            "less than or equal to",
        ),
        (
            {"prompt": "hi", "sampling": {"min_tokens": 2**40}},
            "request.sampling.min_tokens",
            "less than or equal to",
        ),
    ],
)
def test_a_bad_request_is_refused_naming_where_and_what(
    pipeline: Pipeline, prompt: Any, where: str, what: str
) -> None:
    with pytest.raises(BadRequest) as info:
        pipeline.validate(prompt)
    assert isinstance(info.value, ConfigError)
    problem = info.value.problems[0]
    assert problem.where == where and what in problem.what and problem.fix


def test_a_prompt_longer_than_the_context_names_the_limit_and_its_token_count(
    pipeline: Pipeline,
) -> None:
    with pytest.raises(BadRequest) as info:
        pipeline.validate("word " * 20_000)  # 100,000 characters
    problem = info.value.problems[0]
    assert "max_model_len of 2048" in problem.what and "max_tokens 96" in problem.what
    tokens = int(problem.what.split("is ")[1].split(" tokens")[0])
    assert tokens > 2048
    assert "at most 1952 tokens" in problem.fix


def test_a_good_request_passes(pipeline: Pipeline) -> None:
    pipeline.validate("Tell me one fact about the Moon.")
    pipeline.validate({"prompt": "Hi", "sampling": {"max_tokens": 32, "temperature": 0}})
    pipeline.validate(
        {"prompt": "Hi", "sampling": {"max_tokens": 96, "temperature": 2.0, "seed": 2**63 - 1}}
    )
    pipeline.validate({"prompt": "Hi", "sampling": {"seed": -(2**63)}})


def test_the_api_stream_refuses_before_any_actor_is_asked(pipeline: Pipeline) -> None:
    import asyncio

    async def first() -> Any:
        async for e in pipeline.stream("  "):
            return e

    pipeline.runtime.ledger = object()  # looks started; nothing may be sent to it
    try:
        with pytest.raises(BadRequest):
            asyncio.run(first())
    finally:
        pipeline.runtime.ledger = None


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("   ", "is empty or only whitespace"),
        ("word " * 20_000, "over the stage's max_model_len of 2048 tokens"),
    ],
)
def test_the_cli_exits_2_before_ray_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_start: None, prompt: str, expected: str
) -> None:
    prof = tmp_path / "profile.json"
    prof.write_text(make_profile(ram_available=16 * GiB).model_dump_json())
    rec = tmp_path / "runs"
    rc = main(
        [
            "run",
            str(CONFIG),
            "--prompt",
            prompt,
            "--profile",
            str(prof),
            "--skip-verify",
            "--record",
            str(rec),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    assert expected in err and "how to fix" in err and "Traceback" not in err
    assert not rec.exists()  # nothing written


@pytest.mark.parametrize("record", ["/proc/x/r.json", "/proc/x/runs"])
def test_a_record_path_that_cannot_be_written_is_refused_before_planning(
    record: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*a: Any, **k: Any) -> None:
        raise AssertionError("planned despite an unwritable record path")

    monkeypatch.setattr("orchestrator.api.load_config", never)
    with pytest.raises(ConfigError) as info:
        Pipeline.from_config(CONFIG, record=record, start=False)
    assert info.value.problems[0].where.startswith("record /proc/x")


def test_run_checks_its_record_path_before_the_request(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*a: Any, **k: Any) -> None:
        raise AssertionError("ran the request despite an unwritable record path")

    monkeypatch.setattr(Pipeline, "arun", never)
    with pytest.raises(ConfigError, match=r"record /proc/x/r\.json"):
        pipeline.run("hello", record="/proc/x/r.json")
