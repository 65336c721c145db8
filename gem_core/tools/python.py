"""The Python tool: model-written code runs in a bubblewrap sandbox, served by warm workers.

Isolation (``isolation="bwrap"``, the default; needs the Debian package ``bubblewrap``):

* new user, pid, network, IPC, UTS and cgroup namespaces: no network at all (not even the host's
  loopback), a fresh ``/proc`` that shows only the sandbox's own processes;
* a read-only view of ``/usr`` (and the ``/bin``, ``/lib*`` links) and of the Python installation,
  nothing else of the host's files: no home, no project, no ``/etc`` beyond the loader cache;
* a size-capped private ``/tmp`` and ``/dev/shm``; every call gets a fresh temp dir as its cwd,
  ``HOME`` and ``TMPDIR``, and all writable places are wiped after the call;
* an empty environment (``--clearenv``): the host's variables, secrets included, are not there;
* per call: its own session and process group, rlimits on address space, CPU seconds, processes,
  file size and open files, a wall-clock deadline after which everything it started is killed,
  and stdout/stderr read through pipes up to a byte cap (the rest is cut, with a marker).

Speed comes from warm workers: each is one sandboxed Python that imported the common modules once
and keeps a child forked *ahead* of the next request (see ``_sandbox_worker.py``), already isolated
and limited, waiting for its code. The worker hands that child's pipe ends to the host (SCM_RIGHTS
over a Unix socket), so a call goes from the host straight to the child and back: no hop through
the worker, no Python start-up, not even a fork. Then the worker kills every process left in its
sandbox, wipes its writable places and forks the next child; the host takes a worker for a call
only once it has reported itself clean. A worker that cannot prove itself clean, dies, or misses
its deadline is thrown away and replaced, so no state of one call reaches the next.

Heavy modules (numpy, by default) are preloaded in a second zygote of each worker, so a call whose
code names one (or a library built on one, such as scipy or pandas) gets a child with it imported,
while other calls fork a process half the size: fork and exit cost grows with the forking
process's pages. The choice only affects speed; either child can import anything.

When the host runs as root, the sandbox gets its own user namespace in which the snippets run as a
uid that maps to the host's ``nobody``: they are not host root, cannot signal their worker, and the
kernel enforces their process limit (it exempts uid 0 from ``RLIMIT_NPROC``).

``isolation="none"`` runs the same workers without bubblewrap, for machines that cannot have it.
It keeps the rlimits and the timeout but gives **no** file, network or environment isolation, and
it says so loudly every time a sandbox is made that way.
"""

from __future__ import annotations

import atexit
import collections
import functools
import json
import logging
import math
import os
import queue
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gem_core.errors import GemError
from gem_core.tools.base import Tool, ToolCall, ToolResult, first_match

logger = logging.getLogger(__name__)

Isolation = Literal["bwrap", "none"]

BWRAP_PACKAGE = "bubblewrap"
DEFAULT_PRELOAD = (
    "math", "cmath", "re", "json", "string", "random", "itertools", "functools", "collections",
    "fractions", "decimal", "statistics", "heapq", "bisect", "datetime", "numpy",
)  # fmt: skip
# Preloaded in the heavy zygote only: each maps tens of MB that a fork copies page tables for.
HEAVY_MODULES = frozenset({"numpy", "scipy", "pandas", "sympy", "torch", "sklearn", "matplotlib"})
# Code that names one of these gets a heavy child (when the sandbox preloads heavy modules): they
# are the heavy modules and libraries that import numpy when imported.
_HEAVY_HINT = re.compile(r"\b(?:numpy|scipy|pandas|sympy|torch|sklearn|matplotlib|seaborn|statsmodels)\b")
TRUNCATION_MARKER = "\n[... output truncated: more than {limit} bytes ...]"
_WORKER_SOURCE = (Path(__file__).with_name("_sandbox_worker.py")).read_text()
_SANDBOX_UID = 1000  # the uid snippets have inside the sandbox
_HOST_NOBODY = 65534  # what that uid is on the host when the host runs as root
_SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_USERNS_HELPER = (
    "import ctypes, os, sys\n"
    "if ctypes.CDLL(None, use_errno=True).unshare(0x10000000):\n"
    "    sys.exit('unshare(CLONE_NEWUSER) failed, errno %d' % ctypes.get_errno())\n"
    "# No nested user namespaces below this one (bwrap's --disable-userns needs --unshare-user).\n"
    "with open('/proc/sys/user/max_user_namespaces', 'w') as f:\n"
    "    f.write('0')\n"
    "os.write(1, b'ok')\n"
    "os.read(0, 1)\n"
)


