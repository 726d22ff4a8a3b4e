"""How complete an utterance is, from the thinker's own next-token distribution (llama.cpp).

A spoken turn should end when the sentence is over, not after a fixed silence. LiveKit's
turn detector scores the transcript with a small language model; the pipeline already has
one, the thinker. :class:`LlamaCppTurnScorer` loads the thinker's GGUF (memory-mapped: the
pages are the device actor's, read once) with a small context of its own, one thread, and
answers :meth:`~LlamaCppTurnScorer.complete`: the probability that the user's message ends
where the transcript ends.

How: the chat template is rendered with the stage's system prompt and the transcript as the
user's message, cut right after the transcript (a sentinel marks the place), so the model's
next token is what would follow the user's words. The score is the probability of the
template's own end-of-message token (the first token the template writes after a user's
message, ``<|im_end|>`` for ChatML) plus that of a sentence's end (``.``, ``?``, ``!`` and
their CJK forms), with the transcript's trailing punctuation taken off first: Whisper closes
almost every segment with a ``.`` or ``?``, whole or not, and the model would only echo it.

``bench/turn_scores.py`` prints the scores of finished questions and of questions cut after a
preposition or an article ("What is the name of the"); docs/benchmarks.md has its figures, and
``bench/voice_latency.py`` measures the turns.

Cost: the head of the prompt (the template and the system prompt) is kept in the context's
cache between calls and a transcript that grew since the last call is read from where they
part, so a call evaluates the transcript's new tokens only: tens of milliseconds on one core
for a question. Calls are serialised (one context); ``complete`` is blocking — run it in a
thread.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING, Any

from stages.ar_decode.gguf_vocab import GgufVocab, free_llama, llama_cpp_module

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger(__name__)

SENTENCE_ENDS = frozenset(".?!。？！")
"""A token whose text is one of these (a leading space aside) ends a sentence."""
TRAILING = " \t\r\n.?!。？！…,;:-"
"""Taken off the transcript's end before it is scored (Whisper's own punctuation)."""
SENTINEL = "\u2063\u2063omni-edge-turn\u2063\u2063"
"""Marks where the user's message ends in the rendered template (an invisible separator: no
template writes it)."""
SCORER_CONTEXT = 512
"""Tokens of the scorer's context: the system prompt and one spoken question."""


class LlamaCppTurnScorer:
    """The end-of-utterance probability of a transcript (see the module docstring)."""

    def __init__(self, model: Path, system_prompt: str | None, threads: int = 1) -> None:
        self.path = model
        self.system_prompt = system_prompt
        self.threads = threads
        self._lock = threading.Lock()
        self._lc: Any = None
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        self._vocab: GgufVocab | None = None
        self._kept: list[int] = []
        """The tokens whose cells the context holds (sequence 0)."""
        self.ends: tuple[int, ...] = ()
        """The tokens whose probabilities make the score: the template's end of a user message,
        then the sentence ends."""

    def load(self) -> None:
        """Load the GGUF and make the context; ``OSError`` when llama.cpp cannot."""
        lc = self._lc = llama_cpp_module()
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0
        self._model = lc.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise OSError(f"llama.cpp could not load {self.path}")
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = SCORER_CONTEXT
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.no_perf = True
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise OSError(f"llama.cpp could not make a context of {SCORER_CONTEXT} tokens")
        self._vocab = GgufVocab(self._model)
        self._batch = lc.llama_batch_init(SCORER_CONTEXT, 0, 1)
        tail = self._render("x")[1]
        end = self._vocab.tokenize(tail, add_special=False, parse_special=True)[:1]
        punct = [
            t
            for t in range(self._vocab.n_vocab)
            if self._vocab.token_text(t).replace("Ġ", " ").replace("▁", " ").strip()
            in SENTENCE_ENDS
        ]
        self.ends = tuple(dict.fromkeys(end + punct))

    def _render(self, text: str) -> tuple[str, str]:
        """The template's text before and after the end of the user's message ``text``."""
        assert self._vocab is not None
        messages = [{"role": "user", "content": text + SENTINEL}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        head, _, tail = self._vocab.render(messages).partition(SENTINEL)
        return head, tail

    def complete(self, transcript: str) -> float:
        """The probability that the user's message is over after ``transcript`` (0.0 for a
        transcript with no words: nothing said is no finished question)."""
        text = transcript.strip().rstrip(TRAILING)
        if not text:
            return 0.0
        with self._lock:
            if self._ctx is None:
                raise RuntimeError("the turn scorer is not loaded (load() first)")
            assert self._vocab is not None
            tokens = self._vocab.tokenize(
                self._render(text)[0], add_special=False, parse_special=True
            )
            tokens = tokens[-(SCORER_CONTEXT - 1) :]
            return self._score(self._eval(tokens))

    def _eval(self, tokens: list[int]) -> Any:
        """The logits after ``tokens`` (llama.cpp's buffer: read before the next call), reading
        only what the cache does not hold already."""
        lc = self._lc
        same = 0
        for a, b in zip(self._kept, tokens, strict=False):
            if a != b:
                break
            same += 1
        same = min(same, len(tokens) - 1)  # the last token is read again for its logits
        lc.llama_memory_seq_rm(lc.llama_get_memory(self._ctx), 0, same, -1)
        batch, rest = self._batch, tokens[same:]
        for i, tok in enumerate(rest):
            batch.token[i] = tok
            batch.pos[i] = same + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(rest) - 1
        batch.n_tokens = len(rest)
        if lc.llama_decode(self._ctx, batch) != 0:
            self._kept = []
            lc.llama_memory_clear(lc.llama_get_memory(self._ctx), True)
            raise RuntimeError("llama.cpp could not evaluate the transcript")
        self._kept = tokens
        return lc.llama_get_logits_ith(self._ctx, -1)

    def _score(self, logits: Any) -> float:
        """The probability of the end tokens in the distribution ``logits`` (a softmax in
        float64 over the vocabulary)."""
        import numpy as np

        assert self._vocab is not None
        row = np.ctypeslib.as_array(logits, shape=(self._vocab.n_vocab,)).astype(np.float64)
        top = float(row.max())
        log_total = top + math.log(float(np.exp(row - top).sum()))
        return float(min(sum(math.exp(float(row[t]) - log_total) for t in self.ends), 1.0))

    def close(self) -> None:
        if self._lc is None:
            return
        free_llama(self._lc, self._batch, self._ctx, self._model)
        self._batch = self._ctx = self._model = None
        self._vocab = None
