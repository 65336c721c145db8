"""The sandbox worker: the program that runs inside bubblewrap. Standard library only.

The host starts it as ``python -I worker.py <config json>`` with its end of a control socket on
stdin (see ``protocol.py`` for the messages). Two kinds of process live here:

* the **manager** (this program's main process) imports the common modules once, then loops:
  fork a **child** for the next call and hand the child's pipes to the host; wait until the host
  is done with it; kill it and whatever it started, reap it; wipe every writable place and the
  System V IPC objects; start again. A manager that cannot prove the sandbox clean says so and
  exits, and the host replaces it.
* the **child** is forked before its request arrives. It drops into its own session (and, when the
  host is root, to the snippet uid), moves into a fresh temp dir, rehearses a call with no output
  (``rehearse``) and waits on its request pipe.
  The host writes the code straight to it and reads its output straight from its pipes. In
  ``tests`` mode the child is a harness: it forks one process per test case, feeds it that case's
  stdin, enforces the case's time limit and reports each case on its stdout.

Every call is a fresh fork of the same warm manager, so nothing a snippet does to Python state
reaches the next call.

One file on purpose (about 600 lines): it is the program bubblewrap runs, started with ``python -I`` on the
standard library alone, so nothing of it can live in a module it would have to import.
"""

import builtins
import contextlib
import ctypes
import gc
import importlib.util
import io
import json
import linecache
import math
import os
import resource
import select
import signal
import socket
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("_gem_sandbox_protocol", os.path.join(HERE, "protocol.py"))
protocol = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(protocol)
_spec = importlib.util.spec_from_file_location("_gem_sandbox_confine", os.path.join(HERE, "confine.py"))
confinement = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(confinement)

CONFIG = json.loads(sys.argv[1])
SANDBOXED = CONFIG["sandboxed"]  # inside bwrap's pid namespace: /proc lists only the sandbox's processes
TMP_ROOT = CONFIG["tmp_root"]  # a private writable dir, emptied after every call
EXTRA_WIPE = CONFIG.get("extra_wipe", [])  # other writable places (/dev/shm, /dev/mqueue)
KEEP = frozenset(CONFIG.get("keep", []))  # paths under the wiped places that are mounts, not state
SNIPPET_UID = CONFIG.get("snippet_uid")  # set when the manager is namespace root: snippets run as this uid
# Processes of the snippet's uid that are not the snippet's (bwrap's init and the manager when they
# share its uid); the snippet's process limit is added on top.
NPROC_BASE = CONFIG.get("nproc_base", 0)
SNIPPET_NAME = "<python>"
REHEARSAL = "_ = str(sum(range(100)))"  # what rehearse() runs: compiles, calls, formats; prints nothing
WORKDIR = os.path.join(TMP_ROOT, "work")  # each call's cwd, HOME and TMPDIR; made anew for each child

# File descriptors in a child: 0-2 the standard streams, then the request pipe and the status pipe.
REQ_FD, STATUS_FD = 3, 4
FIRST_FREE_FD = STATUS_FD + 1
MAXFD = max(64, min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 65536))
REQUEST_CHUNK = 1 << 20  # bytes per read of the request

# Linux constants (<linux/prctl.h>, <linux/keyctl.h>, <linux/ipc.h>, the syscall tables).
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
KEYCTL_CLEAR = 7
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -4, -5
IPC_RMID = 0

SWEEP_ROUNDS = 500  # kill-and-look rounds before the manager gives up on a sandbox
SWEEP_PAUSE_S = 0.002
KILL_WAIT_S = 5.0  # how long the manager waits for a killed child to be reaped

_libc = ctypes.CDLL(None, use_errno=True)
# Looked up here, once: ctypes makes a function object on first lookup, which in a child would be
# made anew (and its pages copied) on every call.
_syscall = _libc.syscall
_prctl = _libc.prctl
MANAGER_PID = os.getpid()


# -- the child -------------------------------------------------------------------------------------


