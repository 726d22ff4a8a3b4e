"""The exception tree and the refusal codes (contract).

Refusal codes are user-facing: scripts match on them. A new reason gets a new
code; a code is never reused for another meaning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum, unique


# ---- refusal codes (contract: docs/refusals.md) ------------------------------
@unique
class RefusalCode(StrEnum):
    """Why a device was not chosen for a stage: the ``code`` of a refusal.

    A ``StrEnum``: a member is its value wherever a string is expected
    (``json.dumps``, f-strings, ``==`` against the text a script reads), so the
    plan JSON carries the bare code, e.g. ``"budget_exceeds_device"``. ``@unique``:
    two names for one code fail at import."""

    NO_RUNNABLE_DEVICE = "no_runnable_device"
    WEIGHT_FORMAT_UNSUPPORTED = "weight_format_unsupported"
    BUDGET_EXCEEDS_DEVICE = "budget_exceeds_device"
    CONFIG_UNREADABLE = "config_unreadable"
    NO_EXPORTED_GRAPH = "no_exported_graph"
    EXECUTION_PROVIDER_DECLINED_GRAPH = "execution_provider_declined_graph"
    NUMERIC_GATE_FAILED = "numeric_gate_failed"
    DEVICE_UNREACHABLE = "device_unreachable_from_this_process"
    MODEL_ARCHITECTURE_UNSUPPORTED = "model_architecture_unsupported"
    """The backend rejects this model's layout (e.g. vLLM and Qwen2/Qwen3 with
    mixed sliding/full attention layers), whatever the device."""
    CONTEXT_EXCEEDS_MODEL = "context_exceeds_model"
    """The stage asks for a longer context (``max_model_len``) than the model has
    positions (``max_position_embeddings``, a GGUF's ``context_length``)."""
    MODEL_STAGE_UNSUPPORTED = "model_stage_unsupported"
    """The backend cannot run this sub-model of a multi-model checkpoint (``model_stage``):
    vLLM here yields an Omni thinker's text only, not the hidden states its port declares,
    and runs no talker."""
    KV_CACHE_DTYPE_UNSUPPORTED = "kv_cache_dtype_unsupported"
    """The backend cannot hold the KV cache in the stage's ``kv_cache_dtype``: q8_0 is llama.cpp's
    block type (vLLM and transformers have no such cache), and llama.cpp's cache here is f16 or q8_0."""


TERMINAL_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""The C0 controls but newline and tab, DEL and the C1 controls (0x9b is a one-byte CSI):
what a terminal acts on rather than prints."""


def terminal_text(text: str) -> str:
    """``text`` without the control characters a terminal would act on (newlines and tabs kept).

    Error text carries what others wrote — a server's message, a model's reply, a
    value from a file — and an escape sequence in it (OSC 52 sets the clipboard)
    must not reach the terminal it is printed on: the CLI prints errors, replies
    and server text through this (``Problem.lines`` does it for every problem)."""
    return TERMINAL_CONTROLS.sub("", text)


class OmniEdgeError(Exception):
    """Base of every error this project raises on purpose."""


@dataclass
class Problem:
    """One thing wrong with an input: where it is, what is wrong, how to fix it."""

    where: str
    what: str
    fix: str = ""

    def lines(self) -> list[str]:
        """The problem as printed: where: what, then how to fix (control characters removed)."""
        out = [terminal_text(f"{self.where}: {self.what}")]
        if self.fix:
            out.append(terminal_text(f"  how to fix: {self.fix}"))
        return out


@dataclass
class ConfigError(OmniEdgeError):
    """Bad input: a config, profile, manifest or artifact that cannot be used.

    The CLI prints every problem (where → what → how to fix) and exits 2.
    """

    problems: list[Problem] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(line for p in self.problems for line in p.lines())

    @classmethod
    def single(cls, where: str, what: str, fix: str = "") -> ConfigError:
        return cls([Problem(where, what, fix)])


class PlanRefused(OmniEdgeError):
    """Raised by callers that need an admitted plan (``run``) and got a refusal."""

    def __init__(self, plan: object) -> None:
        super().__init__("the plan was refused")
        self.plan = plan


class VerificationError(OmniEdgeError):
    """A verification gate could not be run at all (not: a gate that failed)."""


class StageFailed(OmniEdgeError):
    """A stage failed while loading or running: names the stage, device and cause."""

    def __init__(self, stage: str, device: str, cause: str, code: str = "stage_failed") -> None:
        super().__init__(f"stage {stage!r} on {device} failed: {cause}")
        self.stage = stage
        self.device = device
        self.cause = cause
        self.code = code
        """A short, fixed name of what went wrong (``stage_failed``, ``engine_failed``): what a
        server may tell a client, where ``cause`` (paths, stderr tails) goes to its log only."""

    def public_message(self) -> str:
        """What a client may read: the stage, its device and the code, never the cause."""
        if self.code == "stage_restarting":
            return (
                f"stage {self.stage!r} on {self.device} is coming back after its process died "
                f"(code {self.code}); retry shortly, the cause is in the server's log"
            )
        return f"stage {self.stage!r} on {self.device} failed (code {self.code}); the cause is in the server's log"

    def __reduce__(self) -> tuple[type[StageFailed], tuple[str, str, str, str]]:
        # the default pickling passes only the message to __init__; Ray and
        # multiprocessing need the fields back
        return (StageFailed, (self.stage, self.device, self.cause, self.code))


class PeerLost(OmniEdgeError):
    """A producer's actor could not hand items to its consumer's actor: that actor died (the
    direct mode, ``actor_inputs.StageInputs.deliver``). Not a ``StageFailed``: the runtime says it as the
    death of the consumer's actor (``stage``, ``device``, ``actor_key``), never the producer's."""

    def __init__(self, stage: str, device: str, actor_key: str, cause: str) -> None:
        super().__init__(f"the device actor of {stage!r} ({actor_key}) is gone: {cause}")
        self.stage, self.device, self.actor_key, self.cause = stage, device, actor_key, cause

    def __reduce__(self) -> tuple[type[PeerLost], tuple[str, str, str, str]]:
        return (PeerLost, (self.stage, self.device, self.actor_key, self.cause))


class PipelineBusy(OmniEdgeError):
    """A request refused because the pipeline already runs (and queues) all it can.

    Carries the in-flight ``limit`` (derived from the device actors'
    concurrency), how many requests are ``in_flight`` and ``waiting``, and the
    queue's bound ``max_waiting``: retry later, or raise the bound."""

    def __init__(
        self, limit: int, in_flight: int, waiting: int, max_waiting: int, why: str = ""
    ) -> None:
        super().__init__(
            f"the pipeline is busy: {in_flight} requests in flight (limit {limit}), {waiting} waiting "
            f"(limit {max_waiting}){': ' + why if why else ''}; retry when a request has finished"
        )
        self.limit, self.in_flight, self.waiting, self.max_waiting, self.why = (
            limit,
            in_flight,
            waiting,
            max_waiting,
            why,
        )

    def __reduce__(self) -> tuple[type[PipelineBusy], tuple[int, int, int, int, str]]:
        return (
            PipelineBusy,
            (self.limit, self.in_flight, self.waiting, self.max_waiting, self.why),
        )


class LedgerLost(StageFailed):
    """The ledger actor died or stopped answering: the pipeline's memory accounting
    is gone, so the run stops (exit 4 like a failed stage) — named as the ledger,
    never blamed on a device actor."""

    def __init__(self, cause: str) -> None:
        OmniEdgeError.__init__(
            self, f"the ledger actor (the pipeline's memory accounting) is gone: {cause}"
        )
        self.stage, self.device, self.cause = "ledger", "the ledger actor", cause

    def __reduce__(self) -> tuple[type[LedgerLost], tuple[str]]:  # type: ignore[override]
        return (LedgerLost, (self.cause,))


class BadRequest(ConfigError):
    """A request a stage cannot take (an empty prompt, one longer than the context,
    a sampling value out of range): refused before it reaches the stage, with
    where → what → how to fix like any bad input (exit 2 on the command line)."""
