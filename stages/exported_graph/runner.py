"""The runtime half of ``exported_graph``: an ONNX Runtime session in its route, item by item.

:class:`ExportedGraphRunner` carries out an admitted ``exported_graph``
placement inside a device actor: ``load()`` opens the plan's session spec in
the placement's route (this interpreter, or a route worker started with the
route's interpreter, ``orchestrator.ort.sessions``); ``stream()`` sends each
input item through preprocess → session → postprocess. The hooks run in this
process; only the session runs in the route, so a route needs nothing but
numpy and its onnxruntime build.

The session host, its recycling at the stage's budget (``worker_stats()``,
``worker_recycles`` in ``request_stats``, ``process_ids()`` following the current
worker) and the load's failures come from :class:`~stages.ort_runner.OrtRunner`.

Without a preprocess hook an item feeds the graph as it is (``feeds_for``): a
bare numpy array feeds a graph of one input, a mapping feeds by input name,
and anything else — a bare array into a graph of several inputs, a mapping
whose names are not the graph's, an array of another dtype or rank — is a
``BadRequest`` naming the stage, the graph's inputs and what came, before
the item reaches the session. (What a manifest can say wrong before any item
comes — a hook-less graph that consumes text — is refused when the plan is
made: ``ExportedArtifact.feed_problems``.)

A stage with ``chunk:`` (:class:`ChunkSettings`) reads its items as frames of
codes and runs the graph on windows of them (``stages.exported_graph.chunking``):
preprocess gets a window's codes ``[codebooks, frames]``, postprocess the graph's
outputs with the first output cut to the window's new samples; one output item
per window.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import BadRequest, StageFailed
from orchestrator.ort.worker import SessionIO
from stages.exported_graph.artifact import ExportedArtifact
from stages.exported_graph.chunking import ChunkInputError, FrameChunker, Window, new_samples
from stages.ort_runner import (
    RECYCLE_HEADROOM_FRACTION,
    RECYCLE_HEADROOM_MIN,
    OrtRunner,
    recycle_limit,
    route_for,
)
from stages.payloads import parse_payloads

if TYPE_CHECKING:
    import numpy as np

    from orchestrator.core.plan import StagePlan
    from orchestrator.ort.sessions import ResolvedRoute

__all__ = [
    "RECYCLE_HEADROOM_FRACTION",
    "RECYCLE_HEADROOM_MIN",
    "ChunkSettings",
    "ExportedGraphRunner",
    "feeds_for",
    "manifest_inputs",
    "recycle_limit",
    "route_for",
]

WARMUP_TEXT = "Hello."
"""What a text-consuming stage with a preprocess hook speaks at load (``warmup``): short, so the
load pays the first run's one-off costs and little more. For the Piper voice: espeak-ng's start
(66 ms of CPU in the first preprocess, 0.5 ms after it; in the pipeline the first request's
preprocess went from 13-31 ms to 2-5 ms) and the session's first run (measured in CPU time,
not wall time, which a loaded machine moves more; docs/benchmarks.md, "Time to first audio")."""
STAMPS_KEPT = 256
"""Requests whose first-item stamps wait for ``request_stats``: a cancelled request is never
asked for them, so the oldest are dropped past this (a few hundred bytes each)."""


@dataclass(frozen=True)
class ChunkSettings:
    """A chunked stage's windows (its ``chunk:`` config) and the artifact's samples per frame."""

    frames: int | None
    left_context: int
    first_frames: int
    samples_per_frame: int


class ExportedGraphRunner(OrtRunner):
    """preprocess → session → postprocess per input item, the session in its route.

    ``stream`` yields one output item per input item (for the TTS: a text chunk
    in, ``{"audio": float32 array, "sample_rate": int}`` out). Hooks run in this
    process; only the session runs in the route, so a route needs nothing but
    numpy and its onnxruntime build.
    """

    def __init__(
        self,
        stage_plan: StagePlan,
        artifact: ExportedArtifact,
        route: ResolvedRoute,
        *,
        chunk: ChunkSettings | None = None,
        warmup: bool = True,
    ) -> None:
        super().__init__(stage_plan, route)
        self.chunk = chunk
        self.warmup = warmup
        self.artifact = artifact
        self._handle: int | None = None
        self._inputs: list[SessionIO] = []
        """The session's inputs as the route reported them at load (what a request is fed by)."""
        self._pre = artifact.hook("preprocess")
        self._post = artifact.hook("postprocess")
        self._stamps: dict[str, dict[str, float]] = {}
        """Request → when its first item went through each step (``time.perf_counter``), until
        ``request_stats`` hands them to the device actor (the first-audio trace)."""

    def load(self) -> None:
        specs = self._session_specs()
        with self._loading():
            opened = self._open(specs)["session"]
        self.load_info, self._handle, self._inputs = (
            dict(opened),
            opened["handle"],
            opened["inputs"],
        )
        if self.warmup:
            with self._loading("the warm-up run at load failed: "):
                self.load_info = {**self.load_info, "warmup": self._warm()}
        self._recycle_at_budget()

    def _warm(self) -> dict[str, Any]:
        """One run at load, before any request, so the first request does not pay the first
        run's one-off costs (an EP's lazy allocations, the hook's library start). A stage that
        takes text and has a preprocess hook speaks ``WARMUP_TEXT`` through the whole chain;
        any other runs the artifact's reference inputs through the session. Before the recycle
        limit is set, so it is the load's memory, and no request's. Returns what ran and how long."""
        t0 = time.perf_counter()
        if (
            self._pre is not None
            and self.chunk is None
            and any(t.kind == "text" for t in parse_payloads(self.artifact.manifest.consumes or []))
        ):
            self.run_one(WARMUP_TEXT)
            item = "text"
        else:
            self._host.run(self._handle, self.artifact.reference_inputs())
            item = "reference inputs"
        return {"item": item, "s": round(time.perf_counter() - t0, 4)}

    def request_stats(self, request_id: str) -> dict[str, object]:
        """``worker_recycles``: how many times the stage's route worker was replaced since the load;
        ``stamps``: when the request's first item went through each step (the device actor takes
        them out of the figures, for the runtime's first-audio trace)."""
        out = self._worker_figures()
        stamps = self._stamps.pop(request_id, None)
        if stamps is not None:
            out["stamps"] = stamps
        return out

    def run_one(self, item: Any, stamps: dict[str, float] | None = None) -> Any:
        """One item through the chain, synchronously. ``stamps``, when given, gets when each
        step ended (``time.perf_counter``: ``started``, ``preprocessed``, ``ran``,
        ``postprocessed``) and the session's own ``run_s`` as the route measured it."""
        if self._handle is None:
            self._fail("run before load()")
        if stamps is not None:
            stamps["started"] = time.perf_counter()
        feeds = (
            self._pre(item, self.artifact)
            if self._pre
            else feeds_for(
                item,
                self._inputs,
                f"request (stage {self.plan.name}, kind {self.plan.kind})",
            )
        )
        if stamps is not None:
            stamps["preprocessed"] = time.perf_counter()
        result = self._host.run(self._handle, feeds)
        if stamps is not None:
            stamps["ran"] = time.perf_counter()
            stamps["run_s"] = float(result.get("run_s") or 0.0)
        outputs = result["outputs"]
        out = self._post(outputs, self.artifact) if self._post else outputs
        if stamps is not None:
            stamps["postprocessed"] = time.perf_counter()
        return out

    def run_window(self, window: Window) -> Any:
        """One window of frames through the chain, synchronously: the new samples only."""
        if self._handle is None or self.chunk is None:
            self._fail("run before load(), or not a chunked stage")
        codes = window.codes  # [codebooks, context + new]
        feeds = (
            self._pre(codes, self.artifact)
            if self._pre
            else {self.artifact.manifest.inputs[0].name: codes[None]}
        )
        outputs = dict(self._host.run(self._handle, feeds)["outputs"])
        first = self.artifact.manifest.outputs[0].name
        start, end = new_samples(outputs[first], window, self.chunk.samples_per_frame)
        outputs[first] = outputs[first][..., start:end]
        return self._post(outputs, self.artifact) if self._post else outputs

    async def _stream_chunked(
        self, request_id: str, inputs: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        assert self.chunk is not None
        chunker = FrameChunker(self.chunk.frames, self.chunk.left_context, self.chunk.first_frames)
        async for item in inputs:
            try:
                windows = chunker.add(item)
            except ChunkInputError as exc:
                self._fail(
                    f"request {request_id}: an item after {chunker.received} frame(s) of codes: {exc}"
                )
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
            raise self._failed(exc, f"request {request_id}: ") from exc

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        if self.chunk is not None:
            async for out in self._stream_chunked(request_id, inputs):
                yield out
            return
        first = True
        async for item in inputs:
            stamps: dict[str, float] | None = None
            if first:
                first, stamps = False, {"dispatched": time.perf_counter()}
            try:
                out = await asyncio.to_thread(self.run_one, item, stamps)
                if stamps is not None:
                    self._keep_stamps(request_id, stamps)
                yield out
            except (StageFailed, BadRequest):
                raise
            except Exception as exc:
                raise self._failed(exc, f"request {request_id}: ") from exc

    def _keep_stamps(self, request_id: str, stamps: dict[str, float]) -> None:
        self._stamps[request_id] = stamps
        while len(self._stamps) > STAMPS_KEPT:
            del self._stamps[next(iter(self._stamps))]

    def close(self) -> None:
        super().close()
        self._handle = None


ORT_TENSOR_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int16)": "int16",
    "tensor(int8)": "int8",
    "tensor(uint64)": "uint64",
    "tensor(uint32)": "uint32",
    "tensor(uint16)": "uint16",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
    "tensor(string)": "object",
}
"""ONNX Runtime's input type names (``NodeArg.type``) as numpy dtypes; a type not here
(bfloat16, float8) is not checked before the session sees it."""


