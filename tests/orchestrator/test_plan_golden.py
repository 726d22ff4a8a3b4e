"""`omni-edge plan --json` for every shipped config against every recorded profile,
compared with committed output (tests/orchestrator/golden_plans/).

The plan JSON is a contract (omni-edge.plan/1): a change of code layout must not
change it. Machine-specific paths are normalised (<repo>, <site-packages>), and
planning starts from an empty evidence cache so the result does not depend on
what was verified on this machine before.

After an intended change of the plan, regenerate and review the diff:

    python -m tests.orchestrator.test_plan_golden
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sysconfig
import tempfile
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.helpers import REPO

GOLDEN = Path(__file__).parent / "golden_plans"
GENERATED_GRAPHS = {
    "asr-only.yaml",
    "voice-chat.yaml",
    "voice-and-embed.yaml",
    "voice-on-npu.yaml",
    "qwen2_5-omni-tiny.yaml",
    "qwen3-omni-tiny.yaml",
}
"""Configs whose graphs are generated on the machine (python -m exports.whisper_asr build,
python -m exports.sentence_encoder build, python -m exports.piper_voice build), so their
digests are no committed fact (the int8 voice's quantization scales come from this CPU's
arithmetic): tests/stages/asr/test_kind.py, tests/test_voice_and_embed_example.py and
tests/test_voice_on_npu_example.py plan them instead. The tiny Omni checkpoints
(python -m exports.omni_tiny build) are made at set-up too: tests/stages/ar_decode/
test_transformers_backend.py plans them."""
CONFIGS = sorted(
    [
        REPO / "configs/voice-assistant.yaml",
        *(c for c in (REPO / "configs/examples").glob("*.yaml") if c.name not in GENERATED_GRAPHS),
    ]
)
PROFILES = sorted((REPO / "configs/profiles").glob("*.json"))
CLUSTERS = sorted((REPO / "configs/profiles/clusters").glob("*.json"))
"""Cluster profiles (omni-edge.cluster/1): the default pipeline only, goldens in golden_plans/clusters/."""
CASES = [(c, p) for c in CONFIGS for p in PROFILES] + [
    (REPO / "configs/voice-assistant.yaml", p) for p in CLUSTERS
]


def golden_name(config: Path, profile: Path) -> str:
    sub = "clusters/" if profile.parent.name == "clusters" else ""
    return f"{sub}{config.stem}@{profile.stem}.json"


def normalise(text: str) -> str:
    site = sysconfig.get_paths()["purelib"]
    cache = os.environ["OMNI_EDGE_CACHE_DIR"]
    # A venv reached through a symlink (a git worktree sharing one) reports the link's path;
    # artifacts resolve to the target's. Both spellings are the same site-packages.
    for spelling in sorted({site, os.path.realpath(site)}, key=len, reverse=True):
        text = text.replace(spelling, "<site-packages>")
    return text.replace(cache, "<cache>").replace(str(REPO), "<repo>")


def plan_json(config: Path, profile: Path) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", str(config), "--profile", str(profile), "--json"])
    return code, normalise(out.getvalue())


@pytest.fixture(autouse=True)
def empty_evidence_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize(
    ("config", "profile"), CASES, ids=[golden_name(c, p)[:-5] for c, p in CASES]
)
def test_plan_json_is_unchanged(config: Path, profile: Path) -> None:
    code, text = plan_json(config, profile)
    expected = json.loads((GOLDEN / golden_name(config, profile)).read_text())
    assert code == expected["exit_code"]
    assert json.loads(text) == expected["plan"]


def regenerate() -> None:
    with tempfile.TemporaryDirectory() as cache:
        os.environ["OMNI_EDGE_CACHE_DIR"] = cache
        GOLDEN.mkdir(exist_ok=True)
        for config, profile in CASES:
            code, text = plan_json(config, profile)
            doc = {"exit_code": code, "plan": json.loads(text)}
            (GOLDEN / golden_name(config, profile)).parent.mkdir(exist_ok=True)
            (GOLDEN / golden_name(config, profile)).write_text(
                json.dumps(doc, indent=1, sort_keys=True) + "\n"
            )
            print(golden_name(config, profile), "exit", code)


if __name__ == "__main__":
    regenerate()
