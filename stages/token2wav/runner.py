"""The runtime half of ``token2wav``: a request's codes in, one waveform out.

:class:`Token2WavRunner` opens the plan's two session specs (DiT step, vocoder) in one
session host of the placement's route, as ``asr`` does (:class:`~stages.ort_runner.OrtRunner`;
its route worker is not recycled yet: how the DiT's frame counts grow OpenVINO's memory is
not measured). Per request, when its codes have
all come (the DiT attends over the whole sequence), it does what transformers'
``Qwen2_5OmniToken2WavDiTModel.sample`` and ``Qwen2_5OmniToken2WavModel.forward`` do:

* the initial state: Gaussian noise ``[1, codes × repeats, mel_dim]`` from numpy's default
  generator seeded with the stage's ``seed`` (the same for every request);
* the time points: ``steps`` points spaced evenly on [0, 1], bent by ``sway_coefficient``
  (``t + s · (cos(π/2 · t) − 1 + t)``);
* the solver: transformers' ``RungeKutta4ODESolver`` (the 3/8 rule, four velocity
  evaluations per interval), each evaluation one call of the DiT graph giving the
  conditioned and the code-dropped velocity, mixed as ``g + (g − n) · guidance_scale``;
* the conditioning: the voice's ``cond`` repeated over the frames and its ``ref_mel``,
  from the DiT artifact's ``voices.npz``;
* the vocoder once on the final mel ``[1, mel_dim, frames]``.

``num_steps``, ``guidance_scale``, ``sway_coefficient``, ``repeats``, ``num_embeds`` and
``sample_rate`` come from the manifests' metadata (transformers' defaults where absent).
A code outside ``[0, num_embeds)`` fails the request with ``StageFailed`` naming it; a
request cancelled while it is solved stops at its next velocity evaluation.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.core.errors import StageFailed
from stages.audio_items import Cancelled
from stages.exported_graph.artifact import ExportedArtifact
from stages.ort_runner import OrtRunner, route_for
from stages.token2wav import VOICES, voices_file

if TYPE_CHECKING:
    from orchestrator.core.plan import StagePlan
    from orchestrator.ort.sessions import ResolvedRoute

__all__ = ["Token2WavRunner", "route_for", "solve", "time_points"]

DEFAULTS = {
    "num_steps": 10,
    "guidance_scale": 0.5,
    "sway_coefficient": -1.0,
    "repeats": 2,
    "sample_rate": 24000,
}
"""``Qwen2_5OmniToken2WavModel.forward``'s defaults (10 time points, guidance 0.5, sway -1),
the DiT config's ``repeats`` (2 mel frames per code) and BigVGAN's 24 kHz: used where a
manifest's metadata does not say."""


def time_points(steps: int, sway: float | None) -> Any:
    """``sample``'s time points: ``linspace(0, 1, steps)`` bent by the sway coefficient, float32."""
    t = np.linspace(0.0, 1.0, steps, dtype=np.float32)
    if sway is not None:
        t = (t + np.float32(sway) * (np.cos(np.float32(np.pi / 2) * t) - 1 + t)).astype(np.float32)
    return t


def solve(velocity: Any, initial: Any, times: Any) -> Any:
    """transformers' ``RungeKutta4ODESolver.integrate`` to the last time point: the 3/8-rule
    RK4 step on each interval. ``velocity(t, x)`` → dx/dt."""
    third, two_thirds = np.float32(1 / 3), np.float32(2 / 3)
    x = initial
    for t0, t1 in itertools.pairwise(times):
        dt = t1 - t0
        k1 = velocity(t0, x)
        k2 = velocity(t0 + dt * third, x + dt * k1 * third)
        k3 = velocity(t0 + dt * two_thirds, x + dt * (k2 - k1 * third))
        k4 = velocity(t1, x + dt * (k1 - k2 + k3))
        x = x + (k1 + 3 * (k2 + k3) + k4) * dt / 8
    return x