class SandboxUnavailable(GemError, RuntimeError):
    """The sandbox cannot be started here (bubblewrap missing, or namespaces not allowed)."""


class SandboxError(GemError, RuntimeError):
    """A sandbox worker failed in a way the pool could not recover from."""


@dataclass
class ExecutionResult:
    """The outcome of running one snippet."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None  # None when the snippet was killed by a signal (or never ran)
    signal: int | None = None
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0  # seconds, measured by the host from handing the code over to the end
    error: str | None = None  # a failure of the sandbox itself (worker died), not of the snippet
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the snippet ran to completion with exit code 0 and nothing was cut."""
        return self.exit_code == 0 and not self.timed_out and not self.truncated and self.error is None

    def output(self, max_bytes: int | None = None) -> str:
        """stdout then stderr, as the model sees them, with the truncation marker when cut."""
        text = self.stdout + self.stderr
        if self.truncated:
            text += TRUNCATION_MARKER.format(limit=max_bytes if max_bytes is not None else "the")
        return text


def bwrap_path() -> str | None:
    """Where ``bwrap`` is, or ``None``."""
    return shutil.which("bwrap")


def require_bwrap() -> str:
    """The path of ``bwrap``; a clear error naming the Debian package when it is missing."""
    path = bwrap_path()
    if path is None:
        raise SandboxUnavailable(
            "the Python sandbox needs bubblewrap, and `bwrap` is not on PATH. Install the Debian/Ubuntu "
            f"package '{BWRAP_PACKAGE}' (apt-get install -y {BWRAP_PACKAGE}); or, only on a machine where "
            "running untrusted code unisolated is acceptable, pass isolation='none'."
        )
    return path


# -- one warm worker -------------------------------------------------------------------------------


class _WorkerLost(Exception):
    """The worker died, broke the protocol or missed the host's deadline."""