def child_main():
    """In a freshly forked child (pipes on 1-4): isolate, wait for the request, run it. Never returns."""
    exit_code = 1
    try:
        os.setsid()  # own session and process group: killpg reaches everything it spawns
        if SNIPPET_UID is not None:
            os.setgroups([])
            os.setresgid(SNIPPET_UID, SNIPPET_UID, SNIPPET_UID)
            os.setresuid(SNIPPET_UID, SNIPPET_UID, SNIPPET_UID)
        # Die with the manager (after the uid change, which clears it). Without bwrap's pid namespace
        # (isolation="none") nothing else would end a child whose manager was killed mid-call.
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != MANAGER_PID:
            os._exit(1)
        if SANDBOXED:
            # Out of reach of the manager and bwrap's init (whose fd 0 is the host's control socket):
            # no ptrace, /proc/PID/mem or signal across the domain, whatever the uids (confine.py).
            confinement.confine()
        os.chdir(WORKDIR)
        clear_keyrings()
        reseed_numpy()
        rehearse()
        request = read_request(REQ_FD)
        os.close(REQ_FD)
        if request is None:  # the manager is shutting down
            os._exit(0)
        tests = request["mode"] == protocol.MODE_TESTS
        set_limits(request, extra_processes=1 if tests else 0)  # in tests mode the harness counts too
        if tests:
            exit_code = run_cases(request["code"], json.loads(request["payload"]), request)
        else:
            if request["payload"]:
                use_as_stdin(request["payload"])
            exit_code = run_snippet(request["code"])
    except BaseException as exc:  # noqa: BLE001 - set-up failed: say so on stderr
        with contextlib.suppress(OSError):
            os.write(2, f"sandbox set-up failed: {exc!r}\n".encode())
    finally:
        flush_streams()
        # The host waits for this, not for EOF: a leftover process may hold the output pipes open.
        with contextlib.suppress(OSError):
            os.write(STATUS_FD, protocol.STATUS.pack(exit_code))
        os._exit(exit_code)


def rehearse():
    """Go through a call's steps once, with no output, before the request comes. The fork shares the
    manager's memory until a page is first written; compiling and running a snippet writes a few
    hundred pages, and each first write copies one. Done here, that copying is off the caller's wait
    (benchmarks/python_tool.py: the paced p50 is about a fifth lower; back to back, where the
    cores are busy anyway, it changes nothing)."""
    protocol.decode_request_head(bytes(protocol.REQUEST.size))
    set_limit(resource.RLIMIT_CORE, 0)
    run_snippet(REHEARSAL)


def read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, REQUEST_CHUNK))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_request(fd):
    """The host's request as a dict (code as str, payload as bytes); None when the pipe closed."""
    head = read_exact(fd, protocol.REQUEST.size)
    if head is None:
        return None
    request = protocol.decode_request_head(head)
    body = read_exact(fd, request["code_bytes"] + request["payload_bytes"])
    if body is None:
        return None
    request["code"] = body[: request["code_bytes"]].decode("utf-8", "surrogatepass")
    request["payload"] = body[request["code_bytes"] :]
    return request


def set_limits(request, extra_processes=0):
    """The call's rlimits, on this process and everything it forks."""
    nproc = request["processes"] + extra_processes + (NPROC_BASE if SANDBOXED else nproc_in_use())
    set_limit(resource.RLIMIT_NPROC, nproc)
    set_limit(resource.RLIMIT_AS, request["memory_bytes"] or None)
    set_limit(resource.RLIMIT_FSIZE, request["file_bytes"] or None)
    set_limit(resource.RLIMIT_NOFILE, request["open_files"])
    set_limit(resource.RLIMIT_CORE, 0)
    set_limit(resource.RLIMIT_CPU, request["cpu_seconds"], request["cpu_seconds"] + 1)


def set_limit(which, soft, hard=None):
    if soft is None:
        return
    hard = soft if hard is None else hard
    try:
        resource.setrlimit(which, (soft, hard))
    except (ValueError, OSError):
        resource.setrlimit(which, (soft, soft))


def nproc_in_use():
    """Processes of our uid on the host (isolation="none" only: RLIMIT_NPROC counts them all)."""
    uid, count = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                count += os.stat("/proc/" + name).st_uid == uid
    return count


