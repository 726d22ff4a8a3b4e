"""Human-readable output (rich): the building blocks every command uses, and the plan
(the progress a pipeline shows on stderr while it starts is ``commands/progress.py``'s).

The JSON forms (``PipelinePlan.to_json``, the profile, the verify report) are
the contracts; this module only decides how the same facts read on a screen.

What it promises, at any width down to 80 columns:

* an identifier — a stage, device, backend, pool, purpose or refusal code —
  is never cut or wrapped: columns of identifiers do not wrap, and a table
  that cannot fit them all falls back to one ``field  value`` block per row
  (:class:`Sheet`);
* long free text (reservation notes, why a route is unreachable, the
  evidence behind a verification) wraps between words with a hanging indent:
  below :data:`WIDE_LAYOUT_COLUMNS` it leaves the table as a numbered
  footnote (``[3]`` in the table, ``[3] the text`` under it), at or above it
  it stays in the table's last column;
* mappings print as ``key=value`` lines, never as a Python repr.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from orchestrator.core.console import make_console
from orchestrator.core.errors import terminal_text
from orchestrator.core.ledger import PIPELINE_HOLDER
from orchestrator.core.plan import PipelinePlan, ReplicaPlan, RestartDoc, StagePlan
from orchestrator.core.units import fmt_bytes

if TYPE_CHECKING:
    pass

WIDE_LAYOUT_COLUMNS = 140
"""From this width on, notes stay inside their table instead of becoming footnotes."""

FREE_TEXT_MIN = 40
"""Columns a free-text cell needs to read as prose rather than as a word column."""


# ---- building blocks ---------------------------------------------------------------


@dataclass(frozen=True)
class Note:
    """A long text attached to a cell: inline when wide, a numbered footnote when narrow.

    ``label`` (if any) is what the cell shows in both layouts, e.g.
    ``verified`` with the evidence in the note; ``footnote`` is the text of the
    footnote line when it must say more than the inline text (which stage).
    """

    number: int
    text: str
    label: str = ""
    footnote: str = ""

    def marker(self) -> str:
        return f"[{self.number}]"

    def narrow(self) -> str:
        return f"{self.label} {self.marker()}" if self.label else self.marker()

    def wide(self) -> str:
        return f"{self.label} ({self.text})" if self.label else self.text


class Notes:
    """Numbers notes across one output, so ``[3]`` means the same thing everywhere in it.

    The same text gets the same number (two pools' identical margins share one
    footnote).
    """

    def __init__(self) -> None:
        self._numbers: dict[tuple[str, str, str], int] = {}

    def note(self, text: str, *, label: str = "", footnote: str = "") -> Note:
        key = (text, label, footnote)
        number = self._numbers.setdefault(key, len(self._numbers) + 1)
        return Note(number, text, label, footnote)


Cell = str | Text | Note | None


@dataclass(frozen=True)
class Col:
    """A column of a :class:`Sheet`.

    ``wrap=False`` (identifiers, numbers): never wrapped, never cut; a cell
    may still hold several lines joined with ``\\n``. ``wrap=True`` (prose):
    wraps between words; a single word longer than the column (a path) folds.
    """

    header: str
    justify: str = "left"
    wrap: bool = False
    style: str = ""


def _plain(cell: Cell, wide: bool) -> Text:
    """A cell as rich ``Text``: never read as markup, and without control characters
    (``terminal_text``): a cell may hold what a file says (a manifest's origin, a
    profile's device name), and an escape sequence in it must not reach the terminal."""
    if cell is None:
        return Text("-")
    if isinstance(cell, Note):
        return Text(terminal_text(cell.wide() if wide else cell.narrow()))
    if isinstance(cell, Text):
        clean = terminal_text(cell.plain)
        return cell if clean == cell.plain else Text(clean, style=cell.style)
    return Text(terminal_text(cell))


def _longest_line(text: str) -> int:
    return max((cell_len(line) for line in text.split("\n")), default=0)


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


class Sheet:
    """A titled table that fits the width it is printed at.

    Rendering picks, for the console's width: notes inline (wide) or as
    footnotes (narrow); two spaces between columns, else one; and when even
    that cannot hold every identifier whole, one block per row
    (``field  value`` lines under the row's first cell).
    """

    def __init__(self, title: str, columns: Sequence[Col]) -> None:
        self.title = title
        self.columns = list(columns)
        self.rows: list[tuple[Cell, ...]] = []

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(cells)

    def notes(self) -> list[Note]:
        seen: dict[int, Note] = {}
        for row in self.rows:
            for cell in row:
                if isinstance(cell, Note):
                    seen.setdefault(cell.number, cell)
        return [seen[n] for n in sorted(seen)]

    def _needed(self, wide: bool, gap: int) -> int:
        """The narrowest this table can be with every non-wrapping cell whole."""
        total = gap * (len(self.columns) - 1)
        for i, col in enumerate(self.columns):
            texts = [col.header] + [_plain(row[i], wide).plain for row in self.rows]
            if col.wrap:
                # Prose may wrap, the header too ("reason /" over "remedy"),
                # but not below a readable measure unless the cells are short
                # anyway (footnote markers).
                cells = texts[1:] or [""]
                total += max(
                    max(_longest_word(t) for t in texts),
                    min(FREE_TEXT_MIN, max(_longest_line(t) for t in cells)),
                )
            else:
                total += max(_longest_line(t) for t in texts)
        return total

    def _table(self, wide: bool, gap: int) -> Table:
        table = Table(
            header_style="bold",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            padding=(0, gap - 1, 0, 0),
        )
        for col in self.columns:
            table.add_column(
                col.header,
                justify=col.justify,  # type: ignore[arg-type]
                no_wrap=not col.wrap,
                overflow="fold",
                style=col.style or None,
            )
        for row in self.rows:
            table.add_row(*(_plain(cell, wide) for cell in row))
        return table

    def _records(self) -> RenderableType:
        """One block per row: for widths no table fits (a very long stage name, say)."""
        parts: list[RenderableType] = []
        for row in self.rows:
            parts.append(Text.assemble("  ", _plain(row[0], False)))
            grid = Table.grid(padding=(0, 2, 0, 0))
            grid.add_column(no_wrap=True, style="dim")
            grid.add_column(overflow="fold")
            for col, cell in zip(self.columns[1:], row[1:], strict=True):
                grid.add_row(Text("    " + col.header.replace("\n", " ")), _plain(cell, False))
            parts.append(grid)
        return Group(*parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        # The title is a line of its own, not the table's title, which rich
        # would wrap to the table's (possibly narrow) width.
        yield Text(self.title, style="bold")
        wide = width >= WIDE_LAYOUT_COLUMNS and self._needed(True, 2) <= width
        for gap in (2, 1):
            if self._needed(wide, gap) <= width:
                yield self._table(wide, gap)
                break
        else:
            yield self._records()
        if not wide:
            notes = self.notes()
            if notes:
                yield footnotes(notes)


def footnotes(notes: Iterable[Note]) -> Table:
    """``[n] text`` lines; the text wraps under itself, not under the marker."""
    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(justify="right", no_wrap=True, style="dim")
    grid.add_column(overflow="fold")
    for note in notes:
        grid.add_row(Text(note.marker()), Text(note.footnote or note.text))
    return grid


def labelled(label: str, text: str | Text, *, style: str = "", indent: int = 0) -> Table:
    """``label text`` where the text wraps under itself (``note: …``, ``remedy: …``)."""
    grid = Table.grid(padding=(0, 1, 0, 0))
    cells: list[str | Text] = []
    if indent:
        grid.add_column(width=indent - 1, no_wrap=True)
        cells.append("")
    if label:
        grid.add_column(no_wrap=True, style=style or None)
        cells.append(label)
    grid.add_column(overflow="fold", style=None if label else (style or None))
    # Text, not str: data such as "[fp32]" must not be read as rich markup.
    grid.add_row(*cells, Text(terminal_text(text)) if isinstance(text, str) else text)
    return grid


def problem(
    code: str, where: str, message: str, remedy: str = "", *, style: str = "bold red"
) -> Group:
    """A refusal as a user reads it: the code and where, then why, then what to do.

    ::

        [budget_exceeds_device] thinker on cpu
            the stage needs 3.2 GiB, host_ram has 2.0 GiB left …
            remedy: lower max_model_len …
    """
    head = Text.assemble((f"[{code}]", style), " ", where)
    parts: list[RenderableType] = [head, labelled("", message, indent=4)]
    if remedy:
        parts.append(labelled("remedy:", remedy, style="bold", indent=4))
    return Group(*parts)


def display_value(value: Any) -> str:
    """A scalar for a ``key=value`` line: paths under the working directory shortened."""
    if isinstance(value, str) and os.path.isabs(value):
        try:
            return str(Path(value).relative_to(Path.cwd()))
        except ValueError:
            return value
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "none"
    return str(value)


def key_values(mapping: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """``key=value`` lines for a (nested) mapping: ``session.providers=A, B``.

    Nested mappings flatten with dots, lists of mappings with ``[i]``, lists
    of scalars join with ``, ``; an empty container prints as ``(none)``.
    """
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if value:
                yield from key_values(value, f"{name}.")
            else:
                yield f"{name}=(none)"
        elif isinstance(value, (list, tuple)):
            if not value:
                yield f"{name}=(none)"
            elif all(not isinstance(v, (Mapping, list, tuple)) for v in value):
                yield f"{name}=" + ", ".join(display_value(v) for v in value)
            else:
                for i, item in enumerate(value):
                    if isinstance(item, Mapping):
                        if item:
                            yield from key_values(item, f"{name}[{i}].")
                        else:
                            yield f"{name}[{i}]=(none)"
                    else:
                        yield f"{name}[{i}]={display_value(item)}"
        else:
            yield f"{name}={display_value(value)}"


def spaced(parts: Iterable[RenderableType | None]) -> Group:
    """Sections one blank line apart (``None`` entries are skipped)."""
    out: list[RenderableType] = []
    for part in parts:
        if part is None:
            continue
        if out:
            out.append(Text(""))
        out.append(part)
    return Group(*out)


# ---- the plan ----------------------------------------------------------------------


def verification_cell(stage: StagePlan, notes: Notes) -> Cell:
    v = stage.verification
    if v is None:
        return "-"
    if v.evidence:
        # The footnote repeats the wide layout's words, naming the stage.
        return notes.note(
            v.evidence, label=v.status, footnote=f"{stage.name}: {v.status} ({v.evidence})"
        )
    return v.status


STAGE_COLUMNS = (
    Col("stage"),
    Col("kind"),
    Col("device"),
    Col("backend"),
    Col("budget", "right"),
    Col("KV/token", "right"),
    Col("verification"),
)


def threads_line(plan: PipelinePlan) -> Table | None:
    """``CPU threads  thinker 1, voice 1 (config)``: each CPU stage's thread budget, one line
    under the stages table (a column would push it past 80 columns); None when no stage has one."""
    shown = [
        f"{r.holder} {r.cpu_threads}" + (" (config)" if r.cpu_threads_from == "config" else "")
        for s in plan.stages
        for r in s.placements()
        if r.cpu_threads is not None
    ]
    return labelled("CPU threads:", ", ".join(shown), style="bold") if shown else None


def replicas_line(plan: PipelinePlan) -> Table | None:
    """``Replicas:  voice ×2: igpu:0, cpu``: each stage of several instances and where each
    runs (replica 0 first), one line under the stages table; None when there is none."""
    shown = [
        f"{s.name} ×{len(s.replicas)}: {', '.join(r.device or '-' for r in s.replicas)}"
        for s in plan.stages
        if s.replicas
    ]
    return labelled("Replicas:", "; ".join(shown), style="bold") if shown else None


def restarts_line(plan: PipelinePlan) -> Table | None:
    """``Restarts:  thinker, voice up to 5 in 600 s, back-off 1-30 s``: how each admitted stage
    comes back when its device actor or route worker dies (its ``restart``), stages of one
    policy together, and which stages fall back to their next device when theirs is gone
    (``on_device_loss: fallback``); None for a plan with no admitted stage."""
    by_policy: dict[str, list[str]] = {}
    for s in plan.stages:
        if s.admitted:
            by_policy.setdefault(restart_said(s.restart), []).append(s.name)
    if not by_policy:
        return None
    parts = [f"{', '.join(names)} {said}" for said, names in by_policy.items()]
    moving = [s.name for s in plan.stages if s.admitted and s.on_device_loss == "fallback"]
    if moving:
        parts.append(f"on device loss {', '.join(moving)} fall back to the next device")
    return labelled("Restarts:", "; ".join(parts), style="bold")


def restart_said(restart: RestartDoc | Literal["never"] | None) -> str:
    """A plan's ``restart`` in words: ``never restarted``, or the policy (the default's for None)."""
    from stages.base import RestartConfig

    if restart == "never":
        return "never restarted"
    return (RestartConfig(**restart) if isinstance(restart, dict) else RestartConfig()).said()


def end_of_turn_line(plan: PipelinePlan) -> Table | None:
    """``End of turn: 400 ms of silence (vad min_silence_ms)``: the delay a spoken turn waits
    before it is answered (``serve``'s ``/v1/realtime``), for a plan with a stage that cuts
    turns (``StageKind.turn_detection``: a vad stage)."""
    from stages.registry import get_kind

    for s in plan.stages:
        turn = get_kind(s.kind).turn_detection(s)
        if turn is not None:
            return labelled(
                "End of turn:",
                f"{turn.silence_duration_ms} ms of silence ({s.name} min_silence_ms)",
                style="bold",
            )
    return None


def stages_sheet(plan: PipelinePlan, notes: Notes, title: str = "stages") -> Sheet:
    sheet = Sheet(title, STAGE_COLUMNS)
    for s in plan.stages:
        kv_cache = s.details.get("kv_cache")
        kv = fmt_bytes(kv_cache["bytes_per_token"]) if kv_cache else "-"
        sheet.add_row(
            f"{s.name} ×{len(s.replicas)}" if s.replicas else s.name,
            s.kind,
            s.device or Text("refused", style="bold red"),
            s.backend or "-",
            fmt_bytes(s.budget_bytes()) if s.admitted else "-",
            kv,
            verification_cell(s, notes),
        )
    return sheet


def calibration_sheet(plan: PipelinePlan) -> Sheet | None:
    """Per calibrated stage: the budget from metadata → from measurements, how it matched,
    over how many runs, and the margin (None when no stage was calibrated)."""
    rows = [s for s in plan.stages if s.admitted and s.calibration]
    if not rows:
        return None
    sheet = Sheet(
        "calibration (budget from metadata → from measured peaks)",
        (
            Col("stage"),
            Col("before", "right"),
            Col("after", "right"),
            Col("match"),
            Col("runs", "right"),
            Col("largest peak", "right"),
            Col("margin", "right"),
        ),
    )
    for s in rows:
        c = s.calibration or {}
        match = {"exact": "M", "near": "E from M"}.get(c.get("match", ""), c.get("match", "-"))
        sheet.add_row(
            s.name,
            fmt_bytes(c["before_bytes"]),
            fmt_bytes(c["after_bytes"]),
            match,
            str(c.get("provenance", {}).get("samples", "-")),
            fmt_bytes(c["largest_peak_bytes"]),
            fmt_bytes(c["margin"]["bytes"]),
        )
    return sheet


def _lifetime(lifetime: str, at_load: bool) -> str:
    # "session" reservations that are not allocated at load (the KV cache) say
    # so; on its own line, so the column stays as narrow as "session".
    return lifetime + ("" if at_load or lifetime != "session" else "\n(after load)")


def reservations_sheet(plan: PipelinePlan, notes: Notes) -> Sheet:
    sheet = Sheet(
        "reservations",
        (
            Col("stage"),
            Col("pool"),
            Col("purpose"),
            Col("bytes", "right"),
            Col("lifetime"),
            Col("ev"),
            Col("note", wrap=True),
        ),
    )
    for s in plan.stages:
        for holder, r in [(p.holder, r) for p in s.replicas for r in p.reservations] or [
            (s.name, r) for r in s.reservations
        ]:
            sheet.add_row(
                holder,
                r.pool,
                r.purpose,
                fmt_bytes(r.bytes),
                _lifetime(r.lifetime, r.at_load),
                r.evidence,
                notes.note(r.note) if r.note else "",
            )
    for r in plan.shared_reservations:
        sheet.add_row(
            PIPELINE_HOLDER,
            r.pool,
            r.purpose,
            fmt_bytes(r.bytes),
            r.lifetime,
            r.evidence,
            notes.note(r.note) if r.note else "",
        )
    return sheet


def pools_sheet(plan: PipelinePlan) -> Sheet:
    sheet = Sheet(
        "pools",
        (
            Col("pool"),
            Col("peak", "right"),
            Col("capacity", "right"),
            Col("use", "right"),
            Col("contributors"),
        ),
    )
    for p in plan.pools:
        use = p.peak_bytes / p.capacity_bytes if p.capacity_bytes else 0.0
        # One contributor per line: "thinker 1.50 GiB" never splits between
        # the name and its bytes.
        contributors = "\n".join(
            f"{h} {fmt_bytes(b)}" for h, b in sorted(p.contributors.items(), key=lambda kv: -kv[1])
        )
        sheet.add_row(
            p.id,
            fmt_bytes(p.peak_bytes),
            fmt_bytes(p.capacity_bytes),
            Text(f"{use:.0%}", style="bold red" if use > 1 else ""),
            contributors or "-",
        )
    return sheet


def engine_block(stage: StagePlan | ReplicaPlan) -> Group:
    """The arguments the stage's engine (or one replica's) will be built with, one
    ``key=value`` a line."""
    name = stage.holder if isinstance(stage, ReplicaPlan) else stage.name
    lines: list[RenderableType] = [Text(f"{name} engine ({stage.backend}):", style="bold")]
    lines += [
        labelled("", line, indent=4)
        for line in key_values({k: v for k, v in stage.engine_kwargs.items() if k != "model"})
    ]
    return Group(*lines)


def plan_table(plan: PipelinePlan) -> Group:
    """The whole plan as a user reads it; lays itself out for the console it is printed on."""
    notes = Notes()
    head = labelled(
        "ADMITTED" if plan.admitted else "REFUSED",
        f"pipeline {plan.pipeline!r} on {plan.profile}",
        style="bold green" if plan.admitted else "bold red",
    )

    under = [
        line
        for line in (
            replicas_line(plan),
            threads_line(plan),
            restarts_line(plan),
            end_of_turn_line(plan),
        )
        if line is not None
    ]
    stages: RenderableType = (
        stages_sheet(plan, notes) if not under else Group(stages_sheet(plan, notes), *under)
    )
    parts: list[RenderableType | None] = [
        head,
        stages,
        hub_sheet(plan),
        calibration_sheet(plan),
        reservations_sheet(plan, notes),
        pools_sheet(plan),
    ]
    skipped = [(s.name, r) for s in plan.stages if s.admitted for r in s.refusals]
    if skipped:
        parts.append(
            Group(
                Text("devices not used", style="bold"),
                *(
                    problem(r.code, f"{name} on {r.device}", r.message, r.remedy, style="yellow")
                    for name, r in skipped
                ),
            )
        )
    for s in plan.stages:
        if s.admitted:
            continue
        parts.append(
            Group(
                Text(f"stage {s.name!r} refused:", style="bold red"),
                *(
                    problem(r.code, f"{s.name} on {r.device}", r.message, r.remedy)
                    for r in s.refusals
                ),
            )
        )
    parts += [
        engine_block(p)
        for s in plan.stages
        if s.admitted
        for p in (s.replicas or (s,))
        if p.engine_kwargs
    ]
    if plan.notes:
        parts.append(Group(*(labelled("note:", note, style="dim") for note in plan.notes)))
    return spaced(parts)


def hub_sheet(plan: PipelinePlan) -> Group | None:
    """The models named by Hub id: the commit each is pinned to, and whether it is in the HF
    cache or what ``omni-edge pull`` would download (None when no stage names one)."""
    lines = []
    for s in plan.stages:
        hub = s.artifact.get("hub")
        if not isinstance(hub, dict):
            continue
        head = f"{s.name}: {hub['repo']} @ {hub['commit'][:12]} ({hub['revision']})"
        if hub["downloaded"]:
            text = f"{head}, in the HF cache"
        else:
            free = hub.get("disk_free_bytes")
            text = (
                f"{head}, not downloaded: planned from the Hub's metadata; omni-edge pull fetches "
                f"{fmt_bytes(hub['download_bytes'])} into {hub['cache_dir']}"
                + (f" ({fmt_bytes(free)} free)" if isinstance(free, int) else "")
            )
        lines.append(labelled("model:", text))
    return Group(*lines) if lines else None


def print_plan(plan: PipelinePlan, console: Console | None = None) -> None:
    (console or make_console()).print(plan_table(plan))
