"""A cluster profile gathered live: this project's probe run on every node of a Ray cluster.

:func:`gather_profile` needs a connection (``cluster.connect(..., address=...)``).
Each live node that carries an ``omni_edge_node_<name>`` resource (``ray start
--resources``, docs/cluster.md) is probed by one small Ray task pinned to it
(``NodeAffinitySchedulingStrategy``, not soft: it runs there or fails), which
runs ``orchestrator.probe.probe_profile`` in that node's worker — the same probe
``omni-edge probe`` runs, so the node's RAM, devices and routes are its own.
The answers become one profile (``orchestrator.core.profile.build_cluster``): device
ids, routes and pools qualified by node, the head node first, then the others
by name. A node without the resource is not part of the plan (it is named in
the log).

:func:`gather_at` joins the cluster at an address for the probe and leaves it
again: what ``run``/``serve --address`` without ``--profile`` plan on (the
pipeline joins again to run); :func:`nodes_found` says which nodes it found.

:func:`node_ray_memory` measures Ray's own memory on each node the same way (a
task pinned to it): the summed PSS of the processes of that node's Ray session.
A pipeline's start charges each node's figure to that node's ``host_ram``
(``startup._charge_ray_on_nodes``) and its close records one calibration sample
per node (``calibration.ray_key(node_profile, node=NAME)``).
"""

from __future__ import annotations

import json
import logging

import psutil

from orchestrator.core.errors import ConfigError
from orchestrator.core.memory import NodeRayMemory, descendants, tree_memory
from orchestrator.core.profile import ClusterNode, HardwareProfile, build_cluster, parse_profile
from orchestrator.probe import probe_profile
from orchestrator.runtime import cluster
from orchestrator.runtime.cluster import NODE_RESOURCE_PREFIX, node_names

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 180.0
"""One node's probe: its route interpreters are asked in subprocesses (cached after the first time)."""


def _probe_here() -> str:
    """Runs on the node: this project's probe, as the text of the JSON document ``omni-edge
    probe --json`` writes (read back with ``parse_profile`` on the driver, which names the
    node)."""
    return json.dumps(probe_profile(cached_routes=True).model_dump(mode="json"))


def gather_profile(name: str = "Ray cluster") -> HardwareProfile:
    """Probe every named node of the connected cluster; ``ConfigError`` when none is named
    or a node's probe fails (naming the node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    names = node_names()
    alive = [n for n in ray.nodes() if n.get("Alive")]
    unnamed = [n.get("NodeManagerAddress", "?") for n in alive if n["NodeID"] not in names]
    if unnamed:
        log.warning(
            "nodes without an %s<name> resource are left out of the plan: %s",
            NODE_RESOURCE_PREFIX,
            ", ".join(unnamed),
        )
    if not names:
        raise ConfigError.single(
            "--address",
            f"no node of the Ray cluster carries an {NODE_RESOURCE_PREFIX}<name> resource",
            f"start each node with ray start ... --resources '{{\"{NODE_RESOURCE_PREFIX}laptop\": 1, ...}}' "
            "(docs/cluster.md), or plan with --profile CLUSTER.json",
        )
    head = {n["NodeID"] for n in alive if "node:__internal_head__" in n.get("Resources", {})}
    order = sorted(names, key=lambda nid: (nid not in head, names[nid]))
    address = {n["NodeID"]: n.get("NodeManagerAddress", "") for n in alive}
    probe = ray.remote(num_cpus=0, max_retries=0)(_probe_here)
    refs = {
        nid: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)
        ).remote()
        for nid in order
    }
    nodes = []
    for nid in order:
        try:
            doc = json.loads(ray.get(refs[nid], timeout=PROBE_TIMEOUT_S))
        except Exception as exc:
            raise ConfigError.single(
                f"node {names[nid]}",
                f"its probe failed: {type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}",
                "check that the node runs this project's environment, or plan with --profile",
            ) from None
        nodes.append(
            ClusterNode(
                names[nid],
                parse_profile(doc, where=f"node {names[nid]}"),
                address.get(nid, ""),
                nid,
            )
        )
    return build_cluster(name, nodes, source="probed live on each node through Ray")


def gather_at(address: str, name: str | None = None) -> HardwareProfile:
    """The cluster profile of the Ray cluster at ``address``, gathered live
    (:func:`gather_profile`): joins it, probes each named node, leaves it (unless
    this process was connected already). ``ConfigError`` naming ``--address`` when it
    cannot be joined (the reason: refused without token auth, nothing there)."""
    try:
        cluster.connect([], address=address)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError.single(
            "--address",
            f"could not join the Ray cluster at {address}: {exc}",
            "check the address (ray status on the head) and the auth settings "
            "(docs/cluster.md), or plan with --profile CLUSTER.json",
        ) from None
    try:
        return gather_profile(name or f"Ray cluster at {address}")
    finally:
        cluster.release()


def nodes_found(profile: HardwareProfile) -> str:
    """One line for a person: the nodes of a live cluster profile, each with its
    address and devices: ``2 nodes: head at 10.0.0.2 (cpu, gpu:0); laptop at …``."""
    parts = []
    for node in profile.nodes.values():
        devices = ", ".join(d.id for d in node.profile.devices)
        parts.append(f"{node.name}{f' at {node.address}' if node.address else ''} ({devices})")
    return f"{len(parts)} node{'s' if len(parts) != 1 else ''}: " + "; ".join(parts)


def _ray_memory_here() -> NodeRayMemory:
    """Runs on the node: the summed PSS of this node's Ray processes — those whose command
    line names its session directory (the GCS on the head, the raylet, its agents, the
    log monitor, workers) and the raylet's descendants (every worker, this task's too)."""
    import ray

    session = str(ray._private.worker.global_worker.node.get_session_dir_path())
    pids: set[int] = set()
    names: set[str] = set()
    for proc in psutil.process_iter(["cmdline", "name"]):
        try:
            if session in " ".join(proc.info["cmdline"] or []):
                pids.add(proc.pid)
                if proc.info["name"] == "raylet":
                    pids.update(descendants(proc.pid))
        except (psutil.Error, OSError):
            continue
    for pid in pids:
        try:
            names.add(psutil.Process(pid).name())
        except psutil.Error:
            continue
    total, kind = tree_memory(pids)
    return NodeRayMemory(
        bytes=total,
        processes=len(pids),
        names=sorted(names),
        session_dir=session,
        measure=f"sum of {kind.upper()} of the {len(pids)} processes of the node's Ray session "
        "(GCS on the head, raylet, agents, workers)",
    )


def node_ray_memory() -> dict[str, NodeRayMemory]:
    """Ray's own memory on each named node of the connected cluster, measured now
    (evidence M): node name → ``bytes``, ``processes``, ``names``, ``measure``. Every
    worker of the node counts, this project's device actors too: measured before any
    stage loads (or with no pipeline running) it is Ray's cost on that node. Needs a
    connection, like :func:`gather_profile`; a node whose task fails is left out (logged)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    names = node_names()
    task = ray.remote(num_cpus=0, max_retries=0)(_ray_memory_here)
    refs = {
        nid: task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)
        ).remote()
        for nid in names
    }
    out = {}
    for nid, ref in refs.items():
        try:
            out[names[nid]] = ray.get(ref, timeout=PROBE_TIMEOUT_S)
        except Exception as exc:
            log.warning("Ray's memory on node %s was not measured: %s", names[nid], exc)
    return out
