"""The token2wav stage: the tiny Qwen2.5-Omni's codes → 24 kHz audio through its two exported
graphs (DiT step, BigVGAN) and the RK4 solver loop in numpy, against transformers' own
``model.token2wav`` on the same codes, the same initial noise and the same weights, computed
in the same test (``from_pretrained`` of the checkpoint, its voice from ``spk_dict.pt``).

Tolerance: the graphs' own gate (rel L2 1e-3, cosine 0.999, the exporter's default). The
solver makes 4 DiT evaluations per interval (36 for 10 time points) and each graph call
differs from torch by ~1e-7 relative, so the waveforms agree to ~1e-6 (printed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exports import omni_tiny
from orchestrator.config import parse_config
from orchestrator.core.errors import ConfigError, StageFailed
from orchestrator.planner import plan_pipeline
from stages.base import StageRunner
from stages.registry import get_kind
from tests.helpers.omni_reference import token2wav_reference
from tests.stages.asr.test_kind import profile

pytestmark = [pytest.mark.ort, pytest.mark.slow]

GATE = {"rel_l2": 1e-3, "cosine_min": 0.999}
"""The artifacts' tolerance (the exporter's default, docs/exported-artifacts.md)."""
CODES = 75
"""Codes in the parity test: 150 mel frames, over six of the DiT's 24-frame attention blocks, 1.5 s."""


def _stage(graphs: dict[str, Path], **extra: Any) -> dict[str, Any]:
    return {
        "name": "token2wav",
        "kind": "token2wav",
        "dit": str(graphs["dit"]),
        "vocoder": str(graphs["vocoder"]),
        "devices": ["cpu"],
        "backends": ["ort-cpu"],
        "final_output": True,
        "final_output_type": "audio",
        **extra,
    }


def _runner(graphs: dict[str, Path], base: Path, **extra: Any) -> StageRunner:
    config = parse_config(
        {"name": "p", "stages": [_stage(graphs, **extra)]}, where="t.yaml", base_dir=base
    )
    plan = plan_pipeline(config, profile(), runtime=False)
    runner = get_kind("token2wav").runner(plan.stage("token2wav"), config.stage("token2wav"))
    runner.load()
    return runner


@pytest.fixture(scope="module")
def runner(
    token2wav_graphs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StageRunner]:
    r = _runner(token2wav_graphs, tmp_path_factory.mktemp("t2w"))
    yield r
    r.close()


def _codes(n: int, seed: int) -> list[int]:
    # codes and the talker's specials below its vocabulary (the DiT embeds every talker id)
    return [int(c) for c in np.random.default_rng(seed).integers(0, omni_tiny.Q25_TALKER_VOCAB, n)]


async def _items(values: list[Any]) -> AsyncIterator[Any]:
    for v in values:
        yield v


def _stream(runner: StageRunner, items: list[Any]) -> list[Any]:
    async def main() -> list[Any]:
        return [x async for x in runner.stream("r1", _items(items))]

    return asyncio.run(main())


