"""The Terminal env's program inside bubblewrap: it owns the episode's shell. Standard library only.

The host starts it as ``python -I -S supervisor.py <config json>``, as the sandbox's pid 1 (bwrap's
``--as-pid-1``): no other process holds the host's pipes, and a pid 1 gets no signal from inside its
namespace that it has no handler for. Before anything else it makes itself non-dumpable (no process
of the agent's can trace it, read its memory or open its descriptors through ``/proc``) and blanks its
command line. Requests come as JSON lines on stdin, replies go as JSON lines on stdout. It writes the
task's files into the sandbox's private ``/app`` (a size-capped tmpfs that lives as long as the
sandbox), then answers:

* ``run`` -- feed one command to the persistent ``bash`` (started on first use, and again after a time
  limit or an ``exit``). The command is passed as one ANSI-C quoted word to ``eval``, so no quoting in it
  can swallow what follows; its stdin is ``/dev/null``; its end and exit code come on the shell's fd 3 as a
  random sentinel (at most STATUS_BYTES of it are kept). Output (stdout and stderr together) is kept up
  to a cap, head and tail. On the time limit every process but this one is killed and the shell is
  gone; files stay. While the command runs, the sandbox's processes are counted together: over
  ``memory_mb`` of private memory, the command is killed like on a time limit; over ``max_inodes`` files
  on a writable tmpfs, the episode ends. Between commands every process of the agent's is stopped
  (SIGSTOP) and continued with the next command: nothing of the agent's runs while no command does.
* ``check`` -- kill everything the agent left running, then run the checker script in a fresh
  ``bash -c`` (as the agent's uid, with the agent's limits). The agent's own code runs only through
  the checker's ``agent`` function, confined (``confine.py``), so it cannot trace or signal the
  checker's processes: the checker's exit code, which this program reaps, is the verdict.

Every process of the agent's (its shell, and what a checker runs through ``agent``) is confined by
``confine.py``: a Landlock domain and a seccomp filter that keep it from tracing, reading, writing or
signalling any process outside its own domain (this program, the checker).

When the host runs as root, this program is namespace root and the shell runs as ``agent_uid`` (the
host's ``nobody``); otherwise they share a uid, and the non-dumpable flag, pid 1's signal rules and the
confinement above keep the agent away from it.
"""

import ctypes
import importlib.util
import json
import os
import resource
import select
import signal
import sys
import time

PR_SET_DUMPABLE = 4
ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # first: an agent of the same uid cannot trace us
CONFIG = json.loads(sys.argv[1])
APP = CONFIG["app"]
AGENT_UID = CONFIG.get("agent_uid")  # set when this program is namespace root
LIMITS = CONFIG["limits"]
CAP = CONFIG["output_bytes"]
SHELL_ENV = CONFIG["env"]
MEMORY_BYTES = CONFIG["memory_mb"] * 1024 * 1024  # the private memory of all the agent's processes together
MAX_INODES = CONFIG["max_inodes"]  # files (and directories) on each writable tmpfs
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
# The checker's way to run the agent's code (the sandbox's Python runs confine.py, which execs the rest).
AGENT_FUNCTION = 'agent() { "$GEM_PYTHON" -I -S "$GEM_CONFINE" "$@"; }\n'
WATCHED = set()  # our own children whose wait status matters (the checker)
EXITED = {}  # pid -> wait status, of WATCHED children reaped while reaping orphans
SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-./,:=+@%^")


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


def agent_process(confined=True):
    """In a forked child: own session, the agent's uid and limits, confined. The caller then execs."""
    os.setsid()
    if AGENT_UID is not None:
        os.setgroups([])
        os.setresgid(AGENT_UID, AGENT_UID, AGENT_UID)
        os.setresuid(AGENT_UID, AGENT_UID, AGENT_UID)
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
    if confined:
        confinement.confine()


def spawn(argv, stdin_fd, out_fd, status_fd=None, confined=True, env=None):
    pid = os.fork()
    if pid == 0:
        try:
            agent_process(confined)
            os.dup2(stdin_fd, 0)
            os.dup2(out_fd, 1)
            os.dup2(out_fd, 2)
            if status_fd is not None:
                os.dup2(status_fd, STATUS_FD)
            os.closerange(STATUS_FD + (status_fd is not None), MAXFD)
            os.execve(argv[0], argv, env or SHELL_ENV)
        finally:
            os._exit(127)
    return pid


