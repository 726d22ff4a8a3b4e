"""What `plan`, `probe` and `verify` print at 80 columns: nothing wider, nothing cut.

Every shipped config is planned against every recorded profile (and, where it
can be, this machine), printed through the CLI at ``COLUMNS=80`` and at
``COLUMNS=1000`` (where nothing needs to wrap), and the two screens compared:

* no line of the 80-column screen is wider than 80;
* every identifier of the data (stage, kind, device, backend, pool, purpose,
  refusal code, route, provider) appears whole on some line;
* every word of the 80-column screen is a word of the 1000-column one: a word
  broken by a newline ("materiali" / "zed", "ort-o" / "penvi" / "no") leaves
  fragments that are not. Only a token too long for any 80-column line (a
  site-packages path) may fold, and its pieces must be pieces of it.

Nothing here starts Ray, vLLM or an ONNX Runtime session: plan and probe read
metadata, and the verify screen is rendered from report objects.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len

from orchestrator.cli import build_parser, main
from orchestrator.core.console import WIDTH_WHEN_PIPED, make_console, output_width
from orchestrator.core.plan import PipelinePlan, Refusal, Verification
from tests.helpers import REPO
from tests.helpers.generated import int8_voice_skip

NARROW = 80
REFERENCE = 1000
CONFIGS = sorted(
    [REPO / "configs/voice-assistant.yaml", *(REPO / "configs/examples").glob("*.yaml")]
)
PROFILES = sorted((REPO / "configs/profiles").glob("*.json"))
NEEDS_INT8_VOICE = REPO / "configs/examples/voice-on-npu.yaml"
INT8_VOICE_SKIP = int8_voice_skip()
CASES = [
    pytest.param(
        c,
        p,
        id=f"{c.stem}@{p.stem}",
        marks=[pytest.mark.skip(reason=INT8_VOICE_SKIP)]
        if c == NEEDS_INT8_VOICE and INT8_VOICE_SKIP
        else [],
    )
    for c in CONFIGS
    for p in PROFILES
]
"""Every config on every profile; the one that needs the int8 voice skips (counted, by its
class) where the voice was not built here (tests/helpers/generated.py)."""
MARKER = re.compile(r"\[\d+\]")
EDGE_PUNCTUATION = ",;:.()[]'\"`"


@pytest.fixture(autouse=True)
def empty_evidence_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The screens must not depend on what was verified on this machine before.
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))


def cli(
    args: list[str],
    columns: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    code = main(args)
    out = capsys.readouterr().out
    assert code in (0, 3), out
    return out


def printed(renderable: Any, columns: int, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    make_console(width=columns).print(renderable)
    return capsys.readouterr().out


def words(text: str) -> set[str]:
    out = set()
    for word in text.split():
        if MARKER.fullmatch(word):
            continue
        word = word.strip(EDGE_PUNCTUATION)
        if word:
            out.add(word)
    return out


def assert_reads_whole(
    narrow: str, reference: str, identifiers: Iterable[str], width: int = NARROW
) -> None:
    lines = narrow.splitlines()
    too_wide = [line for line in lines if cell_len(line) > width]
    assert not too_wide, "\n".join(too_wide)
    assert "\x1b" not in narrow, "escape codes in output that is not a terminal"

    missing = sorted({i for i in identifiers if i and i not in narrow})
    assert not missing, f"identifiers not whole on any line: {missing}\n{narrow}"

    vocabulary = words(reference)
    unfittable = [w for w in vocabulary if len(w) > width - 8]
    strays = sorted(
        w for w in words(narrow) - vocabulary if not any(w in long for long in unfittable)
    )
    assert not strays, f"words broken across lines: {strays}\n{narrow}"


def plan_identifiers(plan: PipelinePlan) -> set[str]:
    ids = {plan.pipeline}
    for s in plan.stages:
        ids |= {s.name, s.kind, s.device or "", s.backend or ""}
        ids |= {r.pool for r in s.reservations} | {r.purpose for r in s.reservations}
        ids |= {r.code for r in s.refusals} | {r.device for r in s.refusals}
    ids |= {p.id for p in plan.pools}
    ids |= {r.purpose for r in plan.shared_reservations}
    return ids


def plan_of(config: Path, profile: Path) -> PipelinePlan:
    from orchestrator.config import load_config
    from orchestrator.core.profile import load_profile
    from orchestrator.planner import plan_pipeline

    return plan_pipeline(load_config(config), load_profile(profile))


# ---- plan --------------------------------------------------------------------------


@pytest.mark.parametrize(("config", "profile"), CASES)
def test_plan_screen_fits_80_columns(
    config: Path, profile: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", str(config), "--profile", str(profile)]
    narrow = cli(args, NARROW, monkeypatch, capsys)
    reference = cli(args, REFERENCE, monkeypatch, capsys)
    assert_reads_whole(narrow, reference, plan_identifiers(plan_of(config, profile)))


def test_plan_screen_keeps_codes_numbers_and_remedies(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 80-column layout moves text around; it must not drop any of it."""
    config, profile = (
        REPO / "configs/examples/qwen2_5-omni-3b.yaml",
        REPO / "configs/profiles/strix-point-rtx5090-wsl.json",
    )
    plan = plan_of(config, profile)
    out = cli(["plan", str(config), "--profile", str(profile)], NARROW, monkeypatch, capsys)
    flat = " ".join(out.split())
    for s in plan.stages:
        for r in s.reservations:
            assert " ".join(r.note.split()) in flat
        for refusal in s.refusals:
            assert f"[{refusal.code}] {s.name} on {refusal.device}" in flat
            assert " ".join(refusal.message.split()) in flat
            assert "remedy: " + " ".join(refusal.remedy.split()) in flat
    # engine arguments as key=value lines, not a Python repr
    assert "    kv_cache_memory_bytes=301989888" in out.splitlines()
    assert "{'" not in out and "['" not in out
    assert "session.providers=CPUExecutionProvider" in out