def clear_keyrings():
    """Keyrings of the snippet's uid outlive a process: drop whatever an earlier call left."""
    if SYS_KEYCTL is None:
        return
    for keyring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        _syscall(SYS_KEYCTL, KEYCTL_CLEAR, keyring)  # an error (no keyring) is fine


def reseed_numpy():
    """os.fork reseeds ``random`` (its at-fork hook); numpy's global generator has no such hook."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def use_as_stdin(data):
    """Put ``data`` on fd 0 as a real file (``open(0)`` and ``sys.stdin.buffer`` both work)."""
    fd = os.memfd_create("stdin")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, 0)
    os.close(fd)


def flush_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001, S110 - a closed or broken stream cannot be helped
            pass


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


# -- the child in tests mode: one process per case --------------------------------------------------


def run_cases(code, stdins, request):
    """Run ``code`` once per stdin in ``stdins``, each in its own process with the case time limit;
    write one CASE_REPORT per case to stdout. Expected outputs never enter the sandbox: the host
    compares. Exit code 0 when every case ran (whatever its result)."""
    limit_s = request["case_ms"] / 1000
    for index, stdin in enumerate(stdins):
        workdir = os.path.join(WORKDIR, f"case-{index}")  # each case starts in an empty directory
        os.mkdir(workdir, 0o700)
        report = run_case(code, stdin.encode("utf-8", "surrogatepass"), limit_s, request["output_bytes"], workdir)
        os.write(1, protocol.encode_case(**report))
    return 0


def run_case(code, stdin, limit_s, cap, workdir):
    """One case: fork, feed ``stdin``, collect output up to ``cap`` bytes, kill at ``limit_s``."""
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    stdin_fd = os.memfd_create("stdin")
    os.write(stdin_fd, stdin)
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    flush_streams()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        exit_code = 1
        try:
            os.setpgid(0, 0)  # its own group: the harness kills the case and all it started at once
            os.chdir(workdir)
            for fd, target in ((stdin_fd, 0), (w_out, 1), (w_err, 2)):
                os.dup2(fd, target)
            os.closerange(REQ_FD, MAXFD)  # the harness's report and status pipes must not reach it
            if SANDBOXED:
                confinement.confine()  # a domain inside the harness's: the case cannot trace or signal the harness
            cpu = math.ceil(limit_s) + 1
            set_limit(resource.RLIMIT_CPU, cpu, cpu + 1)
            exit_code = run_snippet(code)
        finally:
            flush_streams()
            os._exit(exit_code)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # whichever of the two runs first
    for fd in (w_out, w_err, stdin_fd):
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    out, err, truncated, exited = collect(pidfd, r_out, r_err, started + limit_s, cap)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)  # a timed-out case, and anything a finished one left running
    status = os.waitpid(pid, 0)[1]
    duration = time.monotonic() - started
    for fd in (pidfd, r_out, r_err):
        os.close(fd)
    exit_code, sig = how_it_ended(status)
    return {
        "exit_code": exit_code, "signal": sig, "timed_out": not exited and not truncated,
        "truncated": truncated, "duration": duration, "stdout": out, "stderr": err,
    }  # fmt: skip


def collect(pidfd, r_out, r_err, deadline, cap):
    """Read both pipes until the process exits, the deadline passes or ``cap`` bytes came; then
    what is left in them. ``(stdout, stderr, truncated, exited)``."""
    buffers = {r_out: bytearray(), r_err: bytearray()}
    for fd in buffers:
        os.set_blocking(fd, False)
    poller = select.poll()
    for fd in (r_out, r_err, pidfd):
        poller.register(fd, select.POLLIN)
    exited = False
    while sum(map(len, buffers.values())) <= cap:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready = {fd for fd, _ in poller.poll(max(1, math.ceil(remaining * 1000)))}
        if pidfd in ready:
            exited = True
            break
        for fd in ready:
            if not protocol.read_some(fd, buffers[fd]):
                poller.unregister(fd)
    for fd, buffer in buffers.items():  # what it wrote before exiting; stragglers may hold the pipes
        while len(buffer) <= cap and protocol.read_some(fd, buffer):
            pass
    out, err = bytes(buffers[r_out]), bytes(buffers[r_err])
    truncated = len(out) + len(err) > cap
    if truncated:  # keep the first `cap` bytes of the two streams together, stdout first
        out = out[:cap]
        err = err[: max(0, cap - len(out))]
    return out, err, truncated, exited


def how_it_ended(wait_status):
    """``(exit_code, signal)`` from a wait status."""
    if os.WIFSIGNALED(wait_status):
        return None, os.WTERMSIG(wait_status)
    return (os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None), None


# -- the manager -----------------------------------------------------------------------------------


def main():
    # Descriptors 0-4 stay taken for good (/dev/null on 0-2, the control socket, one more /dev/null),
    # so each call's pipes land above them and a child can dup2 its ends onto 1-4 directly.
    ctl = socket.socket(fileno=os.dup(0))  # the host's end is a SOCK_SEQPACKET pair: one message each
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # a stray print of the manager's must not reach anyone
    loaded = preload(CONFIG.get("preload", []))
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # a snippet of the same uid cannot ptrace us or read our memory
    prepare_for_children()
    make_workdir()
    gc.collect()
    gc.freeze()  # children then do not write (and so copy) the pages of the preloaded objects
    protocol.send(ctl, protocol.HELLO, pid=os.getpid(), uid=os.getuid(), preloaded=loaded)
    os.dup2(devnull, 2)
    spare = {1, os.getpid()}  # bwrap's init and the manager: the sweep kills every other process
    while True:
        try:
            pid, fds = fork_child()
        except OSError as exc:
            protocol.send(ctl, protocol.UNCLEAN, reason=f"could not fork a child: {exc}")
            return
        try:
            protocol.send(ctl, protocol.READY, fds=fds)
        finally:
            for fd in fds:  # the host alone talks to the child
                os.close(fd)
        try:
            message, _ = protocol.receive(ctl)
        except (OSError, ValueError):
            message = None
        ended = end_child(pid)
        if message is None:  # the host closed the sandbox
            clean_up(spare)
            return
        if message.get("report"):
            exit_code, sig = ended if ended else (None, None)
            protocol.send(ctl, protocol.ENDED, exit_code=exit_code, signal=sig)
        try:
            clean = ended is not None and clean_up(spare)
        except OSError:
            clean = False
        if not clean:
            protocol.send(ctl, protocol.UNCLEAN, reason="the sandbox could not be cleaned after a call")
            return


def preload(names):
    loaded = []
    for name in names:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001, S112 - a module that is not installed is simply not preloaded
            continue
        loaded.append(name)
    return loaded


def prepare_for_children():
    """Once, in the manager: what every child inherits through fork and no call changes."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write raises EFBIG instead of killing
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as in a normal Python: BrokenPipeError
    # Bound to fd numbers 0-2, which each child points at its own pipes.
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)
    sys.argv = [SNIPPET_NAME]
    sys.path.insert(0, WORKDIR)  # as `python file.py` puts the script's dir first
    os.environ.update(HOME=WORKDIR, TMPDIR=WORKDIR, PWD=WORKDIR)
    for name in CONFIG.get("worker_only_env", []):  # set for the worker's start-up alone
        os.environ.pop(name, None)
    os.umask(0o077)
    # Compile and run a line once, so that the compiler's lazily made state is made here, once,
    # instead of in every child.
    exec(compile("_ = [str(i) for i in range(3)]\n", SNIPPET_NAME, "exec"), {"__builtins__": builtins})  # noqa: S102


