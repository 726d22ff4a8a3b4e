"""A route worker over its memory limit is replaced between calls (``WorkerSessions.recycle_limit``).

OpenVINO's CPU plugin keeps memory for every new shape, so the voice's worker
grows without bound (docs/calibration.md); the session host bounds it by
starting a fresh worker that reopens the same sessions. These tests use a real
worker (this venv's interpreter as a route, the CPU EP) and a limit of one
byte, so every call after the first recycles.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.core.errors import StageFailed
from orchestrator.ort.sessions import RecycleFailed, ResolvedRoute, WorkerSessions
from stages.exported_graph.runner import RECYCLE_HEADROOM_FRACTION, RECYCLE_HEADROOM_MIN
from tests.helpers.waiting import NEVER_HANGS_S, wait_until

pytestmark = pytest.mark.ort

WEIGHT = np.arange(16, dtype=np.float32).reshape(4, 4) / 7.0


def _matmul_graph(path: Path) -> Path:
    """y = x @ x (any square size: a big x makes a call last) and z = x[:4,:4] @ WEIGHT."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper, save

    starts, ends = (
        numpy_helper.from_array(np.array([0, 0], np.int64), "starts"),
        numpy_helper.from_array(np.array([4, 4], np.int64), "ends"),
    )
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["x", "x"], ["y"]),
            h.make_node("Slice", ["x", "starts", "ends"], ["corner"]),
            h.make_node("MatMul", ["corner", "w"], ["z"]),
        ],
        "square",
        [h.make_tensor_value_info("x", T.FLOAT, ["n", "n"])],
        [
            h.make_tensor_value_info("y", T.FLOAT, ["n", "n"]),
            h.make_tensor_value_info("z", T.FLOAT, [4, 4]),
        ],
        initializer=[numpy_helper.from_array(WEIGHT, "w"), starts, ends],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, path)
    return path


def _spec(graph: Path) -> dict[str, Any]:
    return {
        "graph": str(graph),
        "providers": ["CPUExecutionProvider"],
        "provider_options": [{}],
        "session_options": {},
        "session_config": {},
    }


@pytest.fixture
def host(tmp_path: Path) -> Any:
    h = WorkerSessions(ResolvedRoute("plain", "interpreter", sys.executable))
    yield h
    h.shutdown()


def test_a_worker_over_its_limit_is_replaced_between_calls_with_the_same_sessions(
    tmp_path: Path, host: Any
) -> None:
    graph = _matmul_graph(tmp_path / "square.onnx")
    opened = host.open(_spec(graph))
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    first = host.run(opened["handle"], {"x": x})["outputs"]
    pid0 = host.pid
    assert host.recycles == 0
    host.recycle_limit = 1  # any worker is over one byte
    second = host.run(opened["handle"], {"x": x})["outputs"]
    assert host.recycles == 1 and host.pid != pid0
    third = host.run(opened["handle"], {"x": x})["outputs"]
    assert host.recycles == 2
    for out in (second, third):
        assert np.array_equal(out["y"], first["y"]) and np.array_equal(out["z"], first["z"])
    np.testing.assert_allclose(first["z"], x[:4, :4] @ WEIGHT, rtol=1e-5)
    # the old workers are gone, not left holding memory
    import psutil

    assert not psutil.pid_exists(pid0) or psutil.Process(pid0).status() == psutil.STATUS_ZOMBIE


