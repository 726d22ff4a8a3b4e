"""The ``ar_decode`` stage on llama.cpp (llama-cpp-python's low-level API), streaming text deltas.

:class:`LlamaCppRunner` carries out an admitted ``llamacpp-*`` placement the way
:class:`stages.ar_decode.engines.vllm_runner.VllmRunner` carries out a vLLM one, with the
same public behaviour (deltas, stats, errors, evidence M):

* ``load()`` loads the GGUF as it is (no conversion) and creates **one**
  llama.cpp context from the plan's ``engine_kwargs`` — ``n_ctx`` (the whole
  cache: ``max_model_len`` per sequence), ``n_seq_max`` sequences, ``n_batch``
  and ``n_ubatch``, the KV cache types, ``n_gpu_layers``, ``flash_attn`` — with
  ``n_threads`` = ``n_threads_batch`` = the plan's ``cpu_threads`` (1 when
  unset). A step that reads a prompt also takes the planned threads of the other stages
  registered on its device in this process that are idle now (the voice before the reply's
  first sentence): llama.cpp computes a batch of several tokens on ``n_threads_batch``, set
  between two decode calls (``llama_set_n_threads``) and back on the plan's share at the first
  step after one turns busy. With ``OMNI_EDGE_CPU_SHARE=follow`` every step does
  (``static``: none; :mod:`stages.cpu_share` says why ``prefill`` is the default).
  The KV cache is not unified: each sequence has its own
  ``n_ctx / n_seq_max`` cells, as vLLM gives each its ``max_model_len``.
* **Continuous batching** on that context: one engine thread owns it (a
  llama.cpp context is not thread-safe) and runs one ``llama_decode`` per step
  over every running sequence's next token plus, in what room ``n_batch``
  leaves, the next chunk of prompts still being read (prefill in chunks of
  ``n_batch``). Requests and aborts reach the thread through a command queue;
  each step's text goes to the request's asyncio queue on its own loop (the
  thread, the queues, cancellation, stats and health are
  :class:`~stages.ar_decode.engines.threaded.ThreadedEngineRunner`'s; the batch
  scheduler, :class:`_Engine`, is this module's own).
* Each sequence samples with its own llama.cpp sampler chain:
  ``repetition_penalty`` (over the prompt and the reply, as vLLM counts it),
  ``presence_penalty`` and ``frequency_penalty`` (over the reply only, as OpenAI and
  vLLM count them), ``top_k``, ``temperature``, ``top_p``, then a draw seeded with the request's
  ``seed`` — greedy when ``temperature`` is 0. Temperature comes before
  ``top_p`` as in vLLM, so a nucleus is taken from the distribution that is
  sampled. ``min_tokens``: the end-of-generation tokens' logits are set to
  -inf (a logit-bias sampler at the head of the chain) until that many tokens
  were generated, then the bias is taken out of the chain.
* ``stop`` strings: the reply's text is cut before the first one
  (:class:`stages.ar_decode.stops.StopText`: a delta that may begin one is held back
  until it is known), and the sequence ends there.
* ``json_schema`` (``response_format``): a grammar of the schema
  (:mod:`stages.ar_decode.json_grammar`) checked against the chain's pick, and over the whole
  vocabulary only when it refuses it (:mod:`~stages.ar_decode.engines.llamacpp_grammar`);
  ``tool_call`` (``tools``) the same, with the grammar of a call (:mod:`stages.ar_decode.tool_grammar`).
* ``logprobs`` (OpenAI's ``logprobs`` with ``top_logprobs`` alternatives): each reply token's
  log-probability under the model's logits at its step, read before sampling
  (:mod:`~stages.ar_decode.engines.llamacpp_logprobs`), in the request's stats (``logprobs``).
* Stop reasons are vLLM's: ``stop`` (an end-of-generation token or a stop string), ``length``
  (``max_tokens``, or the sequence's context is full), ``abort`` (the consumer
  closed the stream: the sequence leaves the batch at the next step and the
  cells of its reply are cleared, so its slot serves the next request).
* **Prefix reuse** (:data:`PREFIX_REUSE`): a finished sequence keeps its
  prompt's KV cells; the next request goes to the free sequence whose kept
  prompt shares the longest head with its own and decodes only the rest — the
  system prompt and the chat template's head are not computed again, as
  llama.cpp's own server does (``cache_prompt``). The cells are the sequence's
  own (planned with it): nothing more is held. ``reused_prompt_tokens`` in the
  request's stats says how many were reused.
* Text is decoded incrementally (:class:`Utf8Deltas`): a character whose bytes
  span several tokens is sent once it is whole.
* The prompt is the GGUF's own chat template (``tokenizer.chat_template``)
  with the stage's ``system_prompt``, tokenized by the GGUF's vocabulary
  (:mod:`stages.ar_decode.gguf_vocab`); requests are checked with
  :func:`stages.ar_decode.prompt.request_parts` and
  :func:`~stages.ar_decode.prompt.check_length`, as on vLLM.

The per-step work in Python is a handful of ctypes writes into a batch
allocated once, one ``llama_decode``, one ``llama_sampler_sample`` per
sequence and a cached token → bytes lookup: ``bench/decode.py`` compares it with
llama-cpp-python's own ``Llama.create_completion`` on the same threads.
"""