def manifest_inputs(artifact: ExportedArtifact) -> list[SessionIO]:
    """The graph's inputs as the manifest declares them, in ``feeds_for``'s shape (what a
    session reports at load: ONNX Runtime's type names, a named axis as None), so a request
    is checked in the caller's process before any session exists."""
    types = {dtype: ort for ort, dtype in ORT_TENSOR_DTYPES.items() if dtype != "object"}
    return [
        {
            "name": t.name,
            "type": types.get(t.dtype, f"tensor({t.dtype})"),
            "shape": [d if isinstance(d, int) else None for d in t.shape],
        }
        for t in artifact.manifest.inputs
    ]


def feeds_for(item: Any, inputs: list[SessionIO], where: str) -> dict[str, np.ndarray | np.generic]:
    """The session's feeds for ``item`` when no preprocess hook makes them.

    ``inputs``: the session's inputs as the route reported them at load
    (``{"name", "type", "shape"}``, in the graph's order). A bare numpy array
    feeds a graph of one input; a mapping feeds by name and must name exactly
    the graph's inputs; every value must be an array of the input's dtype, rank
    and fixed sizes. Anything else is a ``BadRequest`` at ``where`` naming the
    graph's inputs and what came, so a mismatched item never reaches the
    session (where it was an ``AttributeError`` in the route worker).
    """
    import numpy as np

    names = [str(i["name"]) for i in inputs]
    wanted = ", ".join(_spelled(i) for i in inputs) or "nothing"
    if isinstance(item, (np.ndarray, np.generic)):
        if len(names) != 1:
            raise BadRequest.single(
                where,
                f"a bare {_described(item)} array came, and the graph takes {len(names)} inputs ({wanted}): "
                "a bare array feeds a graph of one input",
                f"send a mapping {{{', '.join(names)}}} of arrays, or give the artifact a preprocess hook "
                "that makes the graph's inputs from the item (docs/exported-artifacts.md)",
            )
        feeds = {names[0]: item}
    elif isinstance(item, Mapping):
        got = [str(k) for k in item]
        missing = [n for n in names if n not in item]
        extra = [k for k in got if k not in names]
        if missing or extra:
            raise BadRequest.single(
                where,
                f"a mapping of {', '.join(got) or 'nothing'} came, and the graph takes {wanted}"
                + (f"; missing: {', '.join(missing)}" if missing else "")
                + (f"; unknown: {', '.join(extra)}" if extra else ""),
                "name the arrays as the graph's inputs are named (the manifest's inputs), or give the artifact "
                "a preprocess hook that makes them from the item",
            )
        feeds = {str(k): v for k, v in item.items()}
    else:
        raise BadRequest.single(
            where,
            f"a {type(item).__name__} came, and the graph takes arrays ({wanted})",
            "feed the stage from one that produces tensors, or give the artifact a preprocess hook that turns "
            f"a {type(item).__name__} into the graph's inputs",
        )
    for spec in inputs:
        problem = _feed_problem(feeds[str(spec["name"])], spec)
        if problem:
            raise BadRequest.single(
                f"{where}: {spec['name']}",
                f"{problem}; the graph takes {_spelled(spec)}",
                "produce arrays of the graph's dtype and shape upstream, or convert them in a preprocess hook",
            )
    return feeds


def _feed_problem(value: Any, spec: SessionIO) -> str | None:
    import numpy as np

    if not isinstance(value, (np.ndarray, np.generic)):
        return f"a {type(value).__name__} came, not a numpy array"
    dtype = ORT_TENSOR_DTYPES.get(str(spec.get("type")))
    if (
        dtype is not None
        and value.dtype != np.dtype(dtype)
        and not (dtype == "object" and value.dtype.kind in "OU")
    ):
        return f"a {_described(value)} array came"
    shape = spec.get("shape")
    if shape is not None and (
        value.ndim != len(shape)
        or any(
            isinstance(d, int) and d >= 0 and d != n
            for d, n in zip(shape, value.shape, strict=True)
        )
    ):
        return f"a {_described(value)} array came"
    return None


def _described(value: Any) -> str:
    return f"{value.dtype}{list(value.shape)}"


def _spelled(spec: SessionIO) -> str:
    dtype = ORT_TENSOR_DTYPES.get(str(spec.get("type")), str(spec.get("type")))
    shape = spec.get("shape")
    dims = "?" if shape is None else ",".join("*" if d is None else str(d) for d in shape)
    return f"{spec['name']} {'str' if dtype == 'object' else dtype}[{dims}]"
