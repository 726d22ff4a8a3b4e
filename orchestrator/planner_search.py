"""The joint search: one option per stage (and per replica) such that every pool's peak fits at once, tried in each stage's preference order; and, when none fits, the refusal that names the pool, its figures and who holds what."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from orchestrator.core.errors import RefusalCode
from orchestrator.core.ledger import Ledger
from orchestrator.core.plan import (
    Refusal,
)
from orchestrator.core.units import fmt_bytes
from orchestrator.planner_options import Option, StageState


def choose(states: list[StageState], ledger: Ledger) -> dict[str, Option]:
    """The jointly fitting option per holder (a stage, or a replica of one; none when no
    assignment fits), admitted to ``ledger``; when none fits, ``_explain_joint_failure``
    says why on the states."""
    viable = [s for s in states if s.options]
    choice = _search(viable, ledger)
    chosen: dict[str, Option] = {}
    if choice is not None:
        chosen = {s.holder: o for s, o in zip(viable, choice, strict=True)}
    elif viable:
        _explain_joint_failure(viable, ledger)
    # the search left the ledger holding only the pipeline's own reservations
    for name, option in chosen.items():
        admission = ledger.admit(name, list(option.reservations))
        assert admission.ok, "the search found this assignment fitting"
    return chosen


def _search(states: list[StageState], ledger: Ledger) -> list[Option] | None:
    """Depth-first over options in preference order; the first full fit wins. A replica
    tries its options in spread order (``_spread``); replicas are interchangeable, so each
    distinct spread of a stage's replicas (a multiset of options) is tried once."""
    picked: list[tuple[int, Option]] = []
    tried: dict[str, set[tuple[int, ...]]] = {}

    def go(i: int) -> bool:
        if i == len(states):
            return True
        state = states[i]
        siblings = picked[i - state.replica : i]
        if state.replica == 0:
            tried[state.stage.name] = set()
        for k, option in _spread(state.options, [o for _, o in siblings]):
            if state.replicas > 1:
                spread = tuple(sorted([j for j, _ in siblings] + [k]))
                if spread in tried[state.stage.name]:
                    continue  # the same replicas in another order: that subtree failed
                tried[state.stage.name].add(spread)
            if not ledger.admit(state.holder, list(option.reservations)).ok:
                continue
            picked.append((k, option))
            if go(i + 1):
                return True
            picked.pop()
            ledger.release(state.holder)
        return False

    found = go(0)
    for s in states:
        ledger.release(s.holder)
    return [o for _, o in picked] if found else None


def _spread(options: list[Option], siblings: Sequence[Option]) -> list[tuple[int, Option]]:
    """A replica's options (with their index in the stage's preference order), least used
    by its siblings first: fewest on the device, then fewest on its node, then the config's
    order (stable, so replica 0 keeps the config's preference). A device another replica
    uses comes only after every other."""
    devices = Counter(o.device.id for o in siblings)
    nodes = Counter(o.device.node for o in siblings if o.device.node)
    return sorted(
        enumerate(options),
        key=lambda ko: (
            devices[ko[1].device.id],
            nodes[ko[1].device.node] if ko[1].device.node else 0,
            ko[0],
        ),
    )


def replica_states(
    state: StageState, among: Sequence[StageState] | None = None
) -> list[StageState]:
    """The stage's states to place: itself for one instance; with ``replicas: N`` > 1, N
    sharing its options and refusals (holders ``name#0`` …). ``among``: those already made."""
    if among is not None:
        return [s for s in among if s.stage.name == state.stage.name]
    if state.replicas == 1:
        return [state]
    return [
        replace(state, holder=f"{state.stage.name}#{i}", replica=i) for i in range(state.replicas)
    ]


def refuse_unplaceable_replicas(states: list[StageState], ledger: Ledger) -> None:
    """All or none: a stage whose N replicas cannot all be placed beside the pipeline's own
    reservations (``ledger`` holds only those) is refused whole, naming the first replica
    that fits nowhere once the ones before it are placed, with the numbers."""
    for first in [s for s in states if s.replica == 0 and s.replicas > 1 and s.options]:
        group = replica_states(first, states)
        if _search(group, ledger) is not None:
            continue
        refusal = _replica_refusal(group, ledger)
        for s in group:
            s.options = []
        first.refusals.append(refusal)


def _holders_on(placed: Iterable[tuple[str, str]]) -> str:
    """``voice#0 on igpu:0, voice#1 on cpu``; more than three on one device counted:
    ``13 replicas on cpu (voice#0, voice#1, …, voice#12)``."""
    by_device: dict[str, list[str]] = {}
    for holder, device in placed:
        by_device.setdefault(device, []).append(holder)
    return ", ".join(
        f"{', '.join(hs)} on {d}"
        if len(hs) <= 3
        else f"{len(hs)} replicas on {d} ({hs[0]}, {hs[1]}, …, {hs[-1]})"
        for d, hs in by_device.items()
    )


