"""Where an exported artifact goes: ``-o`` checked before any work, the directory it is
built in, and its durable rename into place.

* :func:`target_problem`: ``-o`` is free — or, with ``--force``, a directory that holds
  an artifact's manifest (or nothing). ``--force`` replaces an earlier artifact, never anything else:
  a directory without a manifest (a project, a thesis) is refused, named, exit 2 (as pip
  and uv refuse to install over a directory that is no package). Checked before any work
  and again just before the rename, since an export takes minutes.
* :func:`work_directory`: the artifact is built in ``.NAME.<pid>.<hex>.export`` beside
  the target, held locked while it is built; what an export that was killed left there is
  removed by the next export to that target (``fileio.remove_orphans``).
* :func:`move_into_place`: every file and directory of the artifact is fsynced, then it
  is renamed over the target (an old artifact first moved aside to
  ``.NAME.replaced-<hex>``, removed once the new one is in place: a crash between the two
  renames leaves it there, whole), and the parent directory is fsynced.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from orchestrator.core.errors import ConfigError, Problem
from orchestrator.core.fileio import fsync_directory, fsync_tree, remove_orphans, temp_name
from orchestrator.core.validation import read_document
from stages.exported_graph.artifact import EXPORT_FORMAT, MANIFEST_NAME

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

FORMAT_PREFIX = EXPORT_FORMAT.rpartition("/")[0] + "/"
SHOWN = 4
"""Entries of a refused directory named in the error (the rest are counted)."""


def is_artifact(directory: Path) -> bool:
    """Whether ``directory`` holds an exported artifact's manifest: a ``manifest.yaml``
    that is a mapping whose ``format`` is an ``omni-edge.export`` one (or absent, as in a
    hand-written manifest) — what ``--force`` may replace."""
    manifest = directory / MANIFEST_NAME
    if not manifest.is_file():
        return False
    try:
        doc = read_document(manifest)
    except (ConfigError, OSError):
        return False
    fmt = doc.get("format") if isinstance(doc, dict) else None
    return isinstance(doc, dict) and (fmt is None or str(fmt).startswith(FORMAT_PREFIX))


def target_problem(out: Path, force: bool) -> Problem | None:
    """Why the artifact cannot go to ``out`` (None: it can): it exists without ``--force``,
    or it exists and is not an earlier artifact (``--force`` would lose it whole)."""
    if not out.exists():
        return None
    if not force:
        return Problem(
            f"-o {out}",
            "it exists",
            "choose another directory, or pass --force to replace it "
            "(only once the new artifact is complete and validated)",
        )
    if not out.is_dir():
        return None  # said by the caller: a file, not an artifact directory
    if is_artifact(out) or not any(out.iterdir()):
        return None  # an earlier artifact, or an empty directory: nothing else is lost
    return Problem(
        f"-o {out}",
        f"it holds no exported artifact ({MANIFEST_NAME} is missing or not an artifact's), "
        f"and --force replaces only an earlier artifact: {_held(out)} would be lost",
        "choose another directory, or remove this one yourself if nothing in it is wanted",
    )


def _held(directory: Path) -> str:
    """What ``directory`` holds, for an error: its first entries by name, then a count."""
    try:
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
    except OSError as exc:
        return f"what it holds ({exc.strerror or exc})"
    shown = ", ".join(names[:SHOWN])
    return f"{shown}{f' and {len(names) - SHOWN} more' if len(names) > SHOWN else ''}"


@contextlib.contextmanager
def work_directory(out: Path) -> Iterator[Path]:
    """A fresh directory to build the artifact for ``out`` in, beside it (so the final rename
    stays on one file system), locked while the block runs; removed when the block fails.
    First removes what killed exports to ``out`` left."""
    parent = out.parent
    remove_orphans(parent, name=out.name)
    work = temp_name(out, "export")
    work.mkdir(mode=0o700)
    fd = os.open(work, os.O_RDONLY)
    try:
        if fcntl is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        os.close(fd)


def move_into_place(work: Path, target: Path, *, force: bool) -> None:
    """Rename the built artifact ``work`` to ``target``, durably: see the module docstring.
    ``ConfigError`` when ``target`` appeared meanwhile (without ``--force``) or is no
    longer an artifact (with it)."""
    problem = target_problem(target, force)
    if problem is None and target.exists() and not target.is_dir():
        problem = Problem(
            f"-o {target}", "it is a file, not an artifact directory", "choose a directory path"
        )
    if problem is not None:
        if problem.what == "it exists":
            problem = Problem(problem.where, "it appeared while exporting", problem.fix)
        raise ConfigError([problem])
    fsync_tree(work)
    if target.exists():
        old = target.with_name(f".{target.name}.replaced-{secrets.token_hex(4)}")
        target.rename(old)
        work.rename(target)
        fsync_directory(target.parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        work.rename(target)
    fsync_directory(target.parent)
