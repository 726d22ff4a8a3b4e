"""Models named by their Hugging Face Hub id: the reference, the local HF cache, the Hub's
metadata, and downloads that are verified — all through ``huggingface_hub``.

A reference is ``ORG/NAME``, optionally ``@REVISION`` (a branch, tag or commit) and, for a
repository of GGUF files, ``:FILE.gguf`` or a quantization tag (``:Q4_K_M``), as llama.cpp's
``-hf`` takes it (:func:`parse_hub_ref`). Guarantees:

* **The cache first, without the network.** :func:`cached_snapshot` reads the standard HF cache
  (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``) as
  ``huggingface_hub`` lays it out — ``models--ORG--NAME/refs/<revision>`` holds the commit,
  ``snapshots/<commit>/`` the files — so a model another tool downloaded is found offline.
* **The Hub's metadata, never its weights, for planning.** :func:`remote_snapshot` lists the
  repository at one commit (sizes, SHA-256 of LFS files, git blob ids), :func:`read_small` and
  :func:`read_range` fetch ``config.json`` or a GGUF's header by range request into memory,
  :func:`safetensors_header` a safetensors header by range request; nothing is written to the
  HF cache. ``HF_HUB_OFFLINE`` (read at each call) makes every one of them an error that says so.
* **Downloads pinned and verified.** :func:`download` fetches files at the resolved commit (never
  a moving branch) with ``hf_hub_download`` (progress bar, resume of an interrupted download,
  size checked), then checks each file's SHA-256 (LFS) or git blob id against the Hub's listing:
  a mismatch removes the file and is a ``ConfigError``; the ref the user named is written so a
  later offline resolution finds the commit.
* **Errors are said, the token never is.** A missing repository, a gated or private one without
  access (401/403), a revision that does not exist, an unreachable Hub: each a ``ConfigError``
  (exit 2) naming the repository and the remedy (:func:`hub_error`). The token comes from where
  ``huggingface_hub`` looks (``HF_TOKEN``, the login cache); nothing here reads, logs or records it.

``huggingface_hub`` is imported inside the functions that talk to the Hub (0.3 s: its HTTP
client), so a plan of local files never pays for it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Required, TypedDict

from orchestrator.core.errors import ConfigError

if TYPE_CHECKING:
    from huggingface_hub import HfApi

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
HUB_REF = re.compile(
    rf"^(?P<repo>{_NAME}/{_NAME})"
    r"(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9._/-]{0,199}))?"
    r"(?::(?P<select>[A-Za-z0-9_][A-Za-z0-9._/-]{0,254}))?$"
)
"""``ORG/NAME[@REVISION][:FILE_OR_TAG]``: the Hub's repository names (letters, digits, ``.``,
``_``, ``-``; 96 characters each side), a revision without spaces, a file path or a tag."""
_TRUTHY = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubRef:
    """A model named by its Hub id (see the module docstring)."""

    repo: str
    revision: str | None = None
    """As written (None: the default branch, ``main``)."""
    select: str | None = None
    """A file in the repository (``model-Q4_K_M.gguf``) or a quantization tag (``Q4_K_M``)."""

    @property
    def text(self) -> str:
        """The reference as a user writes it."""
        return (
            self.repo
            + (f"@{self.revision}" if self.revision else "")
            + (f":{self.select}" if self.select else "")
        )

    @property
    def branch(self) -> str:
        """The revision asked for (``main`` when none was named)."""
        return self.revision or DEFAULT_REVISION

    def at(self, commit: str) -> HubRef:
        """The same model pinned to ``commit``."""
        return HubRef(self.repo, commit, self.select)


def parse_hub_ref(text: str) -> HubRef | None:
    """The Hub reference ``text`` spells, or None when it is not one (a path, a ``package://``
    location, anything with a ``..``, a ``--`` or a leading ``/``)."""
    m = HUB_REF.match(text)
    if m is None or ".." in text or "--" in m["repo"]:
        return None
    return HubRef(m["repo"], m["revision"], m["select"])


class FileRecord(TypedDict, total=False):
    """A repository's file as the plan, the run record and ``pull --json`` show it."""

    path: Required[str]
    size: Required[int]
    sha256: str
    blob_id: str