class _SpyLock:
    """The host's lock, noting which threads asked for it (to see a call wait its turn)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.asked: list[int] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.asked.append(threading.get_ident())
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_call_in_flight_is_not_cut_by_a_recycle_the_next_call_asked_for(
    tmp_path: Path, host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Call A is held in flight by construction: its worker is stopped (SIGSTOP) just before A
    is sent, so A cannot end, on any CPU, until call B is waiting for the host; only then does
    the worker continue. B asked for a recycle (the worker is over its limit) and must wait."""
    import os
    import signal

    graph = _matmul_graph(tmp_path / "square.onnx")
    handle = host.open(_spec(graph))["handle"]
    small = np.eye(4, dtype=np.float32)
    host.run(handle, {"x": small})
    host.recycle_limit = 1
    a_x = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    lock = _SpyLock()
    host._lock = lock
    sent_a = threading.Event()
    order: list[str] = []
    call_locked = host._call_locked

    def holding_a(op: str, args: dict[str, Any], timeout: float) -> Any:
        if op == "run" and args["feeds"]["x"].shape == a_x.shape:
            os.kill(host.pid, signal.SIGSTOP)  # A's worker (the recycled one) answers nothing
            sent_a.set()
        return call_locked(op, args, timeout)

    monkeypatch.setattr(host, "_call_locked", holding_a)
    got: dict[str, Any] = {}

    def call(name: str, x: Any) -> None:
        try:
            got[name] = host.run(handle, {"x": x})["outputs"]
            order.append(name)
        except Exception as exc:  # pragma: no cover - reported below
            got[f"{name} error"] = exc

    a = threading.Thread(target=call, args=("a", a_x))
    a.start()
    try:
        assert sent_a.wait(NEVER_HANGS_S), "call A never reached its worker"
        assert host.recycles == 1 and lock.locked()  # A recycled, and now runs in the new worker
        pid_a = host.pid
        b = threading.Thread(target=call, args=("b", small))
        b.start()
        wait_until(lambda: b.ident in lock.asked, "call B waiting for the host")
        assert "a" not in got and "b" not in got  # both wait: A on its stopped worker, B on A
    finally:
        os.kill(host.pid, signal.SIGCONT)
    a.join(NEVER_HANGS_S)
    b.join(NEVER_HANGS_S)
    assert not [k for k in got if k.endswith("error")], got
    assert order == ["a", "b"]  # B's recycle came after A's answer, not through it
    np.testing.assert_allclose(got["a"]["y"], a_x @ a_x, rtol=1e-4, atol=1e-4)
    assert host.recycles == 2 and host.pid != pid_a
    np.testing.assert_allclose(got["b"]["z"], small @ WEIGHT, rtol=1e-6)


def test_a_recycle_whose_reopen_fails_raises_recycle_failed_now_and_after(
    tmp_path: Path, host: Any
) -> None:
    graph = _matmul_graph(tmp_path / "square.onnx")
    handle = host.open(_spec(graph))["handle"]
    x = np.eye(4, dtype=np.float32)
    host.run(handle, {"x": x})
    graph.write_bytes(graph.read_bytes()[:100])  # damaged after the load: the reopen cannot read it
    host.recycle_limit = 1
    with pytest.raises(RecycleFailed) as info:
        host.run(handle, {"x": x})
    message = str(info.value)
    assert "over its limit of 0 MiB" in message and "did not reopen its sessions" in message
    assert "open failed in the route" in message
    with pytest.raises(RecycleFailed):  # never silently degraded: every later call says so
        host.run(handle, {"x": x})
    assert host.recycles == 0


def _runner(tmp_path: Path) -> Any:
    from orchestrator.config import parse_config
    from orchestrator.planner import plan_pipeline
    from stages.exported_graph.kind import ExportedGraphKind
    from stages.exported_graph.runner import ExportedGraphRunner
    from tests.helpers.graphs import machine_profile, write_artifact

    artifact = write_artifact(tmp_path / "full", "full")
    config = parse_config(
        {
            "name": "p",
            "stages": [
                {
                    "name": "net",
                    "kind": "exported_graph",
                    "artifact": str(artifact),
                    "devices": ["cpu"],
                    "backends": ["ort-cpu"],
                    "final_output": True,
                    "final_output_type": "tensor",
                }
            ],
        },
        where="t.yaml",
        base_dir=tmp_path,
    )
    plan = plan_pipeline(config, machine_profile(), runtime=False)
    runner = ExportedGraphRunner(
        plan.stage("net"),
        ExportedGraphKind().artifact(config.stage("net")),
        ResolvedRoute("worker", "interpreter", sys.executable),
    )
    runner.load()
    return runner