from __future__ import annotations

import codecs
import ctypes
import logging
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.core.errors import BadRequest, StageFailed
from stages import cpu_share
from stages.ar_decode.engines.llamacpp_grammar import GrammarSampling
from stages.ar_decode.engines.llamacpp_logprobs import TokenLogprobs
from stages.ar_decode.engines.threaded import EngineRequest, ThreadedEngineRunner
from stages.ar_decode.gguf_vocab import GgufVocab, free_llama, gguf_path, llama_cpp_module
from stages.ar_decode.prompt import check_length, encode, request_parts
from stages.ar_decode.stops import StopText
from stages.ar_decode.tool_grammar import decode_grammar

if TYPE_CHECKING:
    from pathlib import Path

    from orchestrator.core.plan import StagePlan
    from stages.base import StageConfig
    from stages.requests import Sampling

log = logging.getLogger(__name__)

KV_CACHE_TYPES = {
    "f16": "GGML_TYPE_F16",
    "q8_0": "GGML_TYPE_Q8_0",
    "f32": "GGML_TYPE_F32",
    "bf16": "GGML_TYPE_BF16",
}
"""``type_k``/``type_v`` names of the plan → llama.cpp's ``GGML_TYPE_*`` constants. The planner
writes ``f16`` or ``q8_0`` (DESIGN: from ``kv_cache_dtype``); ``f32``/``bf16`` are llama.cpp's
other unquantized cache types."""
QUANTIZED_KV_TYPES = ("q8_0",)
"""A quantized V cache needs flash attention in llama.cpp ("quantized V cache was requested,
but this requires Flash Attention", llama-context.cpp); the runner turns it on for them."""
ALL_GPU_LAYERS = 0x7FFFFFFF
"""``n_gpu_layers: -1`` means every layer: llama.cpp clamps INT32_MAX to the model's count
(llama-cpp-python passes the same value)."""
UNSEEDED = 0xFFFFFFFF
"""``LLAMA_DEFAULT_SEED``: llama.cpp draws a random seed for a ``dist`` sampler given it."""
BUSY_SAMPLE_INTERVAL_S = 0.1
"""RSS read between steps at most this often while busy: llama.cpp allocates its KV cache and
compute buffers when the context is created, so a busy window grows by Python objects only;
one read (psutil, tens of microseconds) every step would be ~0.5 % of a 10 ms step."""


class Utf8Deltas:
    """Text from the bytes of successive tokens: a multi-byte UTF-8 character split across
    tokens is held back until its last byte arrives; bytes that can never form a
    character become U+FFFD, as a tokenizer's own decode shows them."""

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, piece: bytes) -> str:
        return str(self._decoder.decode(piece))

    def flush(self) -> str:
        """What is left at the end of the text (an unfinished character becomes U+FFFD)."""
        return str(self._decoder.decode(b"", final=True))


