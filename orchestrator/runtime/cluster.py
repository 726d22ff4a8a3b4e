"""Ray, started or joined: loopback only, dashboard off, bounded object store.

* **Local by default, on loopback.** ``connect(devices)`` starts a one-node
  cluster with the dashboard off, a bounded object store, usage stats off
  (nothing leaves the machine) and logging at WARNING. On Linux, Ray binds its
  GCS, raylet and workers to the machine's reachable IP and rewrites
  ``localhost``/``127.0.0.1`` to it (``--node-ip-address=127.0.0.1`` is
  ignored: ray-project/ray#26293). Ray's own single-machine mode — the one it
  uses on macOS and Windows — keeps every service on 127.0.0.1; it is selected
  with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which this module sets for a
  cluster it starts (checked with ``ss -ltn``: every Ray socket listens on
  127.0.0.1). Loopback keeps other machines out, not other users or
  processes of this one: the cluster gets token authentication with a fresh
  token in a file only its owner can read (``RAY_AUTH_MODE=token``,
  ``RAY_AUTH_TOKEN_PATH``; unless the user set ``RAY_AUTH_MODE`` themselves),
  so a process without it cannot join. A cluster that did not come up on
  loopback is an error, never used.
* **Its files in a private directory.** Ray makes its temp directory and every
  directory in it (``session_*``, ``sockets/``, ``logs/``) world-writable (0777,
  no sticky bit: ``try_make_directory_shared``), and by default that is
  ``/tmp/ray``, shared by every user and left behind after each run. A cluster
  started here gets ``_temp_dir`` inside a directory of its own, created 0700
  (:func:`_private_temp_dir`; short, since Ray's Unix socket paths live under
  it), so no other user can reach its sockets or logs; it is removed when the
  cluster shuts down. A joined cluster's directories are its own business.
* **Nothing of the working directory reaches a worker.** Ray ships the driver's
  working directory to its workers and puts it first on their ``sys.path`` unless
  the job names a ``working_dir`` (``ray._private.worker.connect``): every
  connection made here names an empty private one (started or joined alike), so a
  ``numpy.py`` or ``onnxruntime.py`` in the folder omni-edge runs in is never
  imported by an actor, and each worker starts in that empty directory's copy.
  Code a worker imports comes from installed packages only (a test suite that
  pickles its own classes into actors puts its root on ``PYTHONPATH``).
* **Or an existing cluster** with ``address=``: nothing above is changed (a
  multi-node cluster needs its real addresses and its own auth settings). An
  address where nothing accepts a TCP connection is a ``ConfigError`` naming
  ``--address`` within seconds (:func:`check_address`), never a wait in Ray. Its
  nodes must declare the same resources (``ray start --resources
  '{"omni_edge_device_cpu": 1}'``); a device no node offers is reported by
  name before any actor is created. A cluster started with ``ray start`` uses
  token authentication: the driver needs ``RAY_AUTH_MODE=token`` and the
  cluster's token (Ray's own rules).
* The node declares one custom resource per device of the profile
  (:func:`device_resource`), which is how device actors are placed: Ray's own
  ``GPU``/``NPU`` resources are not used (``NPU`` means Ascend to Ray).
* **Shared within a process.** Ray allows one connection per process; several
  pipelines in one process share it. The cluster is shut down when the last
  user that started it closes; a connection made by someone else (a test
  fixture, an application) is left alone.
* **Ray's own memory** (:func:`ray_memory`) is the summed PSS of the cluster's
  processes on this machine (GCS, raylet, agents, idle workers, this
  project's actors before any stage loads) plus the driver's growth from
  connecting; it is charged to ``host_ram`` as evidence M.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

from orchestrator.core.errors import ConfigError
from orchestrator.core.memory import RayMemory, descendants, tree_memory

log = logging.getLogger(__name__)

RESOURCE_PREFIX = "omni_edge_device_"
NODE_RESOURCE_PREFIX = "omni_edge_node_"
"""``omni_edge_node_<name>``: the node of a cluster profile named ``<name>`` (docs/cluster.md)."""
NODE_RESOURCE_UNITS = 1.0
"""Each node that hosts a device declares 1 unit of its resource…"""
ACTOR_RESOURCE_UNITS = 0.001
"""…and each device actor asks for a thousandth, so several pipelines in one
process (tests, an application with two assistants) can each have their own
actor on the same device; the resource says *where*, not *how many*."""
OBJECT_STORE_BYTES = 256 * 2**20
"""Bounded object store: audio chunks (≈100–500 KB each) and text deltas are
all that crosses between actors; 256 MiB holds hundreds of in-flight chunks.
Ray's minimum is 75 MiB."""
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "1",
    "RAY_enable_metrics_collection": "0",
}
"""Set before ``ray.init`` so the GCS, raylet and workers inherit them."""
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}
"""For a cluster started here: Ray's single-machine mode (every service on 127.0.0.1)."""
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""Ray's token authentication settings. Loopback is no boundary between users of
one machine: a cluster started here gets a fresh token (:func:`_fresh_token`)
unless the user set ``RAY_AUTH_MODE`` themselves."""
INIT_TIMEOUT_S = 120.0
ADDRESS_CHECK_TIMEOUT_S = 5.0
"""How long ``--address``'s GCS port has to accept a TCP connection before Ray is asked to
join it: a listening GCS accepts in milliseconds on a LAN (a refused port answers at once);
5 s covers a slow link's SYN retransmit (the first one is sent after 1 s) without making a
typo wait. Ray's own connect, given an address where nothing listens, waits for minutes."""
UNIX_SOCKET_PATH_MAX = 107
"""Bytes of a Unix socket path: ``sun_path`` is 108 bytes on Linux, one for the NUL."""
RAY_SOCKET_SUFFIX = len("/r/session_2026-12-01_15-20-00_123456_4194304/sockets/plasma_store")
"""What Ray appends to the private directory for its longest socket: ``/r`` (the
``_temp_dir`` inside it), the session directory (``session_`` + date to the
microsecond + the driver's pid, up to 7 digits) and ``sockets/plasma_store``."""
PRIVATE_TEMP_PREFIX = "oe-ray-"
PRIVATE_WORKDIR_PREFIX = "omni-edge-workers-"
"""The empty directory given to Ray as the job's ``working_dir`` (:func:`_ray_init`)."""


