"""Which Ray cluster gem_core uses: the one already running, else one it starts (and alone shuts down).

Inside a trainer's Ray job (verl, OpenRLHF start their own cluster) ``ray.is_initialized()`` is true and
gem_core uses that connection. Otherwise :func:`connect` joins the cluster at ``address`` (or
``RAY_ADDRESS``, or the one ``ray start`` left on this machine); only when there is none does it start a
local one, and only that one is shut down, when the last gem_core user of it lets go (:func:`release`).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from gem_core.errors import GemError

INSTALL_HINT = "pip install 'gem-core[ray]'"
PROBE_TIMEOUT_S = 5.0  # how long an address may take to accept a TCP connection

# A Unix socket's path holds at most 107 bytes, and Ray puts its deepest socket at
# <temp>/ray/session_<date>_<time>_<pid>/sockets/plasma_store: under a long temp folder (nox points TMPDIR into
# .nox/<session>/tmp inside the checkout) a local cluster cannot start ("AF_UNIX path length cannot exceed 107
# bytes"). The tail's length is taken with the longest pid Linux gives (4194304).
UNIX_SOCKET_PATH_MAX = 107
RAY_SOCKET_TAIL = len("/ray/session_2026-11-26_19-51-55_123456_4194304/sockets/plasma_store")

_lock = threading.RLock()
_users = 0
_started_here = False
_temp_dir: str | None = None  # the short temp folder of the cluster started here, removed at its shutdown


class RayBackendError(GemError, RuntimeError):
    """Ray is missing, no cluster can be reached, or the cluster cannot place what was asked of it."""


def require_ray() -> Any:
    """The ``ray`` module, or one clear error naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise RayBackendError(f"the ray backend needs Ray, which is not installed here: {INSTALL_HINT}") from None
    return ray


def connect(address: str | None = None, namespace: str | None = None, runtime_env: dict[str, Any] | None = None) -> Any:
    """Make sure this process is connected to a Ray cluster, count one more gem_core user, return ``ray``.

    ``address``: ``"host:port"`` of a head node (what ``ray start --head`` printed), ``"auto"`` (the
    cluster ``ray start`` left on this machine) or ``None``: the running cluster if there is one
    (``RAY_ADDRESS``, or ``ray start``'s on this machine), else a new local one. ``namespace`` and
    ``runtime_env`` go to ``ray.init``. An address that does not answer within a few seconds raises
    :class:`RayBackendError` (never a hang).
    """
    global _users, _started_here, _temp_dir
    ray = require_ray()
    with _lock:
        if not ray.is_initialized():
            target = address or os.environ.get("RAY_ADDRESS") or None
            if target == "auto" or target is None:
                found = _running_cluster_here()
                if target == "auto" and found is None:
                    raise RayBackendError("address='auto': no running Ray cluster on this machine (start one with `ray start --head`)")
                target = found
            if target is not None and target != "local":
                _probe(target)
                ray.init(address=target, namespace=namespace, runtime_env=runtime_env)
            else:
                _temp_dir = local_temp_dir()
                ray.init(namespace=namespace, runtime_env=runtime_env, include_dashboard=False, **ray_temp_dir_arg(_temp_dir))
                _started_here = True
        _users += 1
    return ray


def release() -> None:
    """One gem_core user fewer; the last one shuts down the cluster if gem_core started it (never one it joined)."""
    global _users, _started_here
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _started_here:
            _started_here = False
            import ray

            if ray.is_initialized():
                ray.shutdown()
            _remove_temp_dir()


def local_temp_dir(environ: Mapping[str, str] = os.environ) -> str | None:
    """Where a local cluster started by this process keeps its files: ``None`` (Ray's own choice: ``RAY_TMPDIR``,
    else the system's temp folder) where Ray's sockets fit under it; else a new folder of its own under /tmp,
    short enough, which :func:`release` removes."""
    base = environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    if len(os.path.abspath(base)) + RAY_SOCKET_TAIL <= UNIX_SOCKET_PATH_MAX:
        return None
    return tempfile.mkdtemp(prefix="gem-ray-", dir="/tmp")


def ray_temp_dir_arg(temp_dir: str | None) -> dict[str, str]:
    """``ray.init``'s keyword for ``temp_dir`` (:func:`local_temp_dir`); none where Ray's own choice fits."""
    return {} if temp_dir is None else {"_temp_dir": temp_dir}


def _remove_temp_dir() -> None:
    global _temp_dir
    if _temp_dir is not None:
        shutil.rmtree(_temp_dir, ignore_errors=True)
        _temp_dir = None


def started_here() -> bool:
    """Whether the Ray connection of this process was started by gem_core (and will be shut down by it)."""
    return _started_here


def _running_cluster_here() -> str | None:
    """The address of the cluster ``ray start`` left on this machine, if it still answers."""
    try:
        from ray._private.services import find_bootstrap_address

        address = find_bootstrap_address(None)
    except Exception:  # a private helper: if it moved, behave as if nothing ran here
        return None
    if not address:
        return None
    try:
        _probe(address)
    except RayBackendError:
        return None  # a stale record of a cluster that has stopped
    return address


def _probe(address: str) -> None:
    """Raise :class:`RayBackendError` unless ``address`` (``[ray://]host:port``) accepts a TCP connection."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise RayBackendError(f"Ray address {address!r} is not of the form host:port (or 'auto')")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RayBackendError(f"no Ray cluster answers at {address!r} ({reason}); start one with `ray start --head` or pass its head's address") from None
