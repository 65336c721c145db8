"""The warm worker ("zygote") of the Python sandbox. Standard library only.

It runs inside the bubblewrap sandbox (or, with ``isolation="none"``, as a plain process), started
by :mod:`gem_core.tools.python` as ``python -I -c <this source> <config json>``, with a Unix
SOCK_SEQPACKET socket to the host as its stdin. It imports the common modules once, then forks
a child ahead of each request: the child isolates itself in its own session/process group, in a
fresh temp dir, under rlimits, and waits for its code on a pipe. The worker hands the child's pipe
ends (request in; stdout, stderr and exit report out) and a pidfd to the host over the socket
(SCM_RIGHTS), so a call never passes through the worker: the host writes the code to the child and
reads its output directly. When the host says it is done, the worker kills every process left in
the sandbox, wipes the writable places and System V IPC, forks the next child and hands it over.
Because every call is a fresh fork of the same warm process, nothing a snippet does to Python state
reaches the next call.

Control messages are JSON, one per socket message. The request on the child's pipe is a 4-byte
big-endian length followed by UTF-8 JSON.
"""

import builtins
import contextlib
import ctypes
import gc
import io
import json
import linecache
import os
import resource
import shutil
import signal
import socket
import struct
import sys
import time
import traceback

CONFIG = json.loads(sys.argv[1])
SANDBOXED = CONFIG["sandboxed"]  # inside bwrap's pid namespace: kill(-1) reaches only the sandbox
TMP_ROOT = CONFIG["tmp_root"]  # a private writable dir, emptied after every call
EXTRA_WIPE = CONFIG.get("extra_wipe", [])  # other writable places (/dev/shm, /dev/mqueue)
KEEP = frozenset(CONFIG.get("keep", []))  # paths under the wiped places that are mounts, not state
SNIPPET_UID = CONFIG.get("snippet_uid")  # set when the worker is ns-root: snippets run as this uid
NPROC_BASE = CONFIG.get("nproc_base", 0)  # processes of the snippet's uid that are not the snippet's
LIMITS = CONFIG["limits"]  # memory_bytes, max_processes, max_file_bytes, max_open_files
SNIPPET_NAME = "<python>"

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall  # looked up here: ctypes makes the function object on first access
_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)  # keyctl's syscall number
_MAXFD = max(64, min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 65536))
REQ_FD, STATUS_FD = 3, 4  # in the child: the request arrives on 3, the exit code leaves on 4
WORKDIR = os.path.join(TMP_ROOT, "work")  # the snippet's cwd, HOME and TMPDIR; made anew for each child


# -- framing ---------------------------------------------------------------------------------------


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


def tell(ctl, obj, fds=()):
    """One control message to the host, with file descriptors attached when given."""
    socket.send_fds(ctl, [json.dumps(obj).encode()], list(fds))


def hear(ctl):
    """The host's next control message, or None when it has gone."""
    data = ctl.recv(65536)
    return json.loads(data) if data else None


# -- the child: runs one snippet -------------------------------------------------------------------


def _set_limit(which, soft, hard=None):
    if soft is None:
        return
    hard = soft if hard is None else hard
    try:
        resource.setrlimit(which, (soft, hard))
    except (ValueError, OSError):
        resource.setrlimit(which, (soft, soft))


def _clear_keyrings():
    """Keyrings of the snippet's uid outlive a process; drop whatever an earlier call left."""
    if _KEYCTL is None:
        return
    for keyring in (-4, -5):  # KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING
        _syscall(_KEYCTL, 7, keyring)  # KEYCTL_CLEAR; an error (no keyring) is fine


def _nproc_in_use():
    """Processes of our uid on the host (isolation="none" only: the rlimit counts them all)."""
    uid, count = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat("/proc/" + name).st_uid == uid
            except OSError:
                pass
    return count


