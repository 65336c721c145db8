"""The host's end of one worker: start it, run one call on its waiting child, end it.

A call goes from the host straight to the child the worker forked for it (the worker hands the
child's pipe ends over the control socket) and back: no hop through the worker, no Python start-up
and no fork while the caller waits. Once the host has the child's output it tells the worker
``done`` and returns; the worker cleans up in the background, and the next call on this worker
first waits for its ``ready`` (:meth:`WorkerProcess.wait_ready`).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import queue
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gem_core.tools.sandbox import policy, protocol, reaper

logger = logging.getLogger(__name__)

WORKER_SCRIPT = "worker.py"
REPORT_WAIT_S = 5.0  # how long the worker gets to say how a killed child ended
KILL_WAIT_S = 5.0  # how long the host waits for a killed worker's processes to be gone
EXIT_WAIT_S = 1.0  # isolation="none": how long a worker told to stop gets to end its child and exit
REAPER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")


class WorkerLost(Exception):
    """The worker died, broke the protocol or missed a deadline; the message says which."""


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is made with (calls cannot change it): one shared pool per distinct spec."""

    isolation: str = "bwrap"  # or "none": no bubblewrap, only rlimits and the timeout
    preload: tuple[str, ...] = ()
    tmpfs_mb: int = 64
    start_timeout: float = 60.0


@dataclass
class RawReply:
    """What one call on a child gave, before the API layer turns it into a result."""

    stdout: bytes = b""
    stderr: bytes = b""
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


class ChildPipes:
    """The host's ends of a waiting child's pipes (protocol.CHILD_FDS) and its pidfd."""

    def __init__(self, fds: list[int]):
        self.w_req, self.r_out, self.r_err, self.r_status, self.pidfd = fds

    def fds(self) -> list[int]:
        return [self.w_req, self.r_out, self.r_err, self.r_status, self.pidfd]

    def close(self) -> None:
        close_fds(self.fds())
        self.w_req = self.r_out = self.r_err = self.r_status = self.pidfd = -1

    def call(self, request: bytes, timeout: float, cap: int) -> RawReply:
        """Hand ``request`` over; collect stdout and stderr (up to ``cap`` bytes together) until the
        child reports its exit code, dies, or ``timeout`` seconds pass (then it is killed)."""
        started = time.monotonic()
        deadline = started + timeout
        try:
            if not write_all_before(self.w_req, request, deadline):
                deadline = time.monotonic()  # it did not take its request in time: a timeout
        except OSError:
            pass  # it died before reading: reported below
        close_fds([self.w_req])
        self.w_req = -1
        buffers = {self.r_out: bytearray(), self.r_err: bytearray()}
        poller = select.poll()
        for fd in (self.r_out, self.r_err, self.r_status, self.pidfd):
            poller.register(fd, select.POLLIN)
        reply = RawReply()
        status = b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reply.timed_out = True
                break
            ready = {fd for fd, _ in poller.poll(max(1, math.ceil(remaining * 1000)))}
            if self.r_status in ready:
                data = os.read(self.r_status, protocol.STATUS.size - len(status))
                status += data
                if len(status) == protocol.STATUS.size:
                    reply.exit_code = protocol.STATUS.unpack(status)[0]
                    break
                if not data:  # closed without a report: it died; the pidfd says so too
                    poller.unregister(self.r_status)
            if self.pidfd in ready:
                break
            for fd in (self.r_out, self.r_err):
                if fd in ready and not protocol.read_some(fd, buffers[fd]):
                    poller.unregister(fd)
            if len(buffers[self.r_out]) + len(buffers[self.r_err]) > cap:
                reply.truncated = True
                break
        reply.duration = time.monotonic() - started
        if reply.exit_code is None:  # timed out, over the cap, or died: stop it now; the worker kills the rest
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except OSError:
                pass
        for fd, buffer in buffers.items():  # what it wrote before it reported; leftovers may hold the pipes
            while len(buffers[self.r_out]) + len(buffers[self.r_err]) <= cap and protocol.read_some(fd, buffer):
                pass
        out, err = bytes(buffers[self.r_out]), bytes(buffers[self.r_err])
        if len(out) + len(err) > cap:  # keep the first `cap` bytes of the two streams together, stdout first
            reply.truncated = True
            out = out[:cap]
            err = err[: max(0, cap - len(out))]
        reply.stdout, reply.stderr = out, err
        return reply