PREFIX_REUSE = True
"""Whether a sequence keeps its prompt's cells for the next request (the module docstring). On the
default pipeline's thinker the system prompt and the template's head are ~30 of the ~45 tokens of a
short question; at one thread llama.cpp prefills SmolLM2's Q4_1 at ~180 tokens/s here, so reusing them
takes ~170 ms off the first token (bench/first_audio.py)."""


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class _Slot:
    """One running sequence: its llama.cpp sequence id, prompt progress and sampler chain."""

    __slots__ = (
        "bias",
        "chain",
        "fed",
        "generated",
        "grammar",
        "last",
        "max_tokens",
        "min_tokens",
        "out",
        "pos",
        "probs",
        "prompt",
        "req",
        "seq",
        "stops",
        "text",
        "top",
    )

    def __init__(
        self,
        seq: int,
        req: EngineRequest,
        prompt: list[int],
        chain: Any,
        bias: bool,
        max_tokens: int,
        min_tokens: int,
        stops: Sequence[str] = (),
    ) -> None:
        self.seq = seq
        self.req = req
        self.prompt = prompt
        self.fed = 0  # prompt tokens in the KV cache
        self.pos = 0  # next position to write
        self.chain = chain
        self.bias = bias  # the min_tokens bias still heads the chain
        self.last = -1  # the sampled token still to be fed
        self.generated = 0
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.text = Utf8Deltas()
        self.stops = StopText(stops)
        self.grammar: Any = None  # the json_schema's grammar sampler (llamacpp_grammar)
        self.out = -1  # this step's batch row with logits, -1 when none
        self.top: int | None = None  # the alternatives per token's logprobs (None: none asked)
        self.probs: list[dict[str, Any]] = []  # each reply token's logprobs, when asked


@dataclass(frozen=True)
class _ContextSettings:
    """The context's settings from the plan's engine kwargs (:func:`_context_settings`)."""

    n_seq: int
    n_ctx: int
    n_batch: int
    n_ubatch: int
    type_k: str
    type_v: str
    gpu_layers: int
    flash: bool


def _context_settings(kw: dict[str, Any], lc: Any) -> _ContextSettings:
    """The context's settings from the plan's engine kwargs, checked against this build:
    sequences, context cells, batch and micro-batch sizes, the KV cache types, GPU layers, and
    flash attention (needed by a quantized V cache)."""
    n_seq = int(kw.get("n_seq_max") or 1)
    n_ctx = int(kw.get("n_ctx") or int(kw["max_model_len"]) * n_seq)
    n_batch = int(kw.get("n_batch") or min(2048, n_ctx))
    n_ubatch = int(kw.get("n_ubatch") or min(512, n_batch))
    type_k, type_v = str(kw.get("type_k") or "f16"), str(kw.get("type_v") or "f16")
    for name in (type_k, type_v):
        if name not in KV_CACHE_TYPES:
            raise ValueError(f"KV cache type {name!r} is not one of {', '.join(KV_CACHE_TYPES)}")
    gpu_layers = int(kw.get("n_gpu_layers") or 0)
    if gpu_layers and not lc.llama_supports_gpu_offload():
        raise ValueError(
            f"n_gpu_layers {gpu_layers}: this llama.cpp build has no GPU offload "
            f"(llama_supports_gpu_offload() is false); plan the stage on llamacpp-cpu"
        )
    flash = bool(kw.get("flash_attn")) or type_v in QUANTIZED_KV_TYPES
    return _ContextSettings(n_seq, n_ctx, n_batch, n_ubatch, type_k, type_v, gpu_layers, flash)


GIL_SWITCH_S = 0.0002
"""The interpreter's thread switch interval in a process that runs a llama.cpp engine (CPython's
default is 5 ms): each token the engine thread's sampler and the event loop forwarding the last
token both want the GIL. In an interleaved ``bench/decode.py --interleave`` run the stage at 1
thread went from 0.88x raw llama.cpp to 0.98x and 1.10x with it (docs/benchmarks.md, decode
speed); never raised above what the process already has."""


