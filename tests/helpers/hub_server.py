"""A Hugging Face Hub on loopback, for ``huggingface_hub`` to talk to through ``HF_ENDPOINT``.

It answers what the library asks, with the Hub's own headers: ``GET /api/models/REPO`` (and
``/revision/REV``, ``?blobs=true``: each file's size, git blob id and, for LFS files, SHA-256),
``HEAD``/``GET /REPO/resolve/REV/PATH`` (``X-Repo-Commit``, ``ETag``/``X-Linked-Etag``,
``X-Linked-Size``, ``Content-Length``, ``Accept-Ranges``; a ``Range`` answered 206), and the
errors as the Hub says them (``X-Error-Code``: ``RepoNotFound`` 401, ``GatedRepo`` 401 without a
token and 403 with one that has no access, ``RevisionNotFound`` and ``EntryNotFound`` 404).

A file is bytes, a file on disk (streamed), or *sparse*: a real header and then zeros up to its
full size, so a 60 GB checkpoint's shards can be listed and their headers read by range without
60 GB anywhere. Faults on demand: ``cut_once[path] = n`` sends the first whole-file ``GET`` of
``path`` (no ``Range``: a download, not a header read) with its whole ``Content-Length`` and
closes after ``n`` bytes (an interrupted download); ``corrupt`` serves a path with its last byte
changed (the header intact), so its content no longer has the listing's hash. Every request is logged (method, path,
``Range``, whether a token came, bytes of body sent) so a test can say what was fetched.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".onnx")


@dataclass
class HubFile:
    """One file of a repository: ``data`` bytes, or ``disk`` (a file streamed), or ``header``
    bytes followed by zeros up to ``size`` (sparse); ``sha256`` overrides the listed hash (a
    sparse file's, which nobody downloads whole)."""

    data: bytes | None = None
    disk: Path | None = None
    header: bytes | None = None
    size: int = 0
    sha256: str | None = None

    def __post_init__(self) -> None:
        if self.data is not None:
            self.size = len(self.data)
        elif self.disk is not None:
            self.size = self.disk.stat().st_size
        elif self.header is not None:
            self.size = max(self.size, len(self.header))

    def chunks(self, start: int, end: int) -> Iterator[bytes]:
        """Bytes ``start`` to ``end`` (exclusive), in pieces."""
        if self.data is not None:
            yield self.data[start:end]
        elif self.disk is not None:
            with self.disk.open("rb") as f:
                f.seek(start)
                left = end - start
                while left > 0:
                    block = f.read(min(left, 1 << 20))
                    if not block:
                        return
                    left -= len(block)
                    yield block
        else:
            head = self.header or b""
            if start < len(head):
                yield head[start : min(end, len(head))]
            pos = max(start, len(head))
            while pos < end:
                n = min(end - pos, 1 << 20)
                yield b"\0" * n
                pos += n

    def hashes(self) -> tuple[str, str]:
        """(SHA-256, git blob id) of the content; a sparse file's are the listed ones."""
        sha, git = hashlib.sha256(), hashlib.sha1(usedforsecurity=False)
        git.update(f"blob {self.size}\0".encode())
        if self.data is None and self.disk is None:
            digest = self.sha256 or hashlib.sha256(self.header or b"").hexdigest()
            return digest, digest[:40]
        for block in self.chunks(0, self.size):
            sha.update(block)
            git.update(block)
        return self.sha256 or sha.hexdigest(), git.hexdigest()


@dataclass
class HubRepo:
    files: dict[str, HubFile]
    commit: str = "0" * 40
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    tokens: tuple[str, ...] = ()
    """Tokens that have access to a gated repository."""

    def __post_init__(self) -> None:
        if self.commit == "0" * 40:
            self.commit = hashlib.sha1(json.dumps(sorted(self.files)).encode()).hexdigest()
        self.refs.setdefault("main", self.commit)
        self._hashes: dict[str, tuple[str, str]] = {}

    def hashes(self, path: str) -> tuple[str, str]:
        if path not in self._hashes:
            self._hashes[path] = self.files[path].hashes()
        return self._hashes[path]

    def is_lfs(self, path: str) -> bool:
        return path.endswith(LFS_SUFFIXES) or self.files[path].size > 10 << 20

    def etag(self, path: str) -> str:
        sha, git = self.hashes(path)
        return sha if self.is_lfs(path) else git

    def sibling(self, path: str) -> dict[str, object]:
        sha, git = self.hashes(path)
        row: dict[str, object] = {"rfilename": path, "size": self.files[path].size, "blobId": git}
        if self.is_lfs(path):
            row["lfs"] = {"sha256": sha, "size": self.files[path].size, "pointerSize": 134}
        return row


@dataclass
class Logged:
    method: str
    path: str
    range: str | None
    token: bool
    status: int
    sent: int


class Hub:
    """The server (see the module docstring): ``with Hub(repos) as hub:`` → ``hub.endpoint``."""

    def __init__(self, repos: dict[str, HubRepo]) -> None:
        self.repos = repos
        self.log: list[Logged] = []
        self.cut_once: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Hub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)

    def fetched(self, suffix: str) -> list[Logged]:
        """The GET requests of files whose path ends with ``suffix``."""
        return [e for e in self.log if e.method == "GET" and e.path.endswith(suffix)]


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def do_GET(self) -> None:
            self._serve(head=False)

        def do_HEAD(self) -> None:
            self._serve(head=True)

        # -- routing ---------------------------------------------------------------
        def _serve(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            if path.startswith("/api/models/"):
                self._api(path.removeprefix("/api/models/"), head)
                return
            parts = path.lstrip("/").split("/", 4)
            if len(parts) == 5 and parts[2] == "resolve":
                self._resolve(f"{parts[0]}/{parts[1]}", parts[3], parts[4], head)
                return
            self._error(404, "NotFound", "no such route", head, path)

        def _repo(self, repo_id: str, head: bool, path: str) -> HubRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(401, "RepoNotFound", "Repository not found", head, path)
                return None
            if repo.gated:
                token = self.headers.get("authorization", "").removeprefix("Bearer ").strip()
                if not token:
                    self._error(401, "GatedRepo", "Access to this model is restricted", head, path)
                    return None
                if token not in repo.tokens:
                    self._error(403, "GatedRepo", "Your token has no access", head, path)
                    return None
            return repo

        def _commit(self, repo: HubRepo, revision: str, head: bool, path: str) -> str | None:
            commit = repo.refs.get(revision) or (revision if revision == repo.commit else None)
            if commit is None:
                self._error(404, "RevisionNotFound", "Invalid rev id", head, path)
            return commit

        def _api(self, rest: str, head: bool) -> None:
            repo_id, _, revision = rest.partition("/revision/")
            repo = self._repo(repo_id, head, rest)
            if repo is None:
                return
            commit = self._commit(repo, revision or "main", head, rest)
            if commit is None:
                return
            body = json.dumps(
                {
                    "id": repo_id,
                    "sha": commit,
                    "private": False,
                    "gated": "manual" if repo.gated else False,
                    "siblings": [repo.sibling(p) for p in sorted(repo.files)],
                }
            ).encode()
            self._send(200, {"Content-Type": "application/json"}, body, head, rest)

        def _resolve(self, repo_id: str, revision: str, file: str, head: bool) -> None:
            where = f"/{repo_id}/resolve/{revision}/{file}"
            repo = self._repo(repo_id, head, where)
            if repo is None:
                return
            commit = self._commit(repo, revision, head, where)
            if commit is None:
                return
            entry = repo.files.get(file)
            if entry is None:
                self._error(404, "EntryNotFound", "Entry not found", head, where, commit)
                return
            etag = repo.etag(file)
            headers = {
                "X-Repo-Commit": commit,
                "ETag": f'"{etag}"',
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            if repo.is_lfs(file):
                headers |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(entry.size)}
            start, end, status = 0, entry.size, 200
            wanted = self.headers.get("range")
            if wanted and wanted.startswith("bytes="):
                lo, _, hi = wanted[6:].partition("-")
                start = min(int(lo or 0), entry.size)
                end = min(int(hi) + 1, entry.size) if hi else entry.size
                status = 206
                headers["Content-Range"] = f"bytes {start}-{max(start, end - 1)}/{entry.size}"
            headers["Content-Length"] = str(end - start)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            sent = 0
            if not head:
                sent = self._body(entry, file, start, end)
            hub.record(Logged(self.command, where, wanted, self._token(), status, sent))

        def _body(self, entry: HubFile, file: str, start: int, end: int) -> int:
            whole = self.command == "GET" and not self.headers.get("range")
            cut = hub.cut_once.pop(file, None) if whole else None
            sent = 0
            for block in entry.chunks(start, end):
                if file in hub.corrupt and block and start + sent + len(block) == entry.size:
                    block = block[:-1] + bytes([block[-1] ^ 0xFF])  # the last byte: not the header
                if cut is not None and sent + len(block) > cut:
                    self.wfile.write(block[: cut - sent])
                    self.wfile.flush()
                    self.close_connection = True
                    return cut
                self.wfile.write(block)
                sent += len(block)
            return sent

        # -- answers ---------------------------------------------------------------
        def _token(self) -> bool:
            return bool(self.headers.get("authorization"))

        def _send(
            self, status: int, headers: dict[str, str], body: bytes, head: bool, path: str
        ) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            hub.record(
                Logged(self.command, path, self.headers.get("range"), self._token(), status, 0)
            )

        def _error(
            self, status: int, code: str, message: str, head: bool, path: str, commit: str = ""
        ) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message}
            if commit:
                headers["X-Repo-Commit"] = commit
            body = json.dumps({"error": message}).encode()
            self._send(status, {**headers, "Content-Type": "application/json"}, body, head, path)

    return Handler


