"""The log-probabilities of a llama.cpp sequence's reply tokens, in OpenAI's shape
(``choices[].logprobs.content[]``: ``token``, ``logprob``, ``bytes``, ``top_logprobs``).

The guarantees:

* a token's ``logprob`` is the log-softmax of the model's logits at the step it was sampled
  from — the model's own distribution, before the sampler chain's penalties, temperature,
  top-k/top-p and any grammar (vLLM's default, ``raw_logprobs``) — so it is at most 0, and
  with ``temperature`` 0 and nothing else in the chain the sampled token is the first of its
  ``top_logprobs``;
* ``top_logprobs`` are the ``top`` most likely tokens of that step, most likely first (ties
  by token id), the sampled token's entry among them carrying the same ``logprob`` as the
  token's own;
* the logits are read before the token is sampled (:meth:`TokenLogprobs.row`): no sampler
  of the step has touched them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TokenEntry = dict[str, Any]
"""One token as OpenAI writes it: ``{"token", "logprob", "bytes"}`` (and ``top_logprobs``)."""


class TokenLogprobs:
    """The log-probabilities of one context's steps (``piece``: a token's bytes)."""

    def __init__(self, lc: Any, n_vocab: int, piece: Callable[[int], bytes]) -> None:
        self.lc, self.n_vocab, self.piece = lc, n_vocab, piece

    def row(self, ctx: Any, row: int) -> tuple[Any, float]:
        """Batch row ``row``'s logits (a copy, read before any sampler of the step runs) and
        their log-sum-exp: a token's log-probability is its logit less it."""
        import numpy as np

        logits = np.ctypeslib.as_array(
            self.lc.llama_get_logits_ith(ctx, row), shape=(self.n_vocab,)
        )
        x = logits.copy()
        top = float(x.max())
        return x, top + float(np.log(np.exp(x - top).sum(dtype=np.float64)))

    def entry(self, step: tuple[Any, float], token: int, top: int) -> TokenEntry:
        """``token`` sampled from ``step`` (:meth:`row`), with the step's ``top`` most likely
        tokens (the largest logits: the log-softmax keeps their order)."""
        import numpy as np

        logits, lse = step
        out = self._token(token, float(logits[token]) - lse)
        alternatives: list[TokenEntry] = []
        if top > 0:
            found = np.argpartition(logits, -top)[-top:]
            ids = sorted((int(i) for i in found), key=lambda i: (-float(logits[i]), i))
            alternatives = [self._token(i, float(logits[i]) - lse) for i in ids]
        out["top_logprobs"] = alternatives
        return out

    def _token(self, token: int, logprob: float) -> TokenEntry:
        piece = self.piece(token)
        return {
            "token": piece.decode("utf-8", errors="replace"),
            "logprob": min(logprob, 0.0),  # a rounding above 0 of a probability of 1
            "bytes": list(piece),
        }
