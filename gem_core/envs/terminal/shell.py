"""The host's end of one Terminal episode's sandbox: start it, send commands, run the checker, end it.

The isolation is the Python tool's (:mod:`gem_core.tools.sandbox.policy`): the same bubblewrap command
line (new user, pid, network, IPC, UTS and cgroup namespaces; a read-only ``/usr`` and interpreter; a
size-capped private ``/tmp``; an empty environment), the same user namespace trick when the host is root
(the agent is the host's ``nobody``), the same long-lived spawner thread for ``--die-with-parent`` and
the same per-process reaper, which ends the sandbox if this process dies. The Terminal env adds a
size-capped tmpfs at ``/app`` (the task's files, kept across shell restarts) and its supervisor's source,
read-only. Inside, :mod:`supervisor` runs as the sandbox's pid 1 and runs the shell and the checker.
When the host is not root, the supervisor gets CAP_SYS_ADMIN and CAP_SETPCAP in the sandbox's user
namespace (bwrap's ``--cap-add``): it gives every process of the agent's a PID namespace of its own, and
drops every capability in them (see ``supervisor.py``). An interpreter that lives under ``/tmp`` is
bound on a read-only tmpfs of its own there (:func:`interpreter_binds`).

Every reply from the sandbox is checked here (:func:`validate_reply`: its keys, their types, its size):
one that is not what the supervisor sends is an infrastructure error, never an exception.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gem_core.tools.sandbox import host, policy, reaper

APP = "/app"  # the task's directory inside the sandbox, and the shell's start directory
SUPERVISOR_DIR = Path(__file__).resolve().parent
SUPERVISOR_MOUNT = "/opt/gem-terminal"
START_TIMEOUT_S = 30.0
REPLY_MARGIN_S = 5.0  # on top of a command's time limit: the supervisor's own kill and reply
SHELL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": APP, "TMPDIR": "/tmp", "TERM": "dumb", "PWD": APP}


@dataclass(frozen=True)
class ShellLimits:
    """Per-process rlimits of the shell and everything it starts, and the sizes of its writable places."""

    memory_mb: int = 1024
    max_processes: int = 32
    max_file_mb: int = 16
    max_open_files: int = 256
    cpu_seconds: int = 30  # each process's RLIMIT_CPU, and all of them together during one command
    app_mb: int = 64  # the /app tmpfs
    tmp_mb: int = 64  # the /tmp and /dev/shm tmpfs

    @property
    def max_inodes(self) -> int:
        """Files (and directories) on each writable tmpfs: 256 per MiB of its size, at least 4096."""
        return max(4096, 256 * max(self.app_mb, self.tmp_mb))

    def rlimits(self, extra_processes: int) -> dict[str, int]:
        return {
            "RLIMIT_AS": self.memory_mb * policy.MIB,
            "RLIMIT_NPROC": self.max_processes + extra_processes,
            "RLIMIT_FSIZE": self.max_file_mb * policy.MIB,
            "RLIMIT_NOFILE": self.max_open_files,
            "RLIMIT_CORE": 0,
            "RLIMIT_CPU": self.cpu_seconds,
        }


@dataclass
class CommandResult:
    """One command (or the checker): ``lost`` means the sandbox itself is gone (the agent may have
    killed its supervisor, or it missed its deadline): the episode cannot go on."""

    output: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    truncated: bool = False
    shell_exited: bool = False
    restarted: bool = False
    limit: str | None = None  # "memory", "files" or "cpu": the sandbox's processes together went over a limit
    lost: str | None = None
    infra_error: str | None = None  # the sandbox could not start or broke its protocol: not the agent's doing


MAX_REPLY_BYTES_OVER_OUTPUT = 64 * 1024  # a reply's JSON beyond its output's own escaped size
# What each supervisor reply must hold: key -> the types its value may have (and nothing else).
_INT_OR_NONE = (int, type(None))
RUN_REPLY = {
    "output": (str,), "exit_code": _INT_OR_NONE, "timed_out": (bool,), "shell_exited": (bool,),
    "truncated": (bool,), "restarted": (bool,), "limit": (str, type(None)),
}  # fmt: skip
CHECK_REPLY = {"output": (str,), "exit_code": _INT_OR_NONE, "timed_out": (bool,)}
HELLO_REPLY = {"op": (str,), "pid": (int,)}
FAILED_REPLY = {"failed": (str,)}  # the supervisor could not set up a process of the agent's: an infra error
LIMITS = frozenset({"memory", "files", "cpu"})
MAX_EXIT_CODE = 255  # an exit code (or minus a signal number) is within +-255; anything else is not the supervisor's


def validate_reply(reply: Any, schema: dict[str, tuple[type, ...]]) -> str | None:
    """Why ``reply`` is not a reply of ``schema``'s shape, or None when it is."""
    if not isinstance(reply, dict):
        return f"a {type(reply).__name__}, not an object"
    if set(reply) != set(schema):
        unknown, missing = sorted(set(reply) - set(schema)), sorted(set(schema) - set(reply))
        return f"keys {unknown} unknown, {missing} missing"[:200]
    for key, types in schema.items():
        value = reply[key]
        if not isinstance(value, types) or (bool in types) != isinstance(value, bool):
            return f"{key!r} is a {type(value).__name__}"
    if reply.get("limit") is not None and reply["limit"] not in LIMITS:
        return "an unknown limit"
    if reply.get("exit_code") is not None and not -MAX_EXIT_CODE <= reply["exit_code"] <= MAX_EXIT_CODE:
        return "'exit_code' is out of range"
    return None


