"""The Terminal env's program inside bubblewrap: it owns the episode's shell. Standard library only.

The host starts it as ``python -I -S supervisor.py <config json>``; requests come as JSON lines on stdin,
replies go as JSON lines on stdout. It writes the task's files into the sandbox's private ``/app`` (a
size-capped tmpfs that lives as long as the sandbox), then answers:

* ``run`` -- feed one command to the persistent ``bash`` (started on first use, and again after a time
  limit or an ``exit``). The command is passed as one ANSI-C quoted word to ``eval``, so no quoting in it
  can swallow what follows; its stdin is ``/dev/null``; its end and exit code come on the shell's fd 3 as a
  random sentinel. Output (stdout and stderr together) is kept up to a cap, head and tail. On the time
  limit every process but this one and the sandbox's init is killed and the shell is gone; files stay.
* ``check`` -- kill everything the agent left running, then run the checker script in a fresh
  ``bash -c`` (as the agent's uid, with the agent's limits) and report its exit code.

When the host runs as root, this program is namespace root and the shell runs as ``agent_uid`` (the
host's ``nobody``), so the agent cannot signal or trace it; otherwise they share a uid and an agent that
kills this program ends its own episode (the host sees the pipe close).
"""

import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

CONFIG = json.loads(sys.argv[1])
APP = CONFIG["app"]
AGENT_UID = CONFIG.get("agent_uid")  # set when this program is namespace root
LIMITS = CONFIG["limits"]
CAP = CONFIG["output_bytes"]
SHELL_ENV = CONFIG["env"]
STATUS_FD = 3
MAXFD = max(64, min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 65536))
PR_SET_DUMPABLE = 4
SWEEP_ROUNDS = 500
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


def agent_process():
    """In a forked child: own session, the agent's uid and limits. The caller then execs."""
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
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.chdir(APP)


def spawn(argv, stdin_fd, out_fd, status_fd=None):
    pid = os.fork()
    if pid == 0:
        try:
            agent_process()
            os.dup2(stdin_fd, 0)
            os.dup2(out_fd, 1)
            os.dup2(out_fd, 2)
            if status_fd is not None:
                os.dup2(status_fd, STATUS_FD)
            os.closerange(STATUS_FD + (status_fd is not None), MAXFD)
            os.execve(argv[0], argv, SHELL_ENV)
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
    """SIGKILL every process in the sandbox but its init and this one, until none is left."""
    me = os.getpid()
    for _ in range(SWEEP_ROUNDS):
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        living = []
        for pid in others:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != b"Z":
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
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


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
    if shell is None:
        shell = Shell()
    nonce = os.urandom(8).hex()
    line = f"eval {quote(command)} </dev/null {STATUS_FD}>&-; printf '{nonce} %d\\n' $? >&{STATUS_FD}\n".encode()
    output, status = Output(), b""
    deadline = time.monotonic() + timeout
    exit_code, exited, timed_out = None, False, False
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
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            for fd, _ in poller.poll(max(1, int(remaining * 1000))):
                data = read(fd)
                if data is None:  # nothing after all
                    continue
                if fd == shell.r_out:
                    if data:
                        output.add(data)
                    else:
                        poller.unregister(fd)
                elif data:
                    status += data
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
        timed_out = True
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
    text, truncated = output.text()
    return {"output": text, "exit_code": exit_code, "timed_out": timed_out, "shell_exited": exited, "truncated": truncated, "restarted": restarted}


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
    pid = spawn(["/bin/bash", "--noprofile", "--norc", "-c", script], devnull, w_out)
    os.close(w_out)
    os.close(devnull)
    os.set_blocking(r_out, False)
    output, deadline, code, timed_out = Output(), time.monotonic() + timeout, None, False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
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


def main():
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # an agent of the same uid cannot trace us
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    write_files(CONFIG["files"])
    replies.write(json.dumps({"op": "hello", "pid": os.getpid()}) + "\n")
    os.dup2(devnull, 2)  # the host stops reading our stderr once we are up
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
