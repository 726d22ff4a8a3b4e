"""Stage replicas: which instance of each stage serves a request.

A stage with ``replicas: N`` > 1 runs N instances, each in its own device actor (its actor
key: the device id, or ``device#k`` for the k-th extra replica of a stage on one device).
:class:`Balancer` picks one live replica per stage when a request starts (after admission)
and gives it back when the request winds down:

* **least loaded**: the live replica with the fewest requests in flight (below its cap,
  ``admission.replica_caps``), ties broken round-robin, so an idle pipeline alternates;
* **one replica per request and stage**: every item of the request on that stage goes to the
  one picked (its stream is opened there and every producer's route names it), so per-request
  state (a talker's KV) never splits;
* **a dead replica is skipped** (``mark_dead``); a stage whose replicas are all dead gets no
  pick (the runtime refuses the request first, ``Runtime._check_alive``);
* **sticky conversations**: for a stage whose kind keeps state across turns
  (``StageKind.replica_affinity`` = ``conversation``: an Omni talker), the first pick for a
  conversation id is remembered (at most ``CONVERSATIONS`` ids, least recently used
  forgotten) and every later turn of it goes there while that replica lives.

Thread-safe like ``admission.Admission``: requests come from several event loops or threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

CONVERSATIONS = 4096
"""Conversations whose replica is remembered per stage: far more than the requests a
pipeline holds at once (``admission``: 60 at most per actor); the least recently used goes."""


@dataclass(frozen=True)
class ReplicaRef:
    """One instance of a stage as the runtime placed it."""

    stage: str
    index: int
    """0-based (``holder`` is ``stage#index`` for N > 1); said 1-based: ``replica 2 of 2``."""
    of: int
    """N, the stage's number of replicas."""
    holder: str
    """Its ledger holder: ``voice#1``, or the stage's name when N = 1."""
    device: str
    key: str
    """Its device actor's key (``cpu``, ``cpu#1``)."""

    def said(self) -> str:
        """``replica 2 of 2 (voice#1)``; empty for a stage of one instance."""
        return f"replica {self.index + 1} of {self.of} ({self.holder})" if self.of > 1 else ""


class Balancer:
    """Least-loaded live replica per stage per request (see the module docstring)."""

    def __init__(
        self,
        replicas: Mapping[str, Sequence[ReplicaRef]],
        caps: Mapping[str, int],
        sticky: Iterable[str] = (),
    ) -> None:
        self.replicas = {stage: tuple(refs) for stage, refs in replicas.items()}
        self.caps = dict(caps)
        """Actor key → requests a replica there may hold at once (``admission.replica_caps``)."""
        self.in_flight: dict[str, int] = {r.holder: 0 for rs in self.replicas.values() for r in rs}
        self.served: dict[str, int] = dict.fromkeys(self.in_flight, 0)
        """Holder → requests it was picked for since the start."""
        self.dead: set[str] = set()
        """Actor keys whose actor died."""
        self.sticky = frozenset(sticky)
        """The stages whose conversations stay on one replica."""
        self.conversations: OrderedDict[tuple[str, str], ReplicaRef] = OrderedDict()
        self._next: dict[str, int] = dict.fromkeys(self.replicas, 0)
        self._lock = threading.Lock()

    def live(self, stage: str) -> list[ReplicaRef]:
        return [r for r in self.replicas[stage] if r.key not in self.dead]

    def pick(self, stages: Iterable[str], conversation: str | None = None) -> dict[str, ReplicaRef]:
        """One live replica per stage (a stage with none live is left out), counted in; a
        sticky stage's ``conversation`` goes where it went before while that replica lives."""
        out: dict[str, ReplicaRef] = {}
        with self._lock:
            for stage in stages:
                chosen = self._remembered(stage, conversation) or self._choose(stage)
                if chosen is not None and conversation is not None and stage in self.sticky:
                    self.conversations[(stage, conversation)] = chosen
                    self.conversations.move_to_end((stage, conversation))
                    while len(self.conversations) > CONVERSATIONS:
                        self.conversations.popitem(last=False)
                if chosen is not None:
                    out[stage] = chosen
                    self.in_flight[chosen.holder] += 1
                    self.served[chosen.holder] += 1
        return out

    def _remembered(self, stage: str, conversation: str | None) -> ReplicaRef | None:
        if conversation is None or stage not in self.sticky:
            return None
        ref = self.conversations.get((stage, conversation))
        return ref if ref is not None and ref.key not in self.dead else None

    def _choose(self, stage: str) -> ReplicaRef | None:
        refs = self.replicas[stage]
        live = [r for r in refs if r.key not in self.dead]
        if not live:
            return None
        roomy = [r for r in live if self.in_flight[r.holder] < self.caps.get(r.key, 1)] or live
        least = min(self.in_flight[r.holder] for r in roomy)
        tied = [r for r in roomy if self.in_flight[r.holder] == least]
        start = self._next[stage]
        chosen = min(tied, key=lambda r: (r.index - start) % len(refs))
        self._next[stage] = (chosen.index + 1) % len(refs)
        return chosen

    def release(self, picks: Mapping[str, ReplicaRef]) -> None:
        """The request is over: its replicas are counted out."""
        with self._lock:
            for ref in picks.values():
                self.in_flight[ref.holder] = max(0, self.in_flight[ref.holder] - 1)

    def mark_dead(self, key: str) -> None:
        with self._lock:
            self.dead.add(key)

    def revive(self, key: str) -> None:
        """The actor of ``key`` was restarted: its replicas are picked again."""
        with self._lock:
            self.dead.discard(key)

    def replace(self, new: ReplicaRef, cap: int) -> None:
        """A replica moved to another actor (``runtime.fallback``): ``new`` (same stage and
        holder, its new device and key, requests up to ``cap`` there) replaces it; the
        conversations it held are forgotten (their state was in the actor that is gone)."""
        with self._lock:
            refs = self.replicas[new.stage]
            self.replicas = {
                **self.replicas,
                new.stage: tuple(new if r.holder == new.holder else r for r in refs),
            }
            self.caps = {**self.caps, new.key: cap}
            for k, ref in list(self.conversations.items()):
                if ref.holder == new.holder:
                    del self.conversations[k]
