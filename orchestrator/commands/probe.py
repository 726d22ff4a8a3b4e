"""``omni-edge probe``: describe this machine as a hardware profile.

Prints a table (devices, pools with their capacity, routes with why they are
or are not reachable); ``--json`` prints the profile itself, ``--save FILE``
writes it for ``omni-edge plan --profile FILE``. Saving is atomic and never
overwrites an existing file unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.core.backends import rows as backend_rows
from orchestrator.core.errors import ConfigError
from orchestrator.core.fileio import check_writable, write_text_atomic
from orchestrator.core.profile import THIS_PROCESS, HardwareProfile, Route, cluster_document
from orchestrator.core.settings import PROBE_TIMEOUT_S
from orchestrator.core.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import Console, Group

    from orchestrator.commands.render import Sheet


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
        help="also probe this interpreter (e.g. openvino-venv=.venvs/openvino/bin/python; from WSL2 a "
        "Windows python.exe such as /mnt/c/omni-edge/venv-directml/Scripts/python.exe, a host-process "
        "route); repeatable",
    )
    parser.add_argument(
        "--no-default-routes",
        action="store_true",
        help="probe only this interpreter and each --route: not the route environments next to the "
        "installation (.venvs/openvino, ...) or in your settings file (routes_dir, routes)",
    )
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="probe every node of the Ray cluster at this address (nodes named by their "
        "omni_edge_node_<name> resource, docs/cluster.md) and print or save the cluster profile",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds each interpreter may take to answer (default {PROBE_TIMEOUT_S:g})",
    )


def parse_route_arg(text: str) -> tuple[str, str]:
    """``NAME=PYTHON`` → (name, python). Raises ValueError with the accepted form."""
    name, sep, python = text.partition("=")
    if not sep or not name.strip() or not python.strip():
        # the example: the first route venv the backend table names
        venv, directory = next(
            (v for row in backend_rows() for v in row.route_venvs), ("my-venv", "my-venv")
        )
        raise ValueError(f"{text!r} is not NAME=PYTHON (e.g. {venv}=.venvs/{directory}/bin/python)")
    return name.strip(), python.strip()


def run(args: argparse.Namespace) -> int:
    from orchestrator.commands.exits import check_number
    from orchestrator.ort.hostproc import route_kind_for
    from orchestrator.probe import probe_profile
    from orchestrator.probe.host import running_in_wsl

    check_number(
        "--timeout",
        args.timeout,
        above=0,
        fix=f"give the seconds each interpreter may take to answer, e.g. --timeout {PROBE_TIMEOUT_S:g}",
    )
    routes = []
    wsl = running_in_wsl()
    for i, text in enumerate(args.route):
        try:
            name, python = parse_route_arg(text)
        except ValueError as exc:
            raise ConfigError.single(
                f"--route #{i + 1}", str(exc), "write --route NAME=PATH/TO/python"
            ) from None
        # a Windows python.exe given from inside WSL2 is a host-process route (paths get translated)
        routes.append(Route(name=name, kind=route_kind_for(python, wsl=wsl), python=python))
    names = [r.name for r in routes]
    if THIS_PROCESS in names or len(set(names)) != len(names):
        raise ConfigError.single(
            "--route",
            f"route names must be unique and not {THIS_PROCESS!r} (got {names})",
            "rename the route",
        )

    save_path = Path(args.save) if args.save else None
    if save_path is not None:
        check_writable(save_path, what="--save")
        if save_path.exists() and not args.force:
            raise _exists(save_path)

    if getattr(args, "address", None):
        from orchestrator.runtime.cluster_probe import gather_at

        profile = gather_at(args.address)
        text = json.dumps(cluster_document(profile), indent=2) + "\n"
    else:
        profile = probe_profile(
            routes, use_default_routes=not args.no_default_routes, timeout_s=args.timeout
        )
        text = profile.model_dump_json(indent=2) + "\n"

    if args.json:
        print(text, end="")
    else:
        print_profile(profile)
    if save_path is not None:
        try:
            write_text_atomic(save_path, text, overwrite=args.force, durable=True)
        except FileExistsError:
            raise _exists(save_path) from None
        if not args.json:
            print(f"\nsaved to {save_path}")
    return 0


def _exists(path: Path) -> ConfigError:
    return ConfigError.single(
        str(path),
        "the file already exists and was left untouched",
        "pass --force to replace it, or choose another path",
    )


# ---- the table ---------------------------------------------------------------------


@dataclass(frozen=True)
class PoolRow:
    id: str
    capacity_bytes: int
    parent: str | None
    note: str


def pools_of(profile: HardwareProfile) -> list[PoolRow]:
    """The memory pools a plan against ``profile`` draws on (see docs/profile-format.md)."""
    from orchestrator.core.profile import profile_pools

    return [PoolRow(p.id, p.capacity, p.parent, p.note) for p in profile_pools(profile)]


def profile_view(profile: HardwareProfile) -> Group:
    """The profile as a user reads it (see orchestrator/commands/render.py for the layout rules)."""
    from rich.table import Table
    from rich.text import Text

    from orchestrator.commands.render import Col, Notes, Sheet, spaced

    notes = Notes()
    h = profile.host
    limit = fmt_bytes(h.ram_limit_bytes) if h.ram_limit_bytes is not None else "none"
    head = Table.grid(padding=(0, 2, 0, 0))
    head.add_column(no_wrap=True, style="bold")
    head.add_column(overflow="fold")
    head.add_row("profile", Text(profile.name, style="bold"))
    head.add_row("host", Text(f"{h.os}{' (WSL2)' if h.wsl else ''}, {h.cpu_name}"))
    head.add_row(
        "RAM",
        Text(
            f"total {fmt_bytes(h.ram_total_bytes)}, available {fmt_bytes(h.ram_available_bytes)}, limit {limit}"
        ),
    )

    devices = Sheet("devices", (Col("id"), Col("memory"), Col("name", wrap=True)))
    for d in profile.devices:
        memory = (
            fmt_bytes(d.memory_bytes) if d.memory_bytes is not None else f"host RAM\n({d.pool})"
        )
        devices.add_row(d.id, memory, d.name)

    # One row per device and backend: which interpreter runs that backend
    # there ("ort-openvino → openvino-venv") reads as a sentence, not a list.
    backends = Sheet("backends", (Col("device"), Col("backend"), Col("route")))
    for d in profile.devices:
        if not d.backends:
            backends.add_row(d.id, "(none)", d.route)
        for b in d.backends:
            backends.add_row(d.id, b, d.route_for(b))

    pools = Sheet(
        "pools", (Col("pool"), Col("capacity", "right"), Col("inside"), Col("note", wrap=True))
    )
    for p in pools_of(profile):
        pools.add_row(p.id, fmt_bytes(p.capacity_bytes), p.parent or "-", p.note or "-")

    routes_t = Sheet(
        "routes",
        (
            Col("route"),
            Col("kind"),
            Col("reachable"),
            Col("providers"),
            Col("why", wrap=True),
        ),
    )
    for r in profile.routes:
        why = r.reason + (f"\nremedy: {r.remedy}" if r.remedy else "")
        routes_t.add_row(
            r.name,
            r.kind,
            Text("yes") if r.reachable else Text("no", style="bold red"),
            "\n".join(r.providers or []) or "-",
            notes.note(why, footnote=f"{r.name}: {why}") if why else "-",
        )
    return spaced(
        [
            head,
            devices,
            backends,
            pools,
            routes_t,
            *build_sheets(profile),
            *ep_device_sheets(profile),
        ]
    )


def build_sheets(profile: HardwareProfile) -> list[Sheet]:
    """The decode engine build each route recorded (llama-cpp-python): version, the CPU features
    and GPU offload it was built with, and whether it runs here (or why not)."""
    from rich.text import Text

    from orchestrator.commands.render import Col, Sheet
    from orchestrator.core import engines as engine_table
    from orchestrator.probe import engines

    titles = [r.title for r in engine_table.rows() if r.found == "build"]
    sheet = Sheet(
        f"{' / '.join(titles)} builds",
        (Col("route"), Col("build", wrap=True), Col("runs", wrap=True)),
    )
    for route, build, problem, cpu_backends in engines.build_rows(profile):
        sheet.add_row(
            route,
            build.label,
            Text(f"no: {problem}", style="bold red") if problem else f"yes ({cpu_backends})",
        )
    return [sheet] if sheet.rows else []


def ep_device_sheets(profile: HardwareProfile) -> list[Sheet]:
    """What ``onnxruntime.get_ep_devices()`` listed in each route (after registering the
    plugin EPs installed there), and those plugin packages with what registering gave."""
    from orchestrator.commands.render import Col, Sheet

    found = Sheet(
        "EP devices (onnxruntime.get_ep_devices())",
        (
            Col("route"),
            Col("EP"),
            Col("type"),
            Col("vendor", wrap=True),
            Col("device"),
        ),
    )
    plugins = Sheet("plugin EPs", (Col("route"), Col("package"), Col("status", wrap=True)))
    for r in profile.routes:
        for e in r.ep_devices or []:
            detail = e.ep_metadata.get("ov_device") or f"0x{e.device_id:04x}"
            found.add_row(
                r.name,
                e.ep_name.removesuffix("ExecutionProvider"),
                e.device_type,
                f"{e.vendor} (0x{e.vendor_id:04x})",
                detail,
            )
        for p in r.plugin_eps or []:
            status = f"{p.status}, {p.devices} device{'s' if p.devices != 1 else ''}"
            if p.error:
                status += f": {p.error}"
            plugins.add_row(r.name, f"{p.package}\n{p.version or ''}".strip(), status)
    return [sheet for sheet in (found, plugins) if sheet.rows]


def print_profile(profile: HardwareProfile, console: Console | None = None) -> None:
    from orchestrator.core.console import make_console

    (console or make_console()).print(profile_view(profile))
