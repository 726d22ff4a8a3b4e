"""The runtime half of ``exported_graph``: an ONNX Runtime session in its route, item by item.

:class:`ExportedGraphRunner` carries out an admitted ``exported_graph``
placement inside a device actor: ``load()`` opens the plan's session spec in
the placement's route (this interpreter, or a route worker started with the
route's interpreter, ``orchestrator.ort.sessions``); ``stream()`` sends each
input item through preprocess → session → postprocess. The hooks run in this
process; only the session runs in the route, so a route needs nothing but
numpy and its onnxruntime build.

A route worker is recycled (``WorkerSessions.recycle_limit``) when its RSS
would pass the stage's planned budget (``StagePlan.budget_bytes()``: the worker
holds all of the stage's memory, and the device actor measures the worker's
RSS against that budget); ``request_stats`` reports ``worker_recycles``, and
``process_ids()`` names the current worker, so the device actor follows it.

A stage with ``chunk:`` (:class:`ChunkSettings`) reads its items as frames of
codes and runs the graph on windows of them (``stages.exported_graph.chunking``):
preprocess gets a window's codes ``[codebooks, frames]``, postprocess the graph's
outputs with the first output cut to the window's new samples; one output item
per window.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.errors import StageFailed
from orchestrator.memory import descendants
from orchestrator.ort.routes import resolve
from orchestrator.ort.sessions import ResolvedRoute, open_sessions
from orchestrator.profile import THIS_PROCESS
from stages.base import StageRunner
from stages.exported_graph.artifact import ExportedArtifact
from stages.exported_graph.chunking import ChunkInputError, FrameChunker, Window, new_samples

if TYPE_CHECKING:
    from orchestrator.plan import StagePlan
    from orchestrator.profile import Route


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


@dataclass(frozen=True)
class ChunkSettings:
    """A chunked stage's windows (its ``chunk:`` config) and the artifact's samples per frame."""

    frames: int | None
    left_context: int
    first_frames: int
    samples_per_frame: int


class ExportedGraphRunner(StageRunner):
    """preprocess → session → postprocess per input item, the session in its route.

    ``stream`` yields one output item per input item (for the TTS: a text chunk
    in, ``{"audio": float32 array, "sample_rate": int}`` out). Hooks run in this
    process; only the session runs in the route, so a route needs nothing but
    numpy and its onnxruntime build.
    """

    def __init__(self, stage_plan: StagePlan, artifact: ExportedArtifact, route: ResolvedRoute,
                 *, chunk: ChunkSettings | None = None) -> None:
        self.plan = stage_plan
        self.chunk = chunk
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
            self._host.recycle_limit = self.plan.budget_bytes()
            self.load_info = {**self.load_info, "worker_recycle_limit_bytes": self._host.recycle_limit}

    def process_ids(self) -> list[int]:
        """The route worker's process (and its children), the current one after a recycle; [] in this process."""
        host = self._host
        if host is None or host.in_process:
            return []
        if not self._pids or self._pids[0] != host.pid:
            self._pids = [host.pid, *descendants(host.pid)]
        return list(self._pids)

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

    def run_window(self, window: Window) -> Any:
        """One window of frames through the chain, synchronously: the new samples only."""
        if self._handle is None or self.chunk is None:
            raise StageFailed(self.plan.name, self.plan.device or "?", "run before load(), or not a chunked stage")
        codes = window.codes  # [codebooks, context + new]
        feeds = self._pre(codes, self.artifact) if self._pre else {self.artifact.manifest.inputs[0].name: codes[None]}
        outputs = dict(self._host.run(self._handle, feeds)["outputs"])
        first = self.artifact.manifest.outputs[0].name
        start, end = new_samples(outputs[first], window, self.chunk.samples_per_frame)
        outputs[first] = outputs[first][..., start:end]
        return self._post(outputs, self.artifact) if self._post else outputs

    async def _stream_chunked(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        assert self.chunk is not None
        chunker = FrameChunker(self.chunk.frames, self.chunk.left_context, self.chunk.first_frames)
        async for item in inputs:
            try:
                windows = chunker.add(item)
            except ChunkInputError as exc:
                raise StageFailed(self.plan.name, self.plan.device or "?",
                                  f"request {request_id}: an item after {chunker.received} frame(s) of codes: {exc}") from exc
            for window in windows:
                yield await self._decode(request_id, window)
        for window in chunker.finish():
            yield await self._decode(request_id, window)

    async def _decode(self, request_id: str, window: Window) -> Any:
        try:
            return await asyncio.to_thread(self.run_window, window)
        except StageFailed:
            raise
        except Exception as exc:
            raise StageFailed(self.plan.name, self.plan.device or "?", f"request {request_id}: {type(exc).__name__}: {exc}") from exc

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        if self.chunk is not None:
            async for out in self._stream_chunked(request_id, inputs):
                yield out
            return
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