@dataclass(frozen=True)
class RepoFile:
    """One file of a repository at one commit, as the Hub lists it (or the cache holds it)."""

    path: str
    size: int
    sha256: str | None = None
    """The SHA-256 of an LFS file's content (its ETag on the Hub, its blob's name in the cache)."""
    blob_id: str | None = None
    """The git blob id of a file stored in git (SHA-1 of ``blob <size>\\0`` + content)."""

    def to_dict(self) -> FileRecord:
        d: FileRecord = {"path": self.path, "size": self.size}
        if self.sha256:
            d["sha256"] = self.sha256
        elif self.blob_id:
            d["blob_id"] = self.blob_id
        return d


@dataclass(frozen=True)
class Snapshot:
    """A repository at one commit: from the HF cache (``local``) or the Hub's listing."""

    ref: HubRef
    commit: str
    files: tuple[RepoFile, ...]
    local: bool

    def file(self, path: str) -> RepoFile | None:
        return next((f for f in self.files if f.path == path), None)

    @property
    def names(self) -> list[str]:
        return [f.path for f in self.files]

    @property
    def directory(self) -> Path:
        """Where the files are (or will be, once pulled) in the HF cache."""
        return snapshot_dir(self.ref.repo, self.commit)


# ---- where things are ------------------------------------------------------------------


def endpoint() -> str:
    """The Hub this process talks to: ``$HF_ENDPOINT`` (a mirror, or a test server), else the Hub."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids the network (read at each call)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUTHY


def hub_cache() -> Path:
    """The HF cache's ``hub`` directory, where ``huggingface_hub`` puts it: ``$HF_HUB_CACHE``,
    else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def repo_dir(repo: str) -> Path:
    return hub_cache() / f"models--{repo.replace('/', '--')}"


def snapshot_dir(repo: str, commit: str) -> Path:
    return repo_dir(repo) / "snapshots" / commit


def free_bytes(directory: Path | None = None) -> int | None:
    """Free bytes on the file system that holds ``directory`` (default: the HF cache), looked
    up at its nearest existing parent; None when none can be read."""
    here = directory or hub_cache()
    for candidate in (here, *here.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


# ---- the cache -------------------------------------------------------------------------


def cached_commit(ref: HubRef) -> str | None:
    """The commit ``ref`` names in the cache: a commit itself, or what ``refs/<revision>`` holds."""
    if ref.revision and COMMIT.match(ref.revision):
        return ref.revision
    try:
        commit = (repo_dir(ref.repo) / "refs" / ref.branch).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return commit if COMMIT.match(commit) else None


def cached_snapshot(ref: HubRef) -> Snapshot | None:
    """The repository as the HF cache holds it at the commit ``ref`` names, read without the
    network (None when the cache has no snapshot for it). Each file's hash is its blob's name."""
    commit = cached_commit(ref)
    if commit is None:
        return None
    root = snapshot_dir(ref.repo, commit)
    if not root.is_dir():
        return None
    files = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():  # a dangling link (a blob removed) is not a file
            continue
        blob = path.resolve().name
        files.append(
            RepoFile(
                path.relative_to(root).as_posix(),
                path.stat().st_size,
                sha256=blob if re.fullmatch(r"[0-9a-f]{64}", blob) else None,
                blob_id=blob if COMMIT.match(blob) else None,
            )
        )
    return Snapshot(ref, commit, tuple(files), True)


def write_ref(ref: HubRef, commit: str) -> None:
    """Record that ``ref``'s revision is ``commit`` (``refs/<revision>``), as ``huggingface_hub``
    does, so a later offline resolution of the same reference finds the snapshot."""
    if COMMIT.match(ref.branch):
        return
    path = repo_dir(ref.repo) / "refs" / ref.branch
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(commit, encoding="utf-8")


# ---- the Hub ---------------------------------------------------------------------------


def _api() -> HfApi:
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint())


def token_sent() -> bool:
    """Whether requests carry a token (``HF_TOKEN`` or the login cache); the token itself is
    never read here beyond that question."""
    from huggingface_hub import get_token

    return get_token() is not None


def _require_online(ref: HubRef, where: str) -> None:
    if offline():
        raise ConfigError.single(
            where,
            f"{ref.text} is not in the Hugging Face cache ({hub_cache()}) and HF_HUB_OFFLINE is set, "
            "so the Hub cannot be asked",
            f"unset HF_HUB_OFFLINE to plan from the Hub's metadata, or run omni-edge pull {ref.text} "
            "where the network is and copy the cache here",
        )