# ---- the repositories the tests serve ----------------------------------------------------


def directory_repo(directory: Path, **kw: Any) -> HubRepo:
    """Every file under ``directory`` (recursively), streamed from disk."""
    files = {
        p.relative_to(directory).as_posix(): HubFile(disk=p)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
    return HubRepo(files, **kw)


def header_only_repo(directory: Path) -> HubRepo:
    """A checkpoint whose safetensors files hold their headers alone on disk
    (configs/models/qwen3-omni-30b-a3b) served at their full size: the header, then zeros up
    to the end its header's offsets say. Other top-level files are served as they are."""
    import struct

    files: dict[str, HubFile] = {}
    for p in sorted(directory.iterdir()):
        if not p.is_file():
            continue
        if p.suffix == ".safetensors":
            raw = p.read_bytes()
            (n,) = struct.unpack("<Q", raw[:8])
            header = json.loads(raw[8 : 8 + n])
            end = max(
                (t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0
            )
            files[p.name] = HubFile(header=raw[: 8 + n], size=8 + n + end)
        else:
            files[p.name] = HubFile(disk=p)
    return HubRepo(files)


TEST_TOKEN = "hf_omniEdgeTestToken0123456789abcdef"
"""The one token the served gated repository accepts (never a real one)."""


FREE_BYTES = 1 << 50
"""The free space ``serving`` reports for the HF cache's disk (a pebibyte: room for any
test repository); a test of the refusal sets its own."""


@contextmanager
def serving(repos: dict[str, HubRepo], monkeypatch: Any, tmp_path: Path) -> Iterator[Hub]:
    """The Hub on loopback, with this process's environment pointed at it: ``HF_ENDPOINT``, an
    empty HF cache and HF home under ``tmp_path`` (no login cache, no ``HF_TOKEN``), not
    offline, and a private omni-edge cache."""
    with Hub(repos) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "omni-edge-cache"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        # The disk's free space is the test's, not the machine's: a test repository's
        # download (the Omni model's is 70 GB) would otherwise be refused, or not, by how
        # full this machine's disk happens to be.
        monkeypatch.setattr("orchestrator.core.hub.free_bytes", lambda directory=None: FREE_BYTES)
        yield hub


def cache_files(tmp_path: Path) -> list[str]:
    """Every file in the HF cache ``serving`` set up (relative paths), blobs and links alike."""
    root = tmp_path / "hf-cache"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