def test_refused_plans_fit_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = REPO / "configs/voice-assistant.yaml"
    tiny = json.loads((REPO / "configs/profiles/cpu-only-linux.json").read_text())
    tiny["host"]["ram_available_bytes"] = 2**31  # 2 GiB: the thinker's budget does not fit
    tiny_profile = tmp_path / "tiny.json"
    tiny_profile.write_text(json.dumps(tiny))
    cpu_profile = REPO / "configs/profiles/cpu-only-linux.json"
    for args, code in (
        (["plan", str(config), "--profile", str(tiny_profile)], None),
        (
            ["plan", str(config), "--profile", str(cpu_profile), "--mask", "cpu"],
            "no_runnable_device",
        ),
    ):
        narrow = cli(args, NARROW, monkeypatch, capsys)
        reference = cli(args, REFERENCE, monkeypatch, capsys)
        assert "REFUSED" in narrow
        from orchestrator.config import load_config
        from orchestrator.core.profile import load_profile
        from orchestrator.planner import parse_mask, plan_pipeline

        plan = plan_pipeline(load_config(config), load_profile(args[3]), mask=parse_mask(args[5:]))
        assert not plan.admitted and plan.refusal_codes
        assert code is None or code in plan.refusal_codes
        assert_reads_whole(narrow, reference, plan_identifiers(plan))


