"""A sequence's token sampled under a grammar the way llama.cpp's own tools do it: the grammar
checked against the one token the sampler chain picked, and over the whole vocabulary only
when it refuses that token.

A grammar sampler at the head of the chain would test every token of the vocabulary at every
step (SmolLM2's 49,152) against the grammar's stacks — most of the step's time for a small
model. The chain's pick is usually a token the grammar takes (the model writes JSON when told
to); :meth:`GrammarSampling.sample` tests that one token first, and only on a refusal applies
the grammar to every candidate and samples again from what it leaves (llama.cpp's
``common_sampler_sample`` does the same). The token is then accepted by the grammar and the
chain both, so the guarantee stays: every token taken is one the grammar allows, and
end-of-generation only once the document is whole.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

PICK_FIRST = True
"""Test the chain's pick against the grammar before the whole vocabulary (False: the grammar
over every candidate at every step, as a grammar heading the chain would be;
``bench/structured.py`` measures both)."""


class GrammarSampling:
    """The candidates buffer of one context's vocabulary, reused by every constrained step."""

    def __init__(self, lc: Any, n_vocab: int) -> None:
        import numpy as np

        self.lc = lc
        self.n_vocab = n_vocab
        self.data = (lc.llama_token_data * n_vocab)()
        self.view = np.frombuffer(
            self.data, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        )
        self.ids = np.arange(n_vocab, dtype=np.int32)
        self.one = (lc.llama_token_data * 1)()

    def new(self, vocab: Any, grammar: str) -> Any:
        """A grammar sampler for one sequence (``ValueError`` when llama.cpp cannot parse it)."""
        sampler = self.lc.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not sampler:
            raise ValueError("llama.cpp could not parse the schema's grammar")
        return sampler

    def sample(self, ctx: Any, row: int, chain: Any, grammar: Any) -> int:
        """The token of batch row ``row`` the chain picks among those ``grammar`` allows; both
        accept it."""
        import numpy as np

        lc = self.lc
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, row), shape=(self.n_vocab,))
        refused = True
        if PICK_FIRST:
            token = self._pick(logits, chain, None)
            self.one[0].id, self.one[0].logit, self.one[0].p = token, 0.0, 0.0
            single = lc.llama_token_data_array(self.one, 1, -1, False)
            lc.llama_sampler_apply(grammar, ctypes.byref(single))
            refused = math.isinf(self.one[0].logit)
        if refused:  # the grammar over every candidate first, then the chain again
            token = self._pick(logits, chain, grammar)
        lc.llama_sampler_accept(grammar, token)
        lc.llama_sampler_accept(chain, token)
        return token

    def _pick(self, logits: Any, chain: Any, grammar: Any) -> int:
        lc = self.lc
        self.view["id"] = self.ids
        self.view["logit"] = logits
        self.view["p"] = 0.0
        candidates = lc.llama_token_data_array(self.data, self.n_vocab, -1, False)
        if grammar is not None:
            lc.llama_sampler_apply(grammar, ctypes.byref(candidates))
        lc.llama_sampler_apply(chain, ctypes.byref(candidates))
        if not 0 <= candidates.selected < candidates.size:
            raise RuntimeError("llama.cpp's sampler chain selected no token")
        return int(candidates.data[candidates.selected].id)
