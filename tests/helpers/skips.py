"""Why a test skipped, and the switch that makes a skip for something missing fail.

Every skip falls in one of four classes, read from its reason's prefix:

* ``platform:`` — an operating system or interpreter this machine is not (no ``/proc``,
  no ``fcntl``, not Linux, Python < 3.11): nothing to build here would make it run;
* ``capability:`` — hardware this machine measurably lacks (an EP that exposes no device
  for this CPU's vendor, an int8 graph whose error on this CPU is over the exporter's
  ceiling): the set-up ran and the machine answered no;
* ``excluded:`` — a case the suite cannot run inside itself (the README's test command
  would run the suite again, this test included);
* ``missing:`` — an asset, toolchain or route that a set-up step should have made (a
  graph in ``exports/``, ``.venvs/openvino``, llama-cpp-python, chromium, the package
  index). **Any reason without one of the three prefixes above is this class**, so a
  bare ``pytest.skip``, ``pytest.importorskip`` or ``skipif`` counts as missing.

With ``--require-assets`` (``scripts/test.sh`` passes it) a missing-class skip fails its
test, naming what is missing; the other three stay skips. Every run ends with the skips
counted by class and reason. docs/testing.md, *Skips*, says which class to use.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, NoReturn

import pytest

OPTION = "--require-assets"
PLATFORM, CAPABILITY, EXCLUDED, MISSING = "platform", "capability", "excluded", "missing"
LEGITIMATE = (PLATFORM, CAPABILITY, EXCLUDED)
"""The classes that stay skips under ``--require-assets``."""


def reason(kind: str, text: str) -> str:
    """A skip reason of class ``kind`` (one of the four above)."""
    assert kind in (*LEGITIMATE, MISSING), kind
    return f"{kind}: {text}"


def classify(text: str) -> tuple[str, str]:
    """``(class, reason without its prefix)``: an unprefixed reason is ``missing``."""
    text = text.removeprefix("Skipped: ")
    kind, sep, rest = text.partition(": ")
    if sep and kind in (*LEGITIMATE, MISSING):
        return kind, rest
    return MISSING, text


def skip_missing(what: str) -> NoReturn:
    """Skip for an asset, toolchain or route a set-up step makes (fails under the switch);
    ``what`` names it and how to make it."""
    __tracebackhide__ = True  # the skip is located at the caller
    pytest.skip(reason(MISSING, what))


def skip_platform(why: str) -> NoReturn:
    """Skip on an operating system or interpreter this test cannot run on."""
    __tracebackhide__ = True  # the skip is located at the caller
    pytest.skip(reason(PLATFORM, why))


def skip_capability(why: str) -> NoReturn:
    """Skip where this machine measurably lacks the hardware (say what was measured)."""
    __tracebackhide__ = True  # the skip is located at the caller
    pytest.skip(reason(CAPABILITY, why))


def needs_path(path: Path, fix: str) -> pytest.MarkDecorator:
    """A ``skipif`` for a built file or directory: missing-class (fails under the switch)."""
    return pytest.mark.skipif(not path.exists(), reason=reason(MISSING, f"{path} ({fix})"))


def only_where(condition: bool, why: str) -> pytest.MarkDecorator:
    """A ``skipif`` for a platform: runs only where ``condition`` holds."""
    return pytest.mark.skipif(not condition, reason=reason(PLATFORM, why))


# ---- the plugin (tests/conftest.py loads it) --------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        action="store_true",
        help="fail a test that skips for a missing asset, toolchain or route (scripts/test.sh "
        "sets it); skips for another platform, a capability this machine lacks, or a case "
        "excluded by design stay skips (tests/helpers/skips.py)",
    )


def _skip_text(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _where(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return f"{longrepr[0]}:{longrepr[1]}"
    return report.nodeid


def _judge(config: pytest.Config, report: pytest.TestReport | pytest.CollectReport) -> None:
    """Count a skip; under the switch, turn a missing-class skip into a failure."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    kind, text = classify(_skip_text(report))
    counts: Counter[tuple[str, str]] = config.stash.setdefault(_COUNTS, Counter())
    counts[(kind, text)] += 1
    if kind == MISSING and config.getoption(OPTION):
        report.outcome = "failed"
        report.longrepr = (
            f"missing: {text}\n  (a skip at {_where(report)})\n"
            f"{OPTION} (scripts/test.sh) fails a skip for a missing asset, toolchain or route: "
            "make it (scripts/bootstrap.sh) or, where the machine cannot have it, classify the "
            "skip (docs/testing.md, Skips)"
        )


_COUNTS = pytest.StashKey[Counter[tuple[str, str]]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    _judge(item.config, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    report = yield
    _judge(collector.config, report)
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    counts = config.stash.get(_COUNTS, Counter())
    if not counts:
        return
    strict = config.getoption(OPTION)
    by_kind = Counter[str]()
    for (kind, _), n in counts.items():
        by_kind[kind] += n
    terminalreporter.section("skips by reason")
    terminalreporter.line(
        f"{sum(by_kind.values())} skipped: "
        + ", ".join(f"{by_kind[k]} {k}" for k in (*LEGITIMATE, MISSING) if by_kind[k])
        + (f" (missing ones failed: {OPTION})" if strict and by_kind[MISSING] else "")
    )
    order = {k: i for i, k in enumerate((MISSING, *LEGITIMATE))}
    for (kind, text), n in sorted(counts.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        terminalreporter.line(f"{n:4d} {kind:<10} {text}")
