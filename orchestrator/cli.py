"""The ``omni-edge`` command line: builds the parser, runs one command, maps errors to exit codes.

* **Commands.** :data:`COMMANDS` names each subcommand and its one-line help.
  :func:`build_parser` imports every command module,
  ``orchestrator/commands/<name>.py`` (``import_.py`` for ``import``, a Python
  keyword), and lets its ``add_arguments(parser)`` declare the flags; so each
  module imports at its top only what its parser needs, and what it needs to
  run inside ``run(args) -> int`` (``omni-edge plan`` must not import the
  runtime, verify or the renderer). A command module that is absent from this
  build leaves its subcommand in the help and answers "not available in this
  build" (exit 2).
* **Verbosity.** ``-v`` is counted before and after the subcommand alike
  (``omni-edge -v plan -v`` is ``-vv``): WARNING, INFO, then DEBUG logging.
* **Errors.** :func:`main` turns what a command raises into a message on
  stderr and an exit code, never a traceback: a ``ConfigError`` prints each
  problem (where: what, how to fix; the first :data:`MAX_PROBLEMS_SHOWN`),
  control characters removed from every message. Before a command runs, the
  optional packages its ``needs(args)`` names are looked for
  (``orchestrator.core.extras``): a missing one is exit 2 naming the extra.
* **Exit codes** and ``check_number`` (a numeric flag's check) live in
  ``orchestrator.commands.exits``, which the commands import (importing ``cli``,
  which loads them by name, would be a cycle).
"""

from __future__ import annotations

import argparse
import keyword
import logging
import sys
from importlib import import_module

from orchestrator.commands.exits import (
    EXIT_BAD_INPUT,
    EXIT_STAGE_FAILED,
    MAX_PROBLEMS_SHOWN,
)
from orchestrator.core.errors import ConfigError, OmniEdgeError, StageFailed, terminal_text
from orchestrator.core.extras import missing_package, require
from orchestrator.core.packages import installed_version
from stages import cpu_share

COMMANDS = {
    "plan": "Plan a pipeline for this machine (or a recorded profile) without loading anything.",
    "pipelines": "List the shipped pipelines, with what each needs (models, sizes, whether they are here).",
    "pull": "Download the models a pipeline (or one model, by Hub id) reads into the HF cache, after planning it.",
    "probe": "Describe this machine as a hardware profile (devices, pools, routes).",
    "verify": "Run the coverage and numeric gates a plan needs; write the evidence.",
    "run": "Run a pipeline: plan, start the Ray runtime, stream a request through it.",
    "serve": "Serve a started pipeline over an OpenAI-compatible HTTP API until SIGINT/SIGTERM.",
    "chat": "Chat with a pipeline (started here, or a running serve via --url), keeping the history.",
    "stages": "List the stage kinds and exported artifacts this installation knows, with where each came from.",
    "import": "Convert another project's pipeline config (vLLM-Omni stage_args or deploy YAML) into an omni-edge config.",
    "export": "Export a PyTorch module, a transformers model or an ONNX file as a validated artifact (docs/export.md).",
    "calibration": "Show the measured budgets this machine keeps for each stage (their history), or reset them.",
}


def _version() -> str:
    return installed_version("omni-edge") or "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni-edge",
        description="Plan multi-stage omni pipelines onto GPU, CPU, iGPU and NPU before anything loads, then run them.",
        epilog="Exit codes: 0 ok/admitted, 2 bad input, 3 refused, 4 a stage failed.",
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    # -v also after the subcommand (`omni-edge plan -v cfg`): each subparser
    # counts into its own destination, added to the top-level count in
    # main(), so `omni-edge -v plan -v` is -vv rather than the subparser's
    # count overwriting the top-level one.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        dest="verbose_after",
        action="count",
        default=0,
        help="more logging (-vv for debug)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        try:
            module = import_module(f"orchestrator.commands.{name}{'_' * keyword.iskeyword(name)}")
        except ModuleNotFoundError as exc:
            if exc.name != f"orchestrator.commands.{name}{'_' * keyword.iskeyword(name)}":
                raise
            p.set_defaults(_unavailable=name)
            continue
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def _run_command(args: argparse.Namespace) -> int:
    """The command's ``run(args)``, after the optional packages its ``needs(args)`` names
    are found (``orchestrator.core.extras``: exit 2 naming the extra, before any slow work);
    an optional package missing deeper in is said the same way, never as a traceback."""
    cpu_share.policy()  # a bad OMNI_EDGE_CPU_SHARE is refused here, not in a device actor
    needs = getattr(args._module, "needs", None)
    if needs is not None:
        require(args.command, tuple(needs(args)))
    try:
        return int(args._module.run(args))
    except ModuleNotFoundError as exc:
        error = missing_package(args.command, exc)
        if error is None:
            raise
        raise error from exc


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    verbosity = args.verbose + getattr(args, "verbose_after", 0)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbosity, 2),
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    if getattr(args, "_unavailable", None):
        print(f"omni-edge {args.command}: not available in this build", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return _run_command(args)
    except ConfigError as exc:
        print("error: the input cannot be used:", file=sys.stderr)
        for problem in exc.problems[:MAX_PROBLEMS_SHOWN]:
            for line in problem.lines():
                print(f"  {line}", file=sys.stderr)
        hidden = len(exc.problems) - MAX_PROBLEMS_SHOWN
        if hidden > 0:
            print(
                f"  … and {hidden} more problem{'s' if hidden > 1 else ''} (fix these first)",
                file=sys.stderr,
            )
        return EXIT_BAD_INPUT
    except StageFailed as exc:
        print(terminal_text(f"error: {exc}"), file=sys.stderr)
        return EXIT_STAGE_FAILED
    except OmniEdgeError as exc:
        print(terminal_text(f"error: {exc}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