class WorkerProcess:
    """One warm sandboxed worker: the process, the control socket to it, its waiting child."""

    def __init__(self, spec: WorkerSpec, on_spawn: Callable[[WorkerProcess], None] | None = None):
        """Start a worker and wait for its greeting. ``on_spawn(self)`` runs once its processes exist,
        before the wait (a pool keeps track of workers still starting, to end them if it closes); if it
        raises, the worker is killed and the error passes on."""
        self.spec = spec
        self.host_tmp: str | None = None
        self.child: ChildPipes | None = None
        self.owes_ready = False  # it was told "done" and has not yet said "ready" again
        self.calls = 0
        self.tag = owner.worker_tag()  # in every command line of this worker's processes
        self.init_pidfd: int | None = None  # the sandbox's init (bwrap mode), once known
        self._info_fd = -1  # bwrap's --info-fd, which names the init
        self._info = b""
        self._fd_lock = threading.Lock()  # the two fds above: close() may end a worker that another thread starts
        self.ctl, self.proc = self._spawn()
        if on_spawn is not None:
            try:
                on_spawn(self)
            except BaseException:
                self.kill()
                raise
        self.hello = self._greeting()
        self.preloaded: list[str] = self.hello.get("preloaded", [])
        self.owes_ready = True  # the first child follows the greeting

    # -- start-up
    def _spawn(self) -> tuple[socket.socket, subprocess.Popen[bytes]]:
        spec = self.spec
        config: dict[str, Any] = {"preload": list(spec.preload), "worker_only_env": list(policy.WORKER_ONLY_ENV), "owner": self.tag}
        pass_fds: tuple[int, ...] = ()
        ns_fd = helper = None
        info_w = -1
        if spec.isolation == "none":
            self.host_tmp = tempfile.mkdtemp(prefix=owner.temp_prefix())
            config.update(sandboxed=False, tmp_root=self.host_tmp)
            script = str(policy.WORKER_SOURCE_DIR / WORKER_SCRIPT)
            argv = [sys.executable, "-I", script]
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **policy.SANDBOX_ENV, **policy.WORKER_ONLY_ENV}
        else:
            config.update(
                sandboxed=True, tmp_root=policy.SANDBOX_TMP, extra_wipe=list(policy.EXTRA_WIPED_DIRS),
                keep=policy.kept_under_tmp(),
            )  # fmt: skip
            self._info_fd, info_w = os.pipe()
            os.set_blocking(self._info_fd, False)
            pass_fds = (info_w,)
            if os.geteuid() == 0:
                try:
                    helper, ns_fd = policy.user_namespace_as_root()
                except BaseException:
                    close_fds([self._info_fd, info_w])
                    raise
                pass_fds = (ns_fd, info_w)
                config.update(snippet_uid=policy.SANDBOX_UID, nproc_base=0)
            else:
                config.update(nproc_base=2)  # bwrap's init and the manager share the snippet's uid
            script = f"{policy.WORKER_MOUNT}/{WORKER_SCRIPT}"
            argv = [*policy.bwrap_argv(spec.tmpfs_mb, ns_fd, info_w), policy.sandbox_python(), "-I", script]
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        argv.append(json.dumps(config))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = spawner.popen(
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
            close_fds([self._info_fd])
            self._info_fd = -1
            raise
        finally:
            theirs.close()
            close_fds([info_w])
            if ns_fd is not None:
                os.close(ns_fd)
            if helper is not None:
                helper.stdin.close()  # type: ignore[union-attr]
                helper.wait()
        return ours, proc

    def _greeting(self) -> dict[str, Any]:
        try:
            hello = self._expect(protocol.HELLO, time.monotonic() + self.spec.start_timeout)
        except WorkerLost as lost:
            stderr = self._stderr_text()
            self.kill()
            hint = ""
            if "namespace" in stderr or "Operation not permitted" in stderr:
                hint = " bubblewrap could not create its namespaces here (a container may forbid user namespaces; allow them, or run on a host that does)."
            raise policy.SandboxUnavailable(f"the sandbox worker did not start ({lost}). bwrap said: {stderr.strip()!r}.{hint}") from None
        self.proc.stderr.close()  # type: ignore[union-attr]  # the worker silences its stderr once ready
        self._find_init()  # bwrap wrote it before it let the init start the worker
        return hello

    def _find_init(self) -> None:
        """Read what bwrap's ``--info-fd`` holds so far; once it names the sandbox's init (and that
        process carries this worker's tag: not a reused pid), keep a pidfd to it."""
        with self._fd_lock:
            self._find_init_locked()

    def _find_init_locked(self) -> None:
        if self._info_fd < 0 or self.init_pidfd is not None:
            return
        while True:
            try:
                data = os.read(self._info_fd, 4096)
            except (BlockingIOError, InterruptedError):
                return  # not all written yet (a worker killed while starting)
            except OSError:
                data = b""
            if not data:
                break
            self._info += data
        close_fds([self._info_fd])
        self._info_fd = -1
        try:
            pid = int(json.loads(self._info)["child-pid"])
            pidfd = os.pidfd_open(pid)
        except (ValueError, KeyError, TypeError, OSError):
            return  # no init (bwrap failed before it), or it is gone already
        if carries(pid, json.dumps(self.tag)):  # quoted, as in the config: tag /1 is not tag /12
            self.init_pidfd = pidfd
        else:
            os.close(pidfd)

    def _stderr_text(self) -> str:
        try:
            if self.proc.poll() is None:
                return ""
            return self.proc.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
        except (OSError, ValueError):
            return ""

    # -- talking
    def _expect(self, op: str, deadline: float) -> dict[str, Any]:
        """The worker's next message, which must be ``op`` (or ``unclean``, which is a loss)."""
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0 or not wait_readable(self.ctl.fileno(), remaining):
                raise WorkerLost(f"the worker sent no {op!r} in time")
            message, fds = protocol.receive(self.ctl)
        except OSError as exc:
            raise WorkerLost(f"{self.death_reason()} ({exc})") from None
        except ValueError as exc:
            raise WorkerLost(f"the worker sent an unreadable message ({exc})") from None
        if message is None:
            raise WorkerLost(self.death_reason())
        if message["op"] == protocol.UNCLEAN:
            close_fds(fds)
            raise WorkerLost(f"the worker gave up: {message.get('reason', 'unclean')}")
        if message["op"] != op:
            close_fds(fds)
            raise WorkerLost(f"the worker sent {message['op']!r} where {op!r} was due")
        if op == protocol.READY:
            if len(fds) != len(protocol.CHILD_FDS):
                close_fds(fds)
                raise WorkerLost(f"the worker sent {len(fds)} descriptors with its child")
            self.child = ChildPipes(fds)
        else:
            close_fds(fds)
        return message

    def death_reason(self) -> str:
        """Why the worker is gone, as far as the host can tell."""
        try:
            code = self.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            return "the worker closed its control socket"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            return f"the worker was killed by {name}"
        return f"the worker exited with status {code}"

    def cleaning_up(self) -> bool:
        """Whether it still owes its ``ready`` after the last call (a look, no wait; False for a
        worker whose socket is closed: ``wait_ready`` then finds it gone)."""
        if not self.owes_ready:
            return False
        try:
            return not wait_readable(self.ctl.fileno(), 0)
        except (OSError, ValueError):
            return False

    def wait_ready(self, timeout: float) -> bool:
        """Whether the worker has a clean child waiting (after the last call it cleans up first)."""
        if self.owes_ready:
            try:
                self._expect(protocol.READY, time.monotonic() + timeout)
            except WorkerLost as lost:
                logger.info("sandbox worker lost while cleaning up: %s", lost)
                return False
            self.owes_ready = False
        return self.child is not None and self.proc.poll() is None

    def call(self, request: bytes, timeout: float, cap: int) -> RawReply:
        """Run one request on the waiting child; then tell the worker it may clean up."""
        child, self.child = self.child, None
        if child is None:
            raise WorkerLost("no child is waiting")
        self.calls += 1
        try:
            reply = child.call(request, timeout, cap)
        finally:
            child.close()
        killed = reply.exit_code is None  # the worker, which reaps the child, says how it ended
        try:
            protocol.send(self.ctl, protocol.DONE, report=killed)
        except OSError as exc:
            if killed:
                raise WorkerLost(f"{self.death_reason()} ({exc})") from None
            self.owes_ready = True  # the snippet finished; the next wait_ready finds the worker gone
            return reply
        self.owes_ready = True
        if killed:
            ended = self._expect(protocol.ENDED, time.monotonic() + REPORT_WAIT_S)
            reply.exit_code, reply.signal = ended.get("exit_code"), ended.get("signal")
        return reply

    # -- ending
    def terminate(self) -> None:
        """SIGKILL the sandbox's processes, keeping the descriptors (another thread may be polling them):
        bwrap's process group (bwrap, and the init until it has its own session), then the init, whose
        death ends its whole pid namespace. Does not wait (:meth:`wait_gone`)."""
        if self.proc.returncode is None:  # once reaped, its pid (and group id) may be another's
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.kill()
        except OSError:
            pass
        with self._fd_lock:
            self._find_init_locked()  # after the killpg: a bwrap that is dead names no new init
            if self.init_pidfd is not None:
                try:
                    signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
                except OSError:
                    pass

    def stop(self) -> None:
        """Begin ending the worker without waiting: ``isolation="none"``: close the control socket (the
        worker ends its child and exits by itself; :meth:`kill` forces what is left); bwrap: :meth:`terminate`."""
        if self.spec.isolation == "none":
            try:
                self.ctl.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        else:
            self.terminate()

    def wait_gone(self, timeout: float) -> bool:
        """Whether bwrap (or the worker) and the sandbox's init are gone within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        try:
            self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return False
        with self._fd_lock:
            if self.init_pidfd is None:
                return True
            init = os.dup(self.init_pidfd)  # another thread may close ours meanwhile
        try:
            return wait_readable(init, max(0.0, deadline - time.monotonic()))
        finally:
            os.close(init)

    def kill(self) -> None:
        """Tear the sandbox down: the worker, bwrap and everything in its namespaces; close our ends.
        Returns once its processes are gone (or after KILL_WAIT_S, with a warning)."""
        self.stop()
        if self.spec.isolation == "none":
            self.wait_gone(EXIT_WAIT_S)
            self.terminate()
        if not self.wait_gone(KILL_WAIT_S):
            logger.warning("sandbox worker pid %d did not exit after SIGKILL", self.proc.pid)
        self.forget()
        self.remove_host_tmp()

    def remove_host_tmp(self) -> None:
        """Remove the worker's own temporary directory (``isolation="none"``), once its processes are gone. Two
        threads may both get here (a closing pool and a busy worker's caller): each takes the path once, and a tree
        the other removed first is no error."""
        path, self.host_tmp = self.host_tmp, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)

    def forget(self) -> None:
        """Close our descriptors without touching the processes (in a forked child: they are the parent's)."""
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr, self.ctl):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if self.child is not None:
            self.child.close()
            self.child = None
        with self._fd_lock:
            close_fds([self._info_fd, -1 if self.init_pidfd is None else self.init_pidfd])
            self._info_fd = -1
            self.init_pidfd = None


# -- helpers ---------------------------------------------------------------------------------------


def write_all_before(fd: int, data: bytes, deadline: float) -> bool:
    """Write all of ``data`` to the non-blocking pipe ``fd`` by ``deadline``; False when time ran
    out (a child that stops reading a large request cannot hang the host)."""
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


def carries(pid: int, tag: str) -> bool:
    """Whether process ``pid``'s command line holds ``tag``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return tag.encode() in handle.read()
    except OSError:
        return False


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def wait_readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` becomes readable within ``timeout`` seconds (poll: no FD_SETSIZE limit)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout * 1000))))


class Spawner:
    """Starts worker processes from one long-lived thread.

    bwrap's ``--die-with-parent`` uses PR_SET_PDEATHSIG, which fires when the *thread* that forked
    bwrap exits, not the process. Workers are started from short-lived threads (lazy growth,
    replacements), so the fork itself happens here, in a thread that lives as long as the process.
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

    def after_fork_in_child(self) -> None:
        """The spawner thread is the parent's; a forked child starts its own on first use."""
        self.__init__()  # type: ignore[misc]


spawner = Spawner()
os.register_at_fork(after_in_child=spawner.after_fork_in_child)


class Owner:
    """This process as the owner of sandboxes: its tag (:mod:`.reaper`), and its reaper, started before
    its first worker and holding the read end of a pipe whose write end only this process has."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1  # the process the reaper guards (-1: none started)
        self._lifeline = -1
        self._workers = itertools.count()
        self.label = self.nonce = ""

    def tag(self) -> str:
        """This process's owner tag, starting its reaper first if it has none."""
        with self._lock:
            if self._pid != os.getpid():
                self._start()
            return reaper.owner_tag(self.label, self._pid, self.nonce)

    def worker_tag(self) -> str:
        return f"{self.tag()}/{next(self._workers)}"

    def temp_prefix(self) -> str:
        self.tag()
        return reaper.temp_prefix(self.label, self._pid, self.nonce)

    def _start(self) -> None:
        label = reaper.check_label(os.environ.get(reaper.LABEL_VAR, ""))
        nonce, pid = secrets.token_hex(4), os.getpid()
        read_end, write_end = os.pipe()  # neither is inherited by anything this process starts
        try:
            argv = [sys.executable, "-I", "-S", REAPER_SCRIPT, reaper.REAPER_FLAG, label, str(pid), nonce, tempfile.gettempdir()]
            proc = spawner.popen(argv, stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd="/")
            code = proc.wait()  # the reaper forks and its first process exits at once
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        if code != 0:
            os.close(write_end)
            raise policy.SandboxUnavailable(f"the sandbox's reaper did not start (exit status {code})")
        self._lifeline, self._pid, self.label, self.nonce = write_end, pid, label, nonce

    def after_fork_in_child(self) -> None:
        """The reaper guards the parent: a forked child drops its copy of the lifeline and starts its own."""
        if self._lifeline >= 0:
            try:
                os.close(self._lifeline)
            except OSError:
                pass
        self.__init__()  # type: ignore[misc]


owner = Owner()
os.register_at_fork(after_in_child=owner.after_fork_in_child)