def _one(runner: Any, rid: str) -> Any:
    import asyncio

    from tests.helpers.graphs import K

    async def items() -> Any:
        yield {"x": np.ones((2, K), np.float32)}

    async def main() -> list[Any]:
        return [x async for x in runner.stream(rid, items())]

    return asyncio.run(main())


def test_the_runner_limits_its_worker_to_the_stage_budget_and_reports_recycles_and_the_new_pid(
    tmp_path: Path, private_cache: Path
) -> None:
    runner = _runner(tmp_path)
    try:
        budget = runner.plan.budget_bytes()
        # recycled before it could pass the budget: the limit sits the headroom below it
        assert runner._host.recycle_limit == budget - max(
            RECYCLE_HEADROOM_MIN, int(RECYCLE_HEADROOM_FRACTION * budget)
        )
        assert (
            0
            < runner.load_info["worker_recycle_limit_bytes"]
            == runner._host.recycle_limit
            < budget
        )
        _one(runner, "r0")
        pids = runner.process_ids()
        assert pids[0] == runner._host.pid
        assert runner.request_stats("r0")["worker_recycles"] == 0
        runner._host.recycle_limit = 1
        assert (
            len(_one(runner, "r1")) == 1
        )  # the worker has run a call and is over the limit: recycled first
        assert runner.request_stats("r1")["worker_recycles"] == 1
        assert runner.process_ids()[0] == runner._host.pid != pids[0]
        graph = tmp_path / "full" / "fp32.onnx"
        graph.write_bytes(graph.read_bytes()[:200])
        with pytest.raises(StageFailed) as info:
            _one(runner, "r2")
        assert (info.value.stage, info.value.device) == ("net", "cpu")
        assert (
            "request r2: RecycleFailed" in info.value.cause and "did not reopen" in info.value.cause
        )
    finally:
        runner.close()


def test_the_rise_of_a_call_is_its_peak_during_the_call_not_what_it_left_behind(
    tmp_path: Path, host: Any
) -> None:
    """What a call allocates and frees before it returns (here its 16 MiB reply, encoded and sent)
    counts in the rise the recycle rule adds to the RSS: judged by what the call left behind, a
    worker at its limit ran past it (1238 MB measured against a 1229 MB budget, in the work on recycled route workers)."""
    from orchestrator.core.memory import peak_rss_of, rss_of

    if peak_rss_of(host.pid) is None:
        pytest.skip("platform: no peak RSS to read here (Linux's /proc/PID/status VmHWM)")
    graph = _matmul_graph(tmp_path / "square.onnx")
    handle = host.open(_spec(graph))["handle"]
    host.recycle_limit = 1 << 50  # measured, never reached
    x = np.random.default_rng(2).standard_normal((2048, 2048)).astype(np.float32)  # y: 16 MiB
    host.run(handle, {"x": x})
    before = rss_of(host.pid)
    host.run(handle, {"x": x})
    left = rss_of(host.pid) - before
    assert host.largest_rise >= left + 12 * 2**20, (host.largest_rise, left)
    assert host.calls == 2 and host.recycles == 0


def test_a_unit_is_recycled_before_it_never_between_its_calls(tmp_path: Path, host: Any) -> None:
    """``WorkerSessions.unit()``: calls that carry state from one to the next (a decoder's cache)
    run in one worker; a worker over its limit is replaced before the unit, not inside it."""
    graph = _matmul_graph(tmp_path / "square.onnx")
    handle = host.open(_spec(graph))["handle"]
    small = np.ones((8, 8), np.float32)
    host.run(handle, {"x": small})
    host.recycle_limit = 1  # any worker is over one byte
    with host.unit():
        pid = host.pid
        for _ in range(3):
            host.run(handle, {"x": small})
        assert host.recycles == 1 and host.pid == pid  # replaced once, before the unit
    host.run(handle, {"x": small})
    assert host.recycles == 2 and host.pid != pid  # and again at the next call outside it