class _Worker:
    """One warm sandboxed Python, the control socket to it, and the pipes of its waiting child."""

    def __init__(self, settings: _Settings):
        self.settings = settings
        self.host_tmp: str | None = None
        self.calls = 0
        self.owes_ready = False
        self.child: _ChildPipes | None = None
        self.ctl, self.proc = self._start()
        hello = self._await_ready()
        self.pid_in_sandbox = hello.get("pid")
        self.preloaded: list[str] = hello.get("preloaded", [])
        self.kinds: list[str] = hello.get("kinds", ["lean"])  # of child: "lean", and "heavy" when preloaded
        self.next_kind = "lean"  # the kind of child it has (or is making) ready
        self.owes_ready = True  # the first child's pipes follow the greeting

    # start-up
    def _start(self) -> tuple[socket.socket, subprocess.Popen[bytes]]:
        s = self.settings
        config: dict[str, Any] = {"preload": list(s.preload), "heavy": list(s.heavy), "limits": s.limits}
        pass_fds: tuple[int, ...] = ()
        ns_fd = helper = None
        if s.isolation == "none":
            self.host_tmp = tempfile.mkdtemp(prefix="gem-pysandbox-")
            config.update(sandboxed=False, tmp_root=self.host_tmp)
            argv = [sys.executable, "-I", "-c", _WORKER_SOURCE, json.dumps(config)]
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_SANDBOX_ENV}
        else:
            keep = [d for d in _python_dirs() if d.startswith("/tmp/")]
            config.update(sandboxed=True, tmp_root="/tmp", extra_wipe=["/dev/shm", "/dev/mqueue"], keep=keep)
            if os.geteuid() == 0:
                helper, ns_fd = _user_namespace_as_root()
                pass_fds = (ns_fd,)
                config.update(snippet_uid=_SANDBOX_UID, nproc_base=0)
            else:
                config.update(nproc_base=2)  # bwrap's init and the manager share the snippet's uid (and its zygotes)
            argv = _bwrap_argv(s, ns_fd) + [sys.executable, "-I", "-c", _WORKER_SOURCE, json.dumps(config)]
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        # One message per send, so no framing; the worker sends its child's pipes as SCM_RIGHTS.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = _spawn_from_long_lived_thread(
                argv,
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                pass_fds=pass_fds,
                start_new_session=True,  # the host kills the whole sandbox with one killpg
                cwd="/",
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            if ns_fd is not None:
                os.close(ns_fd)
            if helper is not None:
                helper.stdin.close()  # type: ignore[union-attr]
                helper.wait()
        return ours, proc

    def _await_ready(self) -> dict[str, Any]:
        try:
            hello, fds = self._recv(time.monotonic() + self.settings.start_timeout)
        except _WorkerLost as lost:
            stderr = self._stderr_text()
            self.kill()
            hint = ""
            if "namespace" in stderr or "Operation not permitted" in stderr:
                hint = (
                    " bubblewrap could not create its namespaces here (a container may forbid user "
                    "namespaces; allow them, or run on a host that does)."
                )
            raise SandboxUnavailable(
                f"the sandbox worker did not start ({lost}). bwrap said: {stderr.strip()!r}.{hint}"
            ) from None
        _close_all_fds(fds)
        if not hello.get("ready"):
            self.kill()
            raise SandboxUnavailable(f"the sandbox worker sent an unexpected greeting: {hello!r}")
        self.proc.stderr.close()  # type: ignore[union-attr]  # the worker silences its stderr once ready
        return hello

    def _stderr_text(self) -> str:
        try:
            if self.proc.poll() is None:
                return ""
            return self.proc.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
        except (OSError, ValueError):
            return ""

    # talking
    def _send(self, message: bytes) -> None:
        try:
            self.ctl.send(message)
        except (OSError, ValueError) as exc:
            raise _WorkerLost(f"could not write to the worker: {exc}") from None

    def _recv(self, deadline: float) -> tuple[dict[str, Any], list[int]]:
        """The worker's next message and the file descriptors attached to it."""
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0 or not _wait_readable([self.ctl.fileno()], remaining):
                raise _WorkerLost("no answer before the deadline")
            data, fds, flags, _ = socket.recv_fds(self.ctl, 65536, 8)
        except (OSError, ValueError) as exc:  # the socket was closed under us (the worker was killed)
            raise _WorkerLost(f"the socket to the worker is gone ({exc})") from None
        if not data:
            _close_all_fds(fds)
            raise _WorkerLost("the worker exited")
        try:
            if flags & _TRUNCATED:
                raise _WorkerLost("the worker sent a message too long")
            return dict(_parse_message(data)), fds
        except (json.JSONDecodeError, _WorkerLost) as exc:
            _close_all_fds(fds)
            raise _WorkerLost(f"the worker sent an unreadable message ({exc})") from None

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one request on the waiting child, straight through its pipes; then tell the worker
        (which makes a child of the same kind ready next)."""
        self.calls += 1
        child, self.child = self.child, None
        if child is None:
            raise _WorkerLost("no child is waiting")
        try:
            reply = child.run(request)
            self.owes_ready = True
            try:
                # "report": the child was killed or died without telling its exit code; the worker,
                # which reaps it, says how it ended (one message less on the common path).
                self._send(_done_message(reply["exit_code"] is None, self.next_kind))
            except _WorkerLost:
                if reply["exit_code"] is None:
                    raise
                return reply  # the snippet finished, then its worker went: the next checkout replaces it
            if reply["exit_code"] is None:  # killed, or gone without a report: the worker reaped it
                ended = self._await("ended", time.monotonic() + _WORKER_GRACE)
                reply["exit_code"], reply["signal"] = ended.get("exit_code"), ended.get("signal")
            return reply
        finally:
            child.close()

    def switch(self, kind: str) -> None:
        """Give up the waiting child unused and have one of ``kind`` made ready instead."""
        if self.child is not None:
            self.child.close()  # the worker's zygote ends it
            self.child = None
        self.next_kind = kind
        self.owes_ready = True
        self._send(_done_message(False, kind))

    def _await(self, key: str, deadline: float) -> dict[str, Any]:
        """The worker's next message that carries ``key`` (an ``ended`` report may come first)."""
        while True:
            message, fds = self._recv(deadline)
            if key in message:
                if fds:
                    if len(fds) != len(_ChildPipes.__slots__):
                        _close_all_fds(fds)
                        raise _WorkerLost(f"the worker sent {len(fds)} descriptors")
                    self.child = _ChildPipes(*fds)
                return message
            _close_all_fds(fds)

    def ready(self, timeout: float = 30.0) -> bool:
        """After a call the worker cleans up, forks its next child and hands its pipes over."""
        if not self.owes_ready:
            return self.alive() and self.child is not None
        try:
            message = self._await("ready", time.monotonic() + timeout)
        except _WorkerLost:
            return False
        self.owes_ready = False
        self.next_kind = message.get("kind", self.next_kind)
        return bool(message.get("ready")) and self.child is not None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Tear the sandbox down: the worker, bwrap and everything in its namespaces."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.kill()
        except OSError:
            pass
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr, self.ctl):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if self.child is not None:
            self.child.close()
            self.child = None
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.warning("sandbox worker pid %d did not exit after SIGKILL", self.proc.pid)
        if self.host_tmp is not None:
            shutil.rmtree(self.host_tmp, ignore_errors=True)
            self.host_tmp = None


