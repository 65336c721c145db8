"""The Terminal env's program inside bubblewrap: it owns the episode's shell and judges the episode.
Standard library only.

The host starts it as ``python -I -S supervisor.py <config json>``, as the sandbox's pid 1 (bwrap's
``--as-pid-1``): no other process holds the host's pipes. Before anything else it makes itself
non-dumpable and blanks its command line. Requests come as JSON lines on stdin, replies go as JSON lines
on stdout. It writes the task's files into the sandbox's private ``/app`` (a size-capped tmpfs that lives
as long as the sandbox), then answers:

* ``run`` -- feed one command to the persistent ``bash`` (started on first use, and again after a time
  limit or an ``exit``). The command is passed as one ANSI-C quoted word to ``eval``, so no quoting in it
  can swallow what follows; its stdin is ``/dev/null``; its end and exit code come on the shell's fd 3 as a
  random sentinel (at most STATUS_BYTES of it are kept; a code that is not 0-255 is not believed). Output
  (stdout and stderr together) is kept up to a cap, head and tail. On the time limit every process of the
  agent's is killed and the shell is gone; files stay. While the command runs, the agent's processes are
  counted together: over ``memory_mb`` of private memory, the command is killed like on a time limit;
  over ``max_inodes`` files on a writable tmpfs, the episode ends. Between commands every process of the
  agent's is stopped (SIGSTOP) and continued with the next command: nothing of the agent's runs while no
  command does.
* ``check`` -- kill every process of the agent's, then evaluate the task's checks (``tasks.py``), here,
  in this program: answer files are read without following links or blocking, and the agent's programs
  the checks run start like its shell (below), each in a PID namespace of its own. The checks arrive
  only with this request, so what they expect never was in the sandbox while the agent's code ran.

**The agent's processes.** The shell, and each program a check runs, is the init of a new PID namespace
with a new mount namespace holding a ``/proc`` of that namespace (:func:`start_agent`): the agent sees
only its own processes; this program has no pid the agent can name, so it cannot be signalled, traced,
``prlimit``-ed or reniced by one, even when it shares the agent's uid (a host that is not root). Killing
that init (SIGKILL from here, the parent namespace) makes the kernel kill every process of the namespace,
whatever its state: no scan of ``/proc`` can miss one (a process whose main thread has exited while its
other threads run shows state Z, and a scan for living states skipped such "zombie leaders"). Each one
also runs as the agent's uid (``agent_uid``, the host's ``nobody``, when the host is root: then this
program, namespace root, is another uid) with no capability, the agent's limits, and confined by
``confine.py`` (a Landlock domain and a seccomp filter).

When the host is not root this program holds CAP_SYS_ADMIN (to create those namespaces) and CAP_SETPCAP
(to empty a process's capability bounding set) in the sandbox's user namespace, given by bwrap's
``--cap-add``; the agent's processes drop every capability, the bounding set included, before they exec.

One file on purpose (about 850 lines): it is the program the sandbox runs as its pid 1, started with
``python -I -S`` on the standard library alone, so nothing of it can live in a module it would have to import.
"""