def test_verified_stage_and_a_long_stage_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Evidence moves to a footnote at 80 columns; a name too long for the
    table makes it fall back to one block per stage rather than cut anything."""
    from orchestrator.commands.render import plan_table

    plan = plan_of(
        REPO / "configs/voice-assistant.yaml", REPO / "configs/profiles/cpu-only-linux.json"
    )
    voice = dataclasses.replace(
        plan.stage("voice"), verification=Verification("verified", "M vm 2026-11-30T11:32")
    )
    long_name = "a_rather_long_stage_name_for_the_voice"
    renamed = dataclasses.replace(voice, name=long_name)
    for stages, name in (
        ((plan.stage("thinker"), voice), "voice"),
        ((plan.stage("thinker"), renamed), long_name),
    ):
        edited = dataclasses.replace(plan, stages=stages)
        narrow = printed(plan_table(edited), NARROW, capsys)
        reference = printed(plan_table(edited), REFERENCE, capsys)
        assert_reads_whole(narrow, reference, plan_identifiers(edited))
        assert f"{name}: verified (M vm 2026-11-30T11:32)" in " ".join(narrow.split())
    assert "verified (M vm 2026-11-30T11:32)" in reference


def test_plan_on_this_machine_fits_80_columns(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.commands.render import plan_table
    from orchestrator.config import load_config
    from orchestrator.planner import plan_pipeline
    from orchestrator.probe import probe_profile

    # One probe, rendered twice: the free RAM changes between two probes.
    plan = plan_pipeline(
        load_config(REPO / "configs/voice-assistant.yaml"), probe_profile(cached_routes=True)
    )
    narrow = printed(plan_table(plan), NARROW, capsys)
    assert_reads_whole(narrow, printed(plan_table(plan), REFERENCE, capsys), plan_identifiers(plan))


# ---- probe -------------------------------------------------------------------------


def profile_identifiers(profile: Any) -> set[str]:
    ids = {d.id for d in profile.devices} | {b for d in profile.devices for b in d.backends}
    ids |= {r.name for r in profile.routes} | {r.kind for r in profile.routes}
    ids |= {p for r in profile.routes for p in (r.providers or [])}
    return ids


@pytest.mark.parametrize("profile", PROFILES, ids=[p.stem for p in PROFILES])
def test_profile_screen_fits_80_columns(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.commands.probe import pools_of, profile_view
    from orchestrator.core.profile import load_profile

    p = load_profile(profile)
    narrow = printed(profile_view(p), NARROW, capsys)
    reference = printed(profile_view(p), REFERENCE, capsys)
    assert_reads_whole(narrow, reference, profile_identifiers(p) | {row.id for row in pools_of(p)})
    flat = " ".join(narrow.split())
    for route in p.routes:
        if route.remedy:
            assert "remedy: " + " ".join(route.remedy.split()) in flat


def test_probe_of_this_machine_fits_80_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.commands.probe import profile_view
    from orchestrator.probe import probe_profile

    p = probe_profile(cached_routes=True)
    narrow = printed(profile_view(p), NARROW, capsys)
    assert_reads_whole(narrow, printed(profile_view(p), REFERENCE, capsys), profile_identifiers(p))
    # and the command itself, with COLUMNS
    out = cli(["probe"], NARROW, monkeypatch, capsys)
    assert max(cell_len(line) for line in out.splitlines()) <= NARROW


# ---- verify ------------------------------------------------------------------------


def _result(status: str, backend: str, **kw: Any) -> Any:
    from orchestrator.verify.placement import PlacementResult

    return PlacementResult(
        stage="voice",
        device=kw.pop("device", "cpu"),
        backend=backend,
        route="this-process",
        precision="fp32",
        status=status,
        **kw,
    )


def _record(taken: int, total: int, fallback: dict[str, int], rel: float) -> dict[str, Any]:
    return {
        "coverage": {
            "taken": taken,
            "total": total,
            "fraction": taken / total,
            "partitions": 1,
            "fallback_op_types": fallback,
        },
        "numeric": {"outputs": {"audio": {"rel_l2": rel, "max_abs": rel * 3, "cosine": 1 - rel}}},
    }


def verify_report() -> Any:
    from orchestrator.verify.run import VerifyReport

    declined = Refusal(
        "execution_provider_declined_graph",
        "cpu",
        "OpenVINOExecutionProvider took 0 of 2685 nodes (0.0%) in 0 partition(s) of piper-en-us-joe-medium [fp32] "
        "on cpu; the minimum is 50%. Left to the CPU EP: ConvTranspose×12, LeakyRelu×40",
        "this refuses piper-en-us-joe-medium at fp32 on OpenVINOExecutionProvider only; place the stage on "
        "another backend or device (e.g. the CPU EP, ort-cpu)",
    )
    unreachable = Refusal(
        "device_unreachable_from_this_process",
        "npu:0",
        "route 'wsl-no-npu' offers CPUExecutionProvider, not VitisAIExecutionProvider",
        "pip install onnxruntime-vitisai in a Windows-side Python and pass it with --route",
    )
    numeric = Refusal(
        "numeric_gate_failed",
        "igpu:0",
        "rel L2 3.1e-01 > tolerance 1.0e-02 on output audio",
        "export the graph at fp32 or loosen the manifest's tolerance",
    )
    return VerifyReport(
        pipeline="voice-assistant",
        profile="vm",
        results=[
            _result(
                "passed",
                "ort-openvino",
                cached=True,
                record={**_record(2685, 2685, {}, 3.4e-5), "suspicious": False},
            ),
            _result(
                "passed",
                "ort-cpu",
                verify_s=1.4,
                record={**_record(2681, 2681, {}, 0.0), "suspicious": True},
                warnings=[
                    "outputs are bit-identical to the CPU EP's while OpenVINOExecutionProvider claims nodes"
                ],
            ),
            _result(
                "refused",
                "ort-openvino",
                refusals=[declined],
                record=_record(
                    0,
                    2685,
                    {"ConvTranspose": 12, "LeakyRelu": 40, "Conv": 30, "Add": 9, "Mul": 4},
                    0.0,
                ),
            ),
            _result("refused", "ort-vitisai", device="npu:0", refusals=[unreachable]),
            _result(
                "refused",
                "ort-dml",
                device="igpu:0",
                refusals=[numeric],
                record=_record(2685, 2685, {}, 0.31),
            ),
            _result(
                "error",
                "ort-qnn",
                device="npu:0",
                error="the artifact does not load on the CPU EP: INVALID_GRAPH",
            ),
        ],
        skipped=[{"stage": "voice", "device": "gpu:0", "why": "excluded by --mask"}],
        evidence_dir="/root/.cache/omni-edge/evidence",
    )


def test_verify_screen_fits_80_columns(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.commands.verify import report_view

    report = verify_report()
    summary = {
        "admitted": True,
        "stages": {
            "thinker": {"device": "cpu", "backend": "vllm-cpu", "verification": None},
            "voice": {"device": "cpu", "backend": "ort-cpu", "verification": "verified"},
        },
    }
    narrow = printed(report_view(report, summary), NARROW, capsys)
    reference = printed(report_view(report, summary), REFERENCE, capsys)
    codes = {r.code for result in report.results for r in result.refusals}
    backends = {r.backend for r in report.results}
    assert_reads_whole(
        narrow,
        reference,
        codes | backends | {"npu:0", "igpu:0", "ConvTranspose×12,", "pass (cached)"},
    )
    flat = " ".join(narrow.split())
    for n, result in enumerate(report.results, 1):
        for refusal in result.refusals:
            assert (
                f"[{refusal.code}] #{n} {result.stage} · {result.device} · {result.backend} [fp32]"
                in flat
            )
            assert " ".join(refusal.remedy.split()) in flat
    assert "3.4e-05" in narrow and "2685/2685 100%" in narrow and "pass, SUSPICIOUS" in narrow


# ---- run (its tables and the streamed reply; nothing started) ------------------------


RUN_ROWS = [
    {
        "stage": "thinker",
        "device": "cpu",
        "backend": "vllm-cpu",
        "time_to_first_output_s": 0.074,
        "throughput": {"value": 26.54, "unit": "tok/s"},
        "budget_bytes": 1610612736,
        "measured_peak_bytes": 1320000000,
        "budget_over_measured": 1.22,
        "within_budget": True,
    },
    {
        "stage": "voice",
        "device": "cpu",
        "backend": "ort-openvino",
        "time_to_first_output_s": 0.347,
        "throughput": {"value": 5.05, "unit": "audio s/s"},
        "budget_bytes": 796000000,
        "measured_peak_bytes": 900000000,
        "budget_over_measured": 0.88,
        "within_budget": False,
    },
]


def test_run_screens_fit_80_columns(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.commands.run import print_stage_table, print_summary

    plan = plan_of(
        REPO / "configs/voice-assistant.yaml",
        REPO / "configs/profiles/strix-point-rtx5090-wsl.json",
    )
    screens = []
    for width in (NARROW, REFERENCE):
        console = make_console(width=width)
        print_summary(plan, console)
        print_stage_table(RUN_ROWS, console)
        screens.append(capsys.readouterr().out)
    narrow, reference = screens
    assert_reads_whole(
        narrow,
        reference,
        {
            "thinker",
            "voice",
            "vllm-cpu",
            "ort-openvino",
            "26.54 tok/s",
            "5.05 audio s/s",
            "0.88 OVER",
        },
    )
    # the figures stay in tables at 80 columns (not the one-block-per-row fallback)
    assert any(
        line.split() == ["thinker", "1.50", "GiB", "1.23", "GiB", "1.22"]
        for line in narrow.splitlines()
    )


def test_the_streamed_reply_wraps_between_words() -> None:
    import io

    from orchestrator.commands.common import WordWrap

    reply = (
        "The Moon is about 384,400 km away from Earth, and it always shows the same face to us because "
        "its rotation is tidally locked.\nIt orbits every 27.3 days."
    )
    for width in (20, 33, 80):
        out = io.StringIO()
        wrap = WordWrap(out, width)
        for i in range(0, len(reply), 3):  # tokens that end inside words
            wrap.write(reply[i : i + 3])
        wrap.close()
        lines = out.getvalue().splitlines()
        assert all(len(line) <= width for line in lines), lines
        assert out.getvalue().split() == reply.split()
        assert "It orbits every" in out.getvalue().replace("\n", " ")


# ---- the console itself ------------------------------------------------------------


def test_console_width_follows_columns_then_the_terminal_then_80(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "132")
    assert make_console().width == 132 and make_console(stderr=True).width == 132
    for bad in ("", "0", "wide", "-5"):
        monkeypatch.setenv("COLUMNS", bad)
        assert output_width(sys.stdout) == WIDTH_WHEN_PIPED  # captured: not a terminal
    monkeypatch.delenv("COLUMNS")
    assert make_console().width == WIDTH_WHEN_PIPED == 80
    assert make_console(width=100).width == 100


def run_cli(*args: str, columns: str | None = None) -> subprocess.CompletedProcess[str]:
    import os

    env = {
        k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")
    }
    if columns:
        env["COLUMNS"] = columns
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )


def test_piped_output_is_plain_and_80_wide_unless_columns_says_otherwise(tmp_path: Path) -> None:
    args = (
        "plan",
        "configs/examples/qwen2_5-omni-3b.yaml",
        "--profile",
        "configs/profiles/strix-point-rtx5090-wsl.json",
    )
    piped = run_cli(*args)
    assert piped.returncode == 0, piped.stderr
    assert "\x1b" not in piped.stdout
    assert max(cell_len(line) for line in piped.stdout.splitlines()) == 80
    assert not [line for line in piped.stdout.splitlines() if line != line.rstrip()], (
        "trailing blanks in a pipe"
    )
    wide = run_cli(*args, columns="200")
    assert max(cell_len(line) for line in wide.stdout.splitlines()) > 120
    assert max(cell_len(line) for line in wide.stdout.splitlines()) <= 200


def test_json_output_does_not_depend_on_the_width(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "plan",
        str(REPO / "configs/voice-assistant.yaml"),
        "--profile",
        str(REPO / "configs/profiles/strix-point-rtx5090-wsl.json"),
        "--json",
    ]
    assert cli(args, 40, monkeypatch, capsys) == cli(args, REFERENCE, monkeypatch, capsys)


# ---- -v after the subcommand -------------------------------------------------------


def test_verbose_is_accepted_before_and_after_the_subcommand() -> None:
    parser = build_parser()
    for argv, level in (
        (["plan", "-v", "c.yaml"], 1),
        (["plan", "c.yaml", "-vv"], 2),
        (["-v", "plan", "-v", "c.yaml"], 2),
        (["-vv", "probe"], 2),
        (["verify", "--verbose", "c.yaml"], 1),
        (["run", "c.yaml", "--prompt", "x"], 0),
    ):
        args = parser.parse_args(argv)
        assert args.verbose + args.verbose_after == level, argv


def test_verbose_after_the_subcommand_sets_the_log_level() -> None:
    for flags, level in (([], "WARNING"), (["-v"], "INFO"), (["-vv"], "DEBUG")):
        code = (
            "import logging, sys; from orchestrator.cli import main;"
            f"rc = main(['plan', *{flags!r}, 'configs/voice-assistant.yaml', '--profile', 'configs/profiles/cpu-only-linux.json', '--json']);"
            "print('LEVEL', logging.getLevelName(logging.getLogger().level), file=sys.stderr); sys.exit(rc)"
        )
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
        assert run.returncode == 0, run.stderr
        assert f"LEVEL {level}" in run.stderr
        assert json.loads(run.stdout)["format"] == "omni-edge.plan/1"
