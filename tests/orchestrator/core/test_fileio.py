"""orchestrator.core.fileio: every file is written whole, and never over one it must not replace."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from orchestrator.core.fileio import write_bytes_atomic, write_json_atomic, write_text_atomic


def test_json_is_written_whole_with_a_newline_and_no_temporary_left(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "doc.json"
    write_json_atomic(target, {"a": [1, 2]})
    assert json.loads(target.read_text()) == {"a": [1, 2]}
    assert target.read_text().endswith("\n")
    write_json_atomic(target, {"b": 1}, indent=None)
    assert target.read_text() == '{"b": 1}\n'
    assert os.listdir(target.parent) == ["doc.json"]


def test_json_default_converts_what_json_cannot(tmp_path: Path) -> None:
    target = tmp_path / "doc.json"
    write_json_atomic(target, {"p": Path("/x")}, default=str)
    assert json.loads(target.read_text()) == {"p": "/x"}


def test_overwrite_false_never_replaces_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "mine.txt"
    write_text_atomic(target, "first\n", overwrite=False)
    with pytest.raises(FileExistsError):
        write_text_atomic(target, "second\n", overwrite=False, durable=True)
    assert target.read_text() == "first\n"
    assert os.listdir(tmp_path) == ["mine.txt"]
    write_text_atomic(target, "third\n")
    assert target.read_text() == "third\n"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "doc.json"
    target.write_text("old\n")
    with pytest.raises(TypeError):
        write_json_atomic(target, {"x": object()})
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["doc.json"]


def test_files_get_the_umask_mode_not_owner_only(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        write_bytes_atomic(tmp_path / "b.bin", b"\x00\x01")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == 0o644
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