def test_a_unit_rises_as_one_call(tmp_path: Path, host: Any) -> None:
    """What the whole unit rose (here three 16 MiB replies, each freed before the next call) is
    one call's rise."""
    from orchestrator.core.memory import peak_rss_of

    if peak_rss_of(host.pid) is None:
        pytest.skip("platform: no peak RSS to read here (Linux's /proc/PID/status VmHWM)")
    graph = _matmul_graph(tmp_path / "square.onnx")
    handle = host.open(_spec(graph))["handle"]
    host.run(handle, {"x": np.ones((8, 8), np.float32)})
    host.recycle_limit = 1 << 50  # measured, never reached
    rise = host.largest_rise
    big = np.random.default_rng(3).standard_normal((2048, 2048)).astype(np.float32)  # y: 16 MiB
    with host.unit():
        for _ in range(3):
            host.run(handle, {"x": big})
    assert host.largest_rise >= max(rise, 12 * 2**20)


RISE = 2**30
"""A largest call rise the test sets (``expect_rise``): far above what its tiny calls move the
RSS, so near and over the limit are decided by the limit the test picks, not by the calls."""


def test_a_worker_near_its_limit_is_recycled_while_idle_and_the_next_call_does_not_wait(
    tmp_path: Path, host: Any
) -> None:
    """The limit is put between the RSS plus one rise (the next call may still run here) and
    the RSS plus two (near): the worker is recycled with no call in flight, and the next call
    runs in the fresh worker without a recycle of its own."""
    from orchestrator.core.memory import rss_of

    graph = _matmul_graph(tmp_path / "square.onnx")
    handle = host.open(_spec(graph))["handle"]
    x = np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32)
    first = host.run(handle, {"x": x})["outputs"]
    host.expect_rise(RISE)
    host.recycle_limit = rss_of(host.pid) + RISE + RISE // 2
    assert not host.due(1) and host.due(2)
    pid0 = host.pid
    host.run(handle, {"x": x})  # leaves it near its limit: a recycle waits for it to be idle
    wait_until(lambda: host.pid != pid0, "the idle worker recycled")
    wait_until(lambda: host.recycles == 1 and host.idle_recycle.done == 1, "the recycle counted")
    again = host.run(handle, {"x": x})["outputs"]
    assert host.recycles == 1  # the call found the fresh worker: nothing to wait for
    assert np.array_equal(again["y"], first["y"]) and np.array_equal(again["z"], first["z"])
    # a fresh worker is as near its limit as the old one was: no recycle for it while idle
    assert not host.idle_recycle.armed


def test_an_idle_recycle_is_skipped_when_a_call_came_since_it_was_armed(
    tmp_path: Path,
) -> None:
    from orchestrator.core.memory import rss_of
    from orchestrator.ort.idle_recycle import IdleRecycle

    host = WorkerSessions(ResolvedRoute("plain", "interpreter", sys.executable))
    try:
        host.idle_recycle = IdleRecycle(host, idle_s=NEVER_HANGS_S)  # armed, never fired here
        handle = host.open(_spec(_matmul_graph(tmp_path / "square.onnx")))["handle"]
        x = np.eye(4, dtype=np.float32)
        host.run(handle, {"x": x})
        host.expect_rise(RISE)
        host.recycle_limit = rss_of(host.pid) + RISE + RISE // 2
        host.run(handle, {"x": x})
        assert host.idle_recycle.armed
        armed_at = host.calls
        host.run(handle, {"x": x})  # a call came: the timer armed before it is stale
        host.idle_recycle._fire(armed_at)
        assert host.recycles == 0 and host.idle_recycle.done == 0
        host.idle_recycle._fire(host.calls)  # idle since the last call: recycled
        assert host.recycles == 1 and host.idle_recycle.done == 1
    finally:
        host.shutdown()
    assert not host.idle_recycle.armed  # shutting down cancels it