def device_resource(device_id: str) -> str:
    """``cpu`` → ``omni_edge_device_cpu``; ``igpu:0`` → ``omni_edge_device_igpu_0``;
    on one node of a cluster, ``laptop/npu:0`` → ``omni_edge_device_laptop_npu_0``."""
    return RESOURCE_PREFIX + re.sub(r"[^a-z0-9]+", "_", device_id.lower())


def node_resource(node: str) -> str:
    """``laptop`` → ``omni_edge_node_laptop``: what marks the node named ``laptop``."""
    return NODE_RESOURCE_PREFIX + re.sub(r"[^a-z0-9]+", "_", node.lower())


def node_start_resources(node: str, devices: Iterable[str]) -> dict[str, float]:
    """The ``ray start --resources`` of the node ``node`` that hosts ``devices`` (its own
    ids: ``cpu``, ``npu:0``): its node resource and one per device, qualified by node."""
    out = {node_resource(node): NODE_RESOURCE_UNITS}
    out.update({device_resource(f"{node}/{d}"): NODE_RESOURCE_UNITS for d in devices})
    return out


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and ::ffff:127.x; a name or a malformed address is not."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host == "localhost"
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def auth_problem(addresses: Iterable[str], env: dict[str, str] | None = None) -> str | None:
    """Why joining a cluster whose nodes are at ``addresses`` is refused, or None.

    A cluster any of whose nodes is not on loopback is reachable from other hosts
    (on Linux, Ray's GCS listens on every interface and a node's raylet on its IP
    even when the head was started with ``--node-ip-address=127.0.0.1``): it must
    use Ray's token authentication, which this process learns from its
    environment — ``RAY_AUTH_MODE=token`` and the cluster's token in
    ``RAY_AUTH_TOKEN`` or the file ``RAY_AUTH_TOKEN_PATH`` (Ray's default:
    ``~/.ray/auth_token``)."""
    env = dict(os.environ) if env is None else env
    exposed = sorted({a for a in addresses if a and not is_loopback(a)})
    if not exposed or env.get("RAY_AUTH_MODE", "").lower() == "token":
        return None
    return (
        f"the Ray cluster is reachable from other hosts (nodes at {', '.join(exposed)}) and this process "
        f"does not use Ray's token authentication (RAY_AUTH_MODE={env.get('RAY_AUTH_MODE') or 'unset'}); "
        "start every node and this process with RAY_AUTH_MODE=token and the cluster's token "
        "(RAY_AUTH_TOKEN_PATH=FILE with the token, readable by you only, or RAY_AUTH_TOKEN), "
        "as docs/cluster.md shows"
    )


