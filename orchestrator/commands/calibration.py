"""``omni-edge calibration``: what the measurement store holds, and forgetting it.

``show [STAGE]`` lists the store's entries (one line each: the budget the last
run had, the largest peak); with a STAGE, each run's budget beside what it
measured — the budget's history, so a budget that climbs from run to run shows
(docs/calibration.md). ``reset STAGE`` removes a stage's entries (every device,
backend and setting it was measured with), ``reset --all`` every entry, so the
next plan of that stage budgets from metadata again. ``--json`` beside each.

``reset --all`` removes only the files that are entries by name and by format
(a mistyped ``--store`` holding other files loses none of them: each is named as
left alone), and asks first, listing what will go; ``--yes`` removes without
asking, and without a terminal to ask on it is required (exit 2, nothing removed).

A STAGE is ``PIPELINE/STAGE`` as ``show`` lists it, or a stage name when one
pipeline has it; ``(ray_runtime)`` and ``(server)`` name the shared costs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.core.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.calibration import CalibrationStore, Entry
    from orchestrator.core.documents import JsonObject

STORE_FORMAT = "omni-edge.calibration-store/1"
NAME_WIDTH = 28
"""The entry-name column of ``show``: a longer name is cut with an ellipsis (80 columns in all)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
        metavar="DIR",
        help="the measurement store (default: $OMNI_EDGE_CALIBRATION_DIR, else "
        "~/.cache/omni-edge/calibration)",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser(
        "show",
        help="list the entries, or one stage's budget history",
        description="List the store's entries; with STAGE, each run's budget and what it measured.",
    )
    show.add_argument(
        "stage", nargs="?", metavar="STAGE", help="PIPELINE/STAGE (or a stage name) as listed"
    )
    show.add_argument("--json", action="store_true", help=f"print JSON (format {STORE_FORMAT})")
    reset = sub.add_parser(
        "reset",
        help="forget a stage's measurements (or all): its next plan budgets from metadata",
        description="Remove a stage's entries (or --all), so its next plan budgets from metadata.",
    )
    reset.add_argument(
        "stage", nargs="?", metavar="STAGE", help="PIPELINE/STAGE (or a stage name) as listed"
    )
    reset.add_argument(
        "--all",
        action="store_true",
        help="remove every entry in the store (asks first, listing them; other files are left alone)",
    )
    reset.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="remove without asking (required with --all when stdin is not a terminal)",
    )
    reset.add_argument("--json", action="store_true", help="print what was removed as JSON")


def name_of(entry: Entry) -> str:
    """How ``show`` names an entry: PIPELINE/STAGE, the shared cost (Ray's on a cluster's
    node: ``(ray_runtime) on NODE``), else the file's label."""
    if entry.pipeline and entry.stage:
        return f"{entry.pipeline}/{entry.stage}"
    node = entry.key.get("parts", {}).get("node")
    if entry.stage and isinstance(node, str):
        return f"{entry.stage} on {node}"
    return entry.stage or entry.label or entry.path.stem


def select(entries: list[Entry], stage: str, *, where: str, store: Path) -> list[Entry]:
    """The entries ``stage`` names; ``ConfigError`` (exit 2) when it names none, or a bare stage
    name that several pipelines have."""
    exact = [e for e in entries if stage in (name_of(e), e.label)]
    if exact:
        return exact
    by_stage = [e for e in entries if e.stage == stage]
    pipelines = sorted({e.pipeline for e in by_stage})
    if len(pipelines) > 1:
        raise ConfigError.single(
            where,
            f"{len(pipelines)} pipelines have a stage {stage!r}: "
            + ", ".join(f"{p}/{stage}" for p in pipelines),
            "name one as PIPELINE/STAGE",
        )
    if by_stage:
        return by_stage
    names = sorted({name_of(e) for e in entries})
    held = (
        f"it holds {', '.join(names[:8])}{' …' if len(names) > 8 else ''}"
        if names
        else "it is empty"
    )
    shown = stage if len(stage) <= 80 else stage[:77] + "..."
    raise ConfigError.single(
        where,
        f"no entry in the measurement store {store} is for {shown!r}; {held}",
        "name a stage as `omni-edge calibration show` lists it (PIPELINE/STAGE), or use --store for another store",
    )