def _replica_refusal(group: list[StageState], ledger: Ledger) -> Refusal:
    """Why the stage's replicas do not all fit: replicas placed one by one in spread order
    until one fits on none of the stage's options; its shortfall on each device it tried."""
    placed: list[Option] = []
    failing = group[-1]
    for s in group:
        fit = next(
            (
                o
                for _, o in _spread(s.options, placed)
                if ledger.admit(s.holder, list(o.reservations)).ok
            ),
            None,
        )
        if fit is None:
            failing = s
            break
        placed.append(fit)
    shortfalls, seen = [], set()
    for _, option in _spread(failing.options, placed):
        found = ledger.check({failing.holder: list(option.reservations)})
        if found and option.device.id not in seen:
            seen.add(option.device.id)
            sf = found[0]
            own = sf.contributors.get(failing.holder, 0)
            shortfalls.append(
                f"on {option.device.id} it needs {fmt_bytes(own)} of {sf.pool}, and "
                f"{fmt_bytes(sf.capacity - (sf.peak - own))} of {fmt_bytes(sf.capacity)} is left "
                f"({fmt_bytes(sf.over_by)} short)"
            )
    for s in group:
        ledger.release(s.holder)
    name, n, i = failing.stage.name, failing.replicas, failing.replica
    beside = _holders_on((g.holder, o.device.id) for g, o in zip(group, placed, strict=False))
    return Refusal(
        RefusalCode.BUDGET_EXCEEDS_DEVICE,
        placed[0].device.id if placed else failing.options[0].device.id,
        f"replica {i + 1} of {n} ({failing.holder}) fits on none of the stage's devices"
        + (f" beside {beside} and the pipeline's own reservations" if beside else "")
        + ": "
        + "; ".join(shortfalls),
        f"lower replicas (stages.{name}.replicas: {i} fit here) or allow more devices "
        f"(stages.{name}.devices)",
    )


def _explain_joint_failure(states: list[StageState], ledger: Ledger) -> None:
    """No assignment fits: refuse the stages on the first overflowing pool of the
    most preferred assignment (replicas spread), naming every contributor and its bytes."""
    preferred = _preferred(states)
    found = ledger.check({h: list(o.reservations) for h, o in preferred.items()})
    assert found, "the most preferred assignment fits, so the search would have taken it"
    shortfall = found[0]
    peak, shares = shortfall.peak, shortfall.contributors
    stage_of = {s.holder: s.stage.name for s in states}
    parts = _contributors(shares, stage_of, preferred)
    refused = list(dict.fromkeys(stage_of[h] for h in shares if h in stage_of))
    replicated = [s.stage.name for s in states if s.replica == 1 and s.stage.name in refused]
    replicas = f", fewer replicas of {', '.join(replicated)}" if replicated else ""
    for s in states:
        if s.stage.name not in refused:
            continue
        dev = preferred[s.holder].device.id
        s.options = []
        if s.replica > 0:
            continue  # the replicas of a stage share its refusals: one says it
        s.refusals.append(
            Refusal(
                RefusalCode.BUDGET_EXCEEDS_DEVICE,
                dev,
                f"{shortfall.pool} cannot hold every stage placed on it: {parts} = {fmt_bytes(peak)} > "
                f"{fmt_bytes(shortfall.capacity)} ({fmt_bytes(peak - shortfall.capacity)} short); each fits alone, "
                f"and every other allowed placement overflows too",
                f"free {fmt_bytes(peak - shortfall.capacity)} on {shortfall.pool}: shrink one of {', '.join(refused)} "
                f"(shorter max_model_len, a smaller precision build){replicas}, allow a device with its own memory, "
                "or run fewer stages",
            )
        )


def _contributors(
    shares: Mapping[str, int], stage_of: Mapping[str, str], preferred: Mapping[str, Option]
) -> str:
    """``(pipeline) 1.90 GiB + thinker 1.50 GiB (cpu)``, largest first; replicas of one stage
    with the same bytes on the same device as one term: ``13 replicas of voice 1.49 GiB each
    (cpu)``."""
    terms: dict[tuple[str, int, str], list[str]] = {}
    for h, b in sorted(shares.items(), key=lambda kv: -kv[1]):
        dev = preferred[h].device.id if h in preferred else ""
        replica = h != stage_of.get(h, h)
        terms.setdefault((stage_of[h] if replica else h, b, dev), []).append(h)
    return " + ".join(
        (
            f"{len(hs)} replicas of {name} {fmt_bytes(b)} each"
            if len(hs) > 1
            else f"{hs[0]} {fmt_bytes(b)}"
        )
        + (f" ({dev})" if dev else "")
        for (name, b, dev), hs in terms.items()
    )


def _preferred(states: list[StageState]) -> dict[str, Option]:
    """Each holder's most preferred option: its first, or for a replica the first in spread
    order beside its siblings' (what the search tries first)."""
    out: dict[str, Option] = {}
    for i, s in enumerate(states):
        siblings = [out[states[j].holder] for j in range(i - s.replica, i)]
        out[s.holder] = _spread(s.options, siblings)[0][1]
    return out