def _close(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    assert got.shape == want.shape and float(np.abs(want).max()) > 0
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    cos = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert rel <= GATE["rel_l2"] and cos >= GATE["cosine_min"], (rel, cos)
    return rel, cos


def test_token2wav_is_a_built_in_kind_that_takes_codes_and_yields_24khz_audio(
    token2wav_graphs: dict[str, Path], tmp_path: Path
) -> None:
    kind = get_kind("token2wav")
    config = parse_config(
        {"name": "p", "stages": [_stage(token2wav_graphs)]}, where="t.yaml", base_dir=tmp_path
    )
    ports = kind.ports(config.stage("token2wav"))
    assert [str(p) for p in ports.consumes] == ["token_ids"] and [
        str(p) for p in ports.produces
    ] == ["audio@24000"]
    stage = plan_pipeline(config, profile(), runtime=False).stage("token2wav")
    assert stage.backend == "ort-cpu" and {"dit", "vocoder"} <= set(stage.engine_kwargs)
    assert {r.purpose for r in stage.reservations} >= {
        "dit_weights",
        "vocoder_weights",
        "activations",
    }


@pytest.mark.parametrize("steps", [None, 4])
def test_the_stage_matches_transformers_token2wav_on_the_same_codes_and_noise(
    token2wav_graphs: dict[str, Path], tmp_path: Path, steps: int | None
) -> None:
    codes = _codes(CODES, 1)
    runner = _runner(token2wav_graphs, tmp_path, **({"steps": steps} if steps else {}), seed=7)
    try:
        (item,) = _stream(
            runner, [[c] for c in codes]
        )  # as the talker streams them: one code an item
    finally:
        runner.close()
    want = token2wav_reference(omni_tiny.QWEN2_5_OMNI_DIR, codes, seed=7, steps=steps or 10)
    assert item["sample_rate"] == 24000 and item["audio"].dtype == np.float32
    assert len(item["audio"]) == CODES * 2 * 240  # 2 mel frames a code, 240 samples a frame
    rel, cos = _close(item["audio"], want)
    print(
        f"token2wav vs transformers, {CODES} codes, {steps or 10} time points: rel L2 {rel:.2e}, "
        f"cosine {cos:.9f}, max abs {float(np.abs(item['audio'] - want).max()):.2e}, "
        f"level (std) {float(want.std()):.3f}"
    )


def test_a_different_seed_gives_different_audio(runner: StageRunner) -> None:
    """The noise is the seed's: another seed moves the waveform far beyond the tolerance."""
    codes = np.asarray([_codes(20, 2)])
    a = runner.synthesize(codes)  # type: ignore[attr-defined]
    b = runner.synthesize(
        codes, np.random.default_rng(99).standard_normal((1, 40, 80), dtype=np.float32)
    )  # type: ignore[attr-defined]
    assert np.array_equal(a, runner.synthesize(codes))  # type: ignore[attr-defined]
    assert float(np.linalg.norm(a - b) / np.linalg.norm(a)) > 0.1


def test_a_code_outside_the_dit_vocabulary_fails_the_request_naming_it(runner: StageRunner) -> None:
    with pytest.raises(
        StageFailed, match=r"code 384 at position 2 is outside the DiT's codes \[0, 384\)"
    ):
        _stream(runner, [[1], [2], [384]])
    assert _stream(runner, []) == []  # no codes: no audio, no error


def test_a_voice_the_artifact_lacks_is_refused_naming_the_voices_it_has(
    token2wav_graphs: dict[str, Path], tmp_path: Path
) -> None:
    config = parse_config(
        {"name": "p", "stages": [_stage(token2wav_graphs, voice="Ethan")]},
        where="t.yaml",
        base_dir=tmp_path,
    )
    with pytest.raises(ConfigError) as exc:
        plan_pipeline(config, profile(), runtime=False)
    problem = exc.value.problems[0]
    assert problem.where == "stages.token2wav.voice" and "no voice 'Ethan'" in problem.what
    assert problem.fix == "use one of: Chelsie"


def test_both_graphs_pass_their_gates_on_the_cpu_ep(
    token2wav_graphs: dict[str, Path], tmp_path: Path
) -> None:
    """``omni-edge verify``'s path: one gate per graph, DiT first; the placement verified only when both passed."""
    from orchestrator.verify.run import verify_pipeline

    config = parse_config(
        {"name": "p", "stages": [_stage(token2wav_graphs)]}, where="t.yaml", base_dir=tmp_path
    )
    results = verify_pipeline(config, profile()).results
    assert [r.status for r in results] == ["passed", "passed"]
    stage = plan_pipeline(config, profile(), runtime=False).stage("token2wav")
    assert stage.verification is not None and stage.verification.status == "verified"


@pytest.mark.openvino
def test_in_the_openvino_route_each_graph_is_gated_and_a_declined_one_is_refused_by_name(
    token2wav_graphs: dict[str, Path], tmp_path: Path
) -> None:
    """Each graph through its gate in the OpenVINO route: passed, or refused by name with the
    construct OpenVINO declined and the CPU EP as the remedy — never a crash, never admitted
    unverified. Measured here (onnxruntime-openvino 1.24, its CPU plugin): both refused — the
    DiT's attention reshape ("Cannot get length of dynamic dimension") and BigVGAN's final
    squeeze ("Squeeze operation with dynamic rank"); docs/omni.md."""
    from orchestrator.verify.run import verify_pipeline
    from tests.helpers.graphs import OV_PYTHON, machine_profile

    if not OV_PYTHON.exists():
        pytest.skip("no OpenVINO route")
    config = parse_config(
        {"name": "p", "stages": [_stage(token2wav_graphs, backends=["ort-openvino"])]},
        where="t.yaml",
        base_dir=tmp_path,
    )
    prof = machine_profile()
    results = verify_pipeline(config, prof).results
    assert len(results) == 2 and {r.route for r in results} == {"openvino"}
    for r in results:
        assert r.status in ("passed", "refused"), r
        # one refusal, by name, exactly where the graph was refused (whichever this EP declines)
        declined = ["execution_provider_declined_graph"] if r.status == "refused" else []
        assert [x.code for x in r.refusals] == declined, r
        for refusal in r.refusals:
            assert "OpenVINOExecutionProvider could not build a session" in refusal.message
            assert "ort-cpu" in refusal.remedy
        print(f"{r.record['key']['artifact']}: {r.status}" if r.record else r.status)
    stage = plan_pipeline(config, prof, runtime=False).stage("token2wav")
    refused = any(r.status == "refused" for r in results)
    # a stage with a refused graph is refused for it; one whose graphs all passed is verified
    assert (stage.device is None) is refused, stage
    assert {x.code for x in stage.refusals} == (
        {"execution_provider_declined_graph"} if refused else set()
    )
    verified = stage.verification is not None and stage.verification.status == "verified"
    assert verified is not refused, stage.verification