class Shell:
    def __init__(self):
        r_in, self.w_in = os.pipe()
        self.r_out, w_out = os.pipe()
        self.r_status, w_status = os.pipe()
        self.pid = spawn(["/bin/bash", "--noprofile", "--norc"], r_in, w_out, w_status)
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


def sweep():
    """SIGKILL every process in the sandbox but this one (pid 1), until none is left."""
    for _ in range(SWEEP_ROUNDS):
        living = []
        for pid in others():
            state = state_of(pid)
            if state not in (b"Z", b"X"):
                living.append(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        reap()
        if not living:
            return True
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


def state_of(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b"X"


def freeze():
    """Stop every process of the agent's (SIGSTOP cannot be caught); those that will not stop are killed."""
    for _ in range(SWEEP_ROUNDS):
        running = [pid for pid in others() if state_of(pid) not in (b"T", b"t", b"Z", b"X")]
        if not running:
            reap()
            return
        for pid in running:
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


def private_memory():
    """Resident private memory of every process but this one, in bytes (statm: resident - shared)."""
    total = 0
    for pid in others():
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                fields = f.read().split()
            total += (int(fields[1]) - int(fields[2])) * PAGE
        except (OSError, IndexError, ValueError):
            pass
    return total


def too_many_files():
    for path in WRITABLE:
        try:
            stats = os.statvfs(path)
        except OSError:
            continue
        if stats.f_files - stats.f_ffree > MAX_INODES:
            return True
    return False


def over_limit():
    """ "memory" or "files" when the agent's processes together are over a limit of the sandbox's, else None."""
    if too_many_files():
        return "files"
    if private_memory() > MEMORY_BYTES:
        return "memory"
    return None


def end_shell():
    global shell
    if shell is not None:
        shell.close()
        shell = None
    sweep()


def run(command, timeout):
    """One command in the persistent shell: its output, exit code, and what happened."""
    global shell
    restarted = shell is None
    thaw()  # what the agent left running goes on, only while a command runs
    if shell is None:
        shell = Shell()
    nonce = os.urandom(8).hex()
    line = f"eval {quote(command)} </dev/null {STATUS_FD}>&-; printf '{nonce} %d\\n' $? >&{STATUS_FD}\n".encode()
    output, status = Output(), b""
    deadline = time.monotonic() + timeout
    exit_code, exited, timed_out, limit = None, False, False, None
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
        while exit_code is None:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                raise TimeoutError
            if now >= next_sample:
                next_sample = now + SAMPLE_S
                reap()
                limit = over_limit()
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
                    if status.endswith(b"\n"):
                        word, _, code = status.decode(errors="replace").strip().rpartition(" ")
                        if word.endswith(nonce):
                            exit_code = int(code)
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
        limit = over_limit()  # what the last moments of the command made
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


def check(script, timeout):
    """The checker, after everything of the agent's is gone: exit code and output."""
    end_shell()
    r_out, w_out = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    env = {**SHELL_ENV, "GEM_PYTHON": sys.executable, "GEM_CONFINE": CONFIG["confine"]}
    # Not confined itself: the agent's code, which it runs through `agent`, is, in a domain of its own.
    pid = spawn(["/bin/bash", "--noprofile", "--norc", "-c", AGENT_FUNCTION + script], devnull, w_out, confined=False, env=env)
    WATCHED.add(pid)
    os.close(w_out)
    os.close(devnull)
    os.set_blocking(r_out, False)
    output, deadline, code, timed_out = Output(), time.monotonic() + timeout, None, False
    while True:
        reap()
        if pid in EXITED:
            code = os.waitstatus_to_exitcode(EXITED.pop(pid))
            break
        if time.monotonic() > deadline:
            timed_out = True
            break
        select.select([r_out], [], [], 0.01)
        data = read(r_out)
        if data:
            output.add(data)
    data = read(r_out)
    while data:
        output.add(data)
        data = read(r_out)
    os.close(r_out)
    sweep()
    text, _ = output.text()
    return {"exit_code": code, "timed_out": timed_out, "output": text}


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
    """Overwrite our argv in memory (what /proc/1/cmdline shows): the host's paths and pids are not the
    agent's business. Python keeps its own copy of argv; this is the kernel's view only."""
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
    libc = ctypes.CDLL(None, use_errno=True)
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
        if request["op"] == "run":
            reply = run(request["command"], request["timeout"])
        elif request["op"] == "check":
            reply = check(request["script"], request["timeout"])
        else:
            break
        replies.write(json.dumps(reply) + "\n")
    end_shell()


if __name__ == "__main__":
    main()
