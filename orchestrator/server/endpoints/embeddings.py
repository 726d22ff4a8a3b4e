"""``POST /v1/embeddings``: each input embedded by the pipeline's embedding stage alone (a
tensor-out stage that takes text; the request enters the graph there, ``Pipeline.stream(entry=)``).

Each input is one request whose text reaches the stage whole (``TextRequest.whole``: not cut
into sentences as a producer's stream would be), so its vector is exactly the stage's graph run
on that text. ``encoding_format`` ``float`` gives the numbers, ``base64`` their float32
little-endian bytes (OpenAI's encoding, which the ``openai`` client asks for by default)."""

from __future__ import annotations

from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.core.errors import StageFailed
from orchestrator.runtime.events import Event, OutputItem, StageEvent
from orchestrator.server.failures import REQUEST_ERRORS
from orchestrator.server.http import b64, error_for
from orchestrator.server.media_protocol import read_embeddings
from orchestrator.server.served import Run, Served
from stages.requests import TextRequest


class Embeddings:
    """The embeddings endpoint of one served pipeline."""

    def __init__(self, served: Served) -> None:
        self.served = served

    async def embeddings(self, request: Request) -> Response:
        served = self.served
        if served.embed_stage is None:
            return served.refuse(
                "embeddings",
                served.no_stage(
                    "/v1/embeddings",
                    "embedding stage (a stage whose final output is a tensor and that takes text)",
                    "configs/examples/voice-and-embed.yaml",
                ),
            )
        read = await served.body(
            request, "embeddings", lambda raw: read_embeddings(raw, served.limits)
        )
        if isinstance(read, Response):
            return read
        texts, fmt = read
        data = []
        for i, text in enumerate(texts):
            vector = await self._embed(request, text)
            if isinstance(vector, Response):
                return vector
            data.append(
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": vector.tolist() if fmt == "float" else b64(vector.tobytes()),
                }
            )
        return JSONResponse({"object": "list", "data": data, "model": served.model})

    async def _embed(self, request: Request, text: str) -> Any:
        """One input's vector (float32, little-endian, 1-D): the request entered at the stage
        with the text whole; a refusal or a failure as the response to send."""
        stage = self.served.embed_stage

        def done(event: Event) -> bool:
            return isinstance(event, StageEvent) and event.stage == stage and event.kind == "done"

        run = Run(self.served, TextRequest(text, whole=True), "embeddings", entry=stage)
        try:
            if not await run.until(done, request):
                return Response(status_code=499)
            values = [
                e.value for e in run.buffered if isinstance(e, OutputItem) and e.stage == stage
            ]
            if len(values) == 1 and isinstance(values[0], dict) and len(values[0]) == 1:
                values = list(values[0].values())
            if len(values) != 1 or isinstance(values[0], dict):
                raise StageFailed(
                    stage or "",
                    self.served.runtime.plan.stage(stage or "").device or "?",
                    f"gave {len(values)} items for one input, not one array",
                    "embedding_not_one_array",
                )
        except REQUEST_ERRORS as exc:
            response = error_for(exc)
            await run.close(response.status_code)
            return response
        await run.close(200)
        return np.ascontiguousarray(np.asarray(values[0], dtype="<f4").reshape(-1))


def routes(served: Served) -> list[Route]:
    endpoint = Embeddings(served)
    return [Route("/v1/embeddings", endpoint.embeddings, methods=["POST"])]
