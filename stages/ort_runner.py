"""What every ONNX Runtime stage runner shares: its sessions in the placement's route, recycled at its budget.

:class:`OrtRunner` is the base of the ``exported_graph``, ``vad``, ``asr`` and
``token2wav`` runners. It owns the session host (``orchestrator.ort.sessions``:
this interpreter, or a route worker started with the route's interpreter) and
the handles of the sessions it opened, and does for each runner:

* ``_session_specs`` / ``_open``: the plan's session specs (what admission
  wrote into the engine kwargs), opened in the route with the plan's CPU
  threads, each session's load record kept; every session call marks the stage
  computing (``stages.cpu_share``): while it is idle, a llama.cpp decoder on the
  same CPU, in this process, decodes on the stage's threads too;
* ``_loading``: a failure while loading closes what was opened and becomes a
  ``StageFailed`` naming the stage and its device (``_fail`` for a refusal of
  its own);
* ``_recycle_at_budget``: a route worker is recycled (``WorkerSessions.recycle_limit``)
  when its RSS plus the largest rise one call (or one ``_unit``) has caused would
  pass the stage's planned budget (``StagePlan.budget_bytes()``, less
  ``RECYCLE_HEADROOM_FRACTION``: the worker holds all of the stage's memory, and
  the device actor measures the worker's RSS against that budget). OpenVINO's
  CPU plugin keeps memory for every new input shape (docs/calibration.md), so a
  worker that meets new shapes grows until it is replaced;
* ``_unit``: calls that must run in one worker (a decoding loop whose cache the
  caller carries from step to step): the worker is recycled before the unit or
  after it, never between its calls, and the unit's rise counts as one call's;
* ``process_ids`` (the current worker and its children, so the device actor
  follows it across recycles), ``worker_stats`` (what calibration budgets a
  recycled worker from), ``worker_recycles`` for ``request_stats``; ``close``;
* a route worker that dies is replaced and its sessions reopened, as the stage's ``restart``
  says (``restart_policy``; ``sessions.WorkerSessions.run``: a call cut by the death is run
  again once, since none of it was delivered); ``health`` says so while it happens
  (``route_worker_restarting``) and when it will not (``route_worker_failed``), and
  ``worker_restarts`` counts them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from orchestrator.core.backends import with_cpu_threads
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import StageFailed
from orchestrator.core.memory import descendants
from orchestrator.core.profile import THIS_PROCESS
from orchestrator.core.units import MiB
from orchestrator.ort.revival import RestartPolicy
from orchestrator.ort.routes import resolve
from orchestrator.ort.sessions import ResolvedRoute, open_sessions
from orchestrator.ort.worker import OpenedSession
from stages import cpu_share
from stages.base import RestartConfig, StageHealth, StageRunner

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.core.profile import Route

RECYCLE_HEADROOM_FRACTION = 0.02
"""The recycle limit sits this far below the budget (and at least ``RECYCLE_HEADROOM_MIN``):
the run-to-run noise of a load here is 1-2 % (docs/calibration.md), and a call may rise a
little more than the largest rise seen so far."""
RECYCLE_HEADROOM_MIN = 8 * MiB


def recycle_limit(budget: int) -> int:
    """The RSS a route worker is recycled at (with the largest rise of one call on top): the
    stage's budget less the headroom, so the worker is replaced before it could pass the budget."""
    return max(1, budget - max(RECYCLE_HEADROOM_MIN, int(RECYCLE_HEADROOM_FRACTION * budget)))


def restart_policy(stage_plan: StagePlan) -> RestartPolicy | None:
    """The stage's ``restart`` (the plan carries it when not the default) for its route worker;
    None for ``restart: never``."""
    restart = stage_plan.restart
    if restart == "never":
        return None
    if restart is not None:
        return RestartPolicy(
            restart["max"], restart["window_s"], restart["backoff_s"], restart["backoff_max_s"]
        )
    default = RestartConfig()
    return RestartPolicy(default.max, default.window_s, default.backoff_s, default.backoff_max_s)