_WORKER_GRACE = 5.0  # seconds the worker gets to report how a killed child ended
_TRUNCATED = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)  # an int: flag enums are slow to combine per call
_MAX_CPU_SECONDS = 2**31  # RLIMIT_CPU of a call (sent as 4 bytes); longer than any timeout that makes sense


@functools.lru_cache(maxsize=256)
def _parse_message(data: bytes) -> dict[str, Any]:
    """A worker's message, parsed once: most are the same few bytes ({"ready": true, "kind": ...})."""
    return json.loads(data)


@functools.lru_cache(maxsize=None)
def _done_message(report: bool, next_kind: str) -> bytes:
    """{"done": true, "report": ..., "next": ...}: the host is done with the child; the worker reaps
    it (and says how it ended when ``report``), cleans up and makes a child of ``next_kind`` ready."""
    return json.dumps({"done": True, "report": report, "next": next_kind}).encode()


class _ChildPipes:
    """The host's ends of one waiting child's pipes, handed over by its worker: the call goes
    straight from the host to the child and back, with no hop through the worker."""

    __slots__ = ("w_req", "r_out", "r_err", "r_status", "pidfd")

    def __init__(self, w_req: int, r_out: int, r_err: int, r_status: int, pidfd: int):
        self.w_req, self.r_out, self.r_err, self.r_status, self.pidfd = w_req, r_out, r_err, r_status, pidfd

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Hand the code over, collect output until the child reports, dies, or runs out of time."""
        started = time.monotonic()
        deadline = started + request["timeout"]
        cap = request["max_output_bytes"]
        code = request["code"].encode("utf-8", "surrogatepass")  # framed as the worker's recv_request reads it
        try:
            if not _write_before(self.w_req, struct.pack(">II", len(code), request["cpu_seconds"]) + code, deadline):
                deadline = time.monotonic()  # the child did not take its code in time: a timeout
        except OSError:
            pass  # the child died before reading: reported below
        os.close(self.w_req)
        self.w_req = -1
        buffers = {self.r_out: bytearray(), self.r_err: bytearray()}
        poller = select.poll()
        for fd in (self.r_out, self.r_err, self.r_status, self.pidfd):
            poller.register(fd, select.POLLIN)
        total = 0
        timed_out = truncated = False
        exit_code = None
        status = b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready = {fd for fd, _ in poller.poll(max(1, math.ceil(remaining * 1000)))}
            if self.r_status in ready:
                data = os.read(self.r_status, 4 - len(status))
                status += data
                if len(status) >= 4:
                    exit_code = struct.unpack(">i", status)[0]
                    break
                if not data:  # closed without a report: it died; the pidfd says so too
                    poller.unregister(self.r_status)
            if self.pidfd in ready:
                break
            for fd in (self.r_out, self.r_err):
                if fd in ready:
                    data = os.read(fd, 65536)
                    if data:
                        buffers[fd] += data
                        total += len(data)
                    else:
                        poller.unregister(fd)
            if total > cap:
                truncated = True
                break
        duration = time.monotonic() - started
        if exit_code is None:  # timed out, over the cap, or died: stop it now; the worker kills the rest
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except OSError:
                pass
        # Whatever the child wrote before it reported is in the pipes; leftovers may still hold them open.
        for fd in (self.r_out, self.r_err):  # non-blocking, as the worker hands them over
            while total <= cap:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not data:
                    break
                buffers[fd] += data
                total += len(data)
        if total > cap:
            truncated = True
        out, err = bytes(buffers[self.r_out]), bytes(buffers[self.r_err])
        if truncated:  # keep the first `cap` bytes of the two streams together, stdout first
            out = out[:cap]
            err = err[: max(0, cap - len(out))]
        return {
            "stdout": out.decode("utf-8", "replace"),
            "stderr": err.decode("utf-8", "replace"),
            "exit_code": exit_code,
            "signal": None,
            "timed_out": timed_out,
            "truncated": truncated,
            "duration": duration,
        }

    def close(self) -> None:
        _close_all_fds([self.w_req, self.r_out, self.r_err, self.r_status, self.pidfd])
        self.w_req = self.r_out = self.r_err = self.r_status = self.pidfd = -1


def _write_before(fd: int, data: bytes, deadline: float) -> bool:
    """Write all of ``data`` to the pipe ``fd`` (non-blocking, as the worker hands it over) by
    ``deadline``; False when time ran out: a child that stops reading a large snippet cannot hang the
    host."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(max(1, math.ceil(remaining * 1000))):
                return False
    return True


