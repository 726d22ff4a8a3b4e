"""A decode stage's model named by its Hugging Face Hub id (``orchestrator.core.hub``).

Which files of the repository the stage reads (:func:`wanted_files`: ``config.json``, the
tokenizer's and generation's small files, the safetensors weights and their index — never
``*.bin``, ``*.pth``, ONNX or GGUF copies, nor subfolders; an Omni talker also reads
``spk_dict.pt``; for a GGUF repository the one file the reference selects), whether the HF cache
holds them (:func:`cached_model`, offline), and what planning reads (:func:`hub_model`):

* the cache's own snapshot when every file is there — read like any checkpoint directory;
* else the Hub's metadata, laid out under the omni-edge cache as a metadata-only checkpoint at
  the commit the reference resolved to: ``config.json`` and the other small JSON files (so a
  remote-code ``auto_map`` is refused before anything downloads), each safetensors file's header
  alone (fetched by range request), or a GGUF's header alone (range requests until its tensor
  table ends). The same readers then plan it (``checkpoint.read_checkpoint``/``read_gguf``),
  weights marked not present, and the plan says what a run would download.

Nothing here downloads a weight or writes into the HF cache; ``omni-edge pull`` does that.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

from orchestrator.core import hub
from orchestrator.core.documents import JsonObject
from orchestrator.core.errors import ConfigError
from orchestrator.core.hub import HubRef, RepoFile, Snapshot
from orchestrator.core.settings import cache_root
from orchestrator.core.units import fmt_bytes
from stages.ar_decode.checkpoint import parse_gguf_header, read_checkpoint, weights_missing
from stages.base import Need

CHECKPOINT_PATTERNS = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "*.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
)
"""What a decode stage reads of a checkpoint repository (files at its top level): the config,
the weights as safetensors, the tokenizer and chat template, and the processor configs the
remote-code check reads (``stages.ar_decode.remote_code``)."""
SUB_MODEL_FILES = {"talker": ("spk_dict.pt",)}
"""Files only one sub-model reads: an Omni talker's voices (``omni_talker.load_talker``)."""
METADATA_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
    "processor_config.json",
)
"""Fetched whole (small JSON) to plan a model that is not downloaded."""
GGUF_HEADER_FIRST = 4 << 20
GGUF_HEADER_MOST = 512 << 20
"""A GGUF's header is read by range requests from 4 MiB, doubling until its tensor table
ends (SmolLM2's, with 49,152 tokens and their merges, is about 2 MiB; a 256k-token
vocabulary's about 10 MiB); past 512 MiB it is not a header."""
_SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


def _gguf_files(snapshot: Snapshot) -> list[RepoFile]:
    return [
        f
        for f in snapshot.files
        if f.path.lower().endswith(".gguf") and "mmproj" not in PurePosixPath(f.path).name.lower()
    ]


def choose_gguf(snapshot: Snapshot, where: str) -> RepoFile:
    """The GGUF file the reference's ``:FILE.gguf`` or ``:TAG`` selects (a tag matches a file
    whose name holds it as a whole word, ``Q4_K_M`` in ``model-Q4_K_M.gguf``); ``ConfigError``
    naming the files there are when none or several match, or for a split GGUF."""
    ref, ggufs = snapshot.ref, _gguf_files(snapshot)
    select = ref.select or ""
    listed = ", ".join(PurePosixPath(f.path).name for f in ggufs[:12]) or "none"
    if select.lower().endswith(".gguf"):
        hits = [f for f in snapshot.files if f.path == select]
    else:
        word = re.compile(rf"(?<![A-Za-z0-9]){re.escape(select)}(?![A-Za-z0-9])", re.IGNORECASE)
        hits = [f for f in ggufs if word.search(PurePosixPath(f.path).name)]
    if len(hits) != 1:
        found = (
            f"{len(hits)} GGUF files match {select!r} ({', '.join(f.path for f in hits[:6])})"
            if hits
            else f"no GGUF file matches {select!r}"
        )
        raise ConfigError.single(
            where,
            f"{ref.repo}@{snapshot.commit[:12]}: {found}; its GGUF files: {listed}",
            f"name one file: {ref.repo}:FILE.gguf, or a quantization tag that only one file has",
        )
    if _SPLIT_GGUF.search(hits[0].path):
        raise ConfigError.single(
            where,
            f"{ref.repo}: {hits[0].path} is one part of a split GGUF, which the decode engines here "
            "read as one file only",
            "choose a quantization that ships as a single file",
        )
    return hits[0]