@dataclass
class Cluster:
    """One process's connection to Ray, and what this project knows about it."""

    address: str
    owned: bool
    """True when this process started the cluster (its daemons are our children)."""
    started_s: float
    driver_growth_bytes: int
    connected_here: bool = True
    """True when this module called ``ray.init`` (and will disconnect at the end)."""
    resources: dict[str, float] = field(default_factory=dict)
    auth_saved: dict[str, str | None] | None = None
    """The auth settings before this process gave its cluster a fresh token (put
    back when it shuts down); None when it did not."""
    node_pids: list[int] = field(default_factory=list)
    """Processes ``ray.init`` started here (GCS, raylet, agents); Ray's workers
    are their descendants. Empty for a joined cluster."""
    listening: list[str] = field(default_factory=list)
    """For a joined cluster: the addresses its GCS and nodes listen on (said at join)."""
    temp_dir: str | None = None
    """For a cluster started here: the private (0700) directory that holds Ray's
    temp directory, removed when the cluster shuts down. None for a joined one."""

    def missing(self, devices: Iterable[str]) -> list[str]:
        """Devices whose resource no node of the cluster offers."""
        import ray

        offered = ray.cluster_resources()
        return [d for d in devices if offered.get(device_resource(d), 0) <= 0]


_lock = threading.Lock()
_cluster: Cluster | None = None
_users = 0


def connect(
    devices: Iterable[str], *, address: str | None = None, log_to_driver: bool = False
) -> Cluster:
    """Start (or join) Ray for this process; count one more user of it.

    ``devices`` are declared as custom resources when a local cluster is
    started here. Raises ``RuntimeError`` (with the address) when Ray cannot
    be started or reached.

    Ray allows one connection per process, so the connection is module state
    (``_cluster``, counted by ``_users`` under ``_lock``): the first caller
    makes it (:func:`_connect`), later ones share it, and :func:`release`
    ends it when the last user goes.

    An ``address`` where nothing accepts a connection is a ``ConfigError`` naming
    ``--address`` within :data:`ADDRESS_CHECK_TIMEOUT_S` (:func:`check_address`), before
    Ray is asked (whose connect would wait for minutes).
    """
    global _cluster, _users
    with _lock:
        if _cluster is None:
            if address:
                check_address(address)
            _cluster = _connect(devices, address, log_to_driver)
            _users = 0
        _users += 1
        return _cluster