def route_for(stage_plan: StagePlan, route: Route | None = None) -> ResolvedRoute:
    """Where the session of an admitted placement runs.

    The route comes from ``route`` (the profile's) when given, else from the
    plan (the verification details record the route's interpreter), else this
    interpreter when the plan's route is this process. Raises ``StageFailed``
    when the plan names another route but not its interpreter.
    """
    if route is not None:
        return resolve(route)
    recorded = (
        stage_plan.verification.details.get("route") if stage_plan.verification else None
    ) or {}
    if recorded.get("kind"):
        return ResolvedRoute(recorded["name"], recorded["kind"], recorded.get("python"))
    if stage_plan.route in (None, THIS_PROCESS):
        return ResolvedRoute(THIS_PROCESS, THIS_PROCESS, None)
    raise StageFailed(
        stage_plan.name,
        stage_plan.device or "?",
        f"the plan names route {stage_plan.route!r} but not its interpreter; pass route= from the profile",
    )


class OrtRunner(StageRunner):
    """A stage whose sessions run in its placement's route (see the module's docstring).

    Subclasses call ``_open`` inside ``_loading`` from their ``load()``, then
    ``_recycle_at_budget()`` once the load's own runs are done (so the limit
    judges requests, not the load), and run sessions with ``self._host.run``
    on ``self._handles[graph]``.
    """

    recycles_at_estimate: ClassVar[bool] = True
    """Whether a route worker is recycled at a budget planned from metadata alone (False: only
    at a calibrated one, ``StagePlan.calibration``), for a kind whose estimate is known to sit
    below what one unit of its work takes: recycled at it, the worker would be replaced before
    every unit, bounding nothing."""

    def __init__(self, stage_plan: StagePlan, route: ResolvedRoute) -> None:
        self.plan = stage_plan
        self.route = route
        self._host: Any = None
        self._handles: dict[str, int] = {}
        """The plan's graph name (``session`` for a one-graph stage) -> its session's handle."""
        self.load_info: dict[str, object] = {}
        self._pids: list[int] = []

    def _fail(self, why: str) -> NoReturn:
        raise StageFailed(self.plan.name, self.plan.device or "?", why)

    def _failed(self, exc: BaseException, context: str = "") -> StageFailed:
        """``exc`` as this stage's ``StageFailed``: ``context`` (e.g. ``"request r1: "``), then its type and message."""
        return StageFailed(
            self.plan.name, self.plan.device or "?", f"{context}{type(exc).__name__}: {exc}"
        )

    @contextlib.contextmanager
    def _loading(self, context: str = "") -> Iterator[None]:
        """A failure inside closes what was opened and is raised as ``_failed(exc, context)``."""
        try:
            yield
        except Exception as exc:
            self.close()
            raise self._failed(exc, context) from exc

    def _session_specs(self, *graphs: str, spelled: str | None = None) -> dict[str, JsonObject]:
        """The plan's session spec of each graph (``engine_kwargs[graph]["session"]``), or with no
        graph named the stage's one (``engine_kwargs["session"]``, under the name ``session``).
        A spec missing is a ``StageFailed`` naming the graphs (``spelled``: how, when not by their
        plan names): the plan was not admitted."""
        kwargs = self.plan.engine_kwargs
        if not graphs:
            spec = kwargs.get("session")
            if not spec:
                self._fail("the plan carries no session spec (was it admitted?)")
            return {"session": spec}
        specs = {g: dict((kwargs.get(g) or {}).get("session") or {}) for g in graphs}
        if not all(specs.values()):
            named = spelled or " and ".join(f"the {g}" for g in graphs)
            self._fail(f"the plan carries no session spec for {named} (was it admitted?)")
        return specs

    def _open(self, specs: dict[str, JsonObject]) -> dict[str, OpenedSession]:
        """Start the route's session host and open each spec in order, with the plan's CPU threads;
        each handle goes to ``_handles``. Returns each session's load record (the route's answer),
        which ``load_info`` keeps. A route worker follows the stage's ``restart``
        (``restart_policy``): one that dies is replaced and its sessions reopened."""
        self._host = open_sessions(self.route)
        # Each session call marks the stage computing, so that a decoder on the same CPU takes
        # this stage's threads only while it is idle (stages.cpu_share).
        self._host.run = cpu_share.marking_busy(self.plan.name, self._host.run)
        cpu_share.register(self.plan.name, self.plan.device or "?", self.plan.cpu_threads)
        if not self._host.in_process:
            self._host.revival.policy = restart_policy(self.plan)
        opened: dict[str, OpenedSession] = {}
        for graph, spec in specs.items():
            opened[graph] = self._host.open(
                with_cpu_threads(spec, self.plan.cpu_threads), record=True
            )
            self._handles[graph] = opened[graph]["handle"]
        return opened

    def _recycle_at_budget(self) -> None:
        """Recycle a route worker at the stage's budget (``recycle_limit``), starting from the rise of
        one call a calibrated plan measured; the limit goes to ``load_info``. Nothing in this process,
        nor at an estimate when the kind says not to (``recycles_at_estimate``)."""
        host = self._host
        if (
            host is None
            or host.in_process
            or (not self.recycles_at_estimate and self.plan.calibration is None)
        ):
            return
        host.recycle_limit = recycle_limit(self.plan.budget_bytes())
        rise = (self.plan.calibration or {}).get("call_rise_bytes")
        if isinstance(rise, int) and rise > 0:
            host.expect_rise(rise)
        self.load_info = {**self.load_info, "worker_recycle_limit_bytes": host.recycle_limit}

    def _unit(self) -> contextlib.AbstractContextManager[None]:
        """Calls that run in one worker, never recycled between (``WorkerSessions.unit``)."""
        host = self._host
        return host.unit() if host is not None else contextlib.nullcontext()

    def health(self) -> StageHealth | None:
        """A route worker being replaced after it died (``route_worker_restarting``: the stage
        comes back by itself), or one that is not replaced any more (``route_worker_failed``: a
        crash loop, sessions that reopened differently, ``restart: never``)."""
        host = self._host
        if host is None or host.in_process:
            return None
        revival = host.revival
        dead = host._proc.poll() is not None
        if host._broken is not None or (dead and revival.policy is None):
            return StageHealth(
                code="route_worker_failed", message=str(host._broken or revival.last)
            )
        if revival.restarting or dead:
            return StageHealth(
                code="route_worker_restarting",
                message=f"route {self.route.name!r}: its worker died "
                f"({revival.last or 'just now'}); a fresh one is reopening the sessions",
            )
        return None

    def worker_restarts(self) -> int:
        """Route workers started in place of one that died (``revival.Revival.restarts``)."""
        host = self._host
        return 0 if host is None or host.in_process else int(host.revival.restarts)

    def process_ids(self) -> list[int] | None:
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
        return {
            "recycle_limit_bytes": int(host.recycle_limit),
            "call_rise_bytes": max(0, host.largest_rise),
            "worker_recycles": host.recycles,
            "worker_calls": host.calls,
            "retained_bytes": max(0, host.retained_bytes),
            "fresh_bytes": host.fresh_bytes,
        }

    def _worker_figures(self) -> dict[str, object]:
        """``worker_recycles`` (how many times the route worker was replaced since the load) and,
        once one died, ``worker_restarts``, for ``request_stats``; nothing in this process."""
        host = self._host
        if host is None or host.in_process:
            return {}
        restarts = int(host.revival.restarts)  # since the load: a request served after one says so
        return {
            "worker_recycles": host.recycles,
            **({"worker_restarts": restarts} if restarts else {}),
        }

    def close(self) -> None:
        cpu_share.unregister(self.plan.name)
        if self._host is not None:
            for handle in self._handles.values():
                self._host.close(handle)
            self._host.shutdown()
        self._host, self._handles = None, {}