def wanted_files(snapshot: Snapshot, model_stage: str | None, where: str) -> list[RepoFile]:
    """The files of ``snapshot`` a decode stage reads (see the module docstring); ``ConfigError``
    for a repository it cannot use (no ``config.json`` and no GGUF named, no safetensors)."""
    if snapshot.ref.select:
        return [choose_gguf(snapshot, where)]
    names = snapshot.names
    if "config.json" not in names:
        ggufs = _gguf_files(snapshot)
        raise ConfigError.single(
            where,
            f"{snapshot.ref.repo} has no config.json"
            + (f", only GGUF files ({len(ggufs)})" if ggufs else ""),
            f"name one of its GGUF files by quantization: {snapshot.ref.repo}:Q4_K_M (or :FILE.gguf)"
            if ggufs
            else "name a repository of a transformers checkpoint (config.json and safetensors weights)",
        )
    patterns = (*CHECKPOINT_PATTERNS, *SUB_MODEL_FILES.get(model_stage or "", ()))
    files = [
        f for f in snapshot.files if "/" not in f.path and any(fnmatch(f.path, p) for p in patterns)
    ]
    if not any(f.path.endswith(".safetensors") for f in files):
        raise ConfigError.single(
            where,
            f"{snapshot.ref.repo} has no safetensors weights at its top level "
            "(omni-edge reads weights from safetensors only: pickled *.bin files can run code)",
            "use a repository that ships model.safetensors (or its shards), or its GGUF build",
        )
    return files


def _lacking_locally(snapshot: Snapshot, model_stage: str | None, where: str) -> str | None:
    """Why the cached ``snapshot`` cannot run the stage (a file missing), or None."""
    try:
        files = wanted_files(snapshot, model_stage, where)
    except ConfigError as exc:
        return exc.problems[0].what
    if snapshot.ref.select:
        return None
    index = snapshot.directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return "its model.safetensors.index.json cannot be read"
        gone = sorted(s for s in shards if snapshot.file(s) is None)
        if gone:
            return (
                f"{len(gone)} of its {len(shards)} safetensors shards are not there ({gone[0]}, …)"
            )
    return None if files else "no files"


@dataclass(frozen=True)
class HubModel:
    """A model named by Hub id, resolved to one commit: the files the stage reads, those the
    cache lacks, where planning reads it and where a run loads it from."""

    snapshot: Snapshot
    files: tuple[RepoFile, ...]
    missing: tuple[RepoFile, ...]
    read_path: Path
    """What planning reads: the cache's snapshot (a directory, or the GGUF file), or the
    metadata-only copy under the omni-edge cache."""
    run_path: Path
    """Where a run loads it from: in the HF cache's snapshot at the commit."""

    @property
    def present(self) -> bool:
        return not self.missing

    @property
    def download_bytes(self) -> int:
        return sum(f.size for f in self.missing)

    def record(self) -> JsonObject:
        """What the plan (and so the run record and ``/v1/plan``) says of it: the repository, the
        revision asked for and the commit it is pinned to, each file with its size and hash and
        whether it is here, what a run would download and the free space where it would go. No
        token, no credential: nothing of the request's headers."""
        ref = self.snapshot.ref
        missing = {f.path for f in self.missing}
        return {
            "repo": ref.repo,
            "revision": ref.branch,
            "commit": self.snapshot.commit,
            **({"select": ref.select} if ref.select else {}),
            "endpoint": hub.endpoint(),
            "evidence": "cache" if self.present else "hub-metadata",
            "downloaded": self.present,
            "files": [{**f.to_dict(), "present": f.path not in missing} for f in self.files],
            "download_bytes": self.download_bytes,
            "cache_dir": str(hub.hub_cache()),
            "disk_free_bytes": hub.free_bytes(),
        }

    def note(self) -> str | None:
        """The plan's note on a model that is not downloaded (None when it is)."""
        if self.present:
            return None
        free = hub.free_bytes()
        return (
            f"planned from the Hub's metadata ({self.snapshot.ref.repo}@{self.snapshot.commit[:12]}: "
            "config.json and the weights' headers by range request; nothing downloaded): a run needs "
            f"omni-edge pull, {len(self.missing)} file(s), {fmt_bytes(self.download_bytes)} into "
            f"{hub.hub_cache()}" + (f" ({fmt_bytes(free)} free there)" if free is not None else "")
        )


def cached_model(ref: HubRef, model_stage: str | None, where: str) -> HubModel | None:
    """The model from the HF cache alone — no network — when every file the stage reads is
    there; None otherwise."""
    snapshot = hub.cached_snapshot(ref)
    if snapshot is None or _lacking_locally(snapshot, model_stage, where) is not None:
        return None
    files = tuple(wanted_files(snapshot, model_stage, where))
    path = snapshot.directory / files[0].path if ref.select else snapshot.directory
    return HubModel(snapshot, files, (), path, path)


