"""Where the ONNX Runtime sessions of one route live.

``open_sessions(route)`` returns :class:`InProcessSessions` for this
interpreter or :class:`WorkerSessions` — a subprocess started with the route's
interpreter that runs ``orchestrator/ort/worker.py`` — with the same four
calls: ``probe``, ``open``, ``run``, ``close``, and ``unit()`` around calls that
must run in one worker (nothing to hold in this process). The gates, the route
probe and the stage runner hold one of the two and never care which.

Why a subprocess bridge rather than a Ray actor started with another
interpreter: a Ray worker must run the same Ray and Python version as the
cluster, so every route environment would need Ray installed (the OpenVINO
venv is numpy + onnxruntime-openvino; Ray adds ~200 MB and pins protobuf), and
a Windows ``python.exe`` reached from WSL2 cannot join a Linux Ray cluster at
all. The bridge needs only numpy and onnxruntime in the route, speaks over
stdin/stdout (which WSL interop carries), and the device actor that owns it is
still an ordinary Ray actor. Calls are serialised per route (one request in
flight) — a device runs one inference at a time anyway.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import queue
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core import settings
from orchestrator.core.backends import PATH_OPTIONS, plugin_wire, row_for_ep
from orchestrator.core.documents import JsonObject
from orchestrator.core.engines import wire as engine_wire
from orchestrator.core.errors import VerificationError
from orchestrator.core.memory import peak_rss_of, reset_peak_rss, rss_of
from orchestrator.core.ort_builds import require_one_ort_flavour
from orchestrator.core.profile import THIS_PROCESS
from orchestrator.ort import wire, worker_probe
from orchestrator.ort import worker as route_worker
from orchestrator.ort.hostproc import (
    HOST_PROCESS,
    PathTranslationError,
    is_windows_interpreter,
    launch_remedy,
    windows_path,
)
from orchestrator.ort.idle_recycle import IdleRecycle
from orchestrator.ort.revival import RestartPolicy, Revival
from orchestrator.ort.worker import OpenedSession, RunReply
from orchestrator.ort.worker_cwd import private_cwd

if TYPE_CHECKING:
    from orchestrator.ort.worker import Feeds

log = logging.getLogger(__name__)

_EOF = object()


@dataclass(frozen=True)
class ResolvedRoute:
    """A route with its interpreter made absolute: what it takes to start its sessions
    (``orchestrator.ort.routes.resolve`` makes one from a profile's route)."""

    name: str
    kind: str
    python: str | None
    """None for this-process; otherwise the interpreter to start."""

    @property
    def in_process(self) -> bool:
        return self.kind == THIS_PROCESS

    def path_for_route(self, path: str | Path) -> str:
        """A local path as the route's interpreter must spell it.

        A host-process route crosses from WSL2 to Windows (the profile format
        defines it so), and a process on this side that runs a Windows
        ``python.exe`` can only be inside WSL: that interpreter needs
        ``\\\\wsl.localhost\\...`` paths (``wslpath -w``; ``orchestrator.ort.hostproc``).
        Every other route shares this file system.
        """
        if self.kind == HOST_PROCESS and is_windows_interpreter(self.python) and os.name != "nt":
            try:
                return windows_path(str(path))
            except PathTranslationError as exc:
                raise RouteError(
                    str(exc),
                    "run omni-edge inside WSL2 (where wslpath exists) to use a host-process route",
                ) from None
        return str(path)


def this_process() -> ResolvedRoute:
    """The route of this interpreter."""
    return ResolvedRoute(THIS_PROCESS, THIS_PROCESS, None)


class RouteError(VerificationError):
    """The route's worker could not be started or stopped answering."""

    def __init__(self, message: str, remedy: str = "") -> None:
        super().__init__(message)
        self.remedy = remedy


class RemoteError(VerificationError):
    """A call raised inside the route (the session failed to open, a run failed)."""

    def __init__(self, op: str, type_name: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{op} failed in the route: {type_name}: {message}")
        self.op = op
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback


class InProcessSessions:
    """Sessions in this interpreter (this-process routes)."""

    in_process = True

    def __init__(self, route: ResolvedRoute) -> None:
        require_one_ort_flavour()  # before onnxruntime is imported here: exit 2, naming both builds
        self.route = route
        self._sessions = route_worker.Sessions()
        self._lock = threading.Lock()

    def probe(self, timeout: float | None = None) -> dict[str, Any]:
        return self._call("probe", {"plugins": plugin_wire(), "engines": engine_wire()})

    def open(
        self, spec: dict[str, Any], *, record: bool = True, timeout: float | None = None
    ) -> OpenedSession:
        result: OpenedSession = self._call("open", {"spec": with_plugins(spec), "record": record})
        return result

    def run(
        self,
        handle: int,
        feeds: Feeds,
        *,
        timeout: float | None = None,
    ) -> RunReply:
        return self._call("run", {"handle": handle, "feeds": feeds})

    def close(self, handle: int) -> None:
        self._call("close", {"handle": handle})

    def unit(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to hold in this process (``WorkerSessions.unit``)."""
        return contextlib.nullcontext()

    def shutdown(self) -> None:
        self._sessions = route_worker.Sessions()

    def path(self, p: str | Path) -> str:
        return str(p)

    def _call(self, op: str, args: dict[str, Any]) -> Any:
        with self._lock:
            try:
                return self._sessions.dispatch(op, args)
            except Exception as exc:
                raise RemoteError(op, type(exc).__name__, str(exc)) from exc


class _Renewal:
    """How a ``WorkerSessions`` replaces its worker: recycled at its memory limit between calls
    (``_maybe_recycle``), replaced when it died (``_replace``, with a restart policy), both by
    a fresh worker that opens the same sessions the same way (``_reopen``). A base of its own,
    so each of the two classes stays one subject; its attributes are ``WorkerSessions``'s."""

    route: ResolvedRoute
    recycle_limit: int | None
    recycles: int
    fresh_bytes: int
    revival: Revival
    _proc: subprocess.Popen[bytes]
    _lock: threading.Lock
    _opened: dict[int, tuple[JsonObject, OpenedSession]]
    _handles: dict[int, int]
    _broken: RouteError | None
    _units: int
    _calls_since_start: int
    _largest_rise: int

    def _start(self) -> None:
        raise NotImplementedError

    def _call_locked(self, op: str, args: JsonObject, timeout: float) -> Any:
        raise NotImplementedError

    def stderr_tail(self, lines: int = 6) -> str:
        raise NotImplementedError

    # -- a worker that died ------------------------------------------------------
    def _exited(self, proc: subprocess.Popen[bytes]) -> None:
        """``proc`` exited (its watch): when it is the current worker and no one stopped it (a
        recycle or a replacement stops the old one while holding the lock), it died; with a
        policy it is replaced now, not at the next call."""
        with self._lock:
            if proc is not self._proc or self._broken is not None or self.revival.policy is None:
                return
            try:
                self._replace(f"it exited with code {proc.returncode} while idle")
            except RouteError as exc:
                log.error("route %s: %s", self.route.name, exc)

    def _revive_locked(self, op: str) -> None:
        """Before ``op``: a worker that is dead is replaced first (with a policy; without one,
        the call says it exited, as before)."""
        if (
            self._proc.poll() is not None
            and self._broken is None
            and self.revival.policy is not None
        ):
            self._replace(f"it had exited with code {self._proc.returncode} before {op!r}")

    def _replace(self, why: str) -> None:
        """Replace the dead worker (the lock held): after the policy's back-off, a fresh worker
        opens every session again, the same way (``_reopen``); a worker that dies again is
        another death. Raises ``CrashLoop`` past the policy's limit (then on every later call),
        ``RecycleFailed`` when the sessions come back differently, ``RouteError`` when shut
        down meanwhile."""
        old_pid = self._proc.pid
        while True:
            wait = self.revival.died(why)
            if wait is None:
                if self.revival.crash_loop is not None:
                    self._broken = CrashLoop(
                        f"route {self.route.name!r}: {self.revival.crash_loop}",
                        _remedy_for(self.stderr_tail(), self.route),
                    )
                    raise self._broken
                raise RouteError(f"route {self.route.name!r}: its worker is gone ({why})")
            self.revival.restarting = True
            try:
                if not self.revival.wait(wait):
                    raise RouteError(f"route {self.route.name!r}: shut down while replacing it")
                _stop(self._proc, 1.0)
                self._reopen(old_pid, why)
            except WorkerDied as exc:  # the fresh one died too: another death
                why = f"its replacement died: {exc}"
                continue
            finally:
                self.revival.restarting = False
            self.revival.restarts += 1
            log.warning(
                "route %s: its worker (pid %d) died (%s); replaced by pid %d, %d session(s) "
                "reopened; restart %d",
                self.route.name,
                old_pid,
                why,
                self._proc.pid,
                len(self._opened),
                self.revival.restarts,
            )
            return

    # -- recycling -------------------------------------------------------------
    def _maybe_recycle(self) -> None:
        self.recycle_if_due(1, "before a call")

    def due(self, ahead: int) -> bool:
        """Whether the worker's RSS plus ``ahead`` times the largest rise of one call passes its
        limit (1: the next call must not run in it; more: near it, ``idle_recycle``)."""
        limit = self.recycle_limit
        if (
            limit is None
            or self._units
            or self._broken is not None
            or not self._calls_since_start
            or self._proc.poll() is not None
        ):
            return False
        return rss_of(self._proc.pid) + ahead * self._largest_rise > limit

    def recycle_if_due(self, ahead: int, when: str) -> None:
        """Replace the worker (the lock held) when :meth:`due`; ``when`` is said in the log."""
        if not self.due(ahead):
            return
        limit = self.recycle_limit
        assert limit is not None
        rss = rss_of(self._proc.pid)
        old_pid = self._proc.pid
        _stop(self._proc, 5.0)
        try:
            self._reopen(old_pid, f"it held {_mib(rss)} MiB, over its limit of {_mib(limit)} MiB")
        except (RouteError, RemoteError) as exc:
            _stop(self._proc, 5.0)
            self._broken = RecycleFailed(
                f"route {self.route.name!r}: worker pid {old_pid} held {_mib(rss)} MiB, over its limit of "
                f"{_mib(limit)} MiB; a fresh worker did not reopen its sessions: {exc}",
                getattr(exc, "remedy", "") or _remedy_for(self.stderr_tail(), self.route),
            )
            raise self._broken from exc
        self.recycles += 1
        log.warning(
            "route %s: recycled the worker %s (pid %d -> %d): it held %d MiB, and %d x %d MiB (the "
            "largest rise of one call) more would pass its limit of %d MiB; recycle %d",
            self.route.name,
            when,
            old_pid,
            self._proc.pid,
            _mib(rss),
            ahead,
            _mib(self._largest_rise),
            _mib(limit),
            self.recycles,
        )
        fresh = self.fresh_bytes = rss_of(self._proc.pid)
        if fresh + self._largest_rise > limit:
            log.warning(
                "route %s: a fresh worker holds %d MiB, already near its limit of %d MiB: it will be "
                "recycled before every call; raise the stage's budget",
                self.route.name,
                _mib(fresh),
                _mib(limit),
            )

    def _reopen(self, old_pid: int, why: str) -> None:
        """A fresh worker in place of ``old_pid`` (stopped or dead: ``why``), every session
        opened again with the same arguments; the providers, node assignment and plugin must
        come back the same (a ``RecycleFailed`` otherwise: the evidence would not hold)."""
        self._start()
        handles = {}
        for handle, (args, first) in self._opened.items():
            again = self._call_locked("open", args, settings.OPEN_TIMEOUT_S)
            changed = [
                k for k in ("providers", "assignment", "plugin") if again.get(k) != first.get(k)
            ]
            if changed:
                self._broken = RecycleFailed(
                    f"route {self.route.name!r}: a fresh worker in place of pid {old_pid} ({why}) "
                    f"reopened its sessions differently: their {', '.join(changed)} differ from "
                    "the first open's",
                    _remedy_for(self.stderr_tail(), self.route),
                )
                raise self._broken
            handles[handle] = again["handle"]
        self._handles = handles


class WorkerSessions(_Renewal):
    """Sessions in a worker subprocess started with the route's interpreter.

    The worker runs isolated (``python -I``, no ``PYTHONPATH``): the route's own
    site-packages must win. A this-process route given an interpreter (the
    route probe asks this interpreter in a subprocess, so a crashing
    onnxruntime build cannot take the caller down) keeps this process's
    environment instead, so it sees what an in-process session would — but with
    ``-P``: the working directory is never on its ``sys.path`` (a ``numpy.py`` in
    the folder omni-edge runs in must not replace numpy). Every worker starts in
    a private empty directory (:func:`private_cwd`), so nothing it or a library it
    loads looks up by a relative name (a DLL, a config file) is taken from the
    user's working directory.
    """

    in_process = False

    def __init__(self, route: ResolvedRoute) -> None:
        assert route.python is not None
        self.route = route
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.recycle_limit: int | None = None
        """RSS (bytes) above which the worker is replaced between calls; None: never (see :meth:`run`)."""
        self.recycles = 0
        """How many times the worker was replaced."""
        self._opened: dict[int, tuple[JsonObject, OpenedSession]] = {}
        """Handle given to the caller -> (the open call's arguments, its result): what a recycle reopens."""
        self._handles: dict[int, int] = {}
        """Handle given to the caller -> the current worker's handle (they differ after a recycle)."""
        self._calls_since_start = 0
        self._largest_rise = 0
        self.calls = 0
        """Calls run since the first start (over every worker)."""
        self.retained_bytes = 0
        """What the calls left behind: the sum of (RSS after - RSS before) over ``calls``."""
        self.fresh_bytes = 0
        """The RSS of the latest fresh worker once it had reopened its sessions (0: not recycled yet)."""
        self._broken: RouteError | None = None
        self._units = 0
        """Units (:meth:`unit`) open now, over every thread: no recycle while one is."""
        self._unit_peak_known = False
        self.in_call: str | None = None
        """The call whose reply is awaited now (``run``, ``open``...), None between calls."""
        self.idle_recycle = IdleRecycle(self)
        """Recycles a worker near its limit while no call comes (``idle_recycle``)."""
        self.revival = Revival()
        """Its worker's deaths and replacements (``revival.Revival``): with a ``policy`` (a stage's
        runner sets its ``restart``), a worker that died is replaced and its sessions reopened."""
        self._start()

    def _start(self) -> None:
        """Start a worker with the route's interpreter and send it its program."""
        route = self.route
        assert route.python is not None
        self._replies: queue.Queue[Any] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._calls_since_start = 0
        source = route_program()
        try:
            isolated = route.kind != THIS_PROCESS
            flags = ["-I"] if isolated else wire.safe_path_flags()
            self._proc = subprocess.Popen(
                [route.python, *flags, "-c", wire.BOOTSTRAP],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_worker_env() if isolated else None,
                cwd=private_cwd(),
            )
        except OSError as exc:
            raise RouteError(
                f"cannot start {route.python}: {exc}",
                launch_remedy(route.kind, route.python),
            ) from None
        assert (
            self._proc.stdin is not None
            and self._proc.stdout is not None
            and self._proc.stderr is not None
        )
        # each worker has its own reader threads and queue: an old worker's end of
        # output never reaches the replies of the one that replaced it
        threading.Thread(
            target=self._read_replies,
            args=(self._proc, self._replies),
            daemon=True,
            name=f"route-{route.name}-out",
        ).start()
        self._stderr_reader = threading.Thread(
            target=self._read_stderr,
            args=(self._proc, self._stderr),
            daemon=True,
            name=f"route-{route.name}-err",
        )
        self._stderr_reader.start()
        self.revival.watch(self._proc, self._exited, route.name)
        try:
            self._proc.stdin.write(f"{len(source)}\n".encode() + source)
            self._proc.stdin.flush()
        except OSError:
            self._fail("before it read its program")

    # -- calls ---------------------------------------------------------------
    def probe(self, timeout: float | None = None) -> dict[str, Any]:
        with self._lock:
            self._revive_locked("probe")
            return self._call_locked(
                "probe",
                {"plugins": plugin_wire(), "engines": engine_wire()},
                timeout or settings.PROBE_TIMEOUT_S,
            )

    def open(
        self, spec: dict[str, Any], *, record: bool = True, timeout: float | None = None
    ) -> OpenedSession:
        """Open a session; local paths in the spec are spelled the way the route reads them.
        A malformed spec is refused here, by the key, before the worker is asked."""
        route_worker.check_spec(spec)
        options = [
            {
                k: (self.path(v) if k in PATH_OPTIONS and os.path.isabs(v) else v)
                for k, v in o.items()
            }
            for o in spec["provider_options"]
        ]
        spec = {
            **with_plugins(spec),
            "graph": self.path(spec["graph"]),
            "provider_options": options,
        }
        args: dict[str, Any] = {"spec": spec, "record": record}
        with self._lock:
            self._revive_locked("open")
            result: OpenedSession = self._call_locked(
                "open", args, timeout or settings.OPEN_TIMEOUT_S
            )
            handle = result["handle"]
            self._opened[handle], self._handles[handle] = (args, result), handle
        return result

    def run(
        self,
        handle: int,
        feeds: Feeds,
        *,
        timeout: float | None = None,
    ) -> RunReply:
        """Run a session; between calls, first replace the worker when it holds more than ``recycle_limit``.

        OpenVINO's CPU plugin keeps memory for every new shape, so a worker whose
        outputs vary in length grows without bound (docs/calibration.md). Before
        a call, when the worker has run a call and its RSS plus the largest rise
        one call has caused so far (its peak during the call, not only what it
        left behind: :attr:`largest_rise`) passes ``recycle_limit``, the worker is
        stopped, a fresh one opens the same sessions (the same arguments; the
        providers, node assignment and plugin must come back the same) and this
        call runs there. Calls are serialised, so no call in flight is cut; the
        old worker is stopped before the new one starts, so the two never hold
        memory at once. A reopen that fails raises :class:`RecycleFailed`, now
        and on every later call. A worker left near the limit is recycled while idle
        instead, when no call comes soon (``idle_recycle``).

        With a restart policy (``revival``), a worker that died is replaced first, and a call
        its worker died during is run again once on the fresh one: a call's outputs reach the
        caller whole with its reply or not at all, so nothing of the first try was delivered
        (at most once to the caller). A second death is the caller's error (``WorkerDied``).
        """
        with self._lock:
            self._revive_locked("run")
            self._maybe_recycle()
            measuring = self.recycle_limit is not None and not self._units  # a unit measures itself
            pid = self._proc.pid
            before = rss_of(pid) if measuring else 0
            peak_known = measuring and reset_peak_rss(pid)
            wait = timeout or settings.RUN_TIMEOUT_S
            try:
                result = self._run_locked(handle, feeds, wait)
            except WorkerDied as exc:
                if self.revival.policy is None:
                    raise
                self._replace(f"it died during 'run': {exc}")
                result = self._run_locked(handle, feeds, wait)  # once: none of it was delivered
                measuring = False  # another worker: its rise is not this call's
            self._calls_since_start += 1
            self.calls += 1
            if measuring:
                after = rss_of(pid)
                peak = max(after, (peak_rss_of(pid) or 0) if peak_known else 0)
                self._largest_rise = max(self._largest_rise, peak - before)
                self.retained_bytes += after - before
            self.idle_recycle.after_call()
            return result

    def _run_locked(self, handle: int, feeds: Feeds, timeout: float) -> RunReply:
        return self._call_locked(
            "run", {"handle": self._handles.get(handle, handle), "feeds": feeds}, timeout
        )

    @contextlib.contextmanager
    def unit(self) -> Iterator[None]:
        """Calls that must run in one worker: recycled (when over ``recycle_limit``) before the unit,
        never between its calls, and the unit's rise (its peak less the RSS before it) counted as
        one call's, so the next unit is judged by what a whole unit takes.

        For a loop that carries state from call to call (a decoder's cache, fed back as an input):
        a recycle in the middle would be correct but would reopen the sessions mid-request, and
        the loop's new shapes would be judged one call at a time. While units of several threads
        overlap, none is recycled and each rise runs from the first one's start (an overestimate:
        the worker is recycled earlier, never later).
        """
        with self._lock:
            self._revive_locked("unit")
            self._maybe_recycle()
            measuring = self.recycle_limit is not None
            pid = self._proc.pid
            before = rss_of(pid) if measuring else 0
            if measuring and not self._units:
                self._unit_peak_known = reset_peak_rss(pid)
            self._units += 1
        try:
            yield
        finally:
            with self._lock:
                self._units -= 1
                if measuring and self._proc.pid == pid and self._proc.poll() is None:
                    after = rss_of(pid)
                    peak = max(after, (peak_rss_of(pid) or 0) if self._unit_peak_known else 0)
                    self._largest_rise = max(self._largest_rise, peak - before)
                    self.retained_bytes += after - before

    @property
    def largest_rise(self) -> int:
        """The largest rise one call has caused: its peak RSS during the call (Linux's ``VmHWM``,
        reset before the call; the RSS after it elsewhere) less the RSS before it."""
        return self._largest_rise

    def expect_rise(self, nbytes: int) -> None:
        """Start from a rise measured before (a calibrated plan's), so the first calls of a run
        are judged by it too, not only by the rises this worker has seen."""
        self._largest_rise = max(self._largest_rise, int(nbytes))

    def close(self, handle: int) -> None:
        with contextlib.suppress(RouteError), self._lock:
            self._opened.pop(handle, None)
            self._call_locked(
                "close", {"handle": self._handles.pop(handle, handle)}, settings.RUN_TIMEOUT_S
            )

    def path(self, p: str | Path) -> str:
        return self.route.path_for_route(p)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not within ``timeout`` (never replaced)."""
        self.revival.stopping.set()
        self.idle_recycle.cancel()
        _stop(self._proc, timeout)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _call(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        with self._lock:
            return self._call_locked(op, args, timeout)

    def _call_locked(self, op: str, args: JsonObject, timeout: float) -> Any:
        if self._broken is not None:
            raise self._broken
        if self._proc.poll() is not None:
            self._fail(f"before {op!r}")
        message_id = next(self._ids)
        self.in_call = op
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(wire.encode({"id": message_id, "op": op, "args": args}))
            self._proc.stdin.flush()
        except OSError:
            self._fail(f"while receiving {op!r}")
        try:
            reply = self._replies.get(timeout=timeout)
        except queue.Empty:
            self._proc.kill()
            self._fail(
                f"{op!r} did not answer within {timeout:g} s; the worker was killed", exited=False
            )
        finally:
            self.in_call = None
        if reply is _EOF or isinstance(reply, BaseException):
            detail = f" ({reply})" if isinstance(reply, BaseException) else ""
            self._fail(f"during {op!r}{detail}")
        if reply.get("id") != message_id:  # pragma: no cover - one request in flight
            self._fail(f"protocol error: reply {reply.get('id')} to request {message_id}")
        if not reply.get("ok"):
            err = reply.get("error", {})
            raise RemoteError(
                op, err.get("type", "Error"), err.get("message", ""), err.get("traceback", "")
            )
        return reply.get("result")

    def _fail(self, what: str, *, exited: bool = True) -> Any:
        """Raise ``RouteError`` with the exit code and the worker's last stderr lines."""
        if exited:
            try:
                code = self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                code = self._proc.wait()
            what = f"the worker exited with code {code} {what}"
        self._stderr_reader.join(2)  # let the reader drain what the worker said last
        tail = self.stderr_tail()
        message = f"route {self.route.name!r} ({self.route.python}): {what}"
        if tail:
            message += f"; its last output: {tail}"
        raise (WorkerDied if exited else RouteError)(message, _remedy_for(tail, self.route))

    def stderr_tail(self, lines: int = 6) -> str:
        return " | ".join(list(self._stderr)[-lines:])

    def _read_replies(self, proc: subprocess.Popen[bytes], replies: queue.Queue[Any]) -> None:
        assert proc.stdout is not None
        try:
            while True:
                message = wire.read_message(proc.stdout)
                if message is None:
                    break
                replies.put(message)
        except Exception as exc:  # a torn frame when the worker dies mid-reply
            replies.put(exc)
            return
        replies.put(_EOF)

    def _read_stderr(self, proc: subprocess.Popen[bytes], lines: collections.deque[str]) -> None:
        assert proc.stderr is not None
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                lines.append(line)
                log.debug("route %s: %s", self.route.name, line)


class WorkerDied(RouteError):
    """The route's worker process exited under a call (killed, crashed): with a restart policy
    it is replaced (``WorkerSessions._replace``)."""


class CrashLoop(RouteError):
    """The route's worker died more often within its window than its restart policy allows:
    it is not replaced again, and every later call says so."""


class RecycleFailed(RouteError):
    """A worker over its ``recycle_limit`` was replaced, and the fresh one did not
    reopen the same sessions the same way: the route can no longer run them."""


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Ask a worker to exit; kill it if it does not within ``timeout``."""
    if proc.poll() is None:
        with contextlib.suppress(OSError, ValueError):
            assert proc.stdin is not None
            proc.stdin.write(wire.encode({"id": 0, "op": "exit"}))
            proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _mib(n: int) -> int:
    return round(n / 2**20)


def with_plugins(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with what the worker needs of its target EP's row (it holds no table): the
    plugin packages, which it registers and takes the EP from when the route's build lacks
    it, and the coverage report the EP writes, which it reads after the session opened."""
    if "plugins" in spec or not spec.get("providers"):
        return spec
    row = row_for_ep(spec["providers"][0])
    report = row.coverage_report if row is not None else None
    return {
        **spec,
        "plugins": plugin_wire(spec["providers"][0]),
        **({"report": report.wire()} if report is not None else {}),
    }


def _remedy_for(stderr_tail: str, route: ResolvedRoute) -> str:
    if "No module named 'numpy'" in stderr_tail:
        return f"{route.python} -m pip install numpy (the route worker needs numpy and onnxruntime)"
    return f"run {route.python} -c 'import numpy, onnxruntime' to see what is missing, and install it there"


ROUTE_PROGRAM = (wire, worker_probe, route_worker)
"""The modules the route program is made of, in order: each imports normally here, and a
route's interpreter (which has no omni-edge) runs their sources concatenated, the later
ones finding the earlier ones' names already defined (``worker.py``'s docstring)."""


def route_program() -> bytes:
    """The route program's source: one ``from __future__`` import, then each module of
    :data:`ROUTE_PROGRAM` in order, its own ``__future__`` line left out (a future import
    must be the program's first statement)."""
    parts = [b"from __future__ import annotations\n"]
    for module in ROUTE_PROGRAM:
        source = Path(str(module.__file__)).read_bytes()
        parts.append(source.replace(b"from __future__ import annotations\n", b"", 1))
    return b"\n".join(parts)


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # The route's own site-packages must win; a PYTHONPATH meant for this interpreter
    # could shadow its onnxruntime with ours.
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    return env


Sessions = InProcessSessions | WorkerSessions
"""Either kind: what the gates and the runner hold."""


def open_sessions(route: ResolvedRoute) -> Sessions:
    """The sessions of ``route``: in this interpreter, or in a worker started with its interpreter.

    Starting returns at once; the first call (``probe``) says whether the
    route really answers, within its own timeout.
    """
    if route.in_process:
        return InProcessSessions(route)
    return WorkerSessions(route)


__all__ = [
    "CrashLoop",
    "InProcessSessions",
    "RecycleFailed",
    "RemoteError",
    "ResolvedRoute",
    "RestartPolicy",
    "RouteError",
    "Sessions",
    "WorkerDied",
    "WorkerSessions",
    "open_sessions",
    "this_process",
]