def run(args: argparse.Namespace) -> int:
    from orchestrator.calibration import CalibrationStore
    from orchestrator.commands.exits import EXIT_OK

    if args.action == "reset" and bool(args.stage) == bool(args.all):
        raise ConfigError.single(
            "calibration reset",
            "give a STAGE or --all, not both" if args.stage else "give a STAGE or --all",
            "omni-edge calibration reset PIPELINE/STAGE, or omni-edge calibration reset --all",
        )
    root = Path(args.store).expanduser() if args.store else None
    if root is not None and root.exists() and not root.is_dir():
        raise ConfigError.single(
            f"--store {args.store}",
            "this is a file, not a directory",
            "name the measurement store's directory",
        )
    store = CalibrationStore(root)
    entries, ignored = store.entries()
    if args.action == "show":
        chosen = (
            entries
            if not args.stage
            else select(
                entries, args.stage, where=f"calibration show {_cut(args.stage)}", store=store.root
            )
        )
        doc = _doc(store, chosen, ignored if not args.stage else [])
        if args.json:
            json.dump(doc, sys.stdout, indent=2)
            sys.stdout.write("\n")
        elif args.stage:
            _print_history(chosen)
        else:
            _print_list(store, chosen, ignored)
        return EXIT_OK
    left: list[tuple[Path, str]] = []
    if args.all:
        targets, left = store.removable()
        if targets and not args.yes and not _confirmed(store.root, targets, left):
            print("nothing removed", file=sys.stderr)
            return EXIT_OK
    else:
        targets = [
            e.path
            for e in select(
                entries, args.stage, where=f"calibration reset {_cut(args.stage)}", store=store.root
            )
        ]
    removed = store.remove_paths(targets) if targets else []
    _print_removed(store, args, removed, left)
    return EXIT_OK