def remote_snapshot(ref: HubRef, where: str) -> Snapshot:
    """The repository's listing at the commit ``ref`` names now (sizes and hashes of every file),
    from the Hub; ``ConfigError`` for every way that can fail (:func:`hub_error`)."""
    _require_online(ref, where)
    with hub_errors(ref, where):
        info = _api().model_info(ref.repo, revision=ref.revision, files_metadata=True)
    if not info.sha or not COMMIT.match(info.sha):
        raise ConfigError.single(
            where,
            f"the Hub at {endpoint()} answered for {ref.repo} without a commit id",
            "check HF_ENDPOINT: it must point at a Hugging Face Hub (or a compatible mirror)",
        )
    files = tuple(
        RepoFile(
            s.rfilename,
            int(s.lfs.size if s.lfs else (s.size or 0)),
            sha256=s.lfs.sha256 if s.lfs else None,
            blob_id=s.blob_id if not s.lfs else None,
        )
        for s in info.siblings or ()
    )
    return Snapshot(ref, info.sha, files, False)


def _url(repo: str, commit: str, path: str) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo, path, revision=commit, endpoint=endpoint())


def read_range(snapshot: Snapshot, path: str, start: int, end: int, where: str) -> bytes:
    """Bytes ``start`` to ``end`` (exclusive) of one file at the snapshot's commit, by a range
    request (held in memory, written nowhere)."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    _require_online(snapshot.ref, where)
    headers = {**build_hf_headers(), "Range": f"bytes={start}-{max(start, end - 1)}"}
    with hub_errors(snapshot.ref, where):
        response = get_session().get(
            _url(snapshot.ref.repo, snapshot.commit, path), headers=headers, timeout=30
        )
        hf_raise_for_status(response)
    body = bytes(response.content)
    return body[: end - start] if response.status_code == 206 else body[start:end]


def read_small(snapshot: Snapshot, path: str, where: str, limit: int = 16 << 20) -> bytes:
    """A small file (``config.json``) whole, in memory; ``ConfigError`` past ``limit`` bytes."""
    entry = snapshot.file(path)
    if entry is not None and entry.size > limit:
        raise ConfigError.single(
            where,
            f"{snapshot.ref.repo}: {path} is {entry.size} bytes, more than a metadata file has",
            "check the repository: this file is expected to be small JSON",
        )
    return read_range(snapshot, path, 0, entry.size if entry else limit, where)


def safetensors_header(snapshot: Snapshot, path: str, where: str) -> dict[str, object]:
    """One safetensors file's header as its JSON says it (tensor → dtype, shape, data_offsets),
    read by ``huggingface_hub``'s range request (``parse_safetensors_file_metadata``)."""
    _require_online(snapshot.ref, where)
    with hub_errors(snapshot.ref, where):
        meta = _api().parse_safetensors_file_metadata(
            snapshot.ref.repo, path, revision=snapshot.commit
        )
    header: dict[str, object] = {}
    if meta.metadata:
        header["__metadata__"] = dict(meta.metadata)
    for name, t in meta.tensors.items():
        header[name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [int(t.data_offsets[0]), int(t.data_offsets[1])],
        }
    return header


# ---- downloads -------------------------------------------------------------------------


def download(
    snapshot: Snapshot,
    files: list[RepoFile],
    where: str,
    announce: Callable[[RepoFile, int, int], None] | None = None,
) -> list[Path]:
    """Each of ``files`` downloaded into the HF cache at the snapshot's commit (progress bars on
    stderr; an interrupted download resumes from its ``.incomplete`` file), then verified against
    the Hub's hash (:func:`verify`); the ref the user named is recorded (:func:`write_ref`).
    ``announce(file, index, count)`` hears each file before it starts."""
    from huggingface_hub import hf_hub_download

    _require_online(snapshot.ref, where)
    done = []
    for i, entry in enumerate(files):
        if announce is not None:
            announce(entry, i, len(files))
        with hub_errors(snapshot.ref, where):
            local = Path(
                hf_hub_download(
                    snapshot.ref.repo,
                    entry.path,
                    revision=snapshot.commit,
                    cache_dir=hub_cache(),
                    endpoint=endpoint(),
                )
            )
        verify(snapshot, entry, local, where)
        done.append(local)
    write_ref(snapshot.ref, snapshot.commit)
    return done


