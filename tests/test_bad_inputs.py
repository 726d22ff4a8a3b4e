"""Bad input never gets past the door: exit 2, one readable error, nothing written.

Every case builds the file it needs, runs the CLI in-process
(``orchestrator.cli.main``) and asserts what the user reads: exit code 2, the
file and the place named, a ``how to fix`` line, no traceback, and the
``--out`` file never created.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.fileio import check_writable
from orchestrator.units import GiB
from tests.conftest import llama_config, write_checkpoint

PROFILE: dict[str, Any] = {
    "format": "omni-edge.profile/1", "name": "bad-input box",
    "host": {"os": "linux", "ram_total_bytes": 32 * GiB, "ram_available_bytes": 16 * GiB},
    "devices": [{"id": "cpu", "kind": "cpu", "name": "cpu", "backends": ["vllm-cpu", "ort-cpu"]}],
}


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path) -> Path:
    return private_cache


def good_inputs(tmp_path: Path, *, config: dict[str, Any] | None = None, max_model_len: int = 1024) -> tuple[Path, Path]:
    """A config and a profile that plan with exit 0; each case breaks one thing."""
    ckpt = write_checkpoint(tmp_path / "m", config or llama_config(), {"w": ("BF16", [64, 64])})
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "name: bad-inputs\nstages:\n"
        f"  - {{name: thinker, kind: ar_decode, model: {ckpt}, devices: [cpu], max_model_len: {max_model_len}, final_output: true}}\n"
    )
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    return cfg, prof


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *mentions: str, out: Path | None = None) -> str:
    """Run the CLI; assert exit 2, a where → what → fix error naming ``mentions``, no traceback,
    and ``out`` (when given) not written. Returns stderr."""
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2, f"exit {code}\nstdout: {captured.out}\nstderr: {err}"
    assert err.startswith("error: "), err
    assert "Traceback" not in err + captured.out
    assert "how to fix:" in err, err
    for m in mentions:
        assert m in err, f"{m!r} not in:\n{err}"
    if out is not None:
        assert not out.exists(), f"{out} was written"
    return err


def test_good_inputs_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, prof = good_inputs(tmp_path)
    assert main(["plan", str(cfg), "--profile", str(prof), "--out", str(tmp_path / "plan.json")]) == 0
    assert (tmp_path / "plan.json").exists()


# ---- where the result goes: checked before any work -----------------------------


@pytest.mark.parametrize("where", ["missing-dir/plan.json", "/proc/plan.json", "DIR", "FILE/plan.json"])
def test_plan_out_that_cannot_be_written_is_refused_before_planning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    cfg, prof = good_inputs(tmp_path)
    (tmp_path / "FILE").write_text("x")
    out = Path(where.replace("DIR", str(tmp_path)).replace("FILE", str(tmp_path / "FILE")))
    if not out.is_absolute():
        out = tmp_path / out
    before = sorted(p.name for p in tmp_path.iterdir())
    # the config is broken too: the --out check comes first, before any work
    cfg.write_text("name: [")
    err = refused(capsys, ["plan", str(cfg), "--profile", str(prof), "--out", str(out)], "--out", str(out))
    assert "YAML" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("where", ["missing-dir/p.json", "/proc/p.json", "DIR"])
def test_probe_save_that_cannot_be_written_is_refused_before_probing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    import orchestrator.probe as probe

    def no_probe(*a: object, **k: object) -> None:
        raise AssertionError("probed before the --save path was checked")

    monkeypatch.setattr(probe, "probe_profile", no_probe)
    out = Path(where.replace("DIR", str(tmp_path)))
    if not out.is_absolute():
        out = tmp_path / out
    refused(capsys, ["probe", "--save", str(out), "--force"], "--save", str(out))
    assert list(tmp_path.iterdir()) == []


def test_check_writable_leaves_nothing_behind_and_accepts_a_new_file(tmp_path: Path) -> None:
    check_writable(tmp_path / "new.json", what="--out")
    (tmp_path / "old.json").write_text("{}")
    check_writable(tmp_path / "old.json", what="--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


def test_check_writable_names_a_read_only_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # root writes anywhere, so the directory's refusal is simulated at os.open
    import errno
    import os

    real_open = os.open

    def read_only(path: Any, flags: int, mode: int = 0o777) -> int:
        if Path(path).parent == tmp_path / "ro":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, mode)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(ConfigError) as exc:
        check_writable(tmp_path / "ro" / "plan.json", what="--out")
    text = str(exc.value)
    assert "--out" in text and "Permission denied" in text and "how to fix" in text
