"""A device actor's death, said truly: its phase (did not start / loading / serving), its
node's fate as Ray decides it, and the bound on how long the driver waits for that.

The two-node kill mid-request is tested in test_cluster_nodes.py (slow); here the
wording, the bound's arithmetic, and Ray's verdict on this machine's live node."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.runtime import node_death, startup
from orchestrator.runtime.node_death import (
    RECOMMENDED,
    HealthCheck,
    NodeState,
    death_problem,
    health_check,
)


def test_the_bound_follows_ray_s_health_check_settings() -> None:
    # Ray 2.60's defaults: 5 checks, each up to 3 s apart and 10 s long, + the driver's margin
    assert health_check({}).bound_s() == 5 * (3 + 10) + node_death.NOTICE_MARGIN_S
    # what docs/cluster.md starts every node and the driver with, read back from the environment
    assert health_check(RECOMMENDED.env()) == RECOMMENDED == HealthCheck(1000, 2000, 3)
    assert RECOMMENDED.bound_s() == 3 * (1 + 2) + node_death.NOTICE_MARGIN_S
    assert RECOMMENDED.env()["RAY_health_check_failure_threshold"] == "3"
    # a malformed value is Ray's default, not a crash
    assert health_check({"RAY_health_check_period_ms": "soon"}).period_ms == 3000


NODE = "a1b2c3d4e5f6a7b8c9d0"


def test_a_node_that_died_mid_request_is_named_with_the_actor_and_a_remedy() -> None:
    node = NodeState("laptop", NODE, "192.0.2.7:40123", True, 2.4, "health check failed")
    p = death_problem(
        "voice",
        "laptop/npu:0",
        "while serving request r-7",
        "ActorUnavailableError: …",
        node,
        RECOMMENDED,
    )
    assert p.where == "stage 'voice' on laptop/npu:0"
    assert p.what.startswith(
        "node laptop (Ray node a1b2c3d4e5f6 at 192.0.2.7:40123) died and the device actor "
        "for laptop/npu:0 died with it, while serving request r-7: Ray marked the node dead 2.4 s"
    )
    assert "health check failed" in p.what and "did not start" not in p.what
    assert "start node laptop again" in p.fix and "--mask laptop" in p.fix
    cause = node_death.cause_of(p)
    assert cause == f"{p.what}; how to fix: {p.fix}"


def test_an_actor_that_died_on_a_live_node_does_not_blame_the_node() -> None:
    node = NodeState("laptop", NODE, "192.0.2.7:40123", False, 0.0)
    p = death_problem("voice", "laptop/cpu", "while loading stage voice", "X", node, RECOMMENDED)
    assert "died while loading stage voice; its node laptop" in p.what and "is up" in p.what
    assert "killed or crashed" in p.fix


def test_a_node_ray_still_lists_past_the_bound_names_the_settings_that_bound_it() -> None:
    node = NodeState("laptop", NODE, "192.0.2.7:40123", None, 67.0)
    p = death_problem("voice", "laptop/cpu", "while serving request r", "X", node, health_check({}))
    assert "does not answer, yet Ray still lists it alive after 67.0 s" in p.what
    assert "at most 67 s" in p.what  # the settings this driver runs with, and their bound
    assert "RAY_health_check_period_ms=1000" in p.fix and "within 11 s" in p.fix


def test_on_one_machine_the_actor_alone_is_named() -> None:
    p = death_problem("voice", "igpu:0", "while serving request r", "X", None, RECOMMENDED)
    assert p.what == "the device actor for igpu:0 died while serving request r (X)"


@pytest.mark.ray
def test_ray_s_verdict_on_this_machine_s_live_node_and_on_a_node_it_does_not_list(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time
    from types import SimpleNamespace

    import ray

    polls: list[float] = []  # each wait between two asks of Ray

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(node_death, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    here = ray.get_runtime_context().get_node_id()
    alive = node_death.verdict("here", here, bound_s=30.0)
    assert alive.dead is False and polls == []  # its raylet answers: no waiting
    assert alive.address.endswith(str(ray.nodes()[0]["NodeManagerPort"]))
    gone = node_death.verdict("gone", "f" * 56, bound_s=30.0)
    assert gone.dead is True and polls == []  # Ray does not list it: decided at the first ask


@pytest.mark.ray
def test_an_actor_that_dies_before_it_is_ready_did_not_start(ray_cluster: Any) -> None:
    """The start's ``ready()`` failing because the actor died is "did not start", said
    with the phase: distinct from a death while loading or serving."""
    import ray

    @ray.remote(num_cpus=0)
    class Slow:
        def ready(self) -> int:
            return 1

    actor = Slow.remote()  # type: ignore[attr-defined]
    ray.kill(actor, no_restart=True)
    with pytest.raises(ray.exceptions.RayActorError) as died:
        ray.get(actor.ready.remote(), timeout=60)
    why = startup._not_started("voice", "igpu:0", actor, died.value)
    assert why.startswith("the device actor for igpu:0 died before it was ready (it did not start)")
    assert "how to fix:" in why


def test_a_raylet_that_refuses_connections_is_a_dead_node_said_at_once() -> None:
    """A node's raylet port that refuses connections (nothing listens: the raylet is gone)
    is the node's death, said without waiting for Ray's health checks; a port that
    accepts is a node that is up."""
    import socket

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        up = {"NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port}
        assert node_death._raylet(up) == "up"
    assert node_death._raylet(up) == "refused"  # closed: the kernel answers with a reset
    node = NodeState("laptop", NODE, f"127.0.0.1:{port}", True, 0.1, node_death.RAYLET_GONE)
    p = death_problem("voice", "laptop/cpu", "while serving request r", "X", node, RECOMMENDED)
    assert p.what.startswith(
        f"node laptop (Ray node a1b2c3d4e5f6 at 127.0.0.1:{port}) died and the device actor "
        "for laptop/cpu died with it, while serving request r: its raylet refuses connections"
    )
    assert "Ray marked" not in p.what