def file_hashes(path: Path) -> tuple[str, str]:
    """``(sha256, git blob id)`` of one file, read once."""
    sha, git = hashlib.sha256(), hashlib.sha1(usedforsecurity=False)
    git.update(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
            git.update(block)
    return sha.hexdigest(), git.hexdigest()


def verify(snapshot: Snapshot, entry: RepoFile, local: Path, where: str) -> None:
    """``local`` must hash to what the Hub lists for ``entry`` (SHA-256 for an LFS file, the git
    blob id otherwise); else the file is removed from the cache (its snapshot link and its blob)
    and a ``ConfigError`` says what was expected and what arrived."""
    if not entry.sha256 and not entry.blob_id:
        return
    sha, git = file_hashes(local)
    expected, got, kind = (
        (entry.sha256, sha, "SHA-256") if entry.sha256 else (entry.blob_id, git, "git blob id")
    )
    if got == expected:
        return
    blob = local.resolve()
    for p in (local, blob):
        p.unlink(missing_ok=True)
    raise ConfigError.single(
        where,
        f"{snapshot.ref.repo}@{snapshot.commit[:12]}: {entry.path} arrived with {kind} {got}, and the Hub "
        f"lists {expected}: the download is damaged (or {endpoint()} serves other bytes than it lists), "
        "so it was removed from the cache",
        "run the same omni-edge pull again; if it fails again, check HF_ENDPOINT (a mirror or proxy "
        "serving altered files)",
    )


# ---- errors ----------------------------------------------------------------------------


@contextmanager
def hub_errors(ref: HubRef, where: str) -> Iterator[None]:
    """``with hub_errors(ref, where):`` — what ``huggingface_hub`` raises inside, as the
    ``ConfigError`` :func:`hub_error` makes of it (anything else passes as it is)."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as exc:
        error = hub_error(exc, ref, where)
        if error is None:
            raise
        raise error from None


def _login_fix(repo: str) -> str:
    return (
        f"request access on {endpoint()}/{repo} if it is gated, then give omni-edge a token that has "
        "it: set HF_TOKEN, or run `hf auth login` (huggingface_hub's login cache)"
    )


def hub_error(exc: Exception, ref: HubRef, where: str) -> ConfigError | None:
    """The ``ConfigError`` for one failure of a Hub call, or None for anything that is not one
    (a bug, raised as it is). The token is never part of the message."""
    from huggingface_hub import errors as hf

    repo, url = ref.repo, f"{endpoint()}/{ref.repo}"
    sent = "a token was sent and it has no access" if token_sent() else "no token was sent"
    if isinstance(exc, hf.GatedRepoError):
        what = f"{repo} is a gated repository and {sent} (HTTP {_status(exc)})"
        return ConfigError.single(where, what, _login_fix(repo))
    if isinstance(exc, hf.RevisionNotFoundError):
        return ConfigError.single(
            where,
            f"{repo} has no revision {ref.branch!r} on {endpoint()}",
            f"name a branch, tag or commit that exists ({url}/tree/main lists them), or leave @{ref.branch} out",
        )
    if isinstance(exc, hf.RepositoryNotFoundError):
        return ConfigError.single(
            where,
            f"no repository {repo} on {endpoint()} (HTTP {_status(exc)}), or it is private and {sent}",
            f"check the id (ORG/NAME, as {url} spells it); for a private repository: {_login_fix(repo)}",
        )
    if isinstance(exc, hf.RemoteEntryNotFoundError | hf.EntryNotFoundError):
        return ConfigError.single(
            where,
            f"{repo} has no such file at this revision: {exc}"[:300],
            "name a file the repository lists",
        )
    if isinstance(exc, hf.SafetensorsParsingError | hf.NotASafetensorsRepoError):
        return ConfigError.single(
            where,
            f"{repo}: a safetensors file's header cannot be read from the Hub: {exc}"[:400],
            "name another revision or repository (this one's weights are damaged or not safetensors)",
        )
    if isinstance(exc, hf.HfHubHTTPError) and _status(exc) in (401, 403):
        return ConfigError.single(
            where,
            f"the Hub refused access to {repo} (HTTP {_status(exc)}): {sent}",
            _login_fix(repo),
        )
    if isinstance(exc, hf.HfHubHTTPError):
        return ConfigError.single(
            where,
            f"the Hub at {endpoint()} failed for {repo}: HTTP {_status(exc)}",
            "try again later; HF_HUB_OFFLINE=1 uses the Hugging Face cache only",
        )
    if isinstance(exc, hf.OfflineModeIsEnabled | ConnectionError | TimeoutError | OSError) or (
        type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests", "urllib3")
    ):
        return ConfigError.single(
            where,
            f"cannot reach the Hub at {endpoint()} for {repo}: {type(exc).__name__}: {exc}"[:400],
            "check the network (and HF_ENDPOINT); HF_HUB_OFFLINE=1 plans and runs from the "
            "Hugging Face cache alone",
        )
    return None


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)