import ctypes
import errno
import importlib.util
import json
import os
import re
import resource
import select
import shutil
import signal
import stat
import struct
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE = 4
libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # first: an agent of the same uid cannot trace us
CONFIG = json.loads(sys.argv[1])
APP = CONFIG["app"]
AGENT_UID = CONFIG.get("agent_uid")  # set when this program is namespace root
LIMITS = CONFIG["limits"]
CAP = CONFIG["output_bytes"]
SHELL_ENV = CONFIG["env"]
MEMORY_BYTES = CONFIG["memory_mb"] * 1024 * 1024  # the private memory of all the agent's processes together
MAX_INODES = CONFIG["max_inodes"]  # files (and directories) on each writable tmpfs
TICKS = os.sysconf("SC_CLK_TCK")
# the CPU of all the agent's processes together during one command (each also has it as RLIMIT_CPU): many
# processes cannot use the time limit times the cores
CPU_TICKS = CONFIG["cpu_seconds"] * TICKS
WRITABLE = (APP, "/tmp", "/dev/shm")
_spec = importlib.util.spec_from_file_location("_gem_confine", CONFIG["confine"])
confinement = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(confinement)
STATUS_FD = 3
STATUS_BYTES = 256  # what is kept of the status pipe: its tail (the agent may write there too)
MAXFD = max(64, min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 65536))
SWEEP_ROUNDS = 500
SAMPLE_S = 0.02  # how often a running command's processes are counted
PAGE = os.sysconf("SC_PAGE_SIZE")
WATCHED = set()  # our own children whose wait status matters (the agent's namespace inits)
EXITED = {}  # pid -> wait status, of WATCHED children reaped while reaping orphans
SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-./,:=+@%^")
EXIT_CODE = re.compile(rb"[0-9]{1,3}")  # what a status line's code must be: bash's $? is 0-255
MAX_ANSWER_BYTES = 1 << 20  # an answer file (or a checked program's output) over this is a wrong answer
STOPPED = (b"T", b"t", b"Z", b"X")  # thread states that are not running
# Namespaces and mounts (<sched.h>, <sys/mount.h>), capabilities (<linux/capability.h>, <sys/prctl.h>).
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 1 << 14, 1 << 18
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")  # what bwrap's own /proc covers read-only, as we do
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
CAP_LAST = 63  # the highest capability number a kernel could have (dropping one it lacks fails: ignored)
LINUX_CAPABILITY_VERSION_3 = 0x20080522


def quote(text):
    """``text`` as one bash ANSI-C quoted word: every byte outside a plain set as ``\\xHH``."""
    data = text.replace("\x00", "").encode("utf-8", "replace")
    return "$'" + "".join(chr(b) if b in SAFE else f"\\x{b:02x}" for b in data) + "'"


