"""Per-item cost of an edge between nodes against the same edge within one node, in one run.

    python bench/cluster.py [--items 200] [--repeat 3] [--json FILE]

Starts its own two-node Ray cluster on this machine (a head and a second node,
each ``ray start --block`` with its own temp directory, ``omni_edge_node_<name>``
resources and token authentication), and stops it at the end, whatever happens.
Both nodes share this machine, so what a cross-node edge costs here is Ray's
serialization, object transfer between two object stores and scheduling, not
a network: the figure is a floor for a real LAN.

The edge is the runtime's own path (``orchestrator/runtime/runtime.py``): a
producer actor's streaming generator (``num_returns="streaming"``, backpressure
16) read by this driver, each item handed to a consumer actor with one call.
The consumer is on the head (beside the driver) in both variants; the producer
is on the head ("within one node") or on the second node ("across nodes"). Two
payloads: a text delta (a few bytes, inlined by Ray) and a voice's audio chunk
(4 s of float32 at 22,050 Hz, 352,800 bytes, in the object store). Reported:
median per-item milliseconds over ``--repeat`` interleaved repetitions (after
one warm-up each), and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

AUDIO_BYTES = 4 * 22050 * 4
TEXT = "The Moon is about 384,400 km away. "
START_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TwoNodes:
    """A head and a second node on this machine (token auth, own temp dirs), stopped on exit."""

    def __init__(self) -> None:
        from orchestrator.runtime.cluster import node_start_resources

        self.base = Path(tempfile.mkdtemp(prefix="oe-bench-2n-", dir="/tmp"))
        token = self.base / "auth" / "token"
        token.parent.mkdir(mode=0o700)
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(token),
            RAY_USAGE_STATS_ENABLED="0",
            RAY_enable_metrics_collection="0",
        )
        self.port = _free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self._resources = node_start_resources

    def start(self) -> str:
        for name, head in (("head", True), ("second", False)):
            log = self.base / f"{name}.log"
            args = [
                str(Path(sys.executable).parent / "ray"),
                "start",
                "--block",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=1",
                f"--resources={json.dumps(self._resources(name, ['cpu']))}",
                f"--temp-dir={self.base / name}",
                "--object-store-memory=150000000",
                "--disable-usage-stats",
                f"--dashboard-agent-listen-port={_free_port()}",
                f"--dashboard-agent-grpc-port={_free_port()}",
                f"--metrics-export-port={_free_port()}",
                f"--runtime-env-agent-port={_free_port()}",
            ]
            args += (
                [
                    "--head",
                    f"--port={self.port}",
                    "--include-dashboard=false",
                    f"--ray-client-server-port={_free_port()}",
                    f"--dashboard-port={_free_port()}",
                ]
                if head
                else [f"--address=127.0.0.1:{self.port}"]
            )
            with log.open("wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        args,
                        env=self.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            deadline = time.monotonic() + START_TIMEOUT_S
            while "Ray runtime started" not in log.read_text(errors="replace"):
                if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the {name} node did not start:\n{log.read_text(errors='replace')[-2000:]}"
                    )
                time.sleep(0.5)
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        import psutil

        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for p in psutil.process_iter(["cmdline"]):  # workers that left their node's process group
            try:
                if p.pid != os.getpid() and (
                    str(self.base) in " ".join(p.info["cmdline"] or [])
                    or any(f.path.startswith(str(self.base)) for f in p.open_files())
                ):
                    p.kill()
            except (psutil.Error, OSError):
                pass
        shutil.rmtree(self.base, ignore_errors=True)


def measure(items: int, repeat: int) -> dict[str, Any]:
    import numpy as np
    import ray

    from orchestrator.runtime.cluster import node_resource

    @ray.remote(num_cpus=0)
    class Producer:
        def stream(self, n: int, kind: str) -> Any:
            audio = np.zeros(AUDIO_BYTES // 4, np.float32)
            for i in range(n):
                yield {"audio": audio, "sample_rate": 22050} if kind == "audio" else f"{TEXT}{i}"

    @ray.remote(num_cpus=0)
    class Consumer:
        async def feed(self, item: Any) -> int:
            return len(item) if isinstance(item, str) else int(item["audio"].nbytes)

    head, second = node_resource("head"), node_resource("second")
    consumer = Consumer.options(resources={head: 0.001}).remote()  # type: ignore[attr-defined]
    producers = {
        "within one node": Producer.options(resources={head: 0.001}).remote(),  # type: ignore[attr-defined]
        "across nodes": Producer.options(resources={second: 0.001}).remote(),
    }  # type: ignore[attr-defined]

    async def edge(producer: Any, n: int, kind: str) -> float:
        t0 = time.perf_counter()
        gen = producer.stream.options(
            num_returns="streaming", _generator_backpressure_num_objects=16
        ).remote(n, kind)
        async for ref in gen:
            await consumer.feed.remote(await ref)
        return (time.perf_counter() - t0) / n * 1000.0

    out: dict[str, Any] = {"items": items, "repeat": repeat, "audio_bytes": AUDIO_BYTES, "rows": {}}
    for kind in ("text", "audio"):
        per: dict[str, list[float]] = {k: [] for k in producers}
        for p in producers.values():  # warm-up: workers, connections, first transfers
            asyncio.run(edge(p, max(10, items // 10), kind))
        for _ in range(repeat):
            for where, p in producers.items():
                per[where].append(asyncio.run(edge(p, items, kind)))
        within, across = (
            statistics.median(per["within one node"]),
            statistics.median(per["across nodes"]),
        )
        out["rows"][kind] = {
            "within_ms": round(within, 3),
            "across_ms": round(across, 3),
            "ratio": round(across / within, 2),
            "runs": per,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=200, help="items per timed run (default 200)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="timed runs per variant, interleaved (default 3)"
    )
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    nodes = TwoNodes()
    try:
        address = nodes.start()
        os.environ.update({k: v for k, v in nodes.env.items() if k.startswith("RAY_")})
        import ray

        ray.init(address=address, logging_level=logging.ERROR, include_dashboard=False)
        result = measure(args.items, args.repeat)
        ray.shutdown()
    finally:
        nodes.stop()
    print(
        f"per-item cost of one edge, {args.items} items x {args.repeat} runs (medians), "
        f"two Ray nodes on this machine"
    )
    print(f"{'payload':<26}{'within one node':>17}{'across nodes':>14}{'ratio':>8}")
    for kind, row in result["rows"].items():
        label = "text delta (~40 B)" if kind == "text" else f"audio chunk ({AUDIO_BYTES:,} B)"
        print(
            f"{label:<26}{row['within_ms']:>14.3f} ms{row['across_ms']:>11.3f} ms{row['ratio']:>7.2f}x"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
