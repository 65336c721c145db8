"""The warm worker of the Python sandbox. Standard library only.

It runs inside the bubblewrap sandbox (or, with ``isolation="none"``, as a plain process), started
by :mod:`gem_core.tools.python` as ``python -I -c <this source> <config json>``, with a Unix
SOCK_SEQPACKET socket to the host as its stdin. Three kinds of process live in it:

* the **manager** (this process): imports the common modules, prepares what every child inherits,
  then forks the zygotes once. Per call it ends the last child, kills every process left in the
  sandbox, wipes the writable places and System V IPC, and asks a zygote for the next child.
* one **zygote** per kind of child: "lean" (the common modules) and, when heavy modules such as
  numpy are preloaded, "heavy" (forked after importing them). A zygote only forks children and
  ends them. It does as little else as it can, because after each fork every page it writes is
  copied. Fork and exit cost grows with the forking process's pages and memory mappings: numpy
  doubles them, so calls that do not need it fork the lean zygote (and the manager imports what
  only it needs, such as shutil, after the zygotes exist). A zygote forks with libc's fork, not
  ``os.fork``: CPython's after-fork work in the child concerns other threads, which a zygote has
  none of, and random's reseed, which the zygote does itself before each fork.
* the **child**: forked ahead of its request. It isolates itself in its own session/process
  group, in a fresh temp dir, under rlimits, and waits for its code on a pipe.

The manager hands the child's pipe ends (request in; stdout, stderr and exit report out) and a
pidfd to the host over the socket (SCM_RIGHTS). A call never passes through the worker: the host
writes the code to the child and reads its output directly. Because every call is a fresh fork of
the same warm zygote, nothing a snippet does to Python state reaches the next call.

Control messages from and to the host are JSON, one per socket message. The request on the
child's pipe is binary (see ``recv_request``).
"""

import builtins
import contextlib
import ctypes
import fcntl
import functools
import gc
import importlib.util
import io
import json
import linecache
import os
import resource
import signal
import socket
import struct
import sys
import time
import traceback

CONFIG = json.loads(sys.argv[1])
SANDBOXED = CONFIG["sandboxed"]  # inside bwrap's pid namespace: /proc lists only the sandbox's processes
TMP_ROOT = CONFIG["tmp_root"]  # a private writable dir, emptied after every call
EXTRA_WIPE = CONFIG.get("extra_wipe", [])  # other writable places (/dev/shm, /dev/mqueue)
KEEP = frozenset(CONFIG.get("keep", []))  # paths under the wiped places that are mounts, not state
SNIPPET_UID = CONFIG.get("snippet_uid")  # set when the worker is ns-root: snippets run as this uid
# Modules preloaded only in the heavy zygote: those installed (found before the lean zygote is
# forked, so that its children's process limit counts the heavy zygote only when there is one).
HEAVY = [name for name in CONFIG.get("heavy", []) if importlib.util.find_spec(name.split(".")[0]) is not None]
# Processes of the snippet's uid that are not the snippet's: bwrap's init and the manager, plus the
# zygotes when they share the uid (without snippet_uid everything in the sandbox has one uid).
NPROC_BASE = CONFIG.get("nproc_base", 0) + (1 + bool(HEAVY) if SNIPPET_UID is None and CONFIG["sandboxed"] else 0)
LIMITS = CONFIG["limits"]  # memory_bytes, max_processes, max_file_bytes, max_open_files
SNIPPET_NAME = "<python>"

_libc = ctypes.CDLL(None, use_errno=True)
_libc_fork = ctypes.PyDLL(None, use_errno=True).fork
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


def recv_request(fd):
    """The host's request, ``(code, cpu_seconds)``; None when the host closed the pipe instead.

    Framed as a big-endian 4-byte length and 4-byte CPU seconds, then the code in UTF-8 (lone
    surrogates passed through): no JSON in the child, whose every new page of work is a fault."""
    head = _read_exact(fd, 8)
    if head is None:
        return None
    size, cpu_seconds = struct.unpack(">II", head)
    body = _read_exact(fd, size)
    return None if body is None else (body.decode("utf-8", "surrogatepass"), cpu_seconds)