def prepare_for_children():
    """In the worker, once: the state every child needs that no call changes (signal dispositions,
    the standard streams' objects, the environment, a warmed-up compiler). Children inherit it
    through fork. Each Python object a child makes costs it copy-on-write page faults, and making
    these in every child cost about 0.5 ms of CPU per call."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write raises EFBIG instead of killing
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as in a normal Python: BrokenPipeError
    # Bound to fd numbers 0-2, which each child points at its own pipes; the worker's are /dev/null
    # (so a stray print of the worker's reaches no one), and it flushes them before every fork.
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
    sys.argv = [SNIPPET_NAME]
    # The worker's environment is already the sandbox's (bwrap --clearenv --setenv ...).
    os.environ.update(HOME=WORKDIR, TMPDIR=WORKDIR, PWD=WORKDIR)
    _warm_up()


def prepare_child(r_req, w_out, w_err, w_status, devnull):
    """In a child forked ahead of any request: isolate it, then wait for the snippet. Never returns.

    Everything that does not depend on the request is done before it arrives, so a call costs no
    fork and no set-up; what does not differ between children was done once in the worker.
    """
    exit_code = 1
    try:
        os.setsid()  # own session and process group: killpg reaches everything it spawns
        if SNIPPET_UID is not None:
            os.setgroups([])
            os.setresgid(SNIPPET_UID, SNIPPET_UID, SNIPPET_UID)
            os.setresuid(SNIPPET_UID, SNIPPET_UID, SNIPPET_UID)
        os.chdir(WORKDIR)
        os.umask(0o077)
        _clear_keyrings()
        os.dup2(r_req, _MAXFD - 2)  # parked high so that placing 0-4 below cannot clobber them
        os.dup2(w_status, _MAXFD - 1)
        os.dup2(devnull, 0)
        os.dup2(w_out, 1)
        os.dup2(w_err, 2)
        os.dup2(_MAXFD - 2, REQ_FD)
        os.dup2(_MAXFD - 1, STATUS_FD)
        os.closerange(STATUS_FD + 1, _MAXFD)  # the worker's control pipes must not reach the snippet
        sys.path.insert(0, WORKDIR)
        # The limits that do not depend on the request, set before it comes (CPU time follows it).
        nproc = LIMITS["max_processes"] + (NPROC_BASE if SANDBOXED else _nproc_in_use())
        _set_limit(resource.RLIMIT_NPROC, nproc)
        _set_limit(resource.RLIMIT_AS, LIMITS["memory_bytes"])
        _set_limit(resource.RLIMIT_FSIZE, LIMITS["max_file_bytes"])
        _set_limit(resource.RLIMIT_NOFILE, LIMITS["max_open_files"])
        _set_limit(resource.RLIMIT_CORE, 0)
        if "numpy.random" in sys.modules:  # forked children would otherwise share one global RNG state
            sys.modules["numpy.random"].seed()
        _warm_up()  # again, to take the copy-on-write faults of a call now rather than while the caller waits
        req = recv(REQ_FD)  # length-prefixed: one wake-up, no waiting for the writer to close
        os.close(REQ_FD)
        if req is None:  # the worker is shutting down
            os._exit(0)
        _set_limit(resource.RLIMIT_CPU, req["cpu_seconds"], req["cpu_seconds"] + 1)
        exit_code = run_snippet(req["code"])
    except BaseException as exc:  # noqa: BLE001 - set-up failed: say so on stderr
        with contextlib.suppress(OSError):
            os.write(2, f"sandbox set-up failed: {exc!r}\n".encode())
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):  # a closed or broken stream cannot be helped
                stream.flush()
        # Tell the worker we are done: it must not wait for EOF, a leftover process may hold the pipes.
        with contextlib.suppress(OSError):
            os.write(STATUS_FD, struct.pack(">i", exit_code))
        os._exit(exit_code)


def _warm_up():
    """Run once what a call runs (compile, exec, json, the streams), so that lazily made state (the
    compiler's, above all: 2 ms and 200 page faults in a child the first time) is made in the worker."""
    json.loads(json.dumps({"code": "x", "timeout": 1.0, "env": {"A": "B"}, "max_processes": 1}))
    exec(compile("_ = [str(i) for i in range(3)]\n", SNIPPET_NAME, "exec"), {"__builtins__": builtins})  # noqa: S102
    for which in (resource.RLIMIT_NPROC, resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE):
        resource.getrlimit(which)
    sys.stdout.write("")
    sys.stderr.write("")


def run_snippet(code):
    """Compile and run ``code`` as ``__main__``; the exit code a ``python`` process would have."""
    linecache.cache[SNIPPET_NAME] = (len(code), None, code.splitlines(True), SNIPPET_NAME)
    try:
        compiled = compile(code, SNIPPET_NAME, "exec")
    except (SyntaxError, ValueError) as exc:
        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        return 1
    namespace = {"__name__": "__main__", "__builtins__": builtins, "__file__": SNIPPET_NAME}
    try:
        exec(compiled, namespace)  # noqa: S102 - running the snippet is the point; the sandbox is around us
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        sys.stderr.write(str(exc.code) + "\n")
        return 1
    except BaseException as exc:  # noqa: BLE001 - the snippet's own error: a traceback of its frames only
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))
        return 1


# -- the worker: one request -----------------------------------------------------------------------


def _other_pids(me):
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            pid = int(name)
            if pid != 1 and pid != me:
                pids.append(pid)
    return pids


def _is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True  # gone


def sweep_processes():
    """Kill every process in the sandbox but init and us; True when none is left."""
    me = os.getpid()
    if not SANDBOXED:
        return True
    for attempt in range(500):
        try:
            os.kill(-1, signal.SIGKILL)  # every process we may signal, in our pid namespace only
        except ProcessLookupError:
            pass
        _reap()
        others = _other_pids(me)
        if not others:
            return True
        if attempt > 50 and not [pid for pid in others if not _is_zombie(pid)]:
            return True  # only zombies that init has not reaped yet
        time.sleep(0.0005 if attempt < 20 else 0.005)
    return False


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _make_writable(path):
    for root, dirs, _files in os.walk(path):
        for name in dirs:
            try:
                os.chmod(os.path.join(root, name), 0o700)
            except OSError:
                pass