class Token2WavRunner(OrtRunner):
    """DiT step + vocoder sessions in the placement's route; the solver loop here."""

    def __init__(
        self,
        stage_plan: StagePlan,
        artifacts: dict[str, ExportedArtifact],
        route: ResolvedRoute,
        *,
        voice: str | None = None,
        steps: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(stage_plan, route)
        self.dit, self.vocoder = artifacts["dit"], artifacts["vocoder"]
        meta = {**DEFAULTS, **self.vocoder.metadata, **self.dit.metadata}
        try:
            self.steps = int(steps if steps is not None else meta["num_steps"])
            self.guidance = float(meta["guidance_scale"])
            sway = meta["sway_coefficient"]
            self.sway = None if sway is None else float(sway)
            self.repeats = int(meta["repeats"])
            self.num_embeds = int(meta["num_embeds"]) if "num_embeds" in meta else None
            self.rate = int(meta["sample_rate"])
        except (KeyError, TypeError, ValueError) as exc:
            self._fail(f"{self.dit.dir}/manifest.yaml: metadata {type(exc).__name__}: {exc}")
        x = next((i for i in self.dit.manifest.inputs if i.name == "x"), None)
        if x is None or not isinstance(x.shape[-1], int):
            self._fail(
                f"{self.dit.dir}/manifest.yaml: the DiT step needs an input x of shape [1, frames, mel_dim]"
            )
        self.mel_dim = int(x.shape[-1])
        self.voice_name = voice
        self.seed = seed
        self.cond: Any = None
        self.ref_mel: Any = None

    def load(self) -> None:
        """Read the voice, then open the DiT's and the vocoder's sessions in the route."""
        specs = self._session_specs("dit", "vocoder", spelled="the DiT and the vocoder")
        with self._loading():
            with np.load(voices_file(self.dit.dir)) as data:
                voices = {k: data[k] for k in data.files}
            names = list(dict.fromkeys(k.rsplit(".", 1)[0] for k in voices))
            name = self.voice_name or names[0]
            if f"{name}.cond" not in voices or f"{name}.ref_mel" not in voices:
                raise ValueError(
                    f"no voice {name!r} in {self.dit.dir}/{VOICES} (it has {', '.join(names)})"
                )
            self.voice_name = name
            self.cond = np.asarray(voices[f"{name}.cond"], dtype=np.float32).reshape(1, 1, -1)
            self.ref_mel = np.asarray(voices[f"{name}.ref_mel"], dtype=np.float32).reshape(
                1, -1, self.mel_dim
            )
            self.load_info = dict(self._open(specs))

    def codes_of(self, items: list[Any]) -> Any:
        """The request's items (a code, or a sequence of codes each) as int64 ``[1, codes]``;
        a code outside ``[0, num_embeds)`` is a ``ValueError`` naming it and its position."""
        flat = [np.asarray(item).reshape(-1) for item in items]
        codes = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)
        if codes.size and codes.dtype.kind not in "iu":
            raise ValueError(f"token2wav takes integer codes, got {codes.dtype}")
        codes = codes.astype(np.int64)
        bad = np.nonzero((codes < 0) | ((codes >= self.num_embeds) if self.num_embeds else False))[
            0
        ]
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"code {int(codes[i])} at position {i} is outside the DiT's codes [0, {self.num_embeds})"
            )
        return codes[None]

    def noise(self, codes: int) -> Any:
        """The initial state for ``codes`` codes: standard normal float32 ``[1, codes × repeats, mel_dim]``
        from numpy's default generator seeded with the stage's seed."""
        rng = np.random.default_rng(self.seed)
        return rng.standard_normal((1, codes * self.repeats, self.mel_dim), dtype=np.float32)

    def synthesize(
        self, codes: Any, noise: Any = None, cancel: threading.Event | None = None
    ) -> Any:
        """The waveform (float32 ``[samples]``) of ``codes`` (int64 ``[1, n]``), from ``noise``
        (default :meth:`noise`). A set ``cancel`` stops it at the next velocity evaluation (``Cancelled``)."""
        if not self._handles:
            self._fail("run before load()")
        n = int(codes.shape[1])
        x = self.noise(n) if noise is None else np.asarray(noise, dtype=np.float32)
        speaker = np.repeat(self.cond, x.shape[1], axis=1)
        feeds = {"reference_mel": self.ref_mel, "speaker": speaker, "code": codes}
        guidance = np.float32(self.guidance)
        evaluations = 0

        def velocity(t: Any, state: Any) -> Any:
            nonlocal evaluations
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"cancelled after {evaluations} velocity evaluations")
            evaluations += 1
            out = self._host.run(
                self._handles["dit"], {**feeds, "x": state, "t": np.asarray(t, dtype=np.float32)}
            )
            both = out["outputs"][
                self.dit.manifest.outputs[0].name
            ]  # [2, frames, mel]: conditioned, code dropped
            guided, null = both[0:1], both[1:2]
            return guided + (guided - null) * guidance

        mel = solve(velocity, x, time_points(self.steps, self.sway))
        out = self._host.run(
            self._handles["vocoder"], {"mel": np.ascontiguousarray(mel.transpose(0, 2, 1))}
        )
        return np.asarray(
            out["outputs"][self.vocoder.manifest.outputs[0].name], dtype=np.float32
        ).reshape(-1)

    async def stream(self, request_id: str, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """One audio item when the codes end: ``{"audio": float32 [samples], "sample_rate": int}``
        (none for a request without codes)."""
        items = [item async for item in inputs]
        cancel = threading.Event()
        try:
            try:
                codes = self.codes_of(items)
            except ValueError as exc:
                self._fail(f"request {request_id}: {exc}")
            if codes.shape[1] == 0:
                return
            try:
                audio = await asyncio.to_thread(self.synthesize, codes, None, cancel)
            except (StageFailed, Cancelled):
                raise
            except Exception as exc:
                raise self._failed(exc, f"request {request_id}: ") from exc
            yield {"audio": audio, "sample_rate": self.rate}
        finally:  # cancelled or closed early: the thread still solving stops at its next evaluation
            cancel.set()