def tell(ctl, obj, fds=()):
    """One control message to the host, with file descriptors attached when given."""
    socket.send_fds(ctl, [json.dumps(obj).encode()], list(fds))


def tell_ready(ctl, kind, fds):
    """{"ready": true, "kind": kind} with the child's pipe ends and pidfd: the message of every call."""
    socket.send_fds(ctl, [_ready_message(kind)], fds)


@functools.lru_cache(maxsize=None)
def _ready_message(kind):
    return json.dumps({"ready": True, "kind": kind}).encode()


def hear(ctl):
    """The host's next control message, or None when it has gone."""
    data = ctl.recv(65536)
    return dict(_parsed(data)) if data else None


@functools.lru_cache(maxsize=64)
def _parsed(data):
    return json.loads(data)  # the host's messages are a few distinct ones: each parsed once


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
    sys.path.insert(0, WORKDIR)  # as `python file.py` puts the script's dir first
    # The worker's environment is already the sandbox's (bwrap --clearenv --setenv ...).
    os.environ.update(HOME=WORKDIR, TMPDIR=WORKDIR, PWD=WORKDIR)
    os.umask(0o077)
    _warm_up()


def prepare_child():
    """In a child forked ahead of any request: isolate it, then wait for the snippet. Never returns.

    Everything that does not depend on the request is done before it arrives, so a call costs no
    fork and no set-up; what does not differ between children was done once in the manager, and
    the zygote forked it with its pipes already on 0-4.
    """
    exit_code = 1
    try:
        os.setsid()  # own session and process group: killpg reaches everything it spawns
        if SNIPPET_UID is not None:
            os.setgroups([])
            os.setresgid(SNIPPET_UID, SNIPPET_UID, SNIPPET_UID)
            os.setresuid(SNIPPET_UID, SNIPPET_UID, SNIPPET_UID)
        os.chdir(WORKDIR)
        _clear_keyrings()
        os.closerange(STATUS_FD + 1, _MAXFD)  # the worker's sockets and pipes must not reach the snippet
        # The limits that do not depend on the request, set before it comes (CPU time follows it).
        nproc = LIMITS["max_processes"] + (NPROC_BASE if SANDBOXED else _nproc_in_use())
        _set_limit(resource.RLIMIT_NPROC, nproc)
        _set_limit(resource.RLIMIT_AS, LIMITS["memory_bytes"])
        _set_limit(resource.RLIMIT_FSIZE, LIMITS["max_file_bytes"])
        _set_limit(resource.RLIMIT_NOFILE, LIMITS["max_open_files"])
        _set_limit(resource.RLIMIT_CORE, 0)
        _warm_up()  # again, to take the copy-on-write faults of a call now rather than while the caller waits
        request = recv_request(REQ_FD)  # length-prefixed: one wake-up, no waiting for the writer to close
        os.close(REQ_FD)
        if request is None:  # the worker is shutting down
            os._exit(0)
        code, cpu_seconds = request
        _set_limit(resource.RLIMIT_CPU, cpu_seconds, cpu_seconds + 1)
        exit_code = run_snippet(code)
    except BaseException as exc:  # noqa: BLE001 - set-up failed: say so on stderr
        with contextlib.suppress(OSError):
            os.write(2, f"sandbox set-up failed: {exc!r}\n".encode())
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001, S110 - a closed or broken stream cannot be helped
                pass
        # Tell the host we are done: it must not wait for EOF, a leftover process may hold the pipes.
        try:
            os.write(STATUS_FD, struct.pack(">i", exit_code))
        except OSError:
            pass
        os._exit(exit_code)


def _warm_up():
    """Run what a call runs (read its request, compile and exec, write to the streams): in the
    worker, so that lazily made state (the compiler's, above all: 2 ms and 200 page faults in a
    child the first time) is made once; in a child, to take the copy-on-write faults of a call
    before the caller waits. Nothing more: each extra step costs every child faults of its own
    (json.dumps and getrlimit here cost 0.3 ms of CPU per call)."""
    struct.unpack(">II", bytes(8))
    b"x".decode("utf-8", "surrogatepass")
    exec(compile("_ = [str(i) for i in range(3)]\n", SNIPPET_NAME, "exec"), {"__builtins__": builtins})  # noqa: S102
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