class Output:
    """Bytes kept up to ``CAP``: the first half, and the last half of what came after it."""

    def __init__(self):
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, data):
        self.total += len(data)
        room = CAP // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > CAP:
                del self.tail[: len(self.tail) - CAP // 2]

    def text(self):
        if self.total <= CAP:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace"), False
        tail = bytes(self.tail[len(self.tail) - (CAP - len(self.head)) :])
        omitted = self.total - len(self.head) - len(tail)
        marker = f"\n[... {omitted} bytes of output omitted ...]\n".encode()
        return (bytes(self.head) + marker + tail).decode("utf-8", "replace"), True


# -- the agent's processes ---------------------------------------------------------------------------


class AgentStartError(Exception):
    """The sandbox could not set up a process of the agent's (not the agent's doing)."""


def _check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def drop_bounding_set():
    """Empty the capability bounding set (needs CAP_SETPCAP, which we hold until the agent's uid is taken):
    no exec can ever bring a capability back, no_new_privs or not."""
    for cap in range(CAP_LAST + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


def drop_capabilities():
    """No capability left, none to come back at exec (no ambient ones; no_new_privs follows in confine)."""
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient capabilities")
    header = ctypes.create_string_buffer(struct.pack("=Ii", LINUX_CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(24)  # effective, permitted, inheritable: zero, twice (64 capabilities)
    _check(libc.capset(header, data), "capset")


def become_agent(argv, fds, env, report):
    """In the new PID namespace's init (a child of ours): its own /proc, the agent's uid and limits, no
    capability, confined; then exec ``argv`` with ``fds`` (target fd -> our fd). Never returns. What
    fails before the exec is written to ``report``, as ``setup: why`` or ``exec: why``."""
    stage = "setup"
    try:
        # Our own mount namespace, so that a /proc of the new PID namespace can cover the sandbox's.
        _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making mounts private")
        _check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mounting /proc")
        for name in PROC_READ_ONLY:
            path = f"/proc/{name}".encode()
            if libc.mount(path, path, None, MS_BIND, None) == 0:
                libc.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        os.setsid()
        drop_bounding_set()
        if AGENT_UID is not None:
            os.setgroups([])
            os.setresgid(AGENT_UID, AGENT_UID, AGENT_UID)
            os.setresuid(AGENT_UID, AGENT_UID, AGENT_UID)
        drop_capabilities()
        for name, value in LIMITS.items():
            which = getattr(resource, name)
            hard = value + 1 if name == "RLIMIT_CPU" else value
            try:
                resource.setrlimit(which, (value, hard))
            except (ValueError, OSError):
                resource.setrlimit(which, (value, value))
        for number in (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        os.chdir(APP)
        confinement.confine()
        for target, fd in fds.items():
            os.dup2(fd, target)
        keep = max(fds) + 1
        os.closerange(keep, report)  # everything but the targets and the report pipe (close-on-exec)
        os.closerange(report + 1, MAXFD)
        stage = "exec"
        os.execve(argv[0], argv, env)
    except BaseException as exc:  # noqa: BLE001 - whatever it was, it is reported and this process ends
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
        _report(report, f"{stage}: {why}")
    finally:
        os._exit(127)


def _report(fd, text):
    """Tell the parent why a child failed to set up (best effort: the child ends either way)."""
    try:
        os.write(fd, text[:500].encode())
    except OSError:
        pass


def start_agent(argv, fds, env=None):
    """Start ``argv`` as the init of a new PID namespace (see the module docstring); its pid (ours to wait
    for). Raises AgentStartError when the sandbox failed to set it up, and OSError(why) when ``argv``
    cannot be executed (a program of the agent's that is not executable, say).

    unshare(CLONE_NEWPID) only chooses the namespace of the caller's next children and cannot be undone
    here (bwrap's user namespace owns our own PID namespace), so a short-lived middle process does it
    and forks the init; once it has exited, the init is ours (we are the sandbox's pid 1, its reaper)."""
    pid_r, pid_w = os.pipe()
    report_r, report_w = os.pipe()  # close-on-exec: EOF and no text once the init has exec'd
    middle = os.fork()
    if middle == 0:
        try:
            os.close(pid_r)
            os.close(report_r)
            _check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
            init = os.fork()
            if init == 0:
                os.close(pid_w)
                become_agent(argv, fds, env or SHELL_ENV, report_w)
            os.write(pid_w, str(init).encode())
        except BaseException as exc:  # noqa: BLE001 - reported below through the report pipe
            _report(report_w, f"setup: {exc}")
        finally:
            os._exit(0)
    os.close(pid_w)
    os.close(report_w)
    try:
        text, report = _read_all(pid_r), _read_all(report_r)  # the report pipe: until the init's exec
    finally:
        os.close(pid_r)
        os.close(report_r)
        os.waitpid(middle, 0)
    init = int(text) if text.isdigit() else None
    if init is not None:
        WATCHED.add(init)
    if report:
        if init is not None:
            end_agent(init)
        stage, _, why = report.decode(errors="replace").partition(": ")
        if stage == "exec":
            raise OSError(why)
        raise AgentStartError(f"a process of the agent's could not be set up: {why}")
    if init is None:
        raise AgentStartError("a process of the agent's could not be started")
    return init


def _read_all(fd):
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    return data


def end_agent(pid):
    """SIGKILL the init of one of the agent's PID namespaces, which ends every process in it, and reap
    it (its exit waits for the whole namespace to be gone)."""
    try:
        os.kill(pid, signal.SIGKILL)  # from the parent namespace, even a namespace's init cannot refuse it
    except ProcessLookupError:
        pass
    if pid not in EXITED:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    EXITED.pop(pid, None)
    WATCHED.discard(pid)


class Shell:
    def __init__(self):
        r_in, self.w_in = os.pipe()
        self.r_out, w_out = os.pipe()
        self.r_status, w_status = os.pipe()
        try:
            self.pid = start_agent(["/bin/bash", "--noprofile", "--norc"], {0: r_in, 1: w_out, 2: w_out, STATUS_FD: w_status})
        except OSError as exc:  # /bin/bash would not run: not the agent's doing
            raise AgentStartError(f"the shell could not start: {exc}") from None
        finally:
            for fd in (r_in, w_out, w_status):
                os.close(fd)
        for fd in (self.r_out, self.r_status):
            os.set_blocking(fd, False)

    def close(self):
        for fd in (self.w_in, self.r_out, self.r_status):
            try:
                os.close(fd)
            except OSError:
                pass


shell = None


# -- every process but this one ----------------------------------------------------------------------


def sweep():
    """SIGKILL every process in the sandbox but this one (pid 1), whatever its state, until none is
    left. The agent's processes all die with their namespace's init (end_agent); this is the backstop."""
    for _ in range(SWEEP_ROUNDS):
        reap()
        left = others()
        if not left:
            return True
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)  # a zombie leader's live threads die too; a true zombie ignores it
            except OSError:
                pass
        time.sleep(0.002)
    return False


def reap():
    """Reap every child that has ended (this is pid 1: orphans come here); keep our own children's status."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in WATCHED:
            EXITED[pid] = status


def others():
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != 1]


def stat_fields(path):
    """The fields of a /proc stat file after the command name, or None when it is gone."""
    try:
        with open(path, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def running(pid):
    """Whether any thread of ``pid`` is neither stopped nor dead. A process's state is its main thread's:
    one whose main thread has exited shows Z while its other threads run on, so then (and whenever it
    has several threads) each thread is looked at."""
    fields = stat_fields(f"/proc/{pid}/stat")
    if fields is None:
        return False
    if fields[0] not in (b"Z", b"X") and fields[17] == b"1":  # one thread, alive: its state says it
        return fields[0] not in STOPPED
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in threads:
        fields = stat_fields(f"/proc/{pid}/task/{tid}/stat")
        if fields is not None and fields[0] not in STOPPED:
            return True
    return False


def freeze():
    """Stop every process of the agent's (SIGSTOP cannot be caught); those that will not stop are killed.
    A SIGSTOP to a process stops all its threads, also when its main thread is a zombie."""
    for _ in range(SWEEP_ROUNDS):
        moving = [pid for pid in others() if running(pid)]
        if not moving:
            reap()
            return
        for pid in moving:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        reap()
        time.sleep(0.001)
    for pid in others():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    reap()


def thaw():
    for pid in others():
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass


def _statm(path):
    """Private resident pages of one statm file (resident - shared); 0 when gone."""
    try:
        with open(path, "rb") as f:
            fields = f.read().split()
        return int(fields[1]) - int(fields[2])
    except (OSError, IndexError, ValueError):
        return 0


def private_memory():
    """Resident private memory of every process but this one, in bytes. A zombie leader's own statm reads
    0 (its main thread holds no memory any more); its memory is that of its live threads, which share it:
    the first thread that has any is counted."""
    pages = 0
    for pid in others():
        own = _statm(f"/proc/{pid}/statm")
        if own <= 0:
            try:
                threads = os.listdir(f"/proc/{pid}/task")
            except OSError:
                threads = []
            for tid in threads:
                own = _statm(f"/proc/{pid}/task/{tid}/statm")
                if own > 0:
                    break
        pages += max(own, 0)
    return pages * PAGE


def too_many_files():
    for path in WRITABLE:
        try:
            stats = os.statvfs(path)
        except OSError:
            continue
        if stats.f_files - stats.f_ffree > MAX_INODES:
            return True
    return False


def agent_cpu_ticks():
    """The CPU the agent's processes have used, in clock ticks: every live process's own and what it reaped
    (utime, stime, cutime, cstime: a thread group's, its leader a zombie or not), and the processes this
    supervisor reaped (the agent's inits, with everything they reaped). A process's time moves from its own
    line to its reaper's when it is reaped: counted once at any moment."""
    total = 0
    for pid in others():
        fields = stat_fields(f"/proc/{pid}/stat")
        try:
            total += sum(int(value) for value in fields[11:15]) if fields is not None else 0
        except ValueError:
            pass
    times = os.times()
    return total + round((times.children_user + times.children_system) * TICKS)


def over_limit(cpu_since=None):
    """ "files", "memory" or "cpu" when the agent's processes together are over a limit of the sandbox's,
    else None. ``cpu_since``: :func:`agent_cpu_ticks` when the command began."""
    if too_many_files():
        return "files"
    if private_memory() > MEMORY_BYTES:
        return "memory"
    if cpu_since is not None and agent_cpu_ticks() - cpu_since > CPU_TICKS:
        return "cpu"
    return None


def end_shell():
    """End the shell and every process of the agent's (its PID namespace's), then make sure none is left."""
    global shell
    if shell is not None:
        end_agent(shell.pid)
        shell.close()
        shell = None
    sweep()


# -- commands ----------------------------------------------------------------------------------------


def parse_status(status, nonce):
    """Whether the status pipe's tail ends with the command's sentinel line, and its exit code: an int
    0-255, or None when the line's code is anything else (the agent can write this pipe: a DEBUG trap
    can print the sentinel itself, with a code of 200 digits)."""
    if not status.endswith(b"\n"):
        return False, None
    word, _, code = status[:-1].rpartition(b"\n")[2].rpartition(b" ")
    if not word.endswith(nonce.encode()):
        return False, None
    if EXIT_CODE.fullmatch(code) and int(code) <= 255:
        return True, int(code)
    return True, None


def run(command, timeout):
    """One command in the persistent shell: its output, exit code, and what happened."""
    global shell
    restarted = shell is None
    thaw()  # what the agent left running goes on, only while a command runs
    if shell is None:
        shell = Shell()
    cpu_since = agent_cpu_ticks()
    nonce = os.urandom(8).hex()
    line = f"eval {quote(command)} </dev/null {STATUS_FD}>&-; printf '{nonce} %d\\n' $? >&{STATUS_FD}\n".encode()
    output, status = Output(), b""
    deadline = time.monotonic() + timeout
    exit_code, ended, exited, timed_out, limit = None, False, False, False, None
    next_sample = time.monotonic() + SAMPLE_S
    try:
        view = memoryview(line)
        while view:  # a command bigger than the pipe: bash reads as we write
            _, writable, _ = select.select([], [shell.w_in], [], max(0.0, deadline - time.monotonic()))
            if not writable:
                raise TimeoutError
            view = view[os.write(shell.w_in, view[: 1 << 16]) :]
        poller = select.poll()
        for fd in (shell.r_out, shell.r_status):
            poller.register(fd, select.POLLIN)
        while not ended:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                raise TimeoutError
            if now >= next_sample:
                next_sample = now + SAMPLE_S
                reap()
                limit = over_limit(cpu_since)
                if limit is not None:
                    raise TimeoutError
            for fd, _ in poller.poll(max(1, int(min(remaining, SAMPLE_S) * 1000))):
                data = read(fd)
                if data is None:  # nothing after all
                    continue
                if fd == shell.r_out:
                    if data:
                        output.add(data)
                    else:
                        poller.unregister(fd)
                elif data:
                    status = (status + data)[-STATUS_BYTES:]  # a writer that never ends a line gets nowhere
                    ended, exit_code = parse_status(status, nonce)
                else:  # fd 3 closed: the shell is gone (an `exit`, a killed bash)
                    exited = True
                    raise EOFError
        while True:  # what the command wrote before it ended is in the pipe already
            data = read(shell.r_out)
            if not data:
                break
            output.add(data)
    except TimeoutError:
        timed_out = limit is None
        end_shell()
    except (EOFError, OSError):
        exited = True
        time.sleep(0.01)
        for _ in range(64):
            data = read(shell.r_out) if shell is not None else b""
            if not data:
                break
            output.add(data)
        end_shell()
    if limit is None and shell is not None:
        limit = over_limit(cpu_since)  # what the last moments of the command made
        if limit is not None:
            end_shell()
    freeze()
    text, truncated = output.text()
    return {
        "output": text, "exit_code": exit_code, "timed_out": timed_out, "shell_exited": exited,
        "truncated": truncated, "restarted": restarted, "limit": limit,
    }  # fmt: skip


def read(fd):
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
    except OSError:
        return b""


# -- the checker -------------------------------------------------------------------------------------


class Wrong(Exception):
    """The answer is wrong (or is not a plain file where one belongs): the check fails with this text."""


def open_in_app(path, directory=False):
    """A descriptor of ``APP/path``, opened without following any link on the way (each directory on the
    path a real one, the last component not a link) and without blocking (a FIFO opens at once, to be
    refused by its type). The caller closes it."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise Wrong(f"{path!r} is not a path under {APP}")
    fd = os.open(APP, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = inner
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0)
        return os.open(parts[-1], flags, dir_fd=fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Wrong(f"{path} is (or lies below) a symbolic link") from None
        if exc.errno == errno.ENOTDIR:
            raise Wrong(f"{path} is not a directory, or lies below something that is not one") from None
        raise Wrong(f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def regular_file(path):
    """(fd, fstat) of a regular file at ``path`` (see open_in_app); anything else is Wrong."""
    fd = open_in_app(path)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Wrong(f"{path} is not a regular file")
    return fd, info


def read_answer(path):
    """The text of the regular file ``path`` (at most MAX_ANSWER_BYTES), or Wrong."""
    fd, info = regular_file(path)
    try:
        if info.st_size > MAX_ANSWER_BYTES:
            raise Wrong(f"{path} is over {MAX_ANSWER_BYTES} bytes")
        data = b""
        while len(data) <= MAX_ANSWER_BYTES and (chunk := os.read(fd, MAX_ANSWER_BYTES + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > MAX_ANSWER_BYTES:
        raise Wrong(f"{path} is over {MAX_ANSWER_BYTES} bytes")
    return data.decode("utf-8", "replace")


def matches(got, spec):
    """Whether ``got`` is one of ``spec["want"]`` under ``spec["compare"]`` (see tasks.py)."""
    how = spec.get("compare", "exact")
    normal = {
        "exact": lambda text: text,
        "lines": lambda text: text.rstrip("\n"),  # what "$(cat file)" keeps
        "no_space": lambda text: "".join(text.split()),
        "first_line": lambda text: text.split("\n", 1)[0],
    }[how]
    wants = spec["want"] if isinstance(spec["want"], list) else [spec["want"]]
    return normal(got) in [normal(want) for want in wants]


def check_text(spec, deadline):
    if not matches(read_answer(spec["path"]), spec):
        raise Wrong(f"{spec['path']} does not hold the right answer")


def check_dir(spec, deadline):
    os.close(open_in_app(spec["path"], directory=True))


def check_names(spec, deadline):
    fd = open_in_app(spec["path"], directory=True)
    try:
        found = sorted(os.listdir(fd))
    finally:
        os.close(fd)
    if found != spec["want"]:
        raise Wrong(f"{spec['path']} does not hold exactly the right files")


def check_mode(spec, deadline):
    fd, info = regular_file(spec["path"])
    os.close(fd)
    if stat.S_IMODE(info.st_mode) != spec["want"]:
        raise Wrong(f"{spec['path']} has mode {stat.S_IMODE(info.st_mode):o}")


def check_executable(spec, deadline):
    fd, info = regular_file(spec["path"])
    os.close(fd)
    if not info.st_mode & stat.S_IXUSR:
        raise Wrong(f"{spec['path']} is not executable by its owner")


def check_run(spec, deadline):
    """The agent's program, as its shell would run it, on the check's inputs (written to a directory of a
    random name made now); its stdout compared with what the check wants."""
    inputs = None
    if spec.get("inputs"):
        inputs = f"/tmp/gem-check-{os.urandom(16).hex()}"
        os.mkdir(inputs, 0o755)  # fails if the name exists: nothing of the agent's is followed
        os.chmod(inputs, 0o755)
        for name, content in spec["inputs"].items():
            fd = os.open(f"{inputs}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(content)
    argv = [arg.replace("{inputs}", inputs or "") for arg in spec["argv"]]
    r_out, w_out = os.pipe()
    devnull = os.open(os.devnull, os.O_RDWR)
    pid = None
    try:
        try:
            pid = start_agent(argv, {0: devnull, 1: w_out, 2: devnull})
        except OSError as exc:
            raise Wrong(f"{argv[0]} could not run: {exc}") from None
        finally:
            os.close(w_out)
        got, too_much = _collect(r_out, pid, deadline)
        if too_much:
            raise Wrong(f"{' '.join(argv)} wrote over {MAX_ANSWER_BYTES} bytes")
        if not matches(got.decode("utf-8", "replace"), spec):
            raise Wrong(f"{' '.join(argv)} did not print the right answer")
    finally:
        if pid is not None:
            end_agent(pid)
        os.close(r_out)
        os.close(devnull)
        if inputs is not None:
            shutil.rmtree(inputs, ignore_errors=True)


def _collect(fd, pid, deadline):
    """A checked program's stdout, read until it has exited (and with it every process of its namespace:
    nothing holds the pipe any more), or until it is over MAX_ANSWER_BYTES (then ``too_much``); past the
    deadline, TimeoutError."""
    os.set_blocking(fd, False)
    data = b""
    while True:
        reap()
        done = pid in EXITED
        remaining = deadline - time.monotonic()
        if not done and remaining <= 0:
            raise TimeoutError
        if not done:
            select.select([fd], [], [], min(remaining, 0.01))
        while chunk := read(fd):
            data += chunk
            if len(data) > MAX_ANSWER_BYTES:
                return data, True
        if done:
            return data, False


CHECKS = {"text": check_text, "dir": check_dir, "names": check_names, "mode": check_mode, "executable": check_executable, "run": check_run}


def check(checks, timeout):
    """Every process of the agent's ends first; then each check in turn, the first that fails deciding.
    Exit code 0 (all passed), 1 (one failed) or None (out of time); never an exception: a check that
    breaks on what the agent left fails."""
    end_shell()
    deadline = time.monotonic() + timeout
    code, timed_out, text = 0, False, f"all {len(checks)} checks passed"
    for index, spec in enumerate(checks, 1):
        try:
            CHECKS[spec["check"]](spec, deadline)
        except Wrong as exc:
            code, text = 1, f"check {index} of {len(checks)} failed: {exc}"
        except TimeoutError:
            code, timed_out, text = None, True, f"check {index} of {len(checks)} ran past the time limit"
        except AgentStartError:
            raise
        except Exception as exc:  # noqa: BLE001 - fail closed
            code, text = 1, f"check {index} of {len(checks)} failed: {type(exc).__name__}: {exc}"
        if code != 0:
            break
    sweep()
    return {"exit_code": code, "timed_out": timed_out, "output": text[:2000]}


# -- start-up ----------------------------------------------------------------------------------------


def write_files(files):
    for path, content, mode in files:
        full = os.path.join(APP, path)
        parent = os.path.dirname(full)
        os.makedirs(parent, exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(content)
        os.chmod(full, mode)
    if AGENT_UID is not None:
        for root, dirs, names in os.walk(APP):
            for name in [*dirs, *names]:
                os.lchown(os.path.join(root, name), AGENT_UID, AGENT_UID)
        os.chown(APP, AGENT_UID, AGENT_UID)


def blank_command_line():
    """Overwrite our argv in memory (what /proc/1/cmdline shows to the sandbox's processes, none of which
    is the agent's: they have a /proc of their own). Python keeps its own copy of argv; this is the
    kernel's view only."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49 of stat)
    except (OSError, IndexError, ValueError):
        return
    name = b"gem-terminal-supervisor"[: max(0, end - start - 1)]
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, name, len(name))


def limit_files():
    """When namespace root (the host is root): a hard cap on the number of files of each tmpfs."""
    if AGENT_UID is None:
        return
    ms_remount, ms_nosuid, ms_nodev = 32, 2, 4
    for path in WRITABLE:
        libc.mount(None, path.encode(), None, ms_remount | ms_nosuid | ms_nodev, f"nr_inodes={MAX_INODES}".encode())


def main():
    blank_command_line()
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(number, signal.SIG_IGN)  # pid 1 gets from inside only the signals it handles
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    write_files(CONFIG["files"])
    limit_files()
    replies.write(json.dumps({"op": "hello", "pid": os.getpid()}) + "\n")
    os.dup2(devnull, 2)  # the host stops reading our stderr once we are up
    os.close(devnull)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "run":
                reply = run(request["command"], request["timeout"])
            elif request["op"] == "check":
                reply = check(request["checks"], request["timeout"])
            else:
                break
        except AgentStartError as exc:  # the host ends the episode as an infrastructure error
            reply = {"failed": str(exc)[:300]}
        replies.write(json.dumps(reply) + "\n")
    end_shell()


if __name__ == "__main__":
    main()
