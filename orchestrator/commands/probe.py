"""``omni-edge probe``: describe this machine as a hardware profile.

Prints a table (devices, pools with their capacity, routes with why they are
or are not reachable); ``--json`` prints the profile itself, ``--save FILE``
writes it for ``omni-edge plan --profile FILE``. Saving is atomic and never
overwrites an existing file unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.profile import HardwareProfile, Route
from orchestrator.units import fmt_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the profile as JSON instead of a table"
    )
    parser.add_argument("--save", metavar="FILE", help="write the profile to FILE (JSON)")
    parser.add_argument(
        "--force", action="store_true", help="with --save: replace FILE if it exists"
    )
    parser.add_argument(
        "--route",
        metavar="NAME=PYTHON",
        action="append",
        default=[],
        help="also probe this interpreter (e.g. openvino-venv=.venvs/openvino/bin/python); repeatable",
    )
    parser.add_argument(
        "--no-default-routes",
        action="store_true",
        help="do not look for .venvs/openvino/bin/python on its own",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds each interpreter may take to answer (default 30)",
    )


def run(args: argparse.Namespace) -> int:
    from orchestrator import probe

    routes = []
    for i, text in enumerate(args.route):
        try:
            name, python = probe.parse_route_arg(text)
        except ValueError as exc:
            raise ConfigError.single(
                f"--route #{i + 1}", str(exc), "write --route NAME=PATH/TO/python"
            ) from None
        routes.append(Route(name=name, kind="interpreter", python=python))
    names = [r.name for r in routes]
    if "this-process" in names or len(set(names)) != len(names):
        raise ConfigError.single(
            "--route",
            f"route names must be unique and not 'this-process' (got {names})",
            "rename the route",
        )

    save_path = Path(args.save) if args.save else None
    if save_path is not None:
        if save_path.exists() and not args.force:
            raise _exists(save_path)
        if not save_path.parent.is_dir():
            raise ConfigError.single(
                str(save_path),
                f"the directory {save_path.parent} does not exist",
                "create it first, or save somewhere else",
            )

    kwargs = {"use_default_routes": not args.no_default_routes}
    if args.timeout is not None:
        kwargs["timeout_s"] = args.timeout
    profile = probe.probe_profile(routes, **kwargs)
    text = profile.model_dump_json(indent=2) + "\n"

    if args.json:
        print(text, end="")
    else:
        print_profile(profile)
    if save_path is not None:
        write_atomic(save_path, text, force=args.force)
        if not args.json:
            print(f"saved to {save_path}")
    return 0


def _exists(path: Path) -> ConfigError:
    return ConfigError.single(
        str(path),
        "the file already exists and was left untouched",
        "pass --force to replace it, or choose another path",
    )


def write_atomic(path: Path, text: str, *, force: bool = False) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half.

    Without ``force`` an existing ``path`` is an error even if it appears
    between the check and the write (the final step is a hard link, which
    fails on an existing name).
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise _exists(path) from None
            except OSError:
                # Filesystems without hard links: check, then rename.
                if path.exists():
                    raise _exists(path) from None
                os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# ---- the table ---------------------------------------------------------------------


@dataclass(frozen=True)
class PoolRow:
    id: str
    capacity_bytes: int
    parent: str | None
    note: str


def pools_of(profile: HardwareProfile) -> list[PoolRow]:
    """The memory pools a plan against ``profile`` draws on (see docs/profile-format.md)."""
    from orchestrator.profile import profile_pools

    return [PoolRow(p.id, p.capacity, p.parent, p.note) for p in profile_pools(profile)]


def print_profile(profile: HardwareProfile) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    h = profile.host
    limit = fmt_bytes(h.ram_limit_bytes) if h.ram_limit_bytes is not None else "none"
    console.print(
        f"[bold]{profile.name}[/bold]  {h.os}{' (WSL2)' if h.wsl else ''}  {h.cpu_name}\n"
        f"RAM total {fmt_bytes(h.ram_total_bytes)}, available {fmt_bytes(h.ram_available_bytes)}, limit {limit}"
    )

    devices = Table(title="devices", title_justify="left")
    for col in ("id", "name", "memory", "backends", "route"):
        devices.add_column(col)
    for d in profile.devices:
        memory = fmt_bytes(d.memory_bytes) if d.memory_bytes is not None else f"host RAM ({d.pool})"
        routes = ", ".join(f"{b}→{d.route_for(b)}" for b in d.backends) or d.route
        devices.add_row(d.id, d.name, memory, ", ".join(d.backends) or "(none)", routes)
    console.print(devices)

    pools = Table(title="pools", title_justify="left")
    for col in ("pool", "capacity", "inside", "note"):
        pools.add_column(col)
    for p in pools_of(profile):
        pools.add_row(p.id, fmt_bytes(p.capacity_bytes), p.parent or "", p.note)
    console.print(pools)

    routes_t = Table(title="routes", title_justify="left")
    for col in ("route", "kind", "reachable", "providers", "reason / remedy"):
        routes_t.add_column(col)
    for r in profile.routes:
        why = r.reason + (f"\nremedy: {r.remedy}" if r.remedy else "")
        routes_t.add_row(
            r.name,
            r.kind,
            "yes" if r.reachable else "[red]no[/red]",
            ", ".join(r.providers or []),
            why,
        )
    console.print(routes_t)
