"""``omni-edge verify --address``: the gates run on each node a candidate would run on.

The candidates are the planner's on the cluster profile (``verify.run.candidates``).
For each node that has any, one Ray task pinned to that node
(``NodeAffinitySchedulingStrategy``, not soft: it runs there or fails, as the
probe's does) runs ``verify.run.verify_on_node`` in that node's worker: the
node's own routes and EPs, the node's machine checked against its profile, and
each record keyed by the node's machine. The records come back to the driver,
are checked there as any cached record is (``verify.run.keep_node_evidence``)
and written to this machine's evidence store, where ``plan`` looks for a cluster
node's evidence (``verify.placement.node_verification``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.config import PipelineConfig
from orchestrator.core import settings
from orchestrator.core.errors import ConfigError
from orchestrator.core.profile import HardwareProfile
from orchestrator.runtime.cluster import node_names
from orchestrator.verify.evidence import EvidenceStore
from orchestrator.verify.run import (
    VerifyReport,
    candidates,
    keep_node_evidence,
    node_seed,
    verify_on_node,
)

if TYPE_CHECKING:
    from ray import ObjectRef

log = logging.getLogger(__name__)

NODE_VERIFY_TIMEOUT_S = 3600.0
"""One node's gates, all of its placements: a route worker may take up to 900 s to open
one session (NPU compiles, ``ort.sessions``), and a node may verify several."""


def _verify_here(
    config: PipelineConfig,
    cluster: HardwareProfile,
    node: str,
    mask: frozenset[str],
    force: bool,
    seed: dict[str, str],
) -> tuple[str, VerifyReport]:
    """Runs on the node: ``verify_on_node``, and the Ray node id it ran on."""
    import ray

    report = verify_on_node(config, cluster, node, mask, force=force, seed=seed)
    return ray.get_runtime_context().get_node_id(), report


def verify_on_cluster(
    config: PipelineConfig,
    profile: HardwareProfile,
    mask: frozenset[str] = frozenset(),
    *,
    force: bool = False,
    store: EvidenceStore | None = None,
    on_node: Callable[[str, int], None] | None = None,
) -> VerifyReport:
    """Verify every gated candidate of ``profile`` (a cluster's) on its own node, through
    the connected Ray cluster; ``on_node(name, placements)`` as each node's task starts.
    ``ConfigError`` for a node that is not live or whose verification fails outright
    (its profile is another machine, the task died), naming the node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not profile.nodes:
        raise ConfigError.single(
            "--address",
            f"the profile {profile.name!r} is one machine's, not a cluster's",
            "leave out --profile (the cluster is probed live), or pass a cluster profile "
            "(omni-edge probe --address ADDRESS --save cluster.json)",
        )
    store = store or EvidenceStore()
    settings.require_cache_dir(store.root, "gate evidence")
    found, skipped = candidates(config, profile, mask)
    live = {name: nid for nid, name in node_names().items()}
    nodes = [n for n in profile.node_names if any(c.device.node == n for c in found)]
    missing = [n for n in nodes if n not in live]
    if missing:
        raise ConfigError.single(
            f"node {missing[0]}",
            f"the profile places candidates on {', '.join(missing)}, which the cluster does "
            f"not have live (it has {', '.join(sorted(live)) or 'no named node'})",
            "start the node (docs/cluster.md), or probe the cluster again",
        )
    task = ray.remote(num_cpus=0, max_retries=0)(_verify_here)
    refs: dict[str, ObjectRef[tuple[str, VerifyReport]]] = {}
    for name in nodes:
        if on_node:
            on_node(name, sum(1 for c in found if c.device.node == name))
        seed = {} if force else node_seed(store, profile.nodes[name].profile)
        refs[name] = task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(live[name], soft=False)
        ).remote(config, profile, name, mask, force, seed)
    report = VerifyReport(config.name, profile.name, skipped=skipped, evidence_dir=str(store.root))
    for name in nodes:
        try:
            ran_on, part = ray.get(refs[name], timeout=NODE_VERIFY_TIMEOUT_S)
        except Exception as exc:
            first = str(exc).strip().splitlines()[-1][:400] if str(exc).strip() else ""
            raise ConfigError.single(
                f"node {name}",
                f"verification there failed: {type(exc).__name__}: {first}",
                "check that the node runs this project's environment and that its profile is "
                "that machine's (leave out --profile to probe it live)",
            ) from None
        keep_node_evidence(part, name, store)
        report.nodes[name] = ran_on
        report.results += part.results
        report.routes.update(part.routes)
        report.route_start_s.update(part.route_start_s)
    return report
