"""The progress a pipeline shows on stderr while it prepares weights and starts: a live
table of the stages on a terminal (80 columns), plain lines elsewhere. The library draws
nothing (``api.StartProgress`` is a protocol); the commands hand it :class:`TerminalProgress`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

from rich.text import Text

from orchestrator.core.console import make_console

if TYPE_CHECKING:
    from orchestrator.runtime.startup import StageProgress


START_MARKS = {"waiting": "·", "loading": "…", "loaded": "✓", "failed": "✗"}
"""The mark before a stage's line in :class:`StartDisplay`, by its ``StageProgress.state``."""


class StartDisplay:
    """The runtime's start-up progress (``StageProgress``) for a person, on stderr:
    a live table of the stages on a terminal (80 columns), else one plain line per
    stage that starts loading, loads or fails."""

    def __init__(self, pipeline: str, stages: list[tuple[str, str]]) -> None:
        self._console = make_console(stderr=True)
        self._pipeline = pipeline
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._rows: dict[str, _ProgressRow] = {
            n: _ProgressRow(device=d, state="waiting", since=None, seconds=None, cause=None)
            for n, d in stages
        }
        self._live: Any = None
        if self._console.is_terminal:
            from rich.live import Live

            self._live = Live(
                get_renderable=self._render,
                console=self._console,
                refresh_per_second=4,
                transient=False,
            )
            self._live.start()

    def __call__(self, event: StageProgress) -> None:
        with self._lock:
            row = self._rows.setdefault(
                event.stage,
                _ProgressRow(
                    device=event.device, state=event.state, since=None, seconds=None, cause=None
                ),
            )
            row["state"], row["seconds"], row["cause"] = event.state, event.seconds, event.cause
            row["device"] = event.device
            if event.state == "loading":
                row["since"] = time.perf_counter()
        if self._live is None and event.state != "waiting":
            self._console.print(self._line(event.stage, row), markup=False, soft_wrap=False)

    def _line(self, name: str, row: _ProgressRow) -> str:
        state, device = row["state"], row["device"]
        if state == "loading":
            since = row["since"] or time.perf_counter()
            text = f"loading on {device}" + (
                f"  {time.perf_counter() - since:.0f} s" if self._live else ""
            )
        elif state == "loaded":
            text = f"loaded on {device} in {row['seconds']:.1f} s"
        elif state == "failed":
            text = f"failed on {device}: {row['cause']}"
        else:
            text = f"waiting (on {device})"
        line = f"{START_MARKS.get(state, ' ')} {name}: {text}"
        width = self._console.width
        return line if len(line) <= width else line[: width - 1] + "…"

    def _render(self) -> Any:
        with self._lock:
            lines = [self._line(n, row) for n, row in self._rows.items()]
        states = {row["state"] for row in self._rows.values()}
        phase = (
            "Ray and the device actors"
            if states == {"waiting"}
            else "loading stages"
            if states & {"waiting", "loading"}
            else "every stage loaded"
        )
        head = f"starting {self._pipeline}: {phase}  {time.perf_counter() - self._t0:.0f} s"
        return Text("\n".join([head, *("  " + line for line in lines)]))

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


class ProgressBars:
    """``stages.base.Progress`` as rich progress bars on stderr, started at the first step."""

    def __init__(self) -> None:
        self._progress: Any = None

    def __call__(self, total: int | None, description: str) -> Callable[..., None]:
        if self._progress is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=make_console(stderr=True),
                transient=False,
            )
            self._progress.start()
        task = self._progress.add_task(description, total=total or 1)
        return lambda n=1: self._progress.advance(task, n)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


class _ProgressRow(TypedDict):
    """One stage's line while the pipeline starts: its device, state, when its load was sent
    (``time.perf_counter``), its load's seconds and why it failed."""

    device: str
    state: str
    since: float | None
    seconds: float | None
    cause: str | None


class TerminalProgress:
    """``api.StartProgress`` (structurally) for a person on stderr: the weights' progress bars
    (:class:`ProgressBars`), then each stage's state while it starts (:class:`StartDisplay`)."""

    def __init__(self) -> None:
        self._bars: ProgressBars | None = None
        self._display: StartDisplay | None = None

    def weights(self) -> ProgressBars:
        if self._bars is None:
            self._bars = ProgressBars()
        return self._bars

    def starting(self, pipeline: str, stages: list[tuple[str, str]]) -> StartDisplay:
        self._close_bars()
        self._display = StartDisplay(pipeline, stages)
        return self._display

    def _close_bars(self) -> None:
        if self._bars is not None:
            self._bars.close()
            self._bars = None

    def close(self) -> None:
        self._close_bars()
        if self._display is not None:
            self._display.close()
            self._display = None