def hub_model(ref: HubRef, model_stage: str | None, where: str) -> HubModel:
    """The model as planning reads it: from the cache when it holds every file (no network),
    else from the Hub's metadata at the commit the reference names now (``ConfigError`` for a
    repository that is missing, gated, unreachable, or offline: ``orchestrator.core.hub``)."""
    cached = cached_model(ref, model_stage, where)
    if cached is not None:
        return cached
    snapshot = hub.remote_snapshot(ref, where)
    files = tuple(wanted_files(snapshot, model_stage, where))
    missing = tuple(f for f in files if not (snapshot.directory / f.path).is_file())
    target = snapshot.directory / files[0].path if ref.select else snapshot.directory
    if not missing:
        return HubModel(snapshot, files, (), target, target)
    return HubModel(snapshot, files, missing, _metadata_copy(snapshot, files, where), target)


def metadata_dir(repo: str, commit: str) -> Path:
    """Where the Hub's metadata of ``repo`` at ``commit`` is kept (a commit never changes, so
    it is read once)."""
    return cache_root() / "hub-metadata" / f"models--{repo.replace('/', '--')}" / commit


def _metadata_copy(snapshot: Snapshot, files: tuple[RepoFile, ...], where: str) -> Path:
    """The metadata-only copy of ``files`` (see the module docstring), made once per commit and
    selection; its path (the directory, or the GGUF header's file)."""
    ref = snapshot.ref
    base = metadata_dir(ref.repo, snapshot.commit)
    leaf = base / (PurePosixPath(files[0].path).name if ref.select else "checkpoint")
    if leaf.exists():
        return leaf
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".partial-", dir=base))
    try:
        if ref.select:
            _write_gguf_header(snapshot, files[0], work / leaf.name, where)
        else:
            _write_checkpoint_metadata(snapshot, files, work, where)
        try:
            os.replace(work / leaf.name if ref.select else work, leaf)
        except OSError:
            if not leaf.exists():  # another process made the same copy first: theirs stands
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return leaf


def _write_checkpoint_metadata(
    snapshot: Snapshot, files: tuple[RepoFile, ...], out: Path, where: str
) -> None:
    for entry in files:
        if entry.path in METADATA_FILES:
            (out / entry.path).write_bytes(hub.read_small(snapshot, entry.path, where))
        elif entry.path.endswith(".safetensors"):
            header = hub.safetensors_header(snapshot, entry.path, where)
            raw = json.dumps(header, separators=(",", ":")).encode()
            (out / entry.path).write_bytes(struct.pack("<Q", len(raw)) + raw)


def _write_gguf_header(snapshot: Snapshot, entry: RepoFile, out: Path, where: str) -> None:
    """The GGUF's first bytes, enough to hold its header and tensor table (read by range
    requests, doubling from :data:`GGUF_HEADER_FIRST`)."""
    size = GGUF_HEADER_FIRST
    while True:
        body = hub.read_range(snapshot, entry.path, 0, min(size, entry.size), where)
        out.write_bytes(body)
        try:
            parse_gguf_header(out)
            return
        except struct.error:
            if size >= entry.size or size >= GGUF_HEADER_MOST:
                break
            size *= 2
        except (ValueError, OSError) as exc:
            raise ConfigError.single(
                where,
                f"{snapshot.ref.repo}: {entry.path} is not a readable GGUF file: {exc}"[:300],
                "name another file of the repository",
            ) from None
    raise ConfigError.single(
        where,
        f"{snapshot.ref.repo}: {entry.path}'s header does not end within its first "
        f"{fmt_bytes(min(size, entry.size))}",
        "name another file of the repository (this one is damaged, or not a GGUF)",
    )


def local_need(path: Path, named: str) -> list[Need]:
    """A model a path (``named`` so in the config) names, as ``omni-edge pipelines`` lists it:
    a GGUF file's size, or a checkpoint directory's weights — here, or not for a metadata-only
    directory."""
    try:
        if path.suffix == ".gguf":
            return [Need(named, path.stat().st_size, True)]
        manifest = read_checkpoint(path)
    except (ConfigError, OSError) as exc:
        what = exc.problems[0].what if isinstance(exc, ConfigError) else str(exc)
        return [Need(named, None, False, what)]
    missing = weights_missing(manifest)
    note = f"weights not here: {missing}" if missing else ""
    return [Need(named, manifest.weight_bytes, missing is None, note)]
