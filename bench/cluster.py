"""Per-item cost of one edge between stages, three ways an item can cross, in one run.

    python bench/cluster.py [--nodes 2|3] [--items 200] [--repeat 3] [--json FILE]

Starts its own Ray cluster on this machine (a head, a second node and with
``--nodes 3`` a third, each ``ray start --block`` with its own temp directory,
``omni_edge_node_<name>`` resources and token authentication), and stops it at
the end, whatever happens. The nodes share this machine, so what a cross-node
edge costs here is Ray's serialization, object transfer between object stores
and scheduling, not a network: the figures are a floor for a real LAN.

An edge is a producer actor yielding items and a consumer actor taking each
with one awaited ``feed`` call (both asyncio actors, as the runtime's device
actors are: ``orchestrator/runtime/device_actor.py``), timed three ways:

* ``relay``: the runtime's path today (``orchestrator/runtime/runtime.py``):
  the producer's streaming generator (``num_returns="streaming"``,
  backpressure 16) is read by this driver, which resolves each item and hands
  it to the consumer (``consumer.feed.remote(item)``);
* ``relay-ref``: the driver reads the generator but forwards each ObjectRef
  unresolved (``consumer.feed.remote(ref)``), so a large item's bytes go from
  the producer's object store to the consumer's without passing the driver;
* ``direct``: the producer is given the consumer's actor handle and awaits
  ``consumer.feed.remote(item)`` per item itself; the driver only awaits the
  producer's end.

Layouts: with two nodes, the consumer beside the driver on the head and the
producer on the head ("within one node") or on the second node ("across
nodes"); with three nodes, driver on the head, producer on the second,
consumer on the third (the relay makes a crossing item cross twice). Two
payloads: a text delta (a few bytes, inlined by Ray) and a voice's audio chunk
(4 s of float32 at 22,050 Hz, 352,800 bytes, in the object store). Reported:
per-item milliseconds and the driver process's CPU milliseconds per item
(``time.process_time()`` over the run, all its threads, Ray's included), each
the median of ``--repeat`` interleaved repetitions (after one warm-up each),
and their ratio to the relay's.

Not measured: Ray's compiled graphs and ``ray.experimental.channel``, which
cannot carry the runtime's graph (docs.ray.io, ray-core/compiled-graph, and
``ray/dag/compiled_dag_node.py`` of Ray 2.60): a compiled graph is one static
DAG with exactly one ``InputNode`` that yields one value per node per
``execute()``, with no streaming generators, while a stage yields a variable
number of items per request and a request may enter at any stage; a channel
holds one value (no queue); and a failed task tears the whole graph down,
where the runtime must keep the other stages serving.
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
"""A voice's chunk: 4 s of float32 at 22,050 Hz (Piper's rate), in bytes."""
TEXT = "The Moon is about 384,400 km away. "
START_TIMEOUT_S = 120.0
GENERATOR_BACKPRESSURE = 16
"""Items a producer may run ahead of the driver: the runtime's own bound
(``_generator_backpressure_num_objects`` in orchestrator/runtime/runtime.py)."""
MODES = ("relay", "relay-ref", "direct")
NODE_NAMES = ("head", "second", "third")
LAYOUTS: dict[int, dict[str, tuple[str, str]]] = {
    2: {"within one node": ("head", "head"), "across nodes": ("second", "head")},
    3: {"across, via the driver's node": ("second", "third")},
}
"""Per node count: layout name → (producer's node, consumer's node); the driver is on the head."""
PAYLOADS = {"text": "text delta (~40 B)", "audio": f"audio chunk ({AUDIO_BYTES:,} B)"}


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: every socket is held open until all are picked, so the
    kernel cannot hand one port out twice (two services given one port fail ``ray start``)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


class Nodes:
    """A head and one or two more nodes on this machine (token auth, own temp dirs),
    stopped on exit."""

    def __init__(self, count: int) -> None:
        from orchestrator.runtime.cluster import node_start_resources

        self.names = NODE_NAMES[:count]
        self.base = Path(tempfile.mkdtemp(prefix=f"oe-bench-{count}n-", dir="/tmp"))
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
        self._ports = iter(_free_ports(3 + 4 * count))  # the head: its port and 2 more; 4 per node
        self.port = next(self._ports)
        self.procs: list[subprocess.Popen[bytes]] = []
        self._resources = node_start_resources

    def start(self) -> str:
        for name in self.names:
            head = name == "head"
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
                f"--dashboard-agent-listen-port={next(self._ports)}",
                f"--dashboard-agent-grpc-port={next(self._ports)}",
                f"--metrics-export-port={next(self._ports)}",
                f"--runtime-env-agent-port={next(self._ports)}",
            ]
            args += (
                [
                    "--head",
                    f"--port={self.port}",
                    "--include-dashboard=false",
                    f"--ray-client-server-port={next(self._ports)}",
                    f"--dashboard-port={next(self._ports)}",
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


def measure(nodes: int, items: int, repeat: int) -> dict[str, Any]:
    import numpy as np
    import ray

    from orchestrator.runtime.cluster import node_resource

    def item(kind: str, i: int, audio: Any) -> Any:
        return {"audio": audio, "sample_rate": 22050} if kind == "audio" else f"{TEXT}{i}"

    @ray.remote(num_cpus=0)
    class Producer:
        async def stream(self, n: int, kind: str) -> Any:
            audio = np.zeros(AUDIO_BYTES // 4, np.float32)
            for i in range(n):
                yield item(kind, i, audio)

        async def push(self, n: int, kind: str, consumer: Any) -> int:
            audio = np.zeros(AUDIO_BYTES // 4, np.float32)
            for i in range(n):
                await consumer.feed.remote(item(kind, i, audio))
            return n

    @ray.remote(num_cpus=0)
    class Consumer:
        async def feed(self, got: Any) -> int:
            return len(got) if isinstance(got, str) else int(got["audio"].nbytes)

    def on(node: str) -> dict[str, Any]:
        return {"resources": {node_resource(node): 0.001}}

    layouts = {
        name: (Producer.options(**on(p)).remote(), Consumer.options(**on(c)).remote())  # type: ignore[attr-defined]
        for name, (p, c) in LAYOUTS[nodes].items()
    }

    async def edge(producer: Any, consumer: Any, mode: str, n: int, kind: str) -> None:
        if mode == "direct":
            await producer.push.remote(n, kind, consumer)
            return
        gen = producer.stream.options(
            num_returns="streaming", _generator_backpressure_num_objects=GENERATOR_BACKPRESSURE
        ).remote(n, kind)
        async for ref in gen:
            await consumer.feed.remote(await ref if mode == "relay" else ref)

    def run(layout: str, mode: str, n: int, kind: str) -> tuple[float, float]:
        """Per-item wall ms and driver CPU ms of one run of ``n`` items."""
        t0, c0 = time.perf_counter(), time.process_time()
        asyncio.run(edge(*layouts[layout], mode, n, kind))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return wall / n * 1000.0, cpu / n * 1000.0

    ms: dict[tuple[str, str, str], list[float]] = {}
    cpu: dict[tuple[str, str, str], list[float]] = {}
    cases = [(layout, mode) for layout in layouts for mode in MODES]
    for kind in PAYLOADS:
        for case in cases:  # warm-up: workers, connections, first transfers
            run(*case, max(10, items // 10), kind)
        for _ in range(repeat):
            for layout, mode in cases:
                wall_ms, cpu_ms = run(layout, mode, items, kind)
                ms.setdefault((layout, kind, mode), []).append(wall_ms)
                cpu.setdefault((layout, kind, mode), []).append(cpu_ms)
    return summarise(nodes, items, repeat, ms, cpu)


def summarise(
    nodes: int,
    items: int,
    repeat: int,
    ms: dict[tuple[str, str, str], list[float]],
    cpu: dict[tuple[str, str, str], list[float]],
) -> dict[str, Any]:
    """Medians and ratios to the relay of the runs' per-item ms and driver CPU ms, keyed
    (layout, payload, mode); with two nodes also the relay within one node against across
    nodes (``rows``, the cluster work's first figure)."""
    out: dict[str, Any] = {
        "nodes": nodes,
        "items": items,
        "repeat": repeat,
        "audio_bytes": AUDIO_BYTES,
        "layouts": {
            name: {"producer": p, "consumer": c} for name, (p, c) in LAYOUTS[nodes].items()
        },
        "results": {},
    }
    for layout in LAYOUTS[nodes]:
        for kind in PAYLOADS:
            base_ms = statistics.median(ms[(layout, kind, "relay")])
            base_cpu = statistics.median(cpu[(layout, kind, "relay")])
            for mode in MODES:
                m = statistics.median(ms[(layout, kind, mode)])
                c = statistics.median(cpu[(layout, kind, mode)])
                out["results"].setdefault(layout, {}).setdefault(kind, {})[mode] = {
                    "ms_per_item": round(m, 3),
                    "driver_cpu_ms_per_item": round(c, 3),
                    "ms_vs_relay": round(m / base_ms, 2),
                    "cpu_vs_relay": round(c / base_cpu, 2) if base_cpu else None,
                    "runs_ms": [round(x, 3) for x in ms[(layout, kind, mode)]],
                    "runs_cpu_ms": [round(x, 3) for x in cpu[(layout, kind, mode)]],
                }
    if nodes == 2:
        res = out["results"]
        out["rows"] = {}
        for kind in PAYLOADS:
            within = res["within one node"][kind]["relay"]["ms_per_item"]
            across = res["across nodes"][kind]["relay"]["ms_per_item"]
            out["rows"][kind] = {
                "within_ms": within,
                "across_ms": across,
                "ratio": round(across / within, 2),
            }
    return out


def render(result: dict[str, Any]) -> str:
    """The figures as text, 80 columns."""
    lines = [
        f"one edge, {result['items']} items x {result['repeat']} runs (medians); "
        f"{result['nodes']} Ray nodes here",
        "ms/item: wall time; driver CPU: the driver process's CPU ms per item",
    ]
    for layout, per_kind in result["results"].items():
        where = result["layouts"][layout]
        lines += [
            "",
            f"{layout}: producer on {where['producer']}, consumer on {where['consumer']}",
            f"{'payload':<26}{'mode':<11}{'ms/item':>9}{'x relay':>9}"
            f"{'driver CPU':>13}{'x relay':>9}",
        ]
        for kind, modes in per_kind.items():
            for i, (mode, r) in enumerate(modes.items()):
                label = PAYLOADS[kind] if i == 0 else ""
                cpu_ratio = "-" if r["cpu_vs_relay"] is None else f"{r['cpu_vs_relay']:.2f}x"
                lines.append(
                    f"{label:<26}{mode:<11}{r['ms_per_item']:>9.3f}{r['ms_vs_relay']:>8.2f}x"
                    f"{r['driver_cpu_ms_per_item']:>10.3f} ms{cpu_ratio:>9}"
                )
    if "rows" in result:
        lines += ["", "relay: within one node against across nodes"]
        lines.append(f"{'payload':<26}{'within one node':>17}{'across nodes':>14}{'ratio':>8}")
        for kind, row in result["rows"].items():
            lines.append(
                f"{PAYLOADS[kind]:<26}{row['within_ms']:>14.3f} ms"
                f"{row['across_ms']:>11.3f} ms{row['ratio']:>7.2f}x"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--nodes",
        type=int,
        choices=sorted(LAYOUTS),
        default=2,
        help="2: within one node against across nodes; 3: producer and consumer on two "
        "nodes other than the driver's (default 2)",
    )
    ap.add_argument("--items", type=int, default=200, help="items per timed run (default 200)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="timed runs per variant, interleaved (default 3)"
    )
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    if args.items < 1 or args.repeat < 1:
        ap.error(f"--items ({args.items}) and --repeat ({args.repeat}) must be at least 1")
    nodes = Nodes(args.nodes)
    try:
        address = nodes.start()
        os.environ.update({k: v for k, v in nodes.env.items() if k.startswith("RAY_")})
        import ray

        ray.init(address=address, logging_level=logging.ERROR, include_dashboard=False)
        result = measure(args.nodes, args.items, args.repeat)
        ray.shutdown()
    finally:
        nodes.stop()
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