def interpreter_binds() -> list[str]:
    """bwrap options that put each interpreter directory under ``/tmp`` on a read-only tmpfs of its own.

    The sandbox policy binds the interpreter's directories at their host paths; one under ``/tmp`` lands
    on the sandbox's writable ``/tmp``, below directories bwrap makes there, which belong to the agent's
    uid when the host is not root: the agent could move them away and put a program of its own where the
    interpreter was. Here the topmost such directory becomes a read-only tmpfs (a mount point: it cannot
    be moved or written) holding only the read-only binds again."""
    tops: dict[str, list[str]] = {}
    for directory in policy.kept_under_tmp():
        tops.setdefault("/" + "/".join(Path(directory).parts[1:3]), []).append(directory)
    binds: list[str] = []
    for top, directories in tops.items():
        binds += ["--perms", "0755", "--tmpfs", top]
        made = {top}
        for directory in directories:
            for parent in reversed(Path(directory).parents):
                if str(parent).startswith(top + "/") and str(parent) not in made:
                    made.add(str(parent))
                    binds += ["--perms", "0755", "--dir", str(parent)]
            binds += ["--ro-bind", directory, directory]
        binds += ["--remount-ro", top]
    return binds


class ShellSandbox:
    """One bubblewrap sandbox with the task's files in ``/app`` and a persistent shell in it.

    ``files``: ``(relative path, text, mode)`` triples written into ``/app`` at start.
    """

    def __init__(self, files: list[tuple[str, str, int]], limits: ShellLimits = ShellLimits(), output_bytes: int = 4096):
        self.files, self.limits, self.output_bytes = files, limits, output_bytes
        self.proc: subprocess.Popen[bytes] | None = None
        self.init_pidfd: int | None = None
        self.init_pid: int | None = None  # the supervisor's host pid (the sandbox's pid 1), once known
        self.tag = ""
        self._finalizer: weakref.finalize | None = None

    # -- start-up
    def start(self) -> ShellSandbox:
        """Start the sandbox and wait for its supervisor's greeting (:class:`SandboxUnavailable` when it
        cannot start)."""
        root = os.geteuid() == 0
        self.tag = host.owner.worker_tag()  # the reaper ends whatever carries it once this process is gone
        config = {
            "app": APP,
            "agent_uid": policy.SANDBOX_UID if root else None,
            # The uid's own count: the supervisor shares it when the host is not root.
            "limits": self.limits.rlimits(extra_processes=0 if root else 1),
            "memory_mb": self.limits.memory_mb,
            "cpu_seconds": self.limits.cpu_seconds,
            "max_inodes": self.limits.max_inodes,
            "confine": f"{policy.WORKER_MOUNT}/confine.py",
            "output_bytes": self.output_bytes,
            "env": SHELL_ENV,
            "files": self.files,
            "owner": self.tag,
        }
        info_r, info_w = os.pipe()
        ns_fd = helper = None
        pass_fds: tuple[int, ...] = (info_w,)
        try:
            if root:
                helper, ns_fd = policy.user_namespace_as_root()
                pass_fds = (ns_fd, info_w)
            binds = ["--ro-bind", str(SUPERVISOR_DIR), SUPERVISOR_MOUNT, "--size", str(self.limits.app_mb * policy.MIB), "--perms", "0755", "--tmpfs", APP]
            binds += interpreter_binds()
            argv = [*policy.bwrap_argv(self.limits.tmp_mb, ns_fd, info_w, binds=binds, as_pid_1=True), policy.sandbox_python(), "-I", "-S"]
            if not root:  # namespace root has every capability already; a host user's supervisor needs these two
                argv[1:1] = ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"]
            argv.append(f"{SUPERVISOR_MOUNT}/supervisor.py")
            argv.append(json.dumps(config))
            self.proc = host.spawner.popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                pass_fds=pass_fds,
                start_new_session=True,  # one killpg ends bwrap and what is in its group
                cwd="/",
            )
        finally:
            host.close_fds([info_w])
            if ns_fd is not None:
                os.close(ns_fd)
            if helper is not None:
                helper.stdin.close()  # type: ignore[union-attr]
                helper.wait()
        self._finalizer = weakref.finalize(self, _kill, self.proc, [None])
        os.set_blocking(self.proc.stdout.fileno(), False)  # type: ignore[union-attr]
        self._buffer = b""
        hello = self._reply(time.monotonic() + START_TIMEOUT_S)
        self._find_init(info_r)
        if isinstance(hello, str) or validate_reply(hello, HELLO_REPLY) is not None:
            hello = None
        if hello is None:
            stderr = b""
            if self.proc.poll() is not None:
                stderr = self.proc.stderr.read() or b""  # type: ignore[union-attr]
            self.close()
            raise policy.SandboxUnavailable(f"the terminal sandbox did not start: {stderr.decode(errors='replace').strip()[:300]!r}")
        self.proc.stderr.close()  # type: ignore[union-attr]
        return self

    def _find_init(self, info_r: int) -> None:
        """bwrap's ``--info-fd`` names the sandbox's init (the supervisor): keep a pidfd, to end its namespace
        for sure. It is ours when its parent is our bwrap (its command line is blanked)."""
        try:
            data = b""
            while chunk := os.read(info_r, 4096):
                data += chunk
            pid = int(json.loads(data)["child-pid"])
            pidfd = os.pidfd_open(pid)
        except (ValueError, KeyError, TypeError, OSError):
            return
        finally:
            os.close(info_r)
        if self.proc is not None and _parent_of(pid) == self.proc.pid:
            self.init_pidfd, self.init_pid = pidfd, pid
            if self._finalizer is not None:
                self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _kill, self.proc, [pidfd])
        else:
            os.close(pidfd)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- talking
    def _reply(self, deadline: float) -> Any:
        """The supervisor's next JSON line (any JSON value), None when it is gone or late, or why it is
        not a reply (a string: too long, not JSON)."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        most = 6 * self.output_bytes + MAX_REPLY_BYTES_OVER_OUTPUT  # JSON's \uXXXX is 6 bytes per byte at worst
        while b"\n" not in self._buffer:
            if len(self._buffer) > most:
                return f"a reply over {most} bytes"
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not host.wait_readable(fd, remaining):
                return None
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        if len(line) > most or self._buffer:  # one reply per request: more is not the supervisor's
            return f"a reply over {most} bytes" if len(line) > most else "more than one reply"
        try:
            return json.loads(line)
        except ValueError:
            return "not JSON"

    def _call(self, request: dict[str, Any], timeout: float, schema: dict[str, tuple[type, ...]]) -> dict[str, Any] | CommandResult:
        """One request; the reply, or a CommandResult saying why the sandbox is lost (it is then closed)."""
        if not self.alive:
            self.close()
            return CommandResult(lost="the sandbox is gone")
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (OSError, ValueError):
            self.close()
            return CommandResult(lost="the sandbox's supervisor is gone")
        reply = self._reply(time.monotonic() + timeout + REPLY_MARGIN_S)
        if reply is None:
            why = "the sandbox's supervisor died" if not self.alive else "the sandbox's supervisor did not answer in time"
            self.close()
            return CommandResult(lost=why)
        if isinstance(reply, dict) and validate_reply(reply, FAILED_REPLY) is None:
            self.close()
            return CommandResult(lost="the sandbox could not start a process", infra_error=f"the terminal sandbox failed: {reply['failed'][:300]}")
        invalid = reply if isinstance(reply, str) else validate_reply(reply, schema)
        if invalid is not None:
            self.close()
            return CommandResult(lost="the sandbox broke its protocol", infra_error=f"the terminal sandbox sent an invalid reply ({invalid})")
        return reply

    def run(self, command: str, timeout: float) -> CommandResult:
        """Run ``command`` in the episode's shell with a wall-clock limit of ``timeout`` seconds."""
        reply = self._call({"op": "run", "command": command, "timeout": timeout}, timeout, RUN_REPLY)
        return reply if isinstance(reply, CommandResult) else CommandResult(**reply)

    def check(self, checks: list[dict[str, Any]], timeout: float) -> CommandResult:
        """Kill every process of the agent's, then have the supervisor evaluate ``checks`` (see
        :mod:`.tasks`): exit code 0 when all pass. They reach the sandbox only now, on the supervisor's
        private pipe."""
        reply = self._call({"op": "check", "checks": checks, "timeout": timeout}, timeout, CHECK_REPLY)
        return reply if isinstance(reply, CommandResult) else CommandResult(**reply)

    # -- ending
    def close(self) -> None:
        """End every process of the sandbox and wait until they are gone. Safe to call twice."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self.init_pidfd = None
        if self.proc is not None:
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass


def _kill(proc: subprocess.Popen[bytes], init_pidfd: list[int | None]) -> None:
    """SIGKILL bwrap's group, bwrap and the sandbox's init (whose death ends its pid namespace); wait."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.kill()
        except OSError:
            pass
    pidfd = init_pidfd[0]
    if pidfd is not None:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(timeout=host.KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        pass
    if pidfd is not None:
        host.wait_readable(pidfd, host.KILL_WAIT_S)
        os.close(pidfd)


def cpu_seconds_for(timeout: float) -> int:
    """RLIMIT_CPU for a command time limit: the Python tool's rule (the limit rounded up, plus one)."""
    return math.ceil(timeout) + 1


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def living_sandbox_processes() -> list[int]:
    """The processes of this process's terminal sandboxes still alive (bwrap, and the supervisor, its
    child, whose command line is blanked): what ``close()`` ends. The Python tool's workers carry the
    same owner tag; they are not counted."""
    owner_prefix = host.owner.tag() + "/"
    marker = f"{SUPERVISOR_MOUNT}/supervisor.py".encode()
    living = []
    for pid in reaper.find_processes(owner_prefix):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                living.append(pid)
        except OSError:  # gone meanwhile
            pass
    bwraps = set(living)
    for name in os.listdir("/proc"):
        if name.isdigit() and _parent_of(int(name)) in bwraps:
            living.append(int(name))
    return living
