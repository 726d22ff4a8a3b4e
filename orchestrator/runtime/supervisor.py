"""Bringing back what died: a dead device actor restarted on its placement, bounded and said.

One :class:`Supervisor` per started ``Runtime`` (``startup.start`` starts it once every stage
has loaded; ``closing.close`` stops it first). It guarantees:

* **A death is noticed at once.** It holds one ``watch()`` call on every live device actor (a
  call that answers only when the actor closes), so an actor killed while idle fails that call
  within Ray's notice (well under a second on one machine); a death a request or ``/health``
  met first is handed over by ``failures.device_died``. Either way the actor is marked dead,
  the ledger's holders it hosted are released, and every request in flight on it ends at once
  with a ``StageFailed`` whose code says what follows (:meth:`died`): ``stage_restarting``,
  ``crash_loop``, or ``device_actor_died`` for a stage that stays down (``restart: never``).
* **Restarted on the same placement, after a back-off, bounded.** The policy is the stages'
  ``restart`` (``stages.base.RestartConfig``; an actor hosting several stages follows the
  strictest: any ``never``, the fewest restarts, the longest window and back-off). After
  ``backoff(deaths in the window)`` seconds, a new actor of the same key — device, resources,
  environment — is created, handed to its peers, the ledger's holders taken again exactly once
  (``LedgerService.retake``: replaced, never added, so an attempt that died holding them and is
  tried again never counts them twice) and its stages loaded again from their plans as admitted
  (evidence and calibration reused; nothing verified again). An attempt that fails (the new
  actor died, a load failed, the ledger refused) gives back what it took and counts as a death.
  More than ``max`` deaths within ``window_s`` is a crash loop: the stages stay down,
  ``crash_loop`` with the last cause, and everything else is served on.
* **A device gone for good** — no live node offers it any more (its node left the cluster), or
  ``Runtime.lose_device`` said so — is never restarted on: the stages whose ``on_device_loss``
  is ``fallback`` move to the next device of their list (``runtime.fallback``; also after a
  crash loop), the others stay down.
* **Said, never hidden**: each actor key's :class:`ActorState` (``/health``: ``recovering`` with
  the attempt and the time of death; ``crash_loop``; ``moved``), a log line per death, restart
  and move, counts by stage and cause (``counts``: ``device_actor_died``, ``route_worker_died``,
  read by ``/metrics`` as ``stage_restarts_total``), and the stats of each request served by a
  restarted stage say so (:meth:`served_by`).

Every mutation of the runtime's tables is copy-on-write (a new dict assigned), so a request
reading them on another thread never sees one change size under it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from orchestrator.core.errors import StageFailed
from orchestrator.runtime import failures, fallback, node_death
from orchestrator.runtime import startup as startup_mod
from orchestrator.runtime.admission import replicated_limit
from orchestrator.runtime.cluster import device_resource
from orchestrator.runtime.device_actor import (
    ActorHealth,
    ActorReady,
    LoadReport,
    StageLoad,
    refusal,
)
from orchestrator.runtime.startup import ACTOR_READY_TIMEOUT_S, LOAD_TIMEOUT_S, Device
from stages.base import RestartConfig

if TYPE_CHECKING:
    from ray import ObjectRef

    from orchestrator.runtime.fallback import Move

log = logging.getLogger(__name__)

POLL_S = 0.2
"""How often the supervisor's thread looks up from its watches: deaths handed over by other
threads, and restarts whose back-off has passed, start within this."""
HEALTH_EVERY_S = 2.0
"""How often the supervisor asks each live actor how its stages are (``DeviceActor.health``):
the route worker restarts it reports are counted even when nobody scrapes ``/metrics``."""
STOP_TIMEOUT_S = 30.0
"""How long ``stop`` waits for an attempt under way to give back what it took."""

State = Literal["up", "recovering", "crash_loop", "down", "lost"]
"""``up``: serving; ``recovering``: dead, a restart due or under way; ``crash_loop``: more deaths
in the window than the policy allows; ``down``: dead for good (``restart: never``, or the
supervisor stopped); ``lost``: its device is gone for good (its stages with a fallback moved)."""


class ActorStatus(TypedDict):
    """A device actor's state as ``/health`` shows it (``ActorState.said``): its ``state`` and
    device; once it died, when and why; the attempt of a restart due or under way; the restarts
    attempted; ``moving`` while its stage's fallback is under way."""

    state: State
    device: str
    died_at: NotRequired[str]
    cause: NotRequired[str]
    attempt: NotRequired[int]
    restarts: NotRequired[int]
    moving: NotRequired[bool]