def wipe(path, keep_dir):
    """Remove everything under ``path`` (and ``path`` itself unless ``keep_dir``). True when done."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return True
    except PermissionError:
        os.chmod(path, 0o700)
        names = os.listdir(path)
    ok = True
    for name in names:
        full = os.path.join(path, name)
        if full in KEEP:  # a read-only bind (the interpreter, when it lives under /tmp)
            continue
        if any(kept.startswith(full + "/") for kept in KEEP):
            ok = wipe(full, keep_dir=True) and ok  # a parent bwrap made for such a bind
            continue
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                try:
                    shutil.rmtree(full)
                except OSError:
                    os.chmod(full, 0o700)
                    _make_writable(full)
                    shutil.rmtree(full)
            else:
                os.unlink(full)
        except OSError:
            ok = False
    if not keep_dir:
        try:
            os.rmdir(path)
        except OSError:
            ok = False
    return ok


def clear_sysv_ipc():
    """Shared memory, message queues and semaphore sets live in the sandbox's IPC namespace."""
    if not SANDBOXED:
        return True
    ok = True
    for kind, remove in (
        ("shm", lambda i: _libc.shmctl(i, 0, None)),  # IPC_RMID == 0
        ("msg", lambda i: _libc.msgctl(i, 0, None)),
        ("sem", lambda i: _libc.semctl(i, 0, 0)),
    ):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            ident = int(row.split()[1])
            if remove(ident) != 0:
                ok = False
    return ok


class Child:
    """A child forked ahead of its request, and the worker's ends of its pipes."""

    def __init__(self, devnull):
        os.mkdir(WORKDIR, 0o700)
        if SNIPPET_UID is not None:
            os.chown(WORKDIR, SNIPPET_UID, SNIPPET_UID)
        for stream in (sys.stdout, sys.stderr):  # nothing of the worker's may sit in a child's buffers
            stream.flush()
        r_req, self.w_req = os.pipe()
        self.r_out, w_out = os.pipe()
        self.r_err, w_err = os.pipe()
        self.r_status, w_status = os.pipe()
        pid = os.fork()
        if pid == 0:
            for fd in (self.w_req, self.r_out, self.r_err, self.r_status):
                os.close(fd)
            prepare_child(r_req, w_out, w_err, w_status, devnull)
        for fd in (r_req, w_out, w_err, w_status):
            os.close(fd)
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)

    def hand_over(self, ctl, clean):
        """Send the host this child's pipe ends and pidfd (with ``{"ready": clean}``); keep none of them:
        the host alone talks to the child, and EOF then reaches whoever waits on a pipe."""
        fds = [self.w_req, self.r_out, self.r_err, self.r_status, self.pidfd]
        tell(ctl, {"ready": clean}, fds)
        for fd in fds:
            os.close(fd)

    def end(self):
        """Make sure the child is dead and reaped; how it ended, as {"exit_code", "signal"}."""
        _kill_group(self.pid)
        _, wait_status = os.waitpid(self.pid, 0)
        self.pid = None
        if os.WIFSIGNALED(wait_status):
            return {"exit_code": None, "signal": os.WTERMSIG(wait_status)}
        return {"exit_code": os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None, "signal": None}

    def finish(self):
        """Kill the child and everything it left, close the pipes, wipe every writable place."""
        if self.pid is not None:
            _kill_group(self.pid)
            os.waitpid(self.pid, 0)
            self.pid = None
        clean = sweep_processes()
        clean = wipe(WORKDIR, keep_dir=False) and clean
        clean = wipe(TMP_ROOT, keep_dir=True) and clean
        for path in EXTRA_WIPE:
            clean = wipe(path, keep_dir=True) and clean
        return clear_sysv_ipc() and clean

def _kill_group(pid):
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


def preload(names):
    loaded = []
    for name in names:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001, S112 - a module that is not installed is simply not preloaded
            continue
        loaded.append(name)
    return loaded


def main():
    ctl = socket.socket(fileno=os.dup(0))  # the host's end is a SOCK_SEQPACKET pair: one message each
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # a stray print of the worker's must not reach anyone
    loaded = preload(CONFIG.get("preload", []))
    # PR_SET_DUMPABLE=0: a snippet of the same uid cannot ptrace us or write our memory.
    _libc.prctl(4, 0, 0, 0, 0)
    prepare_for_children()
    gc.collect()
    gc.freeze()  # forked children then do not touch (and copy) the preloaded objects' pages
    tell(ctl, {"ready": True, "pid": os.getpid(), "uid": os.getuid(), "preloaded": loaded})
    os.dup2(devnull, 2)
    child = Child(devnull)
    child.hand_over(ctl, True)
    while True:
        # {"done": true, "report": bool}: the host has what it wanted from the child (it may have
        # killed it); "report" when it wants to know how the child ended.
        message = hear(ctl)
        ended = child.end()
        if message is None:  # the host closed the sandbox
            child.finish()
            return
        if message.get("report"):
            tell(ctl, {"ended": True, **ended})
        try:
            clean = child.finish()
            child = Child(devnull) if clean else None
        except Exception:  # noqa: BLE001
            clean = False
        if not clean:
            tell(ctl, {"ready": False})
            return
        child.hand_over(ctl, True)


if __name__ == "__main__":
    main()
