"""A GGUF's own tokenizer and chat template, through llama.cpp (llama-cpp-python).

:class:`GgufVocab` tokenizes text and renders the chat template stored in the
GGUF (``tokenizer.chat_template``), with the same calls llama-cpp-python makes
for a chat completion: the template rendered by its ``Jinja2ChatFormatter``
(the GGUF's BOS/EOS token texts passed in), the result tokenized with special
tokens parsed and no BOS added (the template writes its own). It duck-types the
two calls :func:`stages.ar_decode.prompt.encode` makes on a Hugging Face
tokenizer (``chat_template``, ``apply_chat_template``, ``encode``), so a
request is counted the same way whichever engine runs it.

Two ways in:

* :func:`gguf_vocab` — the vocabulary alone (``vocab_only``: the GGUF's
  metadata and token table, never its weights; tens of milliseconds), cached
  per path: the request check before a request reaches a device actor;
* ``GgufVocab(model)`` — the vocabulary of a model the runner has loaded.

``llama_cpp`` is imported inside the functions: planning never pays for it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from pathlib import Path
from typing import Any

from orchestrator.core.packages import is_package_location, resolve_package_location

log = logging.getLogger(__name__)

PIECE_BUFFER_BYTES = 64
"""A token's text is a few bytes; a longer one (rare) is retried with the size llama.cpp asks for."""

_backend_lock = threading.Lock()
_backend_ready = False


def llama_cpp_module() -> Any:
    """``llama_cpp`` imported, its backend initialised once per process and its log quiet
    (llama.cpp logs every tensor and setting at INFO to stderr; errors still print)."""
    global _backend_ready
    import llama_cpp

    with _backend_lock:
        if not _backend_ready:
            # llama-cpp-python routes llama.cpp's log through this logger (llama_cpp._logger):
            # ERROR keeps failures visible and drops the per-tensor INFO lines.
            logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
            llama_cpp.llama_backend_init()
            _backend_ready = True
    return llama_cpp


def free_llama(lc: Any, batch: Any, ctx: Any, model: Any) -> None:
    """Free what llama.cpp allocated for one context, in its order: the batch, the context,
    then the model (each may be None or null: never made)."""
    if batch is not None:
        lc.llama_batch_free(batch)
    if ctx:
        lc.llama_free(ctx)
    if model:
        lc.llama_model_free(model)


class GgufVocab:
    """Tokenizer and chat template of one GGUF (see the module docstring).

    Thread-safe: tokenizing takes a lock (requests are checked from a thread pool)."""

    def __init__(self, model: Any, *, owned: bool = False) -> None:
        lc = llama_cpp_module()
        self._lc = lc
        self._model = model
        self._owned = owned
        self._lock = threading.Lock()
        self.vocab = lc.llama_model_get_vocab(model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        self.eog_ids = frozenset(
            t for t in range(self.n_vocab) if lc.llama_vocab_is_eog(self.vocab, t)
        )
        raw = lc.llama_model_chat_template(model, None)
        self.chat_template: str | None = raw.decode("utf-8") if raw else None
        self._formatter: Any = None
        self._piece_buf = ctypes.create_string_buffer(PIECE_BUFFER_BYTES)

    @classmethod
    def open(cls, path: str | Path) -> GgufVocab:
        """The vocabulary alone, read from ``path`` (no weights). ``OSError`` when it cannot be read."""
        lc = llama_cpp_module()
        params = lc.llama_model_default_params()
        params.vocab_only = True
        model = lc.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise OSError(f"llama.cpp could not read the vocabulary of {path}")
        return cls(model, owned=True)

    def close(self) -> None:
        if self._owned and self._model:
            self._lc.llama_model_free(self._model)
        self._model = None

    def token_text(self, token: int) -> str:
        """The token's text in the vocabulary (``<|im_end|>``), as a template names it."""
        raw = self._lc.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def special_text(self, which: str) -> str:
        """``bos`` or ``eos`` token's text, empty when the vocabulary has none."""
        token = int(getattr(self._lc, f"llama_vocab_{which}")(self.vocab))
        return self.token_text(token) if token >= 0 else ""

    def render(self, messages: list[dict[str, str]]) -> str:
        """The chat template applied to ``messages``, with the assistant's turn opened."""
        if self.chat_template is None:
            raise ValueError("this GGUF has no tokenizer.chat_template")
        if self._formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            self._formatter = Jinja2ChatFormatter(
                template=self.chat_template,
                eos_token=self.special_text("eos"),
                bos_token=self.special_text("bos"),
                add_generation_prompt=True,
            )
        return str(self._formatter(messages=messages).prompt)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of ``text`` (``llama_tokenize``; retried with the count it asks for)."""
        lc = self._lc
        data = text.encode("utf-8")
        with self._lock:
            size = len(data) + 8
            for _ in range(2):
                out = (lc.llama_token * size)()
                n = int(
                    lc.llama_tokenize(
                        self.vocab, data, len(data), out, size, add_special, parse_special
                    )
                )
                if n >= 0:
                    return list(out[:n])
                size = -n
        raise RuntimeError(f"llama.cpp could not tokenize {len(data)} bytes")

    def piece(self, token: int) -> bytes:
        """The bytes a generated token adds to the text (control tokens add none). Called by
        the engine thread only."""
        lc, buf = self._lc, self._piece_buf
        n = int(lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False))
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = int(lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False))
        return buf.raw[:n]

    # -- the two calls prompt.encode makes on a Hugging Face tokenizer ----------------
    def apply_chat_template(
        self,
        messages: list[dict[str, str]],
        *,
        tokenize: bool = True,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Ids of the rendered template: special tokens parsed, no BOS added (the template
        writes its own), as llama-cpp-python's chat completion tokenizes it."""
        if not tokenize or not add_generation_prompt:
            raise ValueError(
                "GgufVocab renders prompts for generation only (tokenize=True, add_generation_prompt=True)"
            )
        return self.tokenize(self.render(messages), add_special=False, parse_special=True)

    def encode(self, text: str) -> list[int]:
        """Ids of plain text (no template): the vocabulary's BOS added where it asks for one."""
        return self.tokenize(text, add_special=True, parse_special=True)


def gguf_path(model: str | Path) -> Path:
    """The file a plan's ``model`` names (a path, or a ``package://`` location)."""
    text = str(model)
    return Path(
        resolve_package_location(text) if is_package_location(text) else Path(text).expanduser()
    ).resolve()


def gguf_vocab(model: str | Path) -> GgufVocab:
    """The vocabulary of the GGUF ``model`` names, read once per process."""
    return _vocab_at(str(gguf_path(model)))


@functools.lru_cache(maxsize=4)
def _vocab_at(path: str) -> GgufVocab:
    return GgufVocab.open(path)