class ServedBy(TypedDict):
    """What a request's stats say of a stage instance that was restarted (``restarts``, when it
    last died) or moved (the device it moved from)."""

    restarts: NotRequired[int]
    last_died_at: NotRequired[str | None]
    moved_from: NotRequired[str]


@dataclass
class ActorState:
    """One device actor key's life as the supervisor keeps it."""

    key: str
    device: str
    holders: list[str]
    policy: RestartConfig | None
    """The strictest of its stages' ``restart`` (None: ``never``)."""
    state: State = "up"
    restarts: int = 0
    """Restarts attempted since the start (each one a new actor)."""
    revived: int = 0
    """Restarts that brought it back."""
    attempt: int = 0
    """The restart due or under way (1-based, since the start)."""
    deaths: deque[float] = field(default_factory=deque)
    """When it died (monotonic), within the policy's window."""
    died_at: float | None = None
    """When it last died (wall clock, for ``/health``)."""
    cause: str = ""
    """Why it last died (or why its last attempt failed)."""
    next_at: float = 0.0
    """When the due restart starts (monotonic)."""
    recovered_s: float | None = None
    """Seconds from its last death to its stages loaded again."""

    def said(self) -> ActorStatus:
        """As ``/health`` shows it."""
        doc = ActorStatus(state=self.state, device=self.device)
        if self.died_at is not None:
            doc["died_at"] = _iso(self.died_at)
            doc["cause"] = self.cause
        if self.state == "recovering":
            doc["attempt"] = self.attempt
        if self.restarts:
            doc["restarts"] = self.restarts
        return doc


class Stopped(Exception):
    """The supervisor was stopped while an attempt waited: it gives back what it took."""


def policy_of(rt: Any, holders: Iterable[str]) -> RestartConfig | None:
    """The restart policy of an actor hosting ``holders``: None when any of its stages says
    ``never``; else the strictest of theirs (fewest restarts, longest window and back-off)."""
    policies = [rt.config.stage(rt.refs[h].stage).restart_policy() for h in holders]
    if not policies or any(p is None for p in policies):
        return None
    known = [p for p in policies if p is not None]
    return RestartConfig(
        max=min(p.max for p in known),
        window_s=max(p.window_s for p in known),
        backoff_s=max(p.backoff_s for p in known),
        backoff_max_s=max(p.backoff_max_s for p in known),
    )


