"""A device actor's death, said truly: which actor, doing what, and whether its node died.

When a device actor dies, the driver hears of it in one of two ways, and the
first often comes before Ray has decided whether the actor's *node* died:

* the actor's own connection breaks (its process is gone while its machine
  still answers): the call fails within about a second;
* the GCS's health checks mark the node dead, and every actor on it with it.

So the node's fate is asked of Ray, and waited for within a bound
(:func:`verdict`): the node is *dead* when Ray lists it dead (or no longer
lists it) or its raylet refuses connections (the raylet is gone: Ray will mark
the node dead for it); *up* when its raylet still accepts a connection (the
actor died alone: a crash, an OOM kill); when the raylet does not answer at all
(the machine or the network is down) the driver waits, polling, until Ray's
health checks must have decided (:meth:`HealthCheck.bound_s`), and past that
says the node does not answer though Ray still lists it.

What is said (:func:`death_problem`) is a :class:`~orchestrator.core.errors.Problem`:
*where* (the stage and device), *what* (the actor died before it was ready,
while loading, or while serving a request; the node — its name, Ray node id
and raylet address — died with it, or is up) and *how to fix* it.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from orchestrator.core.errors import Problem

RAY_HEALTH_CHECK_DEFAULTS = {
    "health_check_period_ms": 3000,
    "health_check_timeout_ms": 10000,
    "health_check_failure_threshold": 5,
}
"""Ray 2.60's own settings (``ray._raylet.Config``: ``src/ray/common/ray_config_def.h``):
a check every 3 s, each given 10 s, the node dead after 5 failures in a row — up to
5 × (3 + 10) = 65 s before a node whose machine stopped answering is marked dead."""
RECOMMENDED_HEALTH_CHECK = {
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 2000,
    "health_check_failure_threshold": 3,
}
"""What docs/cluster.md has every node and the driver start with (``RAY_<name>``
environment variables): a check every second, each given 2 s (a raylet answers
in milliseconds on a LAN; 2 s allows a loaded laptop), dead after 3 failures in a
row, so one slow answer is never a death — a bound of 3 × (1 + 2) = 9 s."""
NOTICE_MARGIN_S = 2.0
"""After the GCS marks a node dead: publishing it, every actor on it marked dead, the
driver's call failed and :func:`verdict`'s next poll — well under a second on this
machine (docs/cluster.md has the figures); 2 s leaves room for a loaded one."""
RAYLET_GONE = "its raylet refuses connections (Ray's health checks have yet to mark it dead)"
"""Said for a node whose raylet port refuses connections before Ray lists it dead."""
POLL_S = 0.25
"""How often :func:`verdict` asks Ray about the node while it waits."""
RAYLET_CONNECT_S = 0.5
"""A TCP connect to the node's raylet: a refusal is immediate, an answer on a LAN
takes milliseconds; half a second, then the node counts as not answering."""


@dataclass(frozen=True)
class HealthCheck:
    """Ray's node health checks as the GCS runs them (``gcs_health_check_manager``): a
    check every ``period_ms``, each given ``timeout_ms``, the node marked dead after
    ``failure_threshold`` failures in a row."""

    period_ms: int
    timeout_ms: int
    failure_threshold: int

    def bound_s(self) -> float:
        """Seconds from a node's death until the driver is told, at most: each of the
        ``failure_threshold`` checks waits up to ``period_ms`` to start and up to
        ``timeout_ms`` for its answer (a machine that stopped answering; a node whose
        processes died but whose machine refuses connections fails each check at
        once: ``failure_threshold × period_ms``), plus :data:`NOTICE_MARGIN_S`."""
        per_check_ms = self.period_ms + self.timeout_ms
        return self.failure_threshold * per_check_ms / 1000 + NOTICE_MARGIN_S

    def env(self) -> dict[str, str]:
        """As the ``RAY_<name>`` environment variables Ray reads in every process."""
        return {
            "RAY_health_check_period_ms": str(self.period_ms),
            "RAY_health_check_timeout_ms": str(self.timeout_ms),
            "RAY_health_check_failure_threshold": str(self.failure_threshold),
        }

    def said(self) -> str:
        return (
            f"a check every {self.period_ms} ms, each given {self.timeout_ms} ms, "
            f"dead after {self.failure_threshold} failures: at most {self.bound_s():.0f} s"
        )


RECOMMENDED = HealthCheck(
    RECOMMENDED_HEALTH_CHECK["health_check_period_ms"],
    RECOMMENDED_HEALTH_CHECK["health_check_timeout_ms"],
    RECOMMENDED_HEALTH_CHECK["health_check_failure_threshold"],
)


def health_check(env: dict[str, str] | None = None) -> HealthCheck:
    """The health-check settings this process runs with: its ``RAY_health_check_*``
    environment variables (which Ray reads, over the cluster's ``--system-config``),
    else Ray's defaults. docs/cluster.md has every node and the driver set the same."""
    env = dict(os.environ) if env is None else env
    values = {}
    for name, default in RAY_HEALTH_CHECK_DEFAULTS.items():
        raw = env.get(f"RAY_{name}", "")
        values[name] = int(raw) if raw.strip().isdigit() else default
    return HealthCheck(
        values["health_check_period_ms"],
        values["health_check_timeout_ms"],
        values["health_check_failure_threshold"],
    )


@dataclass(frozen=True)
class NodeState:
    """What Ray says of one node after an actor on it died."""

    name: str
    node_id: str
    address: str
    """Its raylet's ``host:port``, as Ray lists it (``?`` when Ray never said)."""
    dead: bool | None
    """True: Ray lists it dead (or no longer lists it). False: its raylet answers.
    None: it does not answer, yet Ray still lists it alive after the bound."""
    waited_s: float
    """Seconds :func:`verdict` waited for Ray to decide."""
    ray_says: str = ""
    """Ray's reason for the node's death, when it gives one."""


def verdict(name: str, node_id: str, bound_s: float) -> NodeState:
    """Whether ``node_id`` (called ``name``) died: asked of Ray every :data:`POLL_S`
    until it is listed dead, its raylet answers, or ``bound_s`` has passed (module
    docstring). Blocks: an event loop calls it in a thread."""
    import ray

    t0 = time.monotonic()
    address = "?"
    while True:
        waited = round(time.monotonic() - t0, 2)
        try:
            nodes = {n.get("NodeID"): n for n in ray.nodes()}
        except Exception as exc:  # the GCS is what is gone: say what is known
            return NodeState(name, node_id, address, None, waited, f"the GCS did not answer: {exc}")
        node = nodes.get(node_id)
        if node is not None:
            address = f"{node.get('NodeManagerAddress', '?')}:{node.get('NodeManagerPort', '?')}"
        if node is None or not node.get("Alive"):
            why = str((node or {}).get("DeathReasonMessage") or "")
            return NodeState(name, node_id, address, True, waited, why)
        raylet = _raylet(node)
        if raylet == "up":
            return NodeState(name, node_id, address, False, waited)
        if raylet == "refused":
            return NodeState(name, node_id, address, True, waited, RAYLET_GONE)
        if waited >= bound_s:
            return NodeState(name, node_id, address, None, waited)
        time.sleep(POLL_S)


def _raylet(node: dict[str, Any]) -> str:
    """``up`` (the node's raylet accepts a connection), ``refused`` (its machine answers
    that nothing listens there: the raylet is gone, and a node is its raylet — Ray
    marks the node dead for it) or ``silent`` (no answer: the machine or the network
    is down, or slow; only Ray's health checks can tell)."""
    host, port = node.get("NodeManagerAddress"), node.get("NodeManagerPort")
    if not host or not port:
        return "silent"
    try:
        with socket.create_connection((str(host), int(port)), timeout=RAYLET_CONNECT_S):
            return "up"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "silent"


def actor_node(actor: Any) -> str | None:
    """The Ray node id an actor was placed on, from the GCS's actor table (also for an
    actor that died before it was ready); None when Ray does not say."""
    try:
        import ray

        info = ray._private.state.actors(actor._actor_id.hex())
        return str((info.get("Address") or {}).get("NodeID") or "") or None
    except Exception:
        return None


def death_problem(
    stage: str,
    device: str,
    phase: str,
    ray_says: str,
    node: NodeState | None,
    check: HealthCheck,
) -> Problem:
    """Where (``stage`` on ``device``), what (the actor died ``phase`` — ``before it was
    ready``, ``while loading stage X``, ``while serving request R`` — and what became of
    its node) and how to fix it. ``node`` is None on one machine (no cluster node)."""
    where = f"stage {stage!r} on {device}"
    actor = f"the device actor for {device}"
    if node is None:
        return Problem(
            where,
            f"{actor} died {phase} ({ray_says})",
            "its process was killed or crashed (an OOM kill shows in the kernel log, "
            "`dmesg`); Ray's worker logs say more; start the pipeline again",
        )
    if node.node_id == "?":
        return Problem(
            where,
            f"{actor} on node {node.name} died {phase} ({ray_says}); {node.ray_says}",
            f"see whether node {node.name} is up (`ray status` on the head); "
            "start the pipeline again",
        )
    named = f"node {node.name} (Ray node {node.node_id[:12]} at {node.address})"
    if node.dead:
        how = (
            f"{RAYLET_GONE}, {node.waited_s:.1f} s after"
            if node.ray_says == RAYLET_GONE
            else f"Ray marked the node dead {node.waited_s:.1f} s after"
        )
        said = f"; Ray: {node.ray_says}" if node.ray_says and node.ray_says != RAYLET_GONE else ""
        return Problem(
            where,
            f"{named} died and {actor} died with it, {phase}: {how} the actor's failure "
            f"reached the driver ({ray_says}{said})",
            f"start node {node.name} again (`ray start --address ...` with its resources, "
            f"docs/cluster.md) and then the pipeline, or plan without it (`--mask {node.name}`)",
        )
    if node.dead is False:
        return Problem(
            where,
            f"{actor} died {phase}; its {named} is up (its raylet answers) ({ray_says})",
            f"the actor's process on node {node.name} was killed or crashed (an OOM kill shows "
            "in that machine's kernel log); its Ray worker logs say more; start the pipeline again",
        )
    return Problem(
        where,
        f"{actor} died {phase}; its {named} does not answer, yet Ray still lists it alive "
        f"after {node.waited_s:.1f} s (health checks here: {check.said()}) ({ray_says})",
        "start every node and the driver with the health-check settings of docs/cluster.md "
        f"({' '.join(f'{k}={v}' for k, v in RECOMMENDED.env().items())}), so Ray marks a "
        f"dead node dead within {RECOMMENDED.bound_s():.0f} s; "
        f"check the network to node {node.name}",
    )


def cause_of(problem: Problem) -> str:
    """A problem as ``StageFailed``'s one-line cause: what, then how to fix."""
    return f"{problem.what}; how to fix: {problem.fix}" if problem.fix else problem.what


def said(stage: str, dev: Any, doing: str, ray_says: str) -> str:
    """Why the device actor ``dev`` (a ``startup.Device``: its ``id`` and ``ready()``'s
    ``info``) died while ``doing`` (``serving request R``, ``loading stage X``), as the
    cause a ``StageFailed`` carries: on a cluster's node, after Ray's verdict on the node
    (waited for within this process's health-check bound)."""
    node = _node_state(dev.id, dev.info.get("node_id"))
    phase = f"while {doing}" if doing else "while running"
    return cause_of(death_problem(stage, dev.id, phase, ray_says, node, health_check()))


def said_before_ready(stage: str, device: str, actor: Any, ray_says: str) -> str:
    """Why ``device``'s actor did not start (it died, or did not answer, before it was ready)."""
    node = _node_state(device, actor_node(actor))
    return cause_of(
        death_problem(
            stage, device, "before it was ready (it did not start)", ray_says, node, health_check()
        )
    )


def _node_state(device: str, node_id: str | None) -> NodeState | None:
    """Ray's verdict on the node of ``device`` (``laptop/cpu``: node ``laptop``); None on
    one machine (a device without a node)."""
    name = device.rpartition("/")[0]
    if not name:
        return None
    if not node_id:
        return NodeState(name, "?", "?", None, 0.0, "Ray did not say where the actor ran")
    return verdict(name, node_id, health_check().bound_s())
