"""The log-probabilities of a vLLM request's reply tokens, in the shape the llama.cpp runner
returns them (:mod:`~stages.ar_decode.engines.llamacpp_logprobs`: OpenAI's
``choices[].logprobs.content[]`` entries, ``token``, ``logprob``, ``bytes``, ``top_logprobs``).

The guarantees:

* a token's ``logprob`` is the one vLLM's sampler computed (its default ``raw_logprobs``: the
  log-softmax of the model's logits, before penalties, temperature and top-k/top-p), so it is
  at most 0; under a grammar (``response_format``, ``tools``) vLLM masks the tokens the grammar
  refuses before that, so the distribution is the one over the tokens the grammar allows
  (llama.cpp's are read before its grammar) and a refused token never appears;
* ``top_logprobs`` are the step's ``top`` most likely tokens, most likely first (ties by token
  id), the sampled token's entry among them carrying the same ``logprob`` as the token's own;
  fewer than ``top`` only where fewer tokens have a probability above 0 (a grammar that allows
  fewer);
* a token's ``bytes`` are its own bytes in the tokenizer's vocabulary (a byte-level BPE token's
  mapped back to bytes, a SentencePiece byte token ``<0xNN>`` its byte), so the bytes of the
  reply's tokens are the reply's UTF-8 text; ``token`` is them decoded, a character split
  across tokens shown as U+FFFD.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any

from stages.ar_decode.engines.llamacpp_logprobs import TokenEntry

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet back to bytes (each byte is one printable character)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    kept += range(ord("®"), ord("ÿ") + 1)
    chars, extra = list(kept), 0
    for b in range(256):
        if b not in kept:
            kept.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(kept, chars, strict=True)}


class VllmLogprobs:
    """A tokenizer's tokens as OpenAI's log-probability entries (their bytes cached per id)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._bytes: dict[int, bytes] = {}
        # byte-level BPE (GPT-2's alphabet: " a" is "Ġa"), else SentencePiece's ("▁a")
        self.byte_level = any("Ġ" in t for t in tokenizer.tokenize(" a"))

    def piece(self, token: int) -> bytes:
        """The bytes of ``token`` in the vocabulary (not its detokenized, cleaned-up text)."""
        found = self._bytes.get(token)
        if found is None:
            found = self._bytes[token] = self._piece(token)
        return found

    def _piece(self, token: int) -> bytes:
        text = self.tokenizer.convert_ids_to_tokens(token)
        if not isinstance(text, str):
            return b""
        byte = _BYTE_TOKEN.match(text)
        if byte:
            return bytes([int(byte.group(1), 16)])
        table = _byte_decoder()
        if self.byte_level and all(ch in table for ch in text):
            return bytes(table[ch] for ch in text)
        return text.replace("\u2581", " ").encode()  # SentencePiece's word boundary

    def entries(
        self, token_ids: list[int], steps: list[Mapping[int, Any]], top: int
    ) -> list[TokenEntry]:
        """One entry per reply token: ``steps`` are vLLM's (token id → its ``Logprob``: the sampled
        token and the ``top`` most likely), in the order of ``token_ids``."""
        out = []
        for token, step in zip(token_ids, steps, strict=False):
            sampled = step.get(token)
            entry = self._token(token, sampled.logprob if sampled is not None else -math.inf)
            ranked = sorted(
                ((i, float(lp.logprob)) for i, lp in step.items() if math.isfinite(lp.logprob)),
                key=lambda x: (-x[1], x[0]),
            )[:top]
            entry["top_logprobs"] = [self._token(i, lp) for i, lp in ranked]
            out.append(entry)
        return out

    def _token(self, token: int, logprob: float) -> TokenEntry:
        piece = self.piece(token)
        return {
            "token": piece.decode("utf-8", errors="replace"),
            "logprob": min(float(logprob), 0.0),  # a rounding above 0 of a probability of 1
            "bytes": list(piece),
        }