class _Said:
    """What the runtime and the server read of a supervisor (``Supervisor``'s base: its
    queries, apart from its thread's work); its attributes are ``Supervisor``'s."""

    rt: Any
    states: dict[str, ActorState]
    counts: Counter[tuple[str, str]]
    moves: list[Move]
    moving: set[str]
    _lock: threading.RLock
    _workers: dict[tuple[str, str], int]

    def coming_back(self, stage: str) -> bool:
        """Whether some instance of ``stage`` is being brought back (restarting or moving)."""
        with self._lock:
            for ref in self.rt.replicas.get(stage, []):
                st = self.states.get(ref.key)
                if ref.holder in self.moving or (st is not None and st.state == "recovering"):
                    return True
        return False

    def code_of(self, key: str) -> str:
        """The code of ``key``'s dead actor now: ``stage_restarting`` (a restart due or under
        way, or its stages moving), ``crash_loop``, else ``device_actor_died``."""
        with self._lock:
            st = self.states.get(key)
            if st is None:
                return "device_actor_died"
            if st.state == "recovering" or any(h in self.moving for h in st.holders):
                return "stage_restarting"
            return "crash_loop" if st.state == "crash_loop" else "device_actor_died"

    def status(self, holder: str) -> ActorStatus | None:
        """The state of ``holder``'s actor as ``/health`` shows it, once it has died at least
        once (None while it never has): ``state``, ``device``, ``died_at``, ``cause``,
        ``attempt`` (recovering), ``restarts``; ``moving`` while its fallback is under way."""
        ref = self.rt.refs.get(holder)
        if ref is None:
            return None
        with self._lock:
            st = self.states.get(ref.key)
            if st is None or (st.died_at is None and holder not in self.moving):
                return None
            doc = st.said()
            if holder in self.moving:
                doc["moving"] = True
            return doc

    def served_by(self, holder: str) -> ServedBy | None:
        """For a request's stats: the actor serving ``holder`` was restarted (``restarts``,
        ``last_died_at``) or the stage moved (``moved_from``); None otherwise."""
        ref = self.rt.refs.get(holder)
        with self._lock:
            st = self.states.get(ref.key) if ref is not None else None
            moved = next((m for m in reversed(self.moves) if m["holder"] == holder), None)
            if (st is None or not st.revived) and moved is None:
                return None
            doc = ServedBy()
            if st is not None and st.revived:
                doc["restarts"] = st.revived
                doc["last_died_at"] = _iso(st.died_at) if st.died_at is not None else None
            if moved is not None:
                doc["moved_from"] = moved["from"]
            return doc

    def worker_restarts(self, holder: str, dev: Device, restarts: int) -> None:
        """``dev`` reported ``restarts`` route worker restarts for ``holder`` since it loaded:
        the ones not counted yet go to ``counts``."""
        stage = self.rt.refs[holder].stage if holder in self.rt.refs else holder
        with self._lock:
            seen = self._workers.get((holder, f"{dev.key}@{id(dev)}"), 0)
            if restarts > seen:
                self.counts[(stage, "route_worker_died")] += restarts - seen
                self._workers[(holder, f"{dev.key}@{id(dev)}")] = restarts


