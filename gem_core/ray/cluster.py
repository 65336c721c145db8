"""Which Ray cluster gem_core uses: the one already running, else one it starts (and alone shuts down).

Inside a trainer's Ray job (verl, OpenRLHF start their own cluster) ``ray.is_initialized()`` is true and
gem_core uses that connection. Otherwise :func:`connect` joins the cluster at ``address`` (or
``RAY_ADDRESS``, or the one ``ray start`` left on this machine); only when there is none does it start a
local one, and only that one is shut down, when the last gem_core user of it lets go (:func:`release`).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from gem_core.errors import GemError

INSTALL_HINT = "pip install 'gem-core[ray]'"
PROBE_TIMEOUT_S = 5.0  # how long an address may take to accept a TCP connection

_lock = threading.RLock()
_users = 0
_started_here = False


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
    global _users, _started_here
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
                ray.init(namespace=namespace, runtime_env=runtime_env, include_dashboard=False)
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