def _close_all_fds(fds: list[int]) -> None:
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def _readable(fds: list[int]) -> set[int]:
    """Those of ``fds`` that can be read now, without waiting."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(0)}


def _wait_readable(fds: list[int], timeout: float) -> bool:
    """Whether one of ``fds`` becomes readable within ``timeout`` seconds (poll: no FD_SETSIZE limit)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout * 1000))))


class _Spawner:
    """Starts sandbox processes from one long-lived thread.

    bwrap's ``--die-with-parent`` uses PR_SET_PDEATHSIG, which fires when the *thread* that forked
    bwrap exits, not the process. Workers are started from short-lived threads (parallel start-up,
    background replacement), so the fork itself happens here, in a thread that lives as long as
    the interpreter.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Any, Any, queue.SimpleQueue[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="gem-sandbox-spawner", daemon=True)
                self._thread.start()
        answer: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._jobs.put((argv, kwargs, answer))
        ok, value = answer.get()
        if not ok:
            raise value
        return value

    def _loop(self) -> None:
        while True:
            argv, kwargs, answer = self._jobs.get()
            try:
                answer.put((True, subprocess.Popen(argv, **kwargs)))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                answer.put((False, exc))


_spawner = _Spawner()


def _spawn_from_long_lived_thread(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    return _spawner.popen(argv, **kwargs)


def _user_namespace_as_root() -> tuple[subprocess.Popen[bytes], int]:
    """A user namespace where ns-root is host root (for bwrap's set-up) and the snippet uid is nobody.

    bwrap, run by root, would map the sandbox's only uid to host root. Then the snippet would be
    host root to the kernel, which exempts it from RLIMIT_NPROC (a fork bomb could exhaust the
    host's pids). A helper process makes the namespace; we write its maps; bwrap joins it.
    """
    helper = subprocess.Popen(
        [sys.executable, "-S", "-I", "-c", _USERNS_HELPER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if helper.stdout.read(2) != b"ok":  # type: ignore[union-attr]
        err = helper.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
        helper.kill()
        helper.wait()
        raise SandboxUnavailable(f"could not create a user namespace for the sandbox: {err.strip()}")
    pid = helper.pid
    Path(f"/proc/{pid}/uid_map").write_text(f"0 0 1\n{_SANDBOX_UID} {_HOST_NOBODY} 1\n")
    Path(f"/proc/{pid}/gid_map").write_text(f"0 0 1\n{_SANDBOX_UID} {_HOST_NOBODY} 1\n")
    ns_fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    return helper, ns_fd


def _python_dirs() -> list[str]:
    """The directories the sandboxed interpreter needs: its prefixes, outside /usr, outermost only."""
    candidates = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    real_exe = os.path.realpath(sys.executable)
    candidates.add(str(Path(real_exe).parent.parent))
    dirs = sorted({os.path.realpath(p) for p in candidates} | candidates)
    dirs = [d for d in dirs if not (d == "/usr" or d.startswith("/usr/")) and os.path.isdir(d)]
    outer = []
    for d in dirs:
        if not any(d.startswith(o.rstrip("/") + "/") for o in outer):
            outer.append(d)
    return outer


def _bwrap_argv(s: _Settings, ns_fd: int | None) -> list[str]:
    argv = [require_bwrap(), "--die-with-parent", "--new-session"]
    if ns_fd is not None:
        argv += ["--userns", str(ns_fd), "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        argv += ["--unshare-cgroup-try"]
    else:
        argv += ["--unshare-all", "--unshare-user", "--uid", str(_SANDBOX_UID), "--gid", str(_SANDBOX_UID)]
        argv += ["--disable-userns"]  # no nested user namespaces: they would hand the snippet capabilities
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/" + name)
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), str(host)]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # /tmp first: an interpreter that lives under /tmp is then bound on top of it, not hidden by it.
    argv += ["--perms", "1777", "--size", str(s.tmpfs_bytes), "--tmpfs", "/tmp"]
    made: set[str] = set()
    for d in _python_dirs():
        # Parents are made world-traversable: bwrap would copy a private parent's mode (/root is 0700).
        for parent in reversed(Path(d).parents[:-1]):
            if str(parent) not in made:
                made.add(str(parent))
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", d, d]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", str(s.tmpfs_bytes), "--tmpfs", "/dev/shm"]
    argv += ["--mqueue", "/dev/mqueue", "--remount-ro", "/dev"]
    argv += ["--remount-ro", "/", "--clearenv"]
    for key, value in {**_SANDBOX_ENV, "HOME": "/tmp", "TMPDIR": "/tmp"}.items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", "/tmp", "--"]
    return argv


# -- the pool --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Settings:
    isolation: Isolation
    preload: tuple[str, ...]  # in every child
    heavy: tuple[str, ...]  # in heavy children only
    tmpfs_bytes: int
    start_timeout: float
    limits: dict[str, Any]  # set in each child before its request arrives


_live_sandboxes: weakref.WeakSet[PythonSandbox] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for sandbox in list(_live_sandboxes):
        sandbox.close()


class PythonSandbox:
    """A pool of warm sandboxed Python workers. ``run(code)`` is thread-safe; calls run in parallel
    up to ``workers`` at a time.

    Limits apply to every call: ``timeout`` (wall clock, seconds, positive and finite; ``run`` may
    override it per call, and a bad value is a ValueError), ``cpu_seconds`` (whole seconds, rounded
    up; default: the timeout rounded up, plus one), ``memory_mb`` (address space of each
    process), ``max_processes`` (the snippet's process and everything it forks, threads included),
    ``max_file_mb`` (largest file it may write), ``max_open_files``, ``max_output_bytes`` (stdout and
    stderr together; the rest is cut with a marker). Memory, process, file and open-file limits are
    fixed when the sandbox is made (each child sets them before its request arrives).
    ``preload`` names the modules each worker imports once, ahead of every call; those in
    ``HEAVY_MODULES`` (numpy, by default) are imported only in the worker's heavy zygote, whose
    children get the calls whose code names one of them (see ``_HEAVY_HINT``).
    Workers start on the first call (or on :meth:`start`), and are replaced when one dies or cannot
    be proved clean.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        isolation: Isolation = "bwrap",
        timeout: float = 5.0,
        memory_mb: int = 1024,
        cpu_seconds: int | None = None,
        max_processes: int = 8,
        max_file_mb: int = 16,
        max_open_files: int = 256,
        max_output_bytes: int = 16384,
        tmpfs_mb: int = 64,
        preload: tuple[str, ...] | list[str] = DEFAULT_PRELOAD,
        start_timeout: float = 60.0,
    ):
        if isolation not in ("bwrap", "none"):
            raise ValueError(f"isolation must be 'bwrap' or 'none', got {isolation!r}")
        if isinstance(preload, str):
            raise TypeError(f"preload must be a sequence of module names, got the string {preload!r}")
        if isolation == "bwrap":
            require_bwrap()
        else:
            message = (
                "PythonSandbox(isolation='none'): model-written code will run WITHOUT isolation -- it can "
                "read and write your files, reach the network and read your environment. Only rlimits and "
                "the timeout apply. Install bubblewrap and use isolation='bwrap' for anything untrusted."
            )
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            logger.warning(message)
        if not 0 < timeout < math.inf:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        if cpu_seconds is not None and cpu_seconds <= 0:
            raise ValueError(f"cpu_seconds must be positive, got {cpu_seconds}")
        self.workers = workers if workers is not None else max(2, min(8, os.cpu_count() or 1))
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        self.isolation: Isolation = isolation
        self.timeout = float(timeout)
        self.memory_mb = memory_mb
        self.cpu_seconds = math.ceil(cpu_seconds) if cpu_seconds is not None else None  # RLIMIT_CPU counts whole seconds
        self.max_processes = max_processes
        self.max_file_mb = max_file_mb
        self.max_open_files = max_open_files
        self.max_output_bytes = max_output_bytes
        limits = {
            "memory_bytes": memory_mb * 1024 * 1024 if memory_mb else None,
            "max_processes": max_processes,
            "max_file_bytes": max_file_mb * 1024 * 1024,
            "max_open_files": max_open_files,
        }
        lean = tuple(name for name in preload if name.split(".")[0] not in HEAVY_MODULES)
        heavy = tuple(name for name in preload if name.split(".")[0] in HEAVY_MODULES)
        self._settings = _Settings(isolation, lean, heavy, tmpfs_mb * 1024 * 1024, start_timeout, limits)
        self._idle = _IdleWorkers()
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._all: set[_Worker] = set()
        self._booting = 0  # replacements being started
        self.replaced = 0  # workers thrown away and replaced (died, unclean, or late)
        self._pid = os.getpid()
        _live_sandboxes.add(self)

    # lifecycle
    def start(self) -> PythonSandbox:
        """Start every worker now (in parallel) instead of on the first call."""
        with self._lock:
            if self._closed:
                raise SandboxError("this PythonSandbox is closed")
            if self._started:
                return self
            self._started = True
        errors: list[BaseException] = []

        def boot() -> None:
            try:
                self._add(_Worker(self._settings))
            except BaseException as exc:  # noqa: BLE001 - re-raised below in the caller
                errors.append(exc)

        threads = [threading.Thread(target=boot, daemon=True) for _ in range(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.close()
            raise errors[0]
        return self

    def close(self) -> None:
        """Kill every worker. Safe to call twice."""
        with self._lock:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
        for worker in workers:
            worker.kill()
        self._idle.close()  # wake any caller waiting for a worker

    def __enter__(self) -> PythonSandbox:  # noqa: PYI034 - start() returns self
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                worker.kill()
                return
            self._all.add(worker)
        self._idle.put(worker)

    def _replace(self, worker: _Worker) -> None:
        """Throw ``worker`` away and start a new one in the background."""
        with self._lock:
            self._all.discard(worker)
            self.replaced += 1
            closed = self._closed
            if not closed:
                self._booting += 1
        worker.kill()
        if closed:
            return

        def boot() -> None:
            try:
                self._add(_Worker(self._settings))
            except BaseException as exc:  # noqa: BLE001 - a pool that cannot refill must not hang callers
                logger.error("could not replace a sandbox worker: %s", exc)
            finally:
                with self._lock:
                    self._booting -= 1

        threading.Thread(target=boot, daemon=True).start()

    # running
    def _after_fork(self) -> None:
        """In a process forked from the one that made this pool: the workers belong to the parent.
        Forget them (without killing them) and start our own on demand."""
        self._pid = os.getpid()
        self._idle = _IdleWorkers()
        self._all = set()
        self._lock = threading.Lock()
        self._started = False
        self._booting = 0

    def run(self, code: str, timeout: float | None = None) -> ExecutionResult:
        """Run ``code`` in a fresh child of a warm worker; returns within ``timeout`` plus a little."""
        if self._pid != os.getpid():
            self._after_fork()
        if not self._started:
            self.start()
        timeout = self.timeout if timeout is None else float(timeout)
        if not 0 < timeout < math.inf:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        request = {
            "code": code,
            "timeout": timeout,
            "cpu_seconds": min(self.cpu_seconds or math.ceil(timeout) + 1, _MAX_CPU_SECONDS),
            "max_output_bytes": self.max_output_bytes,
        }
        worker = self._checkout("heavy" if self._settings.heavy and _HEAVY_HINT.search(code) else "lean")
        started = time.monotonic()
        try:
            reply = worker.run(request)
        except _WorkerLost as lost:
            self._replace(worker)
            message = f"the sandbox worker was lost ({lost}); the code may have killed its supervisor"
            return ExecutionResult(
                stderr=message + "\n", error=message, duration=time.monotonic() - started, info={"worker_replaced": True}
            )
        except BaseException:
            self._replace(worker)
            raise
        self._idle.put(worker)  # it cleans up in the background; the next checkout waits for that
        return ExecutionResult(
            stdout=reply["stdout"],
            stderr=reply["stderr"],
            exit_code=reply["exit_code"],
            signal=reply["signal"],
            timed_out=reply["timed_out"],
            truncated=reply["truncated"],
            duration=reply["duration"],
        )

    def _checkout(self, kind: str) -> _Worker:
        """An idle worker that has proved itself clean since its last call (others are replaced),
        with a child of ``kind`` ready: one that has it if any is idle, else one that switches."""
        while True:
            try:
                worker = self._idle.get(kind, timeout=1.0)
            except queue.Empty:
                with self._lock:
                    starved = not self._all and self._booting == 0
                if starved:  # every worker died and none could be started again
                    raise SandboxError("the sandbox has no worker left (replacements failed to start)") from None
                continue
            if worker is None:
                raise SandboxError("the sandbox is closed (or could not replace a failed worker)")
            if not worker.ready():
                self._replace(worker)
                continue
            if worker.next_kind == kind or kind not in worker.kinds:
                return worker
            try:
                worker.switch(kind)
            except _WorkerLost:
                self._replace(worker)
                continue
            if worker.ready():
                return worker
            self._replace(worker)

    def __repr__(self) -> str:
        return f"PythonSandbox(workers={self.workers}, isolation={self.isolation!r}, timeout={self.timeout})"


class _IdleWorkers:
    """The pool's free workers, in the order they came back, each with the kind of child it has, or
    is making, ready.

    A call takes the most recently used worker that has finished cleaning up, so that at low load a
    few workers serve every call and their pages stay in the CPU caches (on a 2-core VM, rotating
    through 16 workers made a call 30% slower than through 4); failing that, the oldest, the
    likeliest to finish first."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._workers: collections.deque[_Worker] = collections.deque()
        self._closed = False

    def put(self, worker: _Worker) -> None:
        with self._ready:
            self._workers.append(worker)
            self._ready.notify()

    def get(self, kind: str, timeout: float) -> _Worker | None:
        """Among the free workers with a ``kind`` child (or all, if none has one): the most recently
        used that is ready now, else the oldest. None once closed; queue.Empty when none came free
        within ``timeout`` seconds."""
        with self._ready:
            if not self._ready.wait_for(lambda: self._workers or self._closed, timeout):
                raise queue.Empty
            if self._closed:
                return None
            same_kind = [worker for worker in self._workers if worker.next_kind == kind] or list(self._workers)
            worker = self._most_recent_ready(same_kind) or same_kind[0]
            self._workers.remove(worker)
            return worker

    @staticmethod
    def _most_recent_ready(workers: list[_Worker]) -> _Worker | None:
        """The last of ``workers`` that is ready now: it owes no ready message, or that message has
        arrived (or its socket is closed: a dead worker, which the checkout replaces)."""
        pending: list[tuple[_Worker, int]] = []  # those used after the last one that owes nothing
        settled = None
        for worker in reversed(workers):
            if not worker.owes_ready:
                settled = worker
                break
            pending.append((worker, worker.ctl.fileno()))
        if pending:
            readable = _readable([fd for _, fd in pending if fd >= 0])
            for worker, fd in pending:
                if fd < 0 or fd in readable:
                    return worker
        return settled

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()


# -- the tool --------------------------------------------------------------------------------------

_PYTHON_PATTERNS = [
    re.compile(r"<python>(.*?)</python>", re.DOTALL),
    re.compile(r"```[ \t]*(?:python|py)[ \t]*\n(.*?)```", re.DOTALL),
]


class PythonTool(Tool):
    """Runs the first ``<python>...</python>`` or fenced ```` ```python ```` block of an action.

    The observation is the program's stdout then stderr inside ``<output>...</output>``, with a
    note when it timed out, was cut, or exited with an error. ``ok`` is true only for a clean
    exit. Pass a :class:`PythonSandbox` to share one pool between tools (it is then not closed by
    this tool), or the sandbox's keyword arguments to make one.
    """

    name = "python"

    def __init__(self, sandbox: PythonSandbox | None = None, *, timeout: float | None = None, **sandbox_kwargs: Any):
        if sandbox is not None and sandbox_kwargs:
            raise TypeError("pass either a PythonSandbox or its keyword arguments, not both")
        self._owns_sandbox = sandbox is None
        if sandbox is None:
            if timeout is not None:
                sandbox_kwargs["timeout"] = timeout
            sandbox = PythonSandbox(**sandbox_kwargs)
        self.sandbox = sandbox
        self.timeout = timeout if timeout is not None else sandbox.timeout

    def instructions(self) -> str:
        return (
            "You can run Python code. Write a complete program inside <python>...</python> tags (or a "
            "```python fenced block); it runs in a fresh sandbox without network access, and what it "
            "prints comes back to you inside <output>...</output>. Variables do not carry over between "
            f"runs. Each run may take at most {self.timeout:g} seconds. Use print() to see results."
        )

    def find_call(self, action: str) -> ToolCall | None:
        return first_match(_PYTHON_PATTERNS, action, self.name)

    def run(self, call: ToolCall) -> ToolResult:
        code = call.payload.strip("\n")
        if not code.strip():
            return ToolResult("<output>\n(no code: the block was empty)\n</output>", ok=False, info={"empty": True})
        result = self.sandbox.run(code, timeout=self.timeout)
        text = result.output(self.sandbox.max_output_bytes).rstrip("\n")
        notes = []
        if result.timed_out:
            notes.append(f"[timed out after {self.timeout:g} s: the program was stopped]")
        elif result.signal is not None and not result.truncated:
            notes.append(f"[the program was killed by signal {result.signal} ({_signal_name(result.signal)})]")
        elif result.exit_code not in (0, None):
            notes.append(f"[exit code {result.exit_code}]")
        body = "\n".join(part for part in [text, *notes] if part) or "(no output)"
        info = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "truncated": result.truncated,
            "duration": result.duration,
        }
        return ToolResult(f"<output>\n{body}\n</output>", ok=result.ok, info=info)

    def close(self) -> None:
        if self._owns_sandbox:
            self.sandbox.close()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown"