class Supervisor(_Said):
    """Restarts, crash loops and moves of one runtime's device actors (the module's guarantees)."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.states: dict[str, ActorState] = {
            key: ActorState(key, dev.id, list(dev.holders), policy_of(rt, dev.holders))
            for key, dev in rt.devices.items()
        }
        self.counts: Counter[tuple[str, str]] = Counter()
        """(stage, cause) → restarts: ``device_actor_died`` (its actor) or ``route_worker_died``."""
        self.moves: list[Move] = []
        """Each stage moved to another device: ``{stage, holder, from, to, why, at}``."""
        self.moving: set[str] = set()
        """Holders whose move is due or under way."""
        self.hooks: dict[str, Callable[[str, ActorReady], None]] = {}
        """Called with the actor key and the new actor's ``ready()`` (its ``pid``) at each step
        of a restart (``actor_ready``: the new actor answered, its holders not yet taken again;
        ``retaken``: taken, not yet loaded), in the supervisor's thread: for drills and tests,
        which kill an actor there or hold the restart."""
        self._workers: dict[tuple[str, str], int] = {}
        """(holder, actor key) → route worker restarts that actor reported last."""
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._watches: dict[Any, tuple[str, Device]] = {}
        self._health: dict[Any, Device] = {}
        """``health()`` calls asked and not answered yet."""
        self._health_at = 0.0
        self._thread: threading.Thread | None = None

    # -- the thread ----------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="omni-edge-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and restarting; an attempt under way gives back what it took first."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_TIMEOUT_S)
        with self._lock:
            for st in self.states.values():
                if st.state == "recovering":
                    st.state = "down"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._arm()
                self._wait_watches()
                self._ask_health()
                for key in self._due():
                    self._attempt(key)
                for key, holder in self._moves_due():
                    self._move(key, holder)
            except Stopped:
                return
            except Exception:  # the supervisor must outlive any one failure
                log.exception("the supervisor's loop failed; it goes on")
                self._stop.wait(POLL_S)

    def _arm(self) -> None:
        """One ``watch()`` call on every live device actor that has none."""
        watched = {id(dev) for _, dev in self._watches.values()}
        for key, dev in list(self.rt.devices.items()):
            if not dev.dead and id(dev) not in watched:
                self._watches[dev.actor.watch.remote()] = (key, dev)

    def _wait_watches(self) -> None:
        import ray

        if not self._watches:
            self._stop.wait(POLL_S)
            return
        ready, _ = ray.wait(list(self._watches), num_returns=1, timeout=POLL_S)
        for ref in ready:
            _, dev = self._watches.pop(ref)
            try:
                ray.get(ref)  # "closed": the actor closed, nothing died
            except Exception as exc:
                if not dev.dead and not self._stop.is_set():
                    stage = dev.stages[0] if dev.stages else dev.id
                    doing = failures.doing_on(self.rt, dev)
                    why = node_death.said(stage, dev, doing, failures.cause_of(exc))
                    failures.device_died(self.rt, dev, why)

    def _ask_health(self) -> None:
        """Every ``HEALTH_EVERY_S``, each live actor's ``health()``, read when it answers
        (never waited on here): its route worker restarts counted (``worker_restarts``)."""
        import ray

        if self._health:
            ready, _ = ray.wait(list(self._health), num_returns=len(self._health), timeout=0)
            for ref in ready:
                dev = self._health.pop(ref)
                try:
                    doc: ActorHealth = ray.get(ref)
                except Exception:  # dead: its watch says so
                    continue
                for stage, workers in doc["workers"].items():
                    holder = failures.holder_of(self.rt, dev, stage)
                    self.worker_restarts(holder, dev, workers["restarts"])
        now = time.monotonic()
        if self._health and now - self._health_at > STOP_TIMEOUT_S:
            self._health.clear()  # a busy actor's answer is not waited for past this
        if self._health or now - self._health_at < HEALTH_EVERY_S:
            return
        self._health_at = now
        for dev in list(self.rt.devices.values()):
            if not dev.dead:
                self._health[dev.actor.health.remote()] = dev

    # -- deaths --------------------------------------------------------------------
    def died(self, dev: Device, reason: str) -> str:
        """``dev`` died (``failures.device_died`` calls this once): what follows is decided —
        a restart after its back-off, a crash loop, a move, or down for good — and the code a
        request it failed reads is returned."""
        gone = self.device_gone(dev.id)
        with self._lock:
            st = self.states.get(dev.key)
            if st is None:  # an actor the supervisor never knew (started after it stopped)
                return "device_actor_died"
            return self._death(st, reason, gone)

    def _death(self, st: ActorState, cause: str, gone: str | None) -> str:
        now = time.monotonic()
        st.died_at, st.cause = time.time(), cause
        stages = sorted({self.rt.refs[h].stage for h in st.holders})
        movable = [h for h in st.holders if self._fallback(h)]
        if self._stop.is_set():
            st.state = "down"
            return "device_actor_died"
        if gone is not None:
            st.state = "lost"
            st.cause = f"{cause}; {gone}"
            log.error("device %s is gone (%s): %s", st.device, gone, ", ".join(stages))
            self.moving.update(movable)
            return "stage_restarting" if movable else "device_actor_died"
        if st.policy is None:
            st.state = "down"
            return "device_actor_died"
        st.deaths.append(now)
        while st.deaths and now - st.deaths[0] > st.policy.window_s:
            st.deaths.popleft()
        if len(st.deaths) > st.policy.max:
            st.state = "crash_loop"
            log.error(
                "%s on %s: crash loop, %d deaths within %g s (restart: max %d); it stays down: %s",
                ", ".join(stages),
                st.device,
                len(st.deaths),
                st.policy.window_s,
                st.policy.max,
                cause,
            )
            self.moving.update(movable)
            return "stage_restarting" if movable else "crash_loop"
        wait = st.policy.backoff(len(st.deaths))
        st.state, st.attempt, st.next_at = "recovering", st.restarts + 1, now + wait
        log.warning(
            "%s on %s died (%s); restart %d in %.1f s", ", ".join(stages), st.device, cause,
            st.attempt, wait,
        )  # fmt: skip
        return "stage_restarting"

    def device_gone(self, device: str) -> str | None:
        """Why ``device`` is gone for good, or None while it is there: lost by the runtime's
        word (``Runtime.lose_device``), or offered by no live node of the cluster any more."""
        lost = dict(getattr(self.rt, "lost_devices", {}) or {})
        if device in lost:
            return str(lost[device])
        import ray

        if not ray.is_initialized():
            return None
        try:
            offered = ray.cluster_resources()
        except Exception:  # the GCS is what failed: nothing known of the device
            return None
        if offered.get(device_resource(device), 0) <= 0:
            return f"no live node of the Ray cluster offers {device} any more"
        return None

    def _fallback(self, holder: str) -> bool:
        ref = self.rt.refs.get(holder)
        return ref is not None and self.rt.config.stage(ref.stage).on_device_loss == "fallback"

    # -- restarts ------------------------------------------------------------------
    def _due(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            return [
                k for k, st in self.states.items() if st.state == "recovering" and st.next_at <= now
            ]

    def _attempt(self, key: str) -> None:
        """One restart of ``key``'s actor (the module's guarantees); on failure, a death."""
        rt, st = self.rt, self.states[key]
        old: Device = rt.devices[key]
        t0 = time.monotonic()
        with self._lock:
            st.restarts += 1
            for stage in dict.fromkeys(rt.refs[h].stage for h in st.holders):
                self.counts[(stage, "device_actor_died")] += 1
        log.warning("restarting the device actor %s (%s): attempt %d", key, st.device, st.attempt)
        actor = None
        try:
            actor, ready = startup_mod.create_actor(rt, key)
            info = self._get([ready], ACTOR_READY_TIMEOUT_S, "start")[0]
            self._hook("actor_ready", key, info)
            dev = Device(old.id, actor, info, list(old.stages), key=key, holders=list(old.holders))
            startup_mod.connect_actors(rt, {key: actor})
            results = self._retake_and_load(dev, info)
        except Stopped:
            self._give_back(old, actor)
            raise
        except Exception as exc:
            self._give_back(old, actor)
            why = exc.cause if isinstance(exc, StageFailed) else failures.cause_of(exc)
            gone = self.device_gone(st.device)
            with self._lock:
                self._death(st, f"restart attempt {st.attempt} failed: {why}", gone)
            return
        self._revived(st, dev, results, time.monotonic() - t0)

    def _revived(
        self, st: ActorState, dev: Device, results: dict[str, LoadReport], took_s: float
    ) -> None:
        rt = self.rt
        rt.devices = {**rt.devices, dev.key: dev}
        rt.load_results = {**rt.load_results, **results}
        rt.balancer.revive(dev.key)
        rt.admission.set_limit(replicated_limit(rt.replica_caps, rt.stage_keys, rt.balancer.dead))
        with self._lock:
            st.state, st.revived = "up", st.revived + 1
            st.recovered_s = round(time.time() - st.died_at, 3) if st.died_at is not None else None
        log.warning(
            "restarted the device actor %s (%s): %s loaded again in %.1f s (%.1f s after it died)",
            dev.key,
            dev.id,
            ", ".join(dev.holders),
            took_s,
            st.recovered_s or 0.0,
        )

    def _get(self, refs: list[Any], timeout_s: float, what: str) -> list[Any]:
        """Every ref's value within ``timeout_s``, looking up every ``POLL_S`` for a stop."""
        import ray

        deadline = time.monotonic() + timeout_s
        waiting = list(refs)
        while waiting:
            if self._stop.is_set():
                raise Stopped()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer within {timeout_s:.0f} s ({what})")
            _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=POLL_S)
        return [ray.get(r) for r in refs]

    def _retake_and_load(self, dev: Device, info: ActorReady) -> dict[str, LoadReport]:
        """``dev``'s holders taken again in the ledger and loaded: all at once when they fit
        together at their peaks (as a start's wave), else one after another (as a start that
        needed several waves), each taken just before its load."""
        if self._retake(dev, dev.holders, strict=False):
            self._hook("retaken", dev.key, info)
            return self._load(dev, dev.holders)
        results: dict[str, LoadReport] = {}
        for h in dev.holders:
            self._retake(dev, [h], strict=True)
            self._hook("retaken", dev.key, info)
            results.update(self._load(dev, [h]))
        return results

    def _retake(self, dev: Device, holders: list[str], strict: bool) -> bool:
        """``holders`` taken again in the ledger, replacing whatever they hold; False when they
        do not fit together, or (``strict``) ``StageFailed`` naming the shortfall."""
        rt = self.rt
        batch = [(h, [r.to_dict() for r in rt.views[h].reservations]) for h in holders]
        answer = self._get([rt.ledger.retake.remote(batch)], ACTOR_READY_TIMEOUT_S, "retake")[0]
        if not answer["ok"] and strict:
            raise StageFailed(rt.refs[holders[0]].stage, dev.id, refusal(answer["shortfalls"][0]))
        return bool(answer["ok"])

    def _load(self, dev: Device, holders: list[str]) -> dict[str, LoadReport]:
        """``holders``' stages loaded in ``dev``, at once (the ledger took them together)."""
        rt = self.rt
        refs: list[ObjectRef[LoadReport]] = []
        for h in holders:
            view = rt.views[h]
            refs.append(
                dev.actor.load_stage.remote(
                    StageLoad(
                        view,
                        rt.config.stage(view.name),
                        rt.kinds[view.name],
                        rt.routes.get(view.route or ""),
                        admitted=True,
                        holder=h,
                    )
                )
            )
        return dict(zip(holders, self._get(refs, LOAD_TIMEOUT_S, "load"), strict=True))

    def _give_back(self, old: Device, actor: Any) -> None:
        """A failed attempt: its holders released (taken or not: a release is idempotent), its
        new actor killed."""
        import ray

        for h in old.holders:
            if self.rt.ledger is not None:
                try:
                    self.rt.ledger.release.remote(h)
                except Exception as exc:
                    log.warning("could not release %s after a failed restart: %s", h, exc)
        if actor is not None:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:
                log.debug("the failed attempt's actor did not die cleanly: %s", exc)

    def _hook(self, step: str, key: str, info: ActorReady) -> None:
        hook = self.hooks.get(step)
        if hook is not None:
            hook(key, info)

    # -- moves -----------------------------------------------------------------------
    def _moves_due(self) -> list[tuple[str, str]]:
        with self._lock:
            return [
                (k, h)
                for k, st in self.states.items()
                for h in st.holders
                if h in self.moving and st.state in ("lost", "crash_loop")
            ]

    def _move(self, key: str, holder: str) -> None:
        """``holder`` re-planned onto the next device of its stage's list (``fallback.move``);
        when it fits nowhere, it stays down with the refusal as its cause."""
        st = self.states[key]
        why = "its restarts reached the crash-loop limit" if st.state == "crash_loop" else st.cause
        try:
            moved = fallback.move(self.rt, holder, st.device, why, self._get)
        except Stopped:
            raise
        except Exception as exc:
            cause = exc.cause if isinstance(exc, StageFailed) else failures.cause_of(exc)
            log.error("stage %s could not fall back from %s: %s", holder, st.device, cause)
            with self._lock:
                self.moving.discard(holder)
                st.cause = f"{st.cause}; the fallback failed: {cause}"
            return
        with self._lock:
            self.moving.discard(holder)
            st.holders = [h for h in st.holders if h != holder]
            self.states[moved.key] = ActorState(
                moved.key, moved.to, [holder], policy_of(self.rt, [holder])
            )
            self.moves.append(moved.said)


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"
