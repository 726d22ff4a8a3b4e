"""The one place the CLI's rich consoles are made.

Every command prints through :func:`make_console`, so they agree on:

* **width** — ``COLUMNS`` when it is set (to a positive integer), else the
  size of the terminal the output goes to, else :data:`WIDTH_WHEN_PIPED`.
  A pipe or a file gets a fixed 80 columns rather than the width of whatever
  terminal the command happened to start from: ``omni-edge plan > plan.txt``
  then reads the same on every machine, in a mail or in a CI log, and the
  tables are designed to fit 80 columns anyway. ``COLUMNS=200 omni-edge plan
  | less -S`` asks for the wide layout explicitly.
* **colour** — styles (and any other escape sequence) only when the stream is
  a terminal; rich also honours ``NO_COLOR`` (no colours, bold/dim kept) and
  ``FORCE_COLOR``.
* **no trailing blanks** off a terminal — rich pads every table cell to its
  column's width; in a file or a pipe those blanks are noise (diffs, logs),
  so they are trimmed there.
* **no guessing** — no automatic highlighting of numbers and quotes (the
  tables colour what matters themselves) and no ``:emoji:`` codes, which a
  note or a path could contain by accident.

``--json`` outputs never go through a console: they are written with
``json.dump`` so their bytes do not depend on the terminal.

Text that comes from a model or a server (a reply, an error message, a model
id) is written through :func:`terminal_text` — its control characters, except
newline and tab, removed, so an escape sequence in a reply (OSC 52 sets the
clipboard, others retitle the window or rewrite what was shown) never reaches
the terminal — and, where it goes through a console, with its rich markup
escaped (:func:`plain`), so ``[red]`` or ``[/]`` in it is printed, not obeyed.
The exact text stays in ``--json`` outputs and run records.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TextIO

from rich.console import Console
from rich.markup import escape

from orchestrator.core.errors import terminal_text

WIDTH_WHEN_PIPED = 80
"""Columns when the output is not a terminal and ``COLUMNS`` is unset."""


def plain(text: object) -> str:
    """``text`` (a model's, a server's, an error's) for ``Console.print`` inside markup:
    control characters removed and rich markup escaped."""
    return escape(terminal_text(str(text)))


def _columns_from_env() -> int | None:
    value = os.environ.get("COLUMNS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return None


def output_width(stream: TextIO) -> int:
    """Columns to lay out for ``stream`` (see the module docstring for the order)."""
    columns = _columns_from_env()
    if columns is not None:
        return columns
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns or WIDTH_WHEN_PIPED
    except (AttributeError, ValueError, OSError):
        # A replaced stream (pytest's capture, io.StringIO) has no descriptor.
        pass
    return WIDTH_WHEN_PIPED


class _TrimmedLines:
    """Standard output (or error) with the blanks before each newline removed.

    The stream is looked up at each write, like rich does for its own
    default, so a console made before ``sys.stdout`` is replaced (pytest's
    capture) writes to the new one.
    """

    _TRAILING = re.compile(r"[ \t]+(?=\n)")

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr

    @property
    def _stream(self) -> TextIO:
        return sys.stderr if self._stderr else sys.stdout

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        return self._stream.write(self._TRAILING.sub("", text))

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def make_console(*, stderr: bool = False, width: int | None = None) -> Console:
    """A console for standard output (or standard error) with the CLI's rules.

    The stream itself is looked up by rich at each print, so a console made
    before ``sys.stdout`` is replaced (tests) still writes to the new one; the
    width is decided here, once.
    """
    stream = sys.stderr if stderr else sys.stdout
    return Console(
        stderr=stderr,
        # On a terminal rich writes to the stream itself: live displays
        # (progress bars) redraw lines and rely on their padding.
        file=None if _is_terminal(stream) else _TrimmedLines(stderr),  # type: ignore[arg-type]
        width=width or output_width(stream),
        highlight=False,
        emoji=False,
    )
