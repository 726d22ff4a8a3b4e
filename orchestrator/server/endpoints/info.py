"""What a served pipeline says about itself: ``GET /health`` (every stage can serve, or which
cannot and why), ``/v1/models``, ``/v1/plan`` (each stage's measured peak beside its budget),
``/v1/status`` (stages, pools, the queue, the last requests) and ``/metrics`` (Prometheus)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.core.documents import JsonObject
from orchestrator.core.ledger import MeasuredPeak
from orchestrator.server.auth import error_response
from orchestrator.server.paths import FULL, PATHS_PARAM, paths_asked, redact_paths
from orchestrator.server.served import Served
from stages.base import REQUEST, StageHealth

HEALTH_TIMEOUT_S = 2.0
"""How long ``/health`` waits for a device actor to say how its stages are: an actor
answers in milliseconds; one that does not within this is reported, not waited for."""


class Info:
    """The endpoints that describe one served pipeline."""

    def __init__(self, served: Served) -> None:
        self.served = served

    async def models(self, request: Request) -> Response:
        """OpenAI's list of one model, the pipeline, with what it takes and gives
        (``modalities``) and the endpoints that answer for it (``endpoints``): ``chat`` when a
        request may enter it (text, audio or arrays), ``speech`` with a stage that speaks text,
        ``transcriptions`` with an asr stage taking the request's audio, ``embeddings`` with a
        tensor-out stage taking text, ``realtime`` when it takes audio."""
        served = self.served
        text_entries = set(served.runtime.entry_stages("text"))
        takes_text = any(  # a stage that takes the request itself as text (a thinker, a voice)
            REQUEST in s.inputs and s.name in text_entries for s in served.runtime.stages
        )
        inputs = [m for m, yes in (("text", takes_text), ("audio", served.audio_entry)) if yes]
        if served.tensor_entry:
            inputs.append("tensor")
        outputs = [
            m
            for m, stages in (
                ("text", served.text_stages),
                ("audio", served.audio_stages),
                ("tensor", served.tensor_stages),
            )
            if stages
        ]
        endpoints = {
            "chat": "/v1/chat/completions" if inputs else None,
            "speech": "/v1/audio/speech" if served.speech_stage else None,
            "transcriptions": "/v1/audio/transcriptions" if served.asr_stage else None,
            "embeddings": "/v1/embeddings" if served.embed_stage else None,
            "realtime": "/v1/realtime" if served.audio_entry else None,
        }
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": served.model,
                        "object": "model",
                        "created": served.created,
                        "owned_by": "omni-edge",
                        "stages": [s.name for s in served.runtime.stages],
                        "modalities": {"input": inputs, "output": outputs},
                        "endpoints": [name for name, path in endpoints.items() if path],
                        "paths": {name: path for name, path in endpoints.items() if path},
                    }
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        """Asked of the actors now (``Runtime.stage_failures``: a dead one is noticed by this
        call), within ``HEALTH_TIMEOUT_S``. 200 while every stage can serve: ``ok``, or
        ``degraded`` naming each dead replica of a stage whose other replicas serve and each
        stage moved to its fallback device (``moved``); 503 naming each stage that cannot
        (stage, device, code): ``recovering`` while every one of them is coming back (a
        restart under way or due: ``recovering`` names the stage, its attempt, when it died
        and why; a route worker being replaced), else ``unavailable`` (a crash loop, a
        device actor dead for good, an engine that stopped inside a living actor)."""
        runtime = self.served.runtime
        failures = await runtime.stage_failures(HEALTH_TIMEOUT_S) if not runtime._closed else {}
        stages = self.served.stage_states(failures)
        recovering = self._recovering(failures)
        ok = all(s["alive"] for s in stages)
        degraded = [
            {"stage": s["name"], "replica": r["replica"], "device": r["device"], "code": r["code"]}
            for s in stages
            if s["alive"]
            for r in s.get("replicas", [])
            if not r["alive"] and "code" in r
        ]
        moved = list(runtime.supervisor.moves) if runtime.supervisor is not None else []
        coming = {r["stage"] for r in recovering}
        down = [s["name"] for s in stages if not s["alive"]]
        status = "degraded" if degraded or moved else "ok"
        if not ok:
            status = "recovering" if all(name in coming for name in down) else "unavailable"
        doc: JsonObject = {"status": status, "pipeline": self.served.model, "stages": stages}
        if degraded:  # a dead replica whose siblings serve: still 200, named
            doc["degraded"] = degraded
        if recovering:
            doc["recovering"] = recovering
        if moved:
            doc["moved"] = [{k: m[k] for k in ("stage", "from", "to", "why", "at")} for m in moved]
        if not ok:
            doc["failed"] = [
                {"stage": s["name"], "device": s["device"], "code": s.get("code", "unavailable")}
                for s in stages
                if not s["alive"]
            ]
        return JSONResponse(doc, status_code=200 if ok else 503)

    def _recovering(self, failures: dict[str, StageHealth]) -> list[JsonObject]:
        """Each stage instance coming back: its device actor restarting (``attempt``,
        ``died_at``, ``cause``) or its stage moving to its fallback, or its route worker
        being replaced (a runner's ``*_restarting`` code)."""
        runtime = self.served.runtime
        out: list[JsonObject] = []
        for s in runtime.stages:
            for ref in runtime.replicas[s.name]:
                replica: JsonObject = {"replica": ref.index + 1} if ref.of > 1 else {}
                status = runtime.supervisor.status(ref.holder) if runtime.supervisor else None
                failed = failures.get(ref.holder)
                if status and (status["state"] == "recovering" or status.get("moving")):
                    doc: JsonObject = {
                        "stage": s.name,
                        **replica,
                        "device": ref.device,
                        "code": "stage_restarting",
                    }
                    if "attempt" in status:
                        doc["attempt"] = status["attempt"]
                    if "died_at" in status:
                        doc["died_at"], doc["cause"] = status["died_at"], status.get("cause", "")
                    out.append(doc)
                elif failed is not None and failed["code"].endswith("_restarting"):
                    out.append(
                        {
                            "stage": s.name,
                            **replica,
                            "device": ref.device,
                            "code": failed["code"],
                            "cause": failed["message"],
                        }
                    )
        return out

    async def plan(self, request: Request) -> Response:
        """The plan with its measured peaks; absolute paths cut to their file names unless a
        loopback client asks for them whole (``server.paths``)."""
        asked, refused = paths_asked(request.query_params, request.client)
        if refused is not None:
            status, message, code = refused
            return error_response(
                status, message, "invalid_request_error", param=PATHS_PARAM, code=code
            )
        doc = self.served.pipeline.plan.to_json()
        measured = await self.served.metrics.measured_now()
        for s in doc["stages"]:
            holders = (
                self.served.holders(s["name"]) if s["name"] in self.served.runtime.replicas else []
            )
            # a stage's own fields are its first replica's; each replica has its own figure
            s["measured"] = self._measured(measured, holders[0] if holders else s["name"])
            for r in s.get("replicas", []):
                r["measured"] = self._measured(measured, r["holder"])
        # the serve process's own memory against its shared reservation (``server``)
        server_memory = getattr(self.served.pipeline, "server_memory", None)
        doc["server"] = (
            await asyncio.to_thread(server_memory) if server_memory is not None else None
        )
        return JSONResponse(doc if asked == FULL else redact_paths(doc))

    def _measured(self, measured: dict[str, MeasuredPeak], holder: str) -> JsonObject:
        """A stage's (or one replica's) measured peak next to its budget, for ``/v1/plan``."""
        view = self.served.runtime.views.get(holder) or self.served.pipeline.plan.stage(holder)
        m = measured.get(holder)
        return {
            "pool": view.pool,
            "measured_peak_bytes": m["measured_peak_bytes"] if m else None,
            "budget_bytes": m["budget_bytes"] if m else view.budget_bytes(),
            "within_budget": m["within_budget"] if m else None,
        }

    async def status(self, request: Request) -> Response:
        measured = await self.served.metrics.measured_now()
        ledger = await self.served.metrics.ledger() or {}
        held = {p["id"]: p["held_bytes"] for p in ledger.get("pools", [])}
        pools = []
        for p in self.served.pipeline.plan.pools:
            peaks = [
                m["measured_peak_bytes"]
                for name, m in measured.items()
                if self.served.runtime.views[name].pool == p.id
                and m.get("measured_peak_bytes") is not None
            ]
            pools.append(
                {
                    "id": p.id,
                    "capacity_bytes": p.capacity_bytes,
                    "budget_bytes": p.peak_bytes,
                    "reserved_bytes": held.get(p.id),
                    "measured_peak_bytes": sum(peaks) if peaks else None,
                }
            )
        failures = (
            await self.served.runtime.stage_failures(HEALTH_TIMEOUT_S)
            if not self.served.runtime._closed
            else {}
        )
        stages = [
            {
                k: s[k]
                for k in (
                    "name",
                    "kind",
                    "device",
                    "backend",
                    "alive",
                    "loaded",
                    "final_output_type",
                    "code",  # when it cannot serve: stage_restarting (coming back), crash_loop...
                    "restart",  # once its actor died: the supervisor's state, attempt, cause
                )
                if k in s
            }
            for s in self.served.stage_states(failures)
        ]
        admission = self.served.runtime.admission
        return JSONResponse(
            {
                "pipeline": self.served.model,
                "stages": stages,
                "pools": pools,
                "queue": {
                    "in_flight": admission.in_flight,
                    "waiting": admission.waiting,
                    # waiting (holding no slot) for a stage that is coming back
                    "waiting_for_restart": self.served.runtime.waiting_for_stages,
                    "limit": admission.limit,
                    "max_waiting": admission.max_waiting,
                },
                "recent": list(self.served.metrics.recent),
            }
        )

    async def metrics_text(self, request: Request) -> Response:
        return Response(
            await self.served.metrics.render(),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )


def routes(served: Served) -> list[Route]:
    info = Info(served)
    return [
        Route("/v1/models", info.models, methods=["GET"]),
        Route("/v1/plan", info.plan, methods=["GET"]),
        Route("/v1/status", info.status, methods=["GET"]),
        Route("/health", info.health, methods=["GET"]),
        Route("/metrics", info.metrics_text, methods=["GET"]),
    ]