def _confirmed(root: Path, targets: list[Path], left: list[tuple[Path, str]]) -> bool:
    """Ask on the terminal before ``reset --all`` removes ``targets`` (listed, with what is left
    alone); without a terminal, ``ConfigError`` (exit 2) naming ``--yes``."""
    n = len(targets)
    what = f"{n} entr{'y' if n == 1 else 'ies'}"
    if not sys.stdin.isatty():
        names = ", ".join(p.name for p in targets[:3]) + (" …" if n > 3 else "")
        raise ConfigError.single(
            "calibration reset --all",
            f"would remove {what} from {root} ({names}), and stdin is not a terminal to ask on",
            "pass --yes to remove them without asking (omni-edge calibration reset --all --yes), "
            "or run it in a terminal",
        )
    print(f"this removes {what} from {root}:", file=sys.stderr)
    for p in targets:
        print(f"  {p.name}", file=sys.stderr)
    for line in _left_lines(left):
        print(line, file=sys.stderr)
    print("remove them? [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except (OSError, KeyboardInterrupt):
        answer = ""
    return answer.strip().lower() in ("y", "yes")


def _print_removed(
    store: CalibrationStore,
    args: argparse.Namespace,
    removed: list[Path],
    left: list[tuple[Path, str]],
) -> None:
    if args.json:
        json.dump(
            {
                "format": STORE_FORMAT,
                "store": str(store.root),
                "removed": [str(p) for p in removed],
                "left": [{"file": str(p), "why": why} for p, why in left],
            },
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
        return
    what = "every entry" if args.all else args.stage
    print(
        f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} ({what}) from {store.root}"
    )
    for p in removed:
        print(f"  {p.name}")
    for line in _left_lines(left):
        print(line)
    if removed:
        print("the next plan budgets these from metadata, until a run measures them again")


LEFT_SHOWN = 10
"""Files left alone that ``reset --all`` names one by one (a mistyped --store may hold thousands)."""


def _left_lines(left: list[tuple[Path, str]]) -> list[str]:
    if not left:
        return []
    lines = ["left alone (not removed):"]
    lines += [f"  {_cut(p.name, 36)} ({why})" for p, why in left[:LEFT_SHOWN]]
    if len(left) > LEFT_SHOWN:
        lines.append(f"  … and {len(left) - LEFT_SHOWN} more")
    return lines


def _cut(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _doc(
    store: CalibrationStore, entries: list[Entry], ignored: list[tuple[Path, str]]
) -> JsonObject:
    return {
        "format": STORE_FORMAT,
        "store": str(store.root),
        "entries": [
            {
                "name": name_of(e),
                "pipeline": e.pipeline or None,
                "stage": e.stage or None,
                "label": e.label,
                "file": str(e.path),
                "subject": e.key.get("subject"),
                "device": e.key.get("parts", {}).get("device"),
                "backend": e.key.get("parts", {}).get("backend"),
                "scaling": e.key.get("scaling", {}),
                "samples": list(e.samples),
            }
            for e in entries
        ],
        "ignored": [{"file": str(p), "problem": why} for p, why in ignored],
    }


def _mib(n: int | None) -> str:
    from orchestrator.core.units import fmt_bytes

    return "-" if n is None else fmt_bytes(int(n))


def _print_list(
    store: CalibrationStore, entries: list[Entry], ignored: list[tuple[Path, str]]
) -> None:
    print(f"measurement store: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} in")
    print(f"  {store.root}")
    if entries:
        head = f"{'stage':<{NAME_WIDTH}} {'device':<8} {'backend':<13} {'runs':>4} {'budget':>10} {'peak':>10}"
        print(head)
        print("─" * len(head))
        for e in entries:
            parts = e.key.get("parts", {})
            last = e.samples[-1]
            trusted = e.trusted()
            peak = max((s["peak_bytes"] for s in trusted), default=None)
            print(
                f"{_cut(name_of(e), NAME_WIDTH):<{NAME_WIDTH}} {_cut(str(parts.get('device') or '-'), 8):<8} "
                f"{_cut(str(parts.get('backend') or '-'), 13):<13} {len(e.samples):>4} "
                f"{_mib(last.get('budget_bytes')):>10} {_mib(peak):>10}"
            )
        print("budget: the last run's; peak: the largest measured (upper bounds left out)")
        print("a budget's history: omni-edge calibration show STAGE")
        print("forget a stage's:   omni-edge calibration reset STAGE")
    for path, why in ignored:
        print(f"ignored {path.name}: {_cut(why, 60)}")


def _print_history(entries: list[Entry]) -> None:
    for i, e in enumerate(entries):
        parts = e.key.get("parts", {})
        if i:
            print()
        print(f"{name_of(e)} on {parts.get('device') or '-'} ({parts.get('backend') or '-'})")
        print(f"  {e.path}")
        head = f"{'#':>3} {'when':<16} {'budget':>10} {'peak':>10} {'resident':>10} {'rise':>9} {'rcyc':>4}  note"
        print(head)
        print("─" * 78)
        for n, s in enumerate(e.samples, 1):
            flags = [
                f
                for f, on in (
                    ("cal", s["calibrated"]),
                    ("OVER", s["over_budget"]),
                    ("bound", s["upper_bound"]),
                )
                if on
            ]
            recycles = s.get("worker_recycles")
            print(
                f"{n:>3} {str(s['when'])[:16].replace('T', ' '):<16} {_mib(s.get('budget_bytes')):>10} "
                f"{_mib(s['peak_bytes']):>10} {_mib(s.get('resident_bytes')):>10} {_mib(s.get('call_rise_bytes')):>9} "
                f"{'-' if recycles is None else recycles:>4}  {' '.join(flags)}".rstrip()
            )
    print("budget: what the run was planned with; rise: the largest rise of one call;")
    print("rcyc: worker recycles; cal: a calibrated budget; OVER: measured above it;")
    print("bound: an upper bound (another load counted too), never used")
