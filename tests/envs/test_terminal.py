"""The Terminal env: every shipped task is solvable and not solved by its untouched files, the shell
persists across turns, bad actions are penalised with one clear observation, time limits restart the
shell and keep the files, state replays, and no sandbox process outlives its env."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from sandbox_support import require_bwrap  # noqa: E402

import gem_core  # noqa: E402
from gem_core.core import MAX_OBSERVATION_CHARS, model_message  # noqa: E402
from gem_core.envs.terminal.env import MAX_COMMAND_CHARS, TerminalEnv, parse_action  # noqa: E402
from gem_core.envs.terminal.shell import ShellSandbox, living_sandbox_processes  # noqa: E402
from gem_core.envs.terminal.tasks import TASK_NAMES, TASKS  # noqa: E402

ENV_ID = "terminal:Tasks-v0"


@pytest.fixture(autouse=True)
def _bwrap():
    require_bwrap()


def bash(command: str) -> str:
    return f"```bash\n{command}\n```"


def sandbox_processes() -> list[int]:
    """Living processes of this test process's terminal sandboxes (not the Python tool's pool workers)."""
    return living_sandbox_processes()


def make(task: str, **kwargs) -> TerminalEnv:
    env = gem_core.make(ENV_ID, task=task, command_timeout=kwargs.pop("command_timeout", 3.0), **kwargs)
    env.reset(seed=0)
    return env


def test_between_8_and_12_tasks_ship_with_unique_names():
    assert 8 <= len(TASKS) <= 12 and len(set(TASK_NAMES)) == len(TASKS)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_reference_solution_passes_and_untouched_files_fail(name):
    env = make(name)
    for _ in env.episode.solution:
        _obs, reward, terminated, truncated, info = env.step(env.oracle_action())
        assert reward == 0.0 and not terminated and not truncated, info
    assert env.oracle_action() == "submit"
    obs, reward, terminated, truncated, info = env.step("submit")
    assert (reward, terminated, truncated, info["success"], info["checker_exit_code"]) == (1.0, True, False, True, 0), obs
    # The same checker on the task's untouched files (a command that changes nothing ran first).
    env.reset(seed=0)
    env.step(bash("true"))
    obs, reward, terminated, _truncated, info = env.step("submit")
    assert reward == 0.0 and terminated and info["checked"] and info["checker_exit_code"] != 0, obs
    env.close()


@pytest.mark.parametrize("name", TASK_NAMES)
def test_the_reference_solution_passes_on_every_seed(name):
    """Each episode draws its own files, numbers and checker inputs: the reference solution solves them
    all, and the untouched files of each fail (issue 63: checker inputs the agent cannot predict)."""
    env = gem_core.make(ENV_ID, task=name, command_timeout=10.0)
    try:
        for seed in range(1, 5):
            env.reset(seed=seed)
            while (action := env.oracle_action()) != "submit":
                env.step(action)
            obs, reward, *_ = env.step("submit")
            assert reward == 1.0, (seed, obs)
            env.reset(seed=seed)
            env.step(bash("true"))
            obs, reward, _terminated, _truncated, info = env.step("submit")
            assert reward == 0.0 and info["checked"], (seed, obs)
    finally:
        env.close()


def test_shell_state_persists_and_stdin_is_not_the_shell():
    env = make("count-errors")
    assert "5\n/tmp" in env.step(bash("cd /tmp && X=5 && echo $X && pwd"))[0]
    obs = env.step(bash("echo $X; pwd; cat; echo 'two\nlines'"))[0]
    assert obs == "5\n/tmp\ntwo\nlines\n[exit code: 0]"  # `cat` read /dev/null, not the next command
    obs, reward, *_ = env.step(bash("echo 'unbalanced"))
    assert "unexpected EOF" in obs and reward == 0.0
    assert env.step(bash("false"))[0] == "[exit code: 1]"
    assert "shell exited" in env.step(bash("exit 3"))[0]
    assert env.step(bash("pwd"))[0] == "/app\n[exit code: 0]"  # a new shell, in /app
    env.close()


@pytest.mark.parametrize(
    ("action", "why"),
    [
        ("ls -la", "no ```bash code block"),
        ("```bash\n   \n```", "empty ```bash code block"),
        (None, "not text"),
        (42, "not text"),
    ],
)
def test_malformed_action_is_a_format_error_and_the_episode_goes_on(action, why):
    env = make("count-errors")
    obs, reward, terminated, truncated, info = env.step(action)
    assert reward == TerminalEnv.format_error_reward and info["format_error"] and not (terminated or truncated)
    assert why in obs and "```bash" in obs
    assert env.step(bash("echo ok"))[0] == "ok\n[exit code: 0]"
    env.close()


def test_action_forms():
    assert parse_action("<bash>ls</bash>") == ("command", "ls")
    assert parse_action("first\n```bash\necho a\n```\nthen\n```sh\necho b\n```") == ("command", "echo b")
    assert parse_action("  Submit \n") == ("submit", None) and parse_action(bash("done")) == ("submit", None)
    kind, _ = parse_action(bash("x" * (MAX_COMMAND_CHARS + 1)))
    assert kind == "too_long"


def test_a_huge_command_is_refused_with_a_bounded_echo():
    env = make("count-errors")
    obs, reward, terminated, _truncated, info = env.step(bash("echo " + "y" * 1_000_000))
    assert info["invalid_action"] and reward < 0 and not terminated
    assert "(1000005 chars)" in obs and len(obs) < 400
    env.close()


def test_timeout_kills_the_shell_keeps_files_and_penalises():
    env = make("count-errors", command_timeout=1.0)
    env.step(bash("echo kept > note.txt; cd /tmp; Y=1"))
    obs, reward, terminated, _truncated, info = env.step(bash("sleep 30 & while :; do :; done"))
    assert info["timed_out"] and reward == TerminalEnv.timeout_reward and not terminated and "killed" in obs
    obs = env.step(bash("cat note.txt; echo [$Y]; pwd; ps -e | grep -c sleep"))[0]
    assert obs == "kept\n[]\n/app\n0\n[exit code: 1]"  # files kept; cwd, variables and the sleeper gone
    env.close()


def test_turn_limit_truncates_and_runs_the_checker():
    env = make("count-errors", max_turns=2)
    env.step(bash("grep -c ERROR app.log > error_count.txt"))
    obs, reward, terminated, truncated, info = env.step(bash("cat error_count.txt"))
    assert truncated and not terminated and reward == 1.0 and info["success"] and "all 2 turns" in obs
    with pytest.raises(gem_core.ResetNeeded):
        env.step(bash("ls"))
    env.close()


def test_no_command_scores_zero_without_a_sandbox():
    env = make("make-tree", max_turns=1)
    obs, reward, _terminated, truncated, info = env.step("no command")
    assert truncated and reward == TerminalEnv.format_error_reward and info["checked"] is False
    assert env._sandbox is None


def test_output_is_capped_head_and_tail():
    env = make("count-errors", max_output_bytes=1000)
    obs, _reward, _t, _tr, info = env.step(bash("seq 1 100000"))
    assert info["truncated"] and obs.startswith("1\n2\n") and "100000\n[exit code: 0]" in obs
    assert "bytes of output omitted" in obs and len(obs) < 1300
    env.close()


def test_state_replays_commands_in_a_new_sandbox_and_clones_are_independent():
    env = make("count-errors")
    env.step(bash("echo one > a.txt; cd /tmp"))
    state = env.get_state()
    twin = env.clone()
    env.step(bash("echo two >> /app/a.txt"))
    assert env.step(bash("cat /app/a.txt"))[0] == "one\ntwo\n[exit code: 0]"
    assert twin.step(bash("cat /app/a.txt; pwd"))[0] == "one\n/tmp\n[exit code: 0]"  # replayed: cwd too
    env.set_state(state)
    assert env.turn == 1 and env.step(bash("cat /app/a.txt"))[0] == "one\n[exit code: 0]"
    env.close()
    twin.close()


def test_close_ends_every_sandbox_process_and_the_env_can_be_closed_twice():
    env = make("count-errors")
    env.step(bash("(sleep 1000 &) ; setsid sleep 1000 & echo started"))
    assert sandbox_processes()
    env.close()
    env.close()
    assert sandbox_processes() == []


def test_dropped_env_ends_its_sandbox():
    env = make("count-errors")
    env.step(bash("sleep 1000 &"))
    assert sandbox_processes()
    del env
    assert sandbox_processes() == []


def test_messages_stay_bounded_and_seeds_pick_tasks():
    seen = set()
    for seed in range(12):
        env = gem_core.make(ENV_ID)
        obs, info = env.reset(seed=seed)
        seen.add(info["task"])
        assert len(model_message(obs, info)) <= MAX_OBSERVATION_CHARS
        obs, _r, _t, _tr, info = env.step(bash("cat /dev/urandom | head -c 20000 | base64 -w 0"))
        assert len(model_message(obs, info)) <= MAX_OBSERVATION_CHARS
        env.close()
    assert len(seen) >= 4


def test_sandbox_refuses_to_start_without_bwrap(monkeypatch):
    from gem_core.tools.sandbox import SandboxUnavailable
    from gem_core.tools.sandbox import policy

    monkeypatch.setattr(policy.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        gem_core.make(ENV_ID)
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        ShellSandbox([]).start()


def test_control_characters_reach_observations_escaped():
    env = make("count-errors")
    try:
        # a terminal title, the clipboard (OSC 52), a cleared screen, a bell, a NUL, a C1 CSI
        obs = env.step(bash("printf 'a\\033]0;title\\007b\\033]52;c;ZXZpbA==\\007c\\033[2Jd\\000e\\302\\233f\\tg\\n'"))[0]
    finally:
        env.close()
    assert not any(ord(ch) < 32 and ch not in "\n\t" or 0x7F <= ord(ch) <= 0x9F for ch in obs), repr(obs)
    assert "a\\x1b]0;title\\x07b" in obs and "d\\x00e" in obs and "\\x9bf\tg" in obs, repr(obs)


def test_an_interpreter_path_with_dotdot_starts_the_sandboxes(tmp_path, monkeypatch):
    """``/tmp/x/../../venv/bin/python`` (Python 3.10 keeps such a path in sys.executable): a directory the
    sandbox does not have (its /tmp is its own) on the way. The sandbox binds resolved directories, and
    the interpreter it starts must be one of them: the Terminal env's and the Python tool's."""
    from gem_core.tools.sandbox import PythonSandbox

    dotted = os.path.join(tmp_path, os.path.relpath(os.path.abspath(sys.executable), tmp_path))
    assert ".." in dotted and os.path.samefile(dotted, sys.executable)
    monkeypatch.setattr(sys, "executable", dotted)
    env = make("count-errors")
    try:
        obs, _reward, terminated, _truncated, info = env.step(bash("echo $((6 * 7))"))
    finally:
        env.close()
    assert obs == "42\n[exit code: 0]" and not terminated, (obs, info)
    sandbox = PythonSandbox(workers=1, tmpfs_mb=63)  # a pool of its own, started with the dotted path
    try:
        assert sandbox.run("print(6 * 7)").stdout == "42\n"
    finally:
        sandbox.close()