# -- the manager: cleaning up after a call ----------------------------------------------------------


def _other_pids(spare):
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            pid = int(name)
            if pid not in spare:
                pids.append(pid)
    return pids


def _is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True  # gone


def sweep_processes(spare):
    """Kill every process in the sandbox but those in ``spare`` (init, the manager, the zygotes);
    True when none is left. (kill(-1) would spare only init and the caller.)"""
    if not SANDBOXED:
        return True
    for attempt in range(500):
        if _reap() & spare:
            # A zygote died (a snippet of its uid killed it). Its pid is free for a snippet's process
            # to take, which the sweep would then spare: this sandbox is not clean any more.
            return False
        others = _other_pids(spare)
        if not others:
            return True
        if attempt > 50 and not [pid for pid in others if not _is_zombie(pid)]:
            return True  # only zombies that init has not reaped yet
        for pid in others:  # SIGKILL stops a process at once: it cannot fork after this
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.0005 if attempt < 20 else 0.005)
    return False


def _reap():
    """The manager's own children are the zygotes: reap those that died; their pids."""
    reaped = set()
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.add(pid)


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
                # Imported here, in the manager after the zygotes were forked: shutil brings zlib,
                # bz2 and lzma, 40 memory mappings that made every fork and exit dearer.
                import shutil

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


_IPC_INFO = ctypes.create_string_buffer(64)  # struct shm_info, msginfo or seminfo


def _sysv_ipc_in_use():
    """Whether any System V object exists in our IPC namespace: three syscalls (SHM_INFO, MSG_INFO,
    SEM_INFO report the counts), where reading /proc/sysvipc cost 120 us per call."""
    for query, offset in (
        (lambda: _libc.shmctl(0, 14, _IPC_INFO), 0),  # SHM_INFO: shm_info.used_ids
        (lambda: _libc.msgctl(0, 12, _IPC_INFO), 0),  # MSG_INFO: msginfo.msgpool, the queues
        (lambda: _libc.semctl(0, 0, 19, _IPC_INFO), 28),  # SEM_INFO: seminfo.semusz, the sets
    ):
        if query() < 0 or struct.unpack_from("i", _IPC_INFO, offset)[0]:
            return True  # some exist, or the count could not be read
    return False


def clear_sysv_ipc():
    """Shared memory, message queues and semaphore sets live in the sandbox's IPC namespace."""
    if not SANDBOXED or not _sysv_ipc_in_use():
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


def make_workdir():
    os.mkdir(WORKDIR, 0o700)
    if SNIPPET_UID is not None:
        os.chown(WORKDIR, SNIPPET_UID, SNIPPET_UID)


def clean_up(spare):
    """After a call: no process but ``spare``, nothing in the writable places, a fresh WORKDIR."""
    clean = sweep_processes(spare)
    clean = wipe(WORKDIR, keep_dir=False) and clean
    clean = wipe(TMP_ROOT, keep_dir=True) and clean
    for path in EXTRA_WIPE:
        clean = wipe(path, keep_dir=True) and clean
    clean = clear_sysv_ipc() and clean
    if clean:
        make_workdir()
    return clean


def _ended(wait_status):
    """How a child ended, from its wait status, as {"exit_code", "signal"}."""
    if os.WIFSIGNALED(wait_status):
        return {"exit_code": None, "signal": os.WTERMSIG(wait_status)}
    return {"exit_code": os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None, "signal": None}


# -- the zygote: forks children ---------------------------------------------------------------------

FORK, END = b"f", b"e"  # the manager's two commands to a zygote
_FDS_PER_CHILD = 4  # the host's ends of the child's pipes: w_req, r_out, r_err, r_status


