"""The runtime half of ``exported_graph``: an ONNX Runtime session in its route, item by item.

:class:`ExportedGraphRunner` carries out an admitted ``exported_graph``
placement inside a device actor: ``load()`` opens the plan's session spec in
the placement's route (this interpreter, or a route worker started with the
route's interpreter, ``orchestrator.ort.sessions``); ``stream()`` sends each
input item through preprocess → session → postprocess. The hooks run in this
process; only the session runs in the route, so a route needs nothing but
numpy and its onnxruntime build.

A route worker is recycled (``WorkerSessions.recycle_limit``) when its RSS plus
the largest rise one call has caused would pass the stage's planned budget
(``StagePlan.budget_bytes()``, less ``RECYCLE_HEADROOM_FRACTION``: the worker
holds all of the stage's memory, and the device actor measures the worker's
RSS against that budget); ``worker_stats()`` reports what calibration budgets
it from (resident, the rise of one call, the growth the calls left behind); ``request_stats`` reports ``worker_recycles``, and
``process_ids()`` names the current worker, so the device actor follows it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from orchestrator.errors import StageFailed
from orchestrator.memory import descendants
from orchestrator.ort.routes import resolve
from orchestrator.ort.sessions import ResolvedRoute, open_sessions
from orchestrator.profile import THIS_PROCESS
from orchestrator.units import MiB
from stages.base import StageRunner
from stages.exported_graph.artifact import ExportedArtifact

if TYPE_CHECKING:
    from orchestrator.plan import StagePlan
    from orchestrator.profile import Route


RECYCLE_HEADROOM_FRACTION = 0.02
"""The recycle limit sits this far below the budget (and at least ``RECYCLE_HEADROOM_MIN``):
the run-to-run noise of a load here is 1-2 % (docs/calibration.md), and a call may rise a
little more than the largest rise seen so far."""
RECYCLE_HEADROOM_MIN = 8 * MiB


def recycle_limit(budget: int) -> int:
    """The RSS a route worker is recycled at (with the largest rise of one call on top): the
    stage's budget less the headroom, so the worker is replaced before it could pass the budget."""
    return max(1, budget - max(RECYCLE_HEADROOM_MIN, int(RECYCLE_HEADROOM_FRACTION * budget)))


def route_for(stage_plan: StagePlan, route: Route | None = None) -> ResolvedRoute:
    """Where the session of an admitted placement runs.

    The route comes from ``route`` (the profile's) when given, else from the
    plan (the verification details record the route's interpreter), else this
    interpreter when the plan's route is this process. Raises ``StageFailed``
    when the plan names another route but not its interpreter.
    """
    if route is not None:
        return resolve(route)
    recorded = (stage_plan.verification.details.get("route") if stage_plan.verification else None) or {}
    if recorded.get("kind"):
        return ResolvedRoute(recorded["name"], recorded["kind"], recorded.get("python"))
    if stage_plan.route in (None, THIS_PROCESS):
        return ResolvedRoute(THIS_PROCESS, THIS_PROCESS, None)
    raise StageFailed(
        stage_plan.name, stage_plan.device or "?",
        f"the plan names route {stage_plan.route!r} but not its interpreter; pass route= from the profile",
    )


class ExportedGraphRunner(StageRunner):
    """preprocess → session → postprocess per input item, the session in its route.

    ``stream`` yields one output item per input item (for the TTS: a text chunk
    in, ``{"audio": float32 array, "sample_rate": int}`` out). Hooks run in this
    process; only the session runs in the route, so a route needs nothing but
    numpy and its onnxruntime build.
    """

    def __init__(self, stage_plan: StagePlan, artifact: ExportedArtifact, route: ResolvedRoute) -> None:
        self.plan = stage_plan
        self.artifact = artifact
        self.route = route
        self._host: Any = None
        self._handle: int | None = None
        self._pre = artifact.hook("preprocess")
        self._post = artifact.hook("postprocess")
        self.load_info: dict[str, Any] = {}
        self._pids: list[int] = []

    def load(self) -> None:
        spec = self.plan.engine_kwargs.get("session")
        if not spec:
            raise StageFailed(self.plan.name, self.plan.device or "?", "the plan carries no session spec (was it admitted?)")
        try:
            self._host = open_sessions(self.route)
            self.load_info = self._host.open(spec, record=True)
        except Exception as exc:
            self.close()
            raise StageFailed(self.plan.name, self.plan.device or "?", f"{type(exc).__name__}: {exc}") from exc
        self._handle = self.load_info["handle"]
        if not self._host.in_process:
            self._host.recycle_limit = recycle_limit(self.plan.budget_bytes())
            rise = (self.plan.calibration or {}).get("call_rise_bytes")
            if isinstance(rise, int) and rise > 0:
                self._host.expect_rise(rise)
            self.load_info = {**self.load_info, "worker_recycle_limit_bytes": self._host.recycle_limit}

    def process_ids(self) -> list[int]:
        """The route worker's process (and its children), the current one after a recycle; [] in this process."""
        host = self._host
        if host is None or host.in_process:
            return []
        if not self._pids or self._pids[0] != host.pid:
            self._pids = [host.pid, *descendants(host.pid)]
        return list(self._pids)

    def worker_stats(self) -> dict[str, int] | None:
        """What calibration budgets a recycled worker from (``StageRunner.worker_stats``)."""
        host = self._host
        if host is None or host.in_process or host.recycle_limit is None:
            return None
        return {"recycle_limit_bytes": int(host.recycle_limit), "call_rise_bytes": max(0, host.largest_rise),
                "worker_recycles": host.recycles, "worker_calls": host.calls,
                "retained_bytes": max(0, host.retained_bytes), "fresh_bytes": host.fresh_bytes}

    def request_stats(self, request_id: str) -> dict[str, Any]:
        """``worker_recycles``: how many times the stage's route worker was replaced since the load."""
        host = self._host
        return {} if host is None or host.in_process else {"worker_recycles": host.recycles}

    def run_one(self, item: Any) -> Any:
        """One item through the chain, synchronously."""
        if self._handle is None:
            raise StageFailed(self.plan.name, self.plan.device or "?", "run before load()")
        feeds = self._pre(item, self.artifact) if self._pre else item
        outputs = self._host.run(self._handle, feeds)["outputs"]
        return self._post(outputs, self.artifact) if self._post else outputs

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in inputs:
            try:
                yield await asyncio.to_thread(self.run_one, item)
            except StageFailed:
                raise
            except Exception as exc:
                raise StageFailed(self.plan.name, self.plan.device or "?", f"request {request_id}: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        if self._host is not None:
            if self._handle is not None:
                self._host.close(self._handle)
            self._host.shutdown()
        self._host, self._handle = None, None
