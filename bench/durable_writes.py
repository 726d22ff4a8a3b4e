"""Durable writes: what fsync costs the measurement store and the run record, side by side.

    python bench/durable_writes.py [--writes 50] [--samples 50] [--dir DIR] [--json FILE]

Each write is one that omni-edge makes when a run ends, through the code that makes it:

* **calibration store**: ``CalibrationStore.record`` — under the store's lock, read the
  entry, add a sample, rewrite the whole entry atomically (the entry holds ``--samples``
  samples, 50 by default: a full entry, the largest the store keeps);
* **run record**: ``record.write`` of a document the size of the default pipeline's run
  record (about 24 KB) into a records directory, under a name of its own.

Each is timed durable (the file fsynced before its rename, the directory after: what
``orchestrator.core.fileio`` does by default) and not (``durable=False``, the switch the caches
use), the two alternating write by write, in one process, on one file system: ``--dir``,
by default a temporary directory under the omni-edge cache, where the stores live (``/tmp``
may be a RAM file system, on which fsync costs nothing). Printed: the median and the 90th
percentile per write of each, and what durability adds (difference and ratio of the
medians). Timings on a shared machine move from run to run: run it more than once.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator import calibration as cal  # noqa: E402
from orchestrator import calibration_store  # noqa: E402
from orchestrator.core import fileio, settings  # noqa: E402
from orchestrator.core.units import MiB  # noqa: E402
from orchestrator.runtime import record as rec  # noqa: E402

RECORD_BYTES = 24 * 1024
"""About the size of a run record of configs/voice-assistant.yaml (24,588 bytes measured)."""


def record_doc() -> dict[str, Any]:
    """A document shaped like a run record, about ``RECORD_BYTES`` once written."""
    stage = {
        "stage": "voice",
        "device": "cpu",
        "backend": "ort-openvino",
        "budget_bytes": 1_600_000_000,
        "measured_peak_bytes": 577_000_000,
        "load_info": {"session_options": {f"option_{i}": i for i in range(20)}},
    }
    doc: dict[str, Any] = {
        "format": rec.RUN_FORMAT,
        "pipeline": "bench",
        "stages": [stage, {**stage, "stage": "thinker", "backend": "llamacpp-cpu"}],
        "requests": [{"prompt": "Tell me one fact about the Moon.", "text": "x" * 400}],
        "plan": {"notes": []},
    }
    while len(json.dumps(doc, indent=2)) < RECORD_BYTES:
        doc["plan"]["notes"].append("a note of the plan, as long as the planner writes them " * 2)
    return doc


def with_durability(module: Any, durable: bool) -> Callable[[], None]:
    """Make ``module``'s ``write_json_atomic`` durable or not; returns the undo."""
    real = fileio.write_json_atomic
    module.write_json_atomic = functools.partial(real, durable=durable)

    def undo() -> None:
        module.write_json_atomic = real

    return undo


def time_writes(write: Callable[[int], None], module: Any, writes: int) -> dict[bool, list[float]]:
    """Seconds per write, durable and not, alternating (each write a fresh one)."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(writes):
        for durable in (True, False) if i % 2 == 0 else (False, True):
            undo = with_durability(module, durable)
            try:
                t0 = time.perf_counter()
                write(2 * i + int(durable))
                times[durable].append(time.perf_counter() - t0)
            finally:
                undo()
    return times


def store_writer(root: Path, samples: int) -> Callable[[int], None]:
    store = cal.CalibrationStore(root / "calibration")
    key = cal.Key("stage", {"kind": "bench"}, label="bench-stage", pipeline="bench")
    for i in range(samples):
        store.record(key, sample(f"seed-{i}"))

    def write(n: int) -> None:
        store.record(key, sample(f"run-{n}"))

    return write


def sample(run: str) -> dict[str, Any]:
    return cal.sample(
        run=run,
        peak=600 * MiB,
        budget=700 * MiB,
        calibrated=True,
        resident=400 * MiB,
        where="bench",
    )


def record_writer(root: Path) -> Callable[[int], None]:
    doc = record_doc()
    directory = root / "runs"

    def write(n: int) -> None:
        rec.write(doc, directory, request_id=f"r{n}")

    return write


def file_system(path: Path) -> str:
    """The type of the file system ``path`` is on (from /proc/mounts), or "?"."""
    best, kind = "", "?"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    real = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) > 2 and real.startswith(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind


def row(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1000, 3),
    }


def run(writes: int, samples: int, directory: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, make, module in (
        ("calibration store", lambda: store_writer(directory, samples), calibration_store),
        ("run record", lambda: record_writer(directory), rec),
    ):
        times = time_writes(make(), module, writes)
        durable, plain = row(times[True]), row(times[False])
        results[name] = {
            "durable": durable,
            "not_durable": plain,
            "added_ms": round(durable["median_ms"] - plain["median_ms"], 3),
            "ratio": round(durable["median_ms"] / plain["median_ms"], 2),
        }
    entry = next((directory / "calibration").glob("*.json"))
    record = next((directory / "runs").glob("*.json"))
    return {
        "format": "omni-edge.bench.durable-writes/1",
        "dir": str(directory),
        "file_system": file_system(directory),
        "writes": writes,
        "entry_bytes": entry.stat().st_size,
        "record_bytes": record.stat().st_size,
        "results": results,
    }


def print_report(doc: dict[str, Any]) -> None:
    print(f"durable writes in {doc['dir']} ({doc['file_system']}), {doc['writes']} writes each,")
    print("durable and not alternating; milliseconds per write")
    print(f"{'write':<34} {'fsync':>5} {'median':>8} {'p90':>8}")
    print("─" * 58)
    sizes = {
        "calibration store": f"{doc['entry_bytes'] / 1024:.0f} KB entry",
        "run record": f"{doc['record_bytes'] / 1024:.0f} KB",
    }
    for name, r in doc["results"].items():
        label = f"{name} ({sizes[name]})"
        for fsync, key in (("yes", "durable"), ("no", "not_durable")):
            print(f"{label:<34} {fsync:>5} {r[key]['median_ms']:>8.2f} {r[key]['p90_ms']:>8.2f}")
            label = ""
    print("─" * 58)
    for name, r in doc["results"].items():
        print(f"durability adds {r['added_ms']:.2f} ms to a {name} write (x{r['ratio']:.1f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=50, help="writes of each kind (default 50)")
    parser.add_argument(
        "--samples",
        type=int,
        default=cal.MAX_SAMPLES,
        help="samples in the entry (default: a full one)",
    )
    parser.add_argument(
        "--dir", help="where to write (default: a temporary directory in the cache)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.dir:
        directory = Path(args.dir)
        directory.mkdir(parents=True, exist_ok=True)
        doc = run(args.writes, args.samples, Path(tempfile.mkdtemp(dir=directory)))
    else:
        settings.cache_root().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="bench-durable-", dir=settings.cache_root()) as tmp:
            doc = run(args.writes, args.samples, Path(tmp))
    print_report(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