class Zygote:
    """The manager's handle on a zygote: a process forked once that then forks the children."""

    def __init__(self, devnull, close_in_zygote):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            for sock in (self.sock, *close_in_zygote):  # ours, the host's, other zygotes'
                os.close(sock.detach())
            serve_forks(theirs, devnull)
        theirs.close()
        self.pid = pid

    def fork_child(self):
        """A new child's pipe ends and a pidfd (the caller closes them)."""
        self.sock.send(FORK)
        data, fds, _, _ = socket.recv_fds(self.sock, 4, _FDS_PER_CHILD)
        try:
            if len(data) != 4 or len(fds) != _FDS_PER_CHILD:
                raise OSError("the zygote sent no child")
            # Opened here, not in the zygote: the child stays a zombie until the zygote reaps it,
            # so its pid cannot be reused before this.
            return [*fds, os.pidfd_open(struct.unpack(">i", data)[0])]
        except OSError:
            for fd in fds:
                os.close(fd)
            raise

    def end_child(self):
        """Kill the current child (and its process group), reap it; how it ended."""
        self.sock.send(END)
        data = self.sock.recv(4)
        if len(data) != 4:
            raise OSError("the zygote is gone")
        return _ended(struct.unpack(">i", data)[0])


def serve_forks(sock, devnull):
    """A zygote's loop. Never returns.

    After each fork every page of this process is shared with the child, so each page written here
    afterwards is copied: this loop touches as little as it can (no JSON, no cleanup work)."""
    for stream in (sys.stdout, sys.stderr):  # nothing of ours may sit in a child's buffers
        stream.flush()
    # Our own descriptors move above 4, and /dev/null fills 0-4: pipes made later then get numbers
    # above 4, and each child's ends are put on 0-4 just before it is forked (see fork_child).
    sock = socket.socket(fileno=_above_child_fds(sock.detach()))
    devnull = _above_child_fds(devnull)
    for fd in range(STATUS_FD + 1):
        os.dup2(devnull, fd)
    fork, reseeders = _fork_function(), _reseeders()
    pid = None
    for_host = []  # our copies of the host's ends of the current child's pipes
    while True:
        command = sock.recv(1)
        if command == FORK:
            pid, for_host, message = fork_child(fork, reseeders)
            sock.sendmsg(*message)
        elif command == END and pid is not None:
            _kill_group(pid)
            wait_status = os.waitpid(pid, 0)[1]
            for fd in for_host:  # closed now, with the child gone, where a write costs no copy
                os.close(fd)
            pid = None
            sock.send(struct.pack(">i", wait_status))
        else:  # the manager is gone: so is the sandbox
            if pid is not None:
                _kill_group(pid)
            os._exit(0)


def fork_child(fork, reseeders):
    """Fork a child that prepares itself and waits for its request: its pid, the host's ends of its
    pipes, and the message that hands them to the manager (made before the fork: while the child
    lives, each page the zygote writes is copied)."""
    for reseed in reseeders:
        reseed()
    r_req, w_req = os.pipe()
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    r_status, w_status = os.pipe()
    # The child's ends go on 1-4 here (0 is /dev/null), so the child has none to move: in the
    # child, each Python call costs copy-on-write faults; here the same calls cost far less.
    for target, fd in enumerate((w_out, w_err, r_req, w_status), start=1):
        os.dup2(fd, target)  # they stay here until the next fork replaces them
        os.close(fd)
    for_host = [w_req, r_out, r_err, r_status]
    pid_bytes = bytearray(4)
    message = ([pid_bytes], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("4i", *for_host))])
    pid = fork()
    if pid == 0:
        prepare_child()  # never returns
    struct.pack_into(">i", pid_bytes, 0, pid)
    return pid, for_host, message


def _above_child_fds(fd):
    """``fd`` moved to a number above the child's five (0-4)."""
    if fd > STATUS_FD:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, STATUS_FD + 1)
    os.close(fd)
    return moved


def _reseeders():
    """What gives each child a fresh random state: the zygote's fork skips CPython's at-fork hooks,
    random's reseed among them, and numpy's global RNG has none. (Looked up once: each lookup in
    the zygote's loop writes pages that the next fork write-protects again.)"""
    return [module.seed for module in (sys.modules.get("random"), sys.modules.get("numpy.random")) if module]