def fork_child():
    """Fork the next call's child: its pid and the host's ends of its pipes, plus a pidfd."""
    r_req, w_req = os.pipe()
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    r_status, w_status = os.pipe()
    if r_req < FIRST_FREE_FD:  # the lowest of the eight: a dup2 below would close another end
        raise OSError(f"a pipe landed on fd {r_req}: descriptors 0-{FIRST_FREE_FD - 1} must stay taken")
    flush_streams()  # nothing of ours may sit in the child's buffers
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(w_out, 1)
            os.dup2(w_err, 2)
            os.dup2(r_req, REQ_FD)
            os.dup2(w_status, STATUS_FD)
            os.closerange(FIRST_FREE_FD, MAXFD)  # the manager's socket and pipes must not reach the snippet
        except BaseException:  # noqa: BLE001
            os._exit(1)
        child_main()
    for fd in (r_req, w_out, w_err, w_status):
        os.close(fd)
    host_fds = [w_req, r_out, r_err, r_status, os.pidfd_open(pid)]  # protocol.CHILD_FDS order
    for fd in host_fds[:3]:  # the host never blocks on these
        os.set_blocking(fd, False)
    return pid, host_fds


def end_child(pid):
    """Kill the child and its process group, reap it: ``(exit_code, signal)``, None if it cannot be."""
    for kill, target in ((os.killpg, pid), (os.kill, pid)):  # the group exists once the child called setsid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(target, signal.SIGKILL)
    wait_for_exit(pid, KILL_WAIT_S)
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if reaped:
            return how_it_ended(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(SWEEP_PAUSE_S)


def wait_for_exit(pid, timeout):
    """Block until ``pid`` has exited (its pidfd turns readable) or ``timeout`` passes. A killed child
    exits within a fraction of a millisecond; polling with pauses instead kept every call's worker
    waiting a whole pause (benchmarks/python_tool.py: back-to-back p50 4.3 -> about 1.4 ms)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # already reaped, or no pidfds: the caller's polling loop decides
        return
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


# -- the manager: cleaning up after a call ---------------------------------------------------------


def clean_up(spare):
    """After a call: no process but ``spare``, nothing in the writable places, no System V IPC
    objects, a fresh WORKDIR. True when all of that holds."""
    clean = sweep_processes(spare)
    clean = wipe(WORKDIR, keep_dir=False) and clean
    clean = wipe(TMP_ROOT, keep_dir=True) and clean
    for path in EXTRA_WIPE:
        clean = wipe(path, keep_dir=True) and clean
    clean = clear_sysv_ipc() and clean
    if clean:
        make_workdir()
    return clean


def sweep_processes(spare):
    """Kill every process in the sandbox but ``spare``; True when none is left (zombies that init
    has yet to reap do not count)."""
    if not SANDBOXED:
        return True
    for _ in range(SWEEP_ROUNDS):
        alive = [pid for pid in other_pids(spare) if not is_zombie(pid)]
        if not alive:
            return True
        for pid in alive:  # SIGKILL stops a process at once: it cannot fork after this
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(SWEEP_PAUSE_S)
    return False


def other_pids(spare):
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) not in spare]


def is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True  # gone


def wipe(path, keep_dir):
    """Remove everything under ``path`` (and ``path`` itself unless ``keep_dir``). True when done."""
    import shutil

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
                except OSError:  # a snippet may leave directories without write or search permission
                    make_writable(full)
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


def make_writable(path):
    os.chmod(path, 0o700)
    for root, dirs, _files in os.walk(path):
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, name), 0o700)


def clear_sysv_ipc():
    """Remove the shared memory segments, message queues and semaphore sets the snippet made (they
    live in the sandbox's IPC namespace, listed in /proc/sysvipc)."""
    if not SANDBOXED:
        return True
    ok = True
    for kind, remove in (
        ("shm", lambda ident: _libc.shmctl(ident, IPC_RMID, None)),
        ("msg", lambda ident: _libc.msgctl(ident, IPC_RMID, None)),
        ("sem", lambda ident: _libc.semctl(ident, 0, IPC_RMID)),
    ):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            if remove(int(row.split()[1])) != 0:
                ok = False
    return ok


def make_workdir():
    os.mkdir(WORKDIR, 0o700)
    if SNIPPET_UID is not None:
        os.chown(WORKDIR, SNIPPET_UID, SNIPPET_UID)


if __name__ == "__main__":
    main()