def split_address(address: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (or ``ray://HOST:PORT``, ``[::1]:PORT``) → (host, port); None for
    ``auto`` (Ray finds the cluster itself); ``ConfigError`` naming ``--address`` otherwise."""
    if address == "auto":
        return None
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError.single(
            "--address",
            f"{address!r} is not HOST:PORT",
            "give the head's address and GCS port, e.g. 192.168.1.10:6379 "
            "(`ray status` on the head prints it; docs/cluster.md)",
        )
    return host, int(port)


def check_address(address: str, timeout_s: float = ADDRESS_CHECK_TIMEOUT_S) -> None:
    """``ConfigError`` naming ``--address`` unless something at ``address`` accepts a TCP
    connection within ``timeout_s`` (:data:`ADDRESS_CHECK_TIMEOUT_S`): checked before
    ``ray.init``, which waits for minutes where nothing listens."""
    parsed = split_address(address)
    if parsed is None:
        return
    host, port = parsed
    t0 = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except TimeoutError:
        what = f"no answer within {timeout_s:.0f} s"
    except OSError as exc:
        what = exc.strerror or type(exc).__name__
    raise ConfigError.single(
        "--address",
        f"nothing accepts connections at {address}: {what} "
        f"(after {time.monotonic() - t0:.1f} s; no Ray cluster was joined)",
        f"start the cluster's head there (`ray start --head --port={port}`, docs/cluster.md), "
        "or give the address `ray status` prints on the head",
    )


def _connect(devices: Iterable[str], address: str | None, log_to_driver: bool) -> Cluster:
    """The connection :func:`connect` shares: adopted when someone else already
    connected this process, else made by ``ray.init`` and checked (a joined
    cluster's auth, a local one's loopback). Undoes what it set up when it fails."""
    auth_saved = _prepare_process_for_ray(address)
    import ray

    if ray.is_initialized():
        # Someone else (a test fixture, the application) connected this process.
        return Cluster(
            address=ray.get_runtime_context().gcs_address,
            owned=False,
            connected_here=False,
            started_s=0.0,
            driver_growth_bytes=0,
            resources=ray.cluster_resources(),
        )
    rss0 = psutil.Process().memory_info().rss
    before = set(descendants(os.getpid()))
    t0 = time.perf_counter()
    temp_dir = None if address else _private_temp_dir()
    try:
        _ray_init(devices, address, log_to_driver, temp_dir)
    except BaseException:
        if auth_saved is not None:
            _restore_auth(auth_saved)
        if temp_dir is not None:
            _remove_temp_dir(temp_dir)
        raise
    gcs = ray.get_runtime_context().gcs_address
    listening = _check_joined(gcs) if address else []
    if not address:
        _check_loopback(gcs, temp_dir)
    cluster = Cluster(
        auth_saved=auth_saved,
        address=address or gcs,
        owned=not address,
        started_s=time.perf_counter() - t0,
        driver_growth_bytes=max(0, psutil.Process().memory_info().rss - rss0),
        resources=ray.cluster_resources(),
        node_pids=[p for p in descendants(os.getpid()) if p not in before] if not address else [],
        listening=listening,
        temp_dir=temp_dir,
    )
    log.info(
        "ray %s at %s in %.1f s",
        "started" if cluster.owned else "joined",
        cluster.address,
        cluster.started_s,
    )
    return cluster


def _prepare_process_for_ray(address: str | None) -> dict[str, str | None] | None:
    """The process-wide state Ray reads instead of taking arguments, set before ``ray.init``.

    Ray forces these, which is why they live here and nowhere else:

    * **Environment variables** (:data:`RAY_ENV`; :data:`LOOPBACK_ENV` for a cluster
      started here): the GCS, the raylet and the workers read their settings from
      the environment they inherit, so there is no per-call way to pass them.
      ``setdefault``: what the user set wins.
    * **Token authentication** (:func:`_fresh_token`) for a cluster started here,
      unless the user set ``RAY_AUTH_MODE``: also environment only. Returns the
      settings it replaced (put back when the cluster shuts down or fails to
      start), or None when it changed nothing.
    * **The patch of ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``.** Ray reads
      ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when ``ray_constants`` is first
      imported; if anything imported ray before this module set the variable, the
      constant still says "cluster mode" and Ray binds to the machine's IP. The
      constant itself is read at call time (``services.get_node_ip_address``), so
      setting it to False is what puts a cluster started here on 127.0.0.1. A
      private attribute: a Ray upgrade that moves it fails the loopback check in
      :func:`_check_loopback`, never silently.

    Nothing is changed when joining an existing cluster (``address``) or when this
    process is already connected: that cluster's settings are its own.
    """
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    if not address:
        for key, value in LOOPBACK_ENV.items():
            os.environ.setdefault(key, value)
    import ray

    if address or ray.is_initialized():
        return None
    auth_saved = None if "RAY_AUTH_MODE" in os.environ else _fresh_token()
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
    return auth_saved


def _ray_init(
    devices: Iterable[str], address: str | None, log_to_driver: bool, temp_dir: str | None
) -> None:
    """``ray.init``: join ``address``, or start a local cluster (bounded object store,
    one resource per device, Ray's files under the private ``temp_dir``).

    ``ray.init`` replaces the driver's SIGTERM handler (with sys.exit, then a
    native one that dumps a stack): a Python handler the caller installed (the
    CLI's: close, write the record, exit 143) is put back afterwards."""
    import ray

    workers_dir = tempfile.mkdtemp(prefix=PRIVATE_WORKDIR_PREFIX)  # 0700, empty
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "log_to_driver": log_to_driver,
        "configure_logging": True,
        # Ray ships the driver's working directory to its workers and puts it first on their
        # sys.path unless the job names a working_dir: an empty private one, so a numpy.py or
        # onnxruntime.py in the folder omni-edge was started in is never imported by an actor,
        # and each worker starts in (a copy of) that empty directory.
        "runtime_env": {"working_dir": workers_dir},
    }
    on_main = threading.current_thread() is threading.main_thread()
    term_handler = signal.getsignal(signal.SIGTERM) if on_main else None
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            assert temp_dir is not None
            ray.init(
                address="local",
                object_store_memory=OBJECT_STORE_BYTES,
                resources={device_resource(d): NODE_RESOURCE_UNITS for d in sorted(set(devices))},
                _temp_dir=os.path.join(temp_dir, "r"),
                # Ray starts a worker per CPU for the first driver, in the job's environment: no
                # actor here runs in them (each has its own), and each idle one held ~40 MiB
                # (PSS) and took ~0.7 % of a core beside a decode (docs/benchmarks.md)
                _system_config={"prestart_worker_first_driver": False},
                **kwargs,
            )
    finally:
        # uploaded to the cluster as a package by ray.init; the workers unpack that copy
        shutil.rmtree(workers_dir, ignore_errors=True)
    if on_main and callable(term_handler):
        signal.signal(signal.SIGTERM, term_handler)


def _check_joined(gcs: str) -> list[str]:
    """The addresses a joined cluster listens on (logged); disconnects and raises
    ``RuntimeError`` when it is reachable from other hosts without token auth."""
    import ray

    listening = cluster_addresses(gcs)
    problem = auth_problem(a.rsplit(":", 1)[0] for a in listening)
    log.warning("joined the Ray cluster at %s; it listens on %s", gcs, ", ".join(listening))
    if problem:
        ray.shutdown()
        raise RuntimeError(problem)
    return listening


def _check_loopback(gcs: str, temp_dir: str | None) -> None:
    """A cluster started here that did not come up on loopback is stopped, its
    private directory removed, and ``RuntimeError`` raised: never used."""
    import ray

    if gcs.startswith(("127.", "[::1]", "[::ffff:127.")):
        return
    ray.shutdown()
    if temp_dir is not None:
        _remove_temp_dir(temp_dir)
    raise RuntimeError(
        f"the local Ray cluster came up on {gcs}, not on loopback; refusing to use it "
        "(set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before anything imports ray)"
    )


def cluster_addresses(gcs: str) -> list[str]:
    """Where a joined cluster listens: its GCS and each live node's raylet
    (``host:port``), as Ray reports them."""
    import ray

    out = [gcs]
    for n in ray.nodes():
        if n.get("Alive"):
            out.append(f"{n.get('NodeManagerAddress', '?')}:{n.get('NodeManagerPort', '?')}")
    return list(dict.fromkeys(out))


def node_names() -> dict[str, str]:
    """Ray node id → the name its ``omni_edge_node_<name>`` resource gives it, for the
    live nodes of the connected cluster (a node without one is left out)."""
    import ray

    out = {}
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        names = [
            k[len(NODE_RESOURCE_PREFIX) :]
            for k in n.get("Resources", {})
            if k.startswith(NODE_RESOURCE_PREFIX)
        ]
        if names:
            out[n["NodeID"]] = names[0]
    return out


def release() -> None:
    """One user fewer; the last one shuts down a cluster this process started."""
    global _cluster, _users
    with _lock:
        if _cluster is None:
            return
        _users -= 1
        if _users > 0:
            return
        cluster, _cluster = _cluster, None
        if cluster.connected_here:  # stops a cluster started here; disconnects from a joined one
            import ray

            ray.shutdown()
        if cluster.temp_dir is not None:
            _remove_temp_dir(cluster.temp_dir)
        if cluster.auth_saved is not None:
            _restore_auth(cluster.auth_saved)


_temp_dirs: list[str] = []


def _private_temp_dir() -> str:
    """A new directory only this user can enter (0700), for a cluster about to start
    here: Ray's ``_temp_dir`` goes inside it (Ray makes that one 0777 itself).

    Under the system's temp directory (``RAY_TMPDIR`` when set, as Ray's own
    default honours it), or under ``/tmp`` when that path is too long for Ray's
    Unix sockets (macOS's ``$TMPDIR`` is ~50 bytes): the directory plus
    :data:`RAY_SOCKET_SUFFIX` must fit :data:`UNIX_SOCKET_PATH_MAX`. Removed when
    the cluster shuts down, and when this process exits, whichever comes first.
    """
    base = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    longest = len(os.path.join(base, PRIVATE_TEMP_PREFIX + "x" * 8)) + RAY_SOCKET_SUFFIX
    if longest > UNIX_SOCKET_PATH_MAX and os.path.isdir("/tmp"):
        base = "/tmp"
    directory = tempfile.mkdtemp(prefix=PRIVATE_TEMP_PREFIX, dir=base)  # 0700
    if not _temp_dirs:
        # registered before ray.init registers its own shutdown, so it runs after it (LIFO)
        atexit.register(_remove_temp_dirs)
    _temp_dirs.append(directory)
    return directory


def _remove_temp_dir(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    if directory in _temp_dirs:
        _temp_dirs.remove(directory)


def _remove_temp_dirs() -> None:
    for d in list(_temp_dirs):
        _remove_temp_dir(d)


_token_dirs: list[str] = []


def _fresh_token() -> dict[str, str | None]:
    """Token authentication for a cluster about to start here: a new random token
    in a file only this user can read (0600 in a 0700 directory, removed when the
    process exits), named to Ray by ``RAY_AUTH_TOKEN_PATH`` — which the GCS, the
    raylet and every worker inherit — with ``RAY_AUTH_MODE=token``. Returns the
    settings it replaced."""
    saved = {k: os.environ.get(k) for k in AUTH_ENV}
    directory = tempfile.mkdtemp(prefix="omni-edge-ray-auth-")  # 0700
    path = os.path.join(directory, "token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    if not _token_dirs:
        atexit.register(_remove_token_dirs)
    _token_dirs.append(directory)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = path
    _reload_auth()
    return saved


def _remove_token_dirs() -> None:
    for d in _token_dirs:
        shutil.rmtree(d, ignore_errors=True)


def _restore_auth(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _reload_auth()


def _reload_auth() -> None:
    """Make this process's Ray read the auth settings again (it caches the mode and
    the token on first use); the config first, then the token cache, as Ray's own
    test helpers do."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):  # a Ray without token auth: nothing cached
        log.debug("this Ray has no token authentication to reload")


def ray_memory(cluster: Cluster, actor_pids: Iterable[int]) -> RayMemory:
    """Ray's own memory on this machine, measured now (evidence M).

    A cluster started here: the processes ``ray.init`` started (GCS, raylet,
    agents) and their descendants (workers, this project's actors) — measured
    before any stage loads, so no stage memory is in it; other children of
    this process (a stage run in-process with its own worker) are not Ray's —
    plus the driver's growth from ``ray.init``. A joined cluster: only this
    project's actors and the driver's growth (its daemons were there before us).
    """
    pids = set(actor_pids)
    if cluster.owned:
        for root in cluster.node_pids:
            pids.add(root)
            pids.update(descendants(root))
    total, kind = tree_memory(pids)
    return RayMemory(
        bytes=total + cluster.driver_growth_bytes,
        processes=len(pids),
        measure=f"sum of {kind.upper()} of {len(pids)} Ray processes + driver RSS growth from ray.init",
        cluster="local (started here)" if cluster.owned else f"joined {cluster.address}",
    )


class _OffMainThreadNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def quiet_ray_off_main_thread() -> None:
    """Ray warns when it starts off the main thread that it leaves SIGTERM alone;
    for ``Pipeline.open`` (``api.Opening``) that is the point (the caller's process keeps its own
    handlers), so the warning would only alarm."""
    worker_log = logging.getLogger("ray._private.worker")
    if not any(isinstance(f, _OffMainThreadNotice) for f in worker_log.filters):
        worker_log.addFilter(_OffMainThreadNotice())