def _fork_without_hooks():
    """fork(2) without CPython's after-fork work in the child: it cost about 250 us and 70
    copy-on-write page faults per child, and what it does (drop other threads' state, run the
    at-fork hooks) matters only with other threads, and for random's reseed, which the zygote does
    itself. The GIL stays held across the call (PyDLL)."""
    pid = _libc_fork()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork failed")
    return pid


def _fork_function():
    """A zygote has one thread (fork copies only the caller's): it forks without hooks, unless a
    thread was started in it after all."""
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        return os.fork
    return _fork_without_hooks


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)  # the child leads its own group once it has called setsid
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)  # it has not yet
        except (ProcessLookupError, PermissionError):
            pass


# -- the manager -------------------------------------------------------------------------------------


def preload(names):
    loaded = []
    for name in names:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001, S112 - a module that is not installed is simply not preloaded
            continue
        loaded.append(name)
    return loaded


def start_zygote(devnull, close_in_zygote):
    gc.collect()
    gc.freeze()  # forked children then do not touch (and copy) the preloaded objects' pages
    return Zygote(devnull, close_in_zygote)


def hand_over(ctl, zygote, kind):
    """Have ``zygote`` fork the next child and send the host its pipe ends and pidfd; keep none of
    them: the host alone talks to the child. (The zygote holds copies until it ends the child, so
    a child is never ended by EOF on its request pipe, only by the zygote.)"""
    fds = zygote.fork_child()
    try:
        for fd in fds[:3]:  # w_req, r_out, r_err: the host never blocks on them (setting this is its work saved)
            os.set_blocking(fd, False)
        tell_ready(ctl, kind, fds)
    finally:
        for fd in fds:
            os.close(fd)


def main():
    ctl = socket.socket(fileno=os.dup(0))  # the host's end is a SOCK_SEQPACKET pair: one message each
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # a stray print of the worker's must not reach anyone
    loaded = preload(CONFIG.get("preload", []))
    # PR_SET_DUMPABLE=0: a snippet of the same uid cannot ptrace us or write our memory.
    _libc.prctl(4, 0, 0, 0, 0)
    prepare_for_children()
    make_workdir()
    zygotes = {"lean": start_zygote(devnull, [ctl])}
    heavy = preload(HEAVY)
    if heavy:
        zygotes["heavy"] = start_zygote(devnull, [ctl, zygotes["lean"].sock])
    spare = {1, os.getpid()} | {zygote.pid for zygote in zygotes.values()}
    tell(ctl, {"ready": True, "pid": os.getpid(), "uid": os.getuid(), "preloaded": loaded + heavy, "kinds": list(zygotes)})
    os.dup2(devnull, 2)
    kind = "lean"
    try:
        hand_over(ctl, zygotes[kind], kind)
    except OSError:
        tell(ctl, {"ready": False})
        return
    while True:
        # {"done": true, "report": bool, "next": kind}: the host has what it wanted from the child (it
        # may have killed it, or not used it); "report" when it wants to know how the child ended;
        # "next", the kind of child to make ready.
        message = hear(ctl)
        try:
            ended = zygotes[kind].end_child()
        except OSError:  # a snippet killed its zygote: this sandbox cannot go on
            ended = None
        if message is None:  # the host closed the sandbox
            for zygote in zygotes.values():
                zygote.sock.close()
            clean_up(spare)
            return
        if message.get("report"):
            tell(ctl, {"ended": True, **(ended or {"exit_code": None, "signal": None})})
        kind = message.get("next") if message.get("next") in zygotes else "lean"
        try:
            clean = ended is not None and clean_up(spare)
            if clean:
                hand_over(ctl, zygotes[kind], kind)
        except Exception:  # noqa: BLE001 - a zygote gone, or a wipe that failed: not clean
            clean = False
        if not clean:
            tell(ctl, {"ready": False})
            return


if __name__ == "__main__":
    main()