class LlamaCppRunner(ThreadedEngineRunner):
    """An ``ar_decode`` stage on llama.cpp, in this process (see the module docstring)."""

    title = "llama.cpp"
    stopped = (
        "its llama.cpp engine stopped after a failed decode (code engine_failed; the cause is "
        "in the server's log); restart the server"
    )

    def __init__(self, stage_plan: StagePlan, stage: StageConfig) -> None:
        super().__init__(stage_plan, stage)
        self.threads = int(stage_plan.cpu_threads or 1)
        self.share = cpu_share.policy()
        """Which steps take the threads the idle stages on its device lend (read at creation):
        ``prefill`` a step that reads a prompt, ``follow`` every step, ``static`` none."""
        self.follows_work = self.share == "follow"
        self.threads_now = self.threads
        """The context's threads at its last step (the engine thread writes; tests read)."""
        self.cores = cpu_share.cores()
        """The most threads a step borrows up to (never fewer than the plan's own)."""
        self.batch_threads_now = self.threads
        """The context's threads for a batch of several tokens (a prompt) at its last step."""
        self._lc: Any = None
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        self._vocab: GgufVocab | None = None
        self._seq_limit = 0
        self._n_batch = 0
        self._free_slots = (
            0  # read by tests: sequences not serving a request (engine thread writes)
        )

    # -- lifecycle ---------------------------------------------------------------
    def load(self) -> None:
        """Load the GGUF and create the context. Raises ``StageFailed`` (stage, device, cause)."""
        t0 = time.perf_counter()
        # the engine thread samples each token in Python and must get the GIL back from the
        # event loop that forwards the last one; at CPython's 5 ms switch interval it waited
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        self._meter.start()
        kw = dict(self.plan.engine_kwargs)
        try:
            lc = self._lc = llama_cpp_module()
            t_import = time.perf_counter()
            path = gguf_path(kw["model"])
            cs = _context_settings(kw, lc)
            self._load_model(path, cs)
            t_model = time.perf_counter()
            self._create_context(cs)
            n_ctx_seq = int(lc.llama_n_ctx_seq(self._ctx))
            self._seq_limit = min(int(kw.get("max_model_len") or n_ctx_seq), n_ctx_seq)
            self._n_batch = cs.n_batch
            t_ctx = time.perf_counter()
        except Exception as exc:
            self._meter.stop()
            self._free()
            raise StageFailed(
                self.plan.name, self.device, f"llama.cpp did not start: {type(exc).__name__}: {exc}"
            ) from exc
        self._started()
        self.load_info = {
            "model_path": str(path),
            "import_s": round(t_import - t0, 3),
            "model_load_s": round(t_model - t_import, 3),
            "context_s": round(t_ctx - t_model, 3),
            "load_s": round(t_ctx - t0, 3),
            **self._context_info(cs, n_ctx_seq),
        }
        log.info(
            "%s: llama.cpp loaded %s in %.2f s (%d thread(s), %d sequence(s) of %d tokens)",
            self.plan.name,
            path,
            t_ctx - t0,
            self.threads,
            cs.n_seq,
            n_ctx_seq,
        )

    def _load_model(self, path: Path, cs: _ContextSettings) -> None:
        """The GGUF's model, its layers offloaded as planned (``n_gpu_layers``; -1: all)."""
        lc = self._lc
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = ALL_GPU_LAYERS if cs.gpu_layers < 0 else cs.gpu_layers
        self._model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {path} (its log above says why)")

    def _create_context(self, cs: _ContextSettings) -> None:
        """The context (one KV cache per sequence: ``kv_unified`` off), the vocabulary and the
        batch the engine thread fills."""
        lc = self._lc
        cparams = lc.llama_context_default_params()
        cparams.n_ctx, cparams.n_seq_max = cs.n_ctx, cs.n_seq
        cparams.n_batch, cparams.n_ubatch = cs.n_batch, cs.n_ubatch
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.type_k = getattr(lc, KV_CACHE_TYPES[cs.type_k])
        cparams.type_v = getattr(lc, KV_CACHE_TYPES[cs.type_v])
        cparams.flash_attn_type = (
            lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if cs.flash else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        cparams.kv_unified = False
        cparams.no_perf = True
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise ValueError(
                f"llama.cpp could not create a context (n_ctx {cs.n_ctx}, n_seq_max {cs.n_seq}, "
                f"n_batch {cs.n_batch}; its log above says why)"
            )
        self._vocab = GgufVocab(self._model)
        self._batch = lc.llama_batch_init(cs.n_batch, 0, 1)

    def _context_info(self, cs: _ContextSettings, n_ctx_seq: int) -> dict[str, Any]:
        """What ``load_info`` says of the context as llama.cpp made it, and of this build."""
        lc = self._lc
        assert self._vocab is not None
        return {
            "n_threads": self.threads,
            "threads_follow_work": self.follows_work,
            "threads_share": self.share,
            "n_ctx": int(lc.llama_n_ctx(self._ctx)),
            "n_ctx_seq": n_ctx_seq,
            "n_seq_max": cs.n_seq,
            "n_batch": cs.n_batch,
            "n_ubatch": cs.n_ubatch,
            "type_k": cs.type_k,
            "type_v": cs.type_v,
            "flash_attn": cs.flash,
            "n_gpu_layers": cs.gpu_layers,
            "chat_template": self._vocab.chat_template is not None,
            "system_info": lc.llama_print_system_info().decode("utf-8", errors="replace").strip(),
            "in_process": True,
            "load_peak_growth_bytes": self._meter.peak_growth,
            "resident_growth_bytes": self._resident,
        }

    def _release(self) -> None:
        """Free the context and the model."""
        self._free()

    def _ready(self) -> bool:
        return self._ctx is not None and self._vocab is not None

    def _free(self) -> None:
        if self._lc is None:
            return
        free_llama(self._lc, self._batch, self._ctx, self._model)
        self._batch = self._ctx = self._model = None
        self._vocab = None

    # -- requests ----------------------------------------------------------------
    async def _accept(
        self, request_id: str, inputs: AsyncIterator[Any]
    ) -> tuple[EngineRequest, tuple[Any, ...]]:
        """The prompt (a string, or a dict with ``prompt`` or ``messages`` and optional
        ``sampling`` overrides, as vLLM's runner takes them) through the GGUF's chat template,
        checked against the stage's ``max_model_len`` and a sequence's cells."""
        items = [item async for item in inputs]
        messages, sampling = request_parts(
            self.stage, items, getattr(self._vocab, "chat_template", None)
        )
        grammar = decode_grammar(
            sampling
        )  # checked here too: a grammar asked with min_tokens aborts
        prompt_ids = encode(self._vocab, messages)
        check_length(self.stage, len(prompt_ids), sampling)
        self._check_fits(len(prompt_ids))
        req = self._new_request(request_id, len(prompt_ids))
        req.extra.update(waited_for_slot=False, reused_prompt_tokens=0)
        return req, ("add", req, prompt_ids, sampling, grammar)

    def _check_fits(self, prompt_tokens: int) -> None:
        """The engine's own limit (a sequence's cells), beyond the stage's ``max_model_len``
        that :func:`check_length` applied: a prompt needs room for one token of reply."""
        if prompt_tokens >= self._seq_limit:
            raise BadRequest.single(
                "prompt",
                f"is {prompt_tokens} tokens with the chat template, the whole context of "
                f"{self._seq_limit} tokens a sequence has",
                "shorten the prompt or raise max_model_len in the config",
            )

    # -- sampling ------------------------------------------------------------------
    def _chain(self, sampling: Sampling, prompt: list[int]) -> tuple[Any, bool]:
        """A sampler chain for one request (see the module docstring); True when it starts with
        the ``min_tokens`` bias."""
        lc, vocab = self._lc, self._vocab
        assert vocab is not None
        params = lc.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = lc.llama_sampler_chain_init(params)
        add = lc.llama_sampler_chain_add
        bias = int(sampling.get("min_tokens") or 0) > 0 and bool(vocab.eog_ids)
        if bias:
            eog = sorted(vocab.eog_ids)
            biases = (lc.llama_logit_bias * len(eog))()
            for i, token in enumerate(eog):
                biases[i].token, biases[i].bias = token, float("-inf")
            add(chain, lc.llama_sampler_init_logit_bias(vocab.n_vocab, len(eog), biases))
        penalty = float(sampling.get("repetition_penalty") or 1.0)
        if penalty != 1.0:
            repeats = lc.llama_sampler_init_penalties(
                vocab.n_vocab, self._seq_limit, penalty, 0.0, 0.0
            )
            # vLLM's repetition penalty counts the prompt's tokens too; fed to this sampler
            # alone (a grammar fed the prompt would take it for the reply's start)
            for token in prompt:
                lc.llama_sampler_accept(repeats, token)
            add(chain, repeats)
        frequency = float(sampling.get("frequency_penalty") or 0.0)
        presence = float(sampling.get("presence_penalty") or 0.0)
        if frequency or presence:  # fed nothing of the prompt: they count the reply only
            add(
                chain,
                lc.llama_sampler_init_penalties(
                    vocab.n_vocab, self._seq_limit, 1.0, frequency, presence
                ),
            )
        temperature = float(sampling.get("temperature", 1.0))
        if temperature <= 0.0:
            add(chain, lc.llama_sampler_init_greedy())
            return chain, bias
        top_k = int(sampling.get("top_k") or 0)
        if top_k > 0:
            add(chain, lc.llama_sampler_init_top_k(top_k))
        add(chain, lc.llama_sampler_init_temp(temperature))
        top_p = float(sampling.get("top_p", 1.0))
        if top_p < 1.0:
            add(chain, lc.llama_sampler_init_top_p(top_p, 1))
        seed = sampling.get("seed")
        # llama.cpp seeds are 32-bit and 0xFFFFFFFF means "draw one": a config seed (int64) is
        # folded into 0 .. 0xFFFFFFFE, so a given seed always decodes the same way.
        add(chain, lc.llama_sampler_init_dist(UNSEEDED if seed is None else int(seed) % UNSEEDED))
        return chain, bias

    # -- the engine thread ---------------------------------------------------------
    def _serve_engine(self) -> None:
        """The engine thread: the batch scheduler over the context (:class:`_Engine`)."""
        _Engine(self).run()


class _Engine:
    """The engine thread's loop over one context: commands in, sequences admitted to free slots,
    one ``llama_decode`` per step over every decoding sequence's next token and the prompt chunks
    that fit, then each sequence's token sampled and its text handed to its request.

    State: the batch's arrays (written in place each step, allocated once by ``llama_batch_init``),
    the free sequences and the prompt each still holds in the KV cache (``cached``: prefix reuse),
    the requests waiting for a sequence and the running ones (:class:`_Slot`)."""

    def __init__(self, runner: LlamaCppRunner) -> None:
        self.runner = r = runner
        self.lc, self.ctx = r._lc, r._ctx
        vocab = r._vocab
        assert vocab is not None
        self.vocab = vocab
        self.batch, self.n_batch = r._batch, r._n_batch
        self.mem = self.lc.llama_get_memory(self.ctx)
        batch, n_batch = self.batch, self.n_batch
        self.tokens: Any = (ctypes.c_int32 * n_batch).from_address(
            ctypes.addressof(batch.token.contents)
        )
        self.positions: Any = (ctypes.c_int32 * n_batch).from_address(
            ctypes.addressof(batch.pos.contents)
        )
        self.wants: Any = (ctypes.c_int8 * n_batch).from_address(
            ctypes.addressof(batch.logits.contents)
        )
        n_seq_ids: Any = (ctypes.c_int32 * n_batch).from_address(
            ctypes.addressof(batch.n_seq_id.contents)
        )
        n_seq_ids[:] = [1] * n_batch
        self.seq_rows = [batch.seq_id[i] for i in range(n_batch)]
        self.pieces: dict[int, bytes] = {}
        self.grammars = GrammarSampling(self.lc, vocab.n_vocab)
        self.logprobs = TokenLogprobs(self.lc, vocab.n_vocab, self._piece)
        self.free = list(range(int(self.lc.llama_n_seq_max(self.ctx)) - 1, -1, -1))
        self.cached: dict[int, list[int]] = {}  # a free sequence's prompt whose KV it still holds
        r._free_slots = len(self.free)
        self.waiting: deque[tuple[EngineRequest, list[int], Sampling, str | None]] = deque()
        self.running: list[_Slot] = []
        self.busy = False
        self.decoding = 0
        """Rows of the last scheduled step that decode one token of a sequence (the rest read a
        prompt)."""
        self.last_sample = 0.0

    def run(self) -> None:
        """Steps until a ``stop`` command, or a decode error that stops the engine."""
        r = self.runner
        while True:
            if not self._commands():
                return
            self._admit()
            if not self.running:
                if self.busy:
                    self.busy = False
                    r._idle()
                continue
            if not self.busy:
                self.busy = True
                r._busy()
            n = self._schedule()
            if r.share != "static":
                self._follow_work(prompt=n > self.decoding)
            outcome = self._decode(n)
            if outcome == "stop":
                return
            if outcome == "ok":
                self._sample(time.perf_counter())

    def _follow_work(self, prompt: bool) -> None:
        """The context's threads for the next step (``prompt``: it reads a prompt's tokens): the
        plan's share, and what the idle stages on the device lend now for the steps the policy
        lends to (``follow``: every one; ``prefill``: one that reads a prompt, on llama.cpp's
        batch threads); set only when that changed (llama.cpp reads them at each decode)."""
        r = self.runner
        lends = r.follows_work or prompt
        lent = cpu_share.lent_threads(r.device, r.plan.name) if lends else 0
        want = max(min(r.threads + lent, r.cores), r.threads)
        step, batch = (want, want) if r.follows_work else (r.threads, want)
        if (step, batch) != (r.threads_now, r.batch_threads_now):
            self.lc.llama_set_n_threads(self.ctx, step, batch)
            r.threads_now, r.batch_threads_now = step, batch

    def finish(self, slot: _Slot, reason: str | None) -> None:
        """End a sequence: ``reason`` to its request (None: aborted, nobody reads the queue); the
        prompt's cells stay for the next request that starts the same way (the system prompt and
        the template's head: PREFIX_REUSE), the reply's are freed."""
        lc, mem = self.lc, self.mem
        if PREFIX_REUSE and lc.llama_memory_seq_rm(mem, slot.seq, slot.fed, -1):
            self.cached[slot.seq] = slot.prompt[: slot.fed]
        else:
            lc.llama_memory_seq_rm(mem, slot.seq, -1, -1)
            self.cached.pop(slot.seq, None)
        lc.llama_sampler_free(slot.chain)
        if slot.grammar is not None:
            lc.llama_sampler_free(slot.grammar)
        self.running.remove(slot)
        self.free.append(slot.seq)
        self.runner._free_slots = len(self.free)
        req = slot.req
        if slot.top is not None:
            req.extra["logprobs"] = slot.probs
        if reason is not None:
            tail = slot.stops.add(slot.text.flush())
            tail += slot.stops.flush()
            if tail:
                req.put(tail)
            req.end(reason)
        req.released.set()

    def _commands(self) -> bool:
        """Take the queued commands (waiting for one when idle): add, abort; False on stop."""
        for cmd in self.runner._take(block=not self.running and not self.waiting):
            if cmd[0] == "stop":
                for slot in list(self.running):
                    self.finish(slot, None)
                return False
            if cmd[0] == "add":
                # aborts before it have freed theirs
                cmd[1].extra["waited_for_slot"] = not self.free or bool(self.waiting)
                self.waiting.append(cmd[1:])
            else:
                self._abort(cmd[1])
        return True

    def _abort(self, target: EngineRequest) -> None:
        for item in self.waiting:
            if item[0] is target:
                self.waiting.remove(item)
                break
        for slot in self.running:
            if slot.req is target:
                self.finish(slot, None)
                break
        target.released.set()  # waiting or running, or already ended: the engine holds it no more

    def _admit(self) -> None:
        """Waiting requests onto free sequences: the one whose cached prompt shares the longest head
        with the request's, its cells kept up to there (one token decoded at least)."""
        r, lc, mem = self.runner, self.lc, self.mem
        while self.waiting and self.free:
            req, prompt, sampling, grammar = self.waiting.popleft()
            constrained = None
            try:
                if grammar is not None:
                    constrained = self.grammars.new(self.vocab.vocab, grammar)
                chain, bias = r._chain(sampling, prompt)
            except Exception as exc:
                if constrained is not None:
                    lc.llama_sampler_free(constrained)
                req.put(
                    StageFailed(
                        r.plan.name,
                        r.device,
                        f"llama.cpp refused the request's sampling: {type(exc).__name__}: {exc}",
                    )
                )
                continue
            seq, reuse = max(
                ((q, _common_prefix(self.cached.get(q, ()), prompt)) for q in self.free),
                key=lambda qr: qr[1],
            )
            self.free.remove(seq)
            r._free_slots = len(self.free)
            reuse = min(reuse, len(prompt) - 1) if PREFIX_REUSE else 0
            if reuse <= 0 or not lc.llama_memory_seq_rm(mem, seq, reuse, -1):
                lc.llama_memory_seq_rm(mem, seq, -1, -1)
                reuse = 0
            self.cached.pop(seq, None)
            slot = _Slot(
                seq,
                req,
                prompt,
                chain,
                bias,
                int(sampling.get("max_tokens") or 16),
                int(sampling.get("min_tokens") or 0),
                sampling.get("stop") or (),
            )
            slot.grammar = constrained
            top = sampling.get("logprobs")
            slot.top = None if top is None else int(top)
            slot.fed = slot.pos = req.extra["reused_prompt_tokens"] = reuse
            self.running.append(slot)

    def _schedule(self) -> int:
        """Fill the batch: every decoding sequence's next token first, then prompt chunks in the
        room left; each slot's ``out`` is its row with logits this step (-1: none). Rows used."""
        tokens, positions, wants, rows = self.tokens, self.positions, self.wants, self.seq_rows
        n = 0
        for slot in self.running:
            if slot.last >= 0:
                tokens[n], positions[n], wants[n] = slot.last, slot.pos, 1
                rows[n][0] = slot.seq
                slot.out = n
                n += 1
            else:
                slot.out = -1
        self.decoding = n
        for slot in self.running:
            if slot.last >= 0 or n >= self.n_batch:
                continue
            take = min(len(slot.prompt) - slot.fed, self.n_batch - n)
            end = n + take
            tokens[n:end] = slot.prompt[slot.fed : slot.fed + take]
            positions[n:end] = range(slot.pos, slot.pos + take)
            wants[n:end] = bytes(take)
            for i in range(n, end):
                rows[i][0] = slot.seq
            slot.fed += take
            slot.pos += take
            if slot.fed == len(slot.prompt):
                wants[end - 1] = 1
                slot.out = end - 1
            n = end
        return n

    def _decode(self, n: int) -> Literal["ok", "skip", "stop"]:
        """One ``llama_decode`` of ``n`` rows. 1 (no KV cells for this batch): its requests fail and
        the engine serves on (``skip``); below 0 or 2: the engine stops (``stop``)."""
        r = self.runner
        self.batch.n_tokens = n
        rc = self.lc.llama_decode(self.ctx, self.batch)
        if rc == 0:
            now = time.perf_counter()
            if now - self.last_sample >= BUSY_SAMPLE_INTERVAL_S:
                r._meter.sample()
                self.last_sample = now
            return "ok"
        if rc < 0 or rc == 2:
            log.error(
                "%s: llama_decode returned %d (batch of %d tokens); the engine stops",
                r.plan.name,
                rc,
                n,
            )
            r._engine_stopped(RuntimeError(f"llama_decode returned {rc}"))
            for slot in list(self.running):
                self.finish(slot, None)
            return "stop"
        for slot in list(self.running):
            slot.req.put(
                StageFailed(
                    r.plan.name,
                    r.device,
                    "llama.cpp found no KV cache cells for the request (llama_decode 1)",
                )
            )
            self.finish(slot, None)
        return "skip"

    def _sample(self, now: float) -> None:
        """Each sequence with logits this step: its token sampled, its text to its request, the
        sequence finished at an end-of-generation token, ``max_tokens`` or the context's end."""
        lc, eog, limit = self.lc, self.vocab.eog_ids, self.runner._seq_limit
        for slot in list(self.running):
            if slot.out < 0:
                continue
            if slot.last >= 0:
                slot.pos += 1
            step = None if slot.top is None else self.logprobs.row(self.ctx, slot.out)
            token = (
                lc.llama_sampler_sample(slot.chain, self.ctx, slot.out)
                if slot.grammar is None
                else self.grammars.sample(self.ctx, slot.out, slot.chain, slot.grammar)
            )
            req = slot.req
            req.produced(1, now)
            slot.generated += 1
            if slot.bias and slot.generated >= slot.min_tokens:
                lc.llama_sampler_free(lc.llama_sampler_chain_remove(slot.chain, 0))
                slot.bias = False
            if token in eog:
                self.finish(slot, "stop")
                continue
            if step is not None and slot.top is not None:
                slot.probs.append(self.logprobs.entry(step, token, slot.top))
            text = slot.stops.add(slot.text.add(self._piece(token)))
            if text:
                req.put(text)
            if slot.stops.stopped:
                self.finish(slot, "stop")
            elif slot.generated >= slot.max_tokens or slot.pos >= limit:
                self.finish(slot, "length")
            else:
                slot.last = token

    def _piece(self, token: int) -> bytes:
        """The token's bytes (looked up once per token)."""
        piece = self.pieces.get(token)
        if piece is None:
            piece = self.pieces[token] = self.vocab.piece(token)
        return piece
