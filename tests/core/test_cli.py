"""The ``gem-core`` command: list, play (human, random, oracle) and the vector batch mode."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import gem_core
from gem_core import cli, play
from gem_core.core import Env
from gem_core.errors import GemError

GTN = "game:GuessTheNumber-v0-hard"
GTN_EASY = "game:GuessTheNumber-v0-easy"


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- list --------------------------------------------------------------------------------------------


def _blocks(out: str) -> dict[str, list[tuple[str, str]]]:
    """``gem-core list`` output as {block header: [(first column, rest), ...]}."""
    blocks = {}
    for block in out.strip("\n").split("\n\n"):
        header, *rows = block.split("\n")
        blocks[header] = [re.fullmatch(r"  (\S+)(?:\s+(.*))?", row).groups(default="") for row in rows]
    return blocks


def test_list_groups_ids_by_category_with_descriptions(capsys):
    code, out, err = run(capsys, ["list"])
    assert code == 0 and err == ""
    blocks = _blocks(out)
    game_ids = gem_core.list_envs("game")
    rows = blocks[f"game ({len(game_ids)} envs)"]
    assert [env_id for env_id, _ in rows] == game_ids
    assert dict(rows)[GTN] == gem_core.spec(GTN).description == "GuessTheNumber, hard"
    categories = {gem_core.spec(i).category for i in gem_core.list_envs()}
    assert {header.split(" (")[0] for header in blocks} - {"aliases"} == categories


def test_list_one_category_and_unknown_category(capsys):
    code, out, _ = run(capsys, ["list", "--category", "game"])
    assert code == 0
    assert [header.split(" (")[0] for header in _blocks(out)] in (["game"], ["game", "aliases"])
    code, out, err = run(capsys, ["list", "--category", "nope"])
    assert code == 2 and out == ""
    assert "no envs in category 'nope'" in err and "game" in err and "Traceback" not in err


def test_gem_core_list_script_runs():
    script = os.path.join(os.path.dirname(sys.executable), "gem-core")
    command = [script, "list"] if os.path.exists(script) else [sys.executable, "-m", "gem_core.cli", "list"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"  {GTN} " in done.stdout and re.search(r"^game \(\d+ envs\)$", done.stdout, flags=re.M)


def test_import_gem_core_does_not_import_the_cli():
    code = "import sys, gem_core; print('gem_core.cli' in sys.modules, 'tqdm' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "False"], done.stderr


# -- errors ------------------------------------------------------------------------------------------


def test_unknown_id_is_a_clear_error_with_exit_code_2(capsys):
    code, out, err = run(capsys, ["play", "game:GuessTheNumber-v0-hrd", "--policy", "random"])
    assert code == 2 and out == ""
    assert err.startswith("gem-core: error: no env registered as 'game:GuessTheNumber-v0-hrd'.")
    assert "game:GuessTheNumber-v0-hard" in err and "Traceback" not in err
    code, _, err = run(capsys, ["play", "zzz:Nothing-v0", "--num-envs", "4"])
    assert code == 2 and "gem-core list" in err


@pytest.mark.parametrize(
    "argv",
    [[], ["dance"], ["play"], ["play", GTN, "--policy", "genius"], ["play", GTN, "--num-envs", "0"], ["play", GTN, "--seed", "x"]],
)
def test_bad_usage_returns_2_instead_of_raising(capsys, argv):
    code, _, err = run(capsys, argv)
    assert code == 2 and "usage: gem-core" in err


def test_help_returns_0(capsys):
    code, out, _ = run(capsys, ["play", "--help"])
    assert code == 0 and "--num-envs" in out and "--policy" in out


class NoOracleEnv(Env[str, str]):
    """One-turn env with no oracle_action."""

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return "say anything", {}

    def step(self, action):
        return "ok", 0.0, True, False, {}

    def sample_random_action(self) -> str:
        return "x"


@pytest.fixture
def no_oracle_env(monkeypatch):
    """``gem_core.make`` builds a NoOracleEnv (the id still resolves, so spec() passes)."""
    monkeypatch.setattr(gem_core, "make", lambda env_id, **_: NoOracleEnv())


def test_oracle_needs_oracle_action(capsys, no_oracle_env):
    code, _, err = run(capsys, ["play", GTN, "--policy", "oracle"])
    assert code == 2 and "has no oracle_action()" in err
    code, _, err = run(capsys, ["play", GTN, "--policy", "oracle", "--episodes", "2"])
    assert code == 2 and "has no oracle_action()" in err
    code, out, _ = run(capsys, ["play", GTN, "--policy", "random", "--seed", "0"])
    assert code == 0 and "[turn 1] action x  reward +0.000\nok" in out


def test_batch_mode_refuses_the_human_policy(capsys):
    code, _, err = run(capsys, ["play", GTN, "--policy", "human", "--num-envs", "2"])
    assert code == 2 and "--policy random" in err


# -- play: one episode -------------------------------------------------------------------------------


def _bare_episode(env_id: str, seed: int, policy: str) -> list[tuple[str, str, float]]:
    env = gem_core.make(env_id)
    env.reset(seed=seed)
    turns = []
    while True:
        action = env.sample_random_action() if policy == "random" else env.oracle_action()
        obs, reward, terminated, truncated, _ = env.step(action)
        turns.append((action, obs, reward))
        if terminated or truncated:
            return turns


@pytest.mark.parametrize("policy", ["random", "oracle"])
def test_self_play_prints_each_turn_and_is_reproducible(capsys, policy):
    code, out, err = run(capsys, ["play", GTN, "--policy", policy, "--seed", "11"])
    assert code == 0 and err == ""
    turns = _bare_episode(GTN, 11, policy)
    for number, (action, obs, reward) in enumerate(turns, start=1):
        assert f"[turn {number}] action {action}  reward {reward:+.3f}\n{obs}\n" in out
    assert f"[turn {len(turns) + 1}]" not in out
    assert out.startswith(f"== {GTN}  (seed 11, policy {policy}) ==\n")
    assert out.rstrip().endswith(f"after {len(turns)} turn{'s' if len(turns) != 1 else ''}, return {sum(r for *_, r in turns):+.3f} ==")
    if policy == "oracle":
        assert "== episode won after" in out
    assert run(capsys, ["play", GTN, "--policy", policy, "--seed", "11"])[1] == out


def test_human_play_wraps_bare_answers_and_quits_cleanly_on_eof(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("25\n\n I pick \\boxed{12}\n"))
    code, out, err = run(capsys, ["play", GTN, "--seed", "4"])
    assert code == 0 and err == ""
    bare = gem_core.make(GTN)
    task, _ = bare.reset(seed=4)
    first = bare.step("\\boxed{25}")[0]
    second = bare.step("I pick \\boxed{12}")[0]
    assert task in out
    assert f"[turn 1] action \\boxed{{25}}  reward +0.000\n{first}\n\nEnter your next guess.\n" in out
    assert f"[turn 2] reward +0.000\n{second}\n" in out  # already boxed: not echoed back
    assert "[turn 3]" not in out  # the blank line was skipped, not played
    assert out.rstrip().endswith("bye (episode not finished)")


def test_human_play_to_a_win(capsys, monkeypatch):
    bare = gem_core.make(GTN_EASY)
    bare.reset(seed=9)
    target = bare.unwrapped.target
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{target}\nthis line is never read\n"))
    code, out, _ = run(capsys, ["play", GTN_EASY, "--seed", "9", "--policy", "human"])
    assert code == 0
    assert out.rstrip().endswith("== episode won after 1 turn, return +1.000 ==")


# -- play: batch mode (with a scripted vector env, then the real one) --------------------------------


class FixedLengthEnv(Env[str, str]):
    """Every episode lasts ``length`` turns, 0.5 reward per turn; ends by winning or by truncation."""

    def __init__(self, length: int, win: bool, format_error_on_first: bool = False, moves_when_done: bool = True):
        self.length, self.win, self.format_error_on_first = length, win, format_error_on_first
        self.moves_when_done = moves_when_done
        self.turn = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return "go", {}

    def step(self, action):
        assert action == "act", action
        self.turn += 1
        end = self.turn >= self.length
        info = {"success": end and self.win, "format_error": self.format_error_on_first and self.turn == 1}
        return "obs", 0.5, end and self.win, end and not self.win, info

    def sample_random_action(self) -> str:
        if self.turn >= self.length and not self.moves_when_done:
            raise RuntimeError("no move in a finished game")  # some games cannot move when done
        return "act"


class ScriptedVectorEnv:
    """The vector API the CLI codes against, with NEXT_STEP autoreset, over given envs."""

    def __init__(self, envs: list[Env]):
        self.envs = envs
        self.num_envs = len(envs)
        self._ended = np.zeros(self.num_envs, dtype=bool)
        self.closed = False
        self.seed: int | None = None
        self.step_calls: list[list[int]] = []  # the env indices of each step() call

    def reset(self, seed: int | None = None):
        self.seed = seed
        self._ended[:] = False
        results = [env.reset(seed=None if seed is None else seed + i) for i, env in enumerate(self.envs)]
        return [o for o, _ in results], [i for _, i in results]

    def call(self, name: str) -> list[Any]:
        try:
            return [getattr(env, name)() for env in self.envs]
        except Exception as exc:  # the real vector env raises VectorEnvError, a GemError
            raise GemError(f"call({name!r}) failed: {exc}") from exc

    def step(self, actions: list[str] | dict[int, str]):
        if not isinstance(actions, dict):
            assert len(actions) == self.num_envs
            actions = dict(enumerate(actions))
        self.step_calls.append(sorted(actions))
        obs, infos = [], []
        rewards = np.zeros(len(actions))
        terminated = np.zeros(len(actions), dtype=bool)
        truncated = np.zeros(len(actions), dtype=bool)
        for k, (i, action) in enumerate(actions.items()):
            env = self.envs[i]
            if self._ended[i]:
                o, info = env.reset()
                info = {**info, "autoreset": True}
                self._ended[i] = False
            else:
                o, rewards[k], terminated[k], truncated[k], info = env.step(action)
                self._ended[i] = terminated[k] or truncated[k]
            obs.append(o)
            infos.append(info)
        return obs, rewards, terminated, truncated, infos

    def close(self):
        self.closed = True


@pytest.fixture
def scripted_vector(monkeypatch):
    made: dict[str, Any] = {"moves_when_done": True}

    def fake_make_vec(env_id, num_envs, vectorization_mode="sync", wrappers=(), **_):
        # env 0: one-turn wins (first turn a format error); env 1: three-turn truncations
        moves = made["moves_when_done"]
        envs = [
            FixedLengthEnv(1, win=True, format_error_on_first=True, moves_when_done=moves),
            FixedLengthEnv(3, win=False, moves_when_done=moves),
        ]
        for wrapper in wrappers:  # what the command asks of make_vec (the episode statistics) is applied
            envs = [wrapper(env) for env in envs]
        made.update(env_id=env_id, num_envs=num_envs, mode=vectorization_mode, vec=ScriptedVectorEnv(envs[:num_envs]))
        return made["vec"]

    monkeypatch.setattr(gem_core, "make_vec", fake_make_vec)
    return made


def _table_values(out: str) -> dict[str, str]:
    return {m[0]: m[1] for m in re.findall(r"^  ([a-z/ -]+?)  +(.+)$", out, flags=re.M)}


@pytest.mark.parametrize("moves_when_done", [True, False])
def test_batch_counts_episodes_and_skips_autoreset_steps(capsys, scripted_vector, moves_when_done):
    scripted_vector["moves_when_done"] = moves_when_done
    code, out, err = run(capsys, ["play", GTN, "--policy", "random", "--num-envs", "2", "--episodes", "4", "--vector", "async"])
    assert code == 0 and err == ""  # stdout is not a tty: no progress bar
    vec = scripted_vector["vec"]
    assert scripted_vector["num_envs"] == 2 and scripted_vector["mode"] == "async"
    assert vec.closed and vec.seed == 0
    if moves_when_done:
        # step 1: env0 ends (ep 1); 2: env0 autoresets; 3: env0 ends (ep 2), env1 ends (ep 3);
        # 4: both autoreset; 5: env0 ends (ep 4). Turns: env0 3, env1 4 (steps 1, 2, 3, 5).
        assert vec.step_calls == [[0, 1]] * 5
        turns = 7
    else:
        # A finished env cannot pick a move, so it is autoreset alone (a subset step) first:
        # env0 ends at each full step (eps 1, 2, 3), env1 at the third (ep 4). Turns: 3 + 3.
        assert vec.step_calls == [[0, 1], [0], [0, 1], [0], [0, 1]]
        turns = 6
    values = _table_values(out)
    assert out.startswith(f"{GTN}  policy=random  num_envs=2  vector=async  seed=0\n")
    assert values["episodes"] == "4"
    assert values["mean return"] == f"{(0.5 + 0.5 + 1.5 + 0.5) / 4:.4f}"
    assert values["success rate"] == "75.0%"
    assert values["mean length"] == "1.50 turns"
    assert values["format-error rate"] == "75.0% of episodes"
    assert values["truncation rate"] == "25.0% of episodes"
    assert re.fullmatch(rf"[\d,]+  \({turns} turns in \d+\.\d\ds\)", values["steps/s"])


def test_batch_defaults_and_single_env(capsys, scripted_vector):
    code, out, _ = run(capsys, ["play", GTN, "--episodes", "2", "--seed", "5"])
    assert code == 0 and scripted_vector["num_envs"] == 1 and scripted_vector["mode"] == "sync"
    assert scripted_vector["vec"].seed == 5 and "policy=random" in out
    values = _table_values(out)
    assert values["episodes"] == "2" and values["mean length"] == "1.00 turns" and values["success rate"] == "100.0%"


def test_progress_bar_only_when_enabled():
    assert play._progress_bar(10, "x", enabled=False) is None
    bar = play._progress_bar(10, "x", enabled=True)
    try:
        assert bar.total == 10
    finally:
        bar.close()


def _real_vector_available() -> bool:
    try:
        from gem_core import vector
    except ImportError:
        return False
    return hasattr(vector, "SyncVectorEnv") and hasattr(vector, "AsyncVectorEnv")


@pytest.mark.skipif(not _real_vector_available(), reason="gem_core.vector is not there yet")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_batch_on_the_real_vector_env(capsys, mode):
    argv = ["play", GTN_EASY, "--policy", "random", "--num-envs", "8", "--episodes", "30", "--vector", mode, "--no-progress"]
    code, out, err = run(capsys, argv)
    assert code == 0, err
    values = _table_values(out)
    assert values["episodes"] == "30"
    assert 1.0 <= float(values["mean length"].split()[0]) <= 4.0  # the easy variant has 4 turns
    assert values["format-error rate"] == "0.0% of episodes"  # random actions are well formed
    assert run(capsys, argv)[1].split("steps/s")[0] == out.split("steps/s")[0]  # same seed, same numbers


@pytest.mark.skipif(not _real_vector_available(), reason="gem_core.vector is not there yet")
def test_batch_oracle_wins_every_episode(capsys):
    code, out, err = run(capsys, ["play", GTN, "--policy", "oracle", "--num-envs", "4", "--episodes", "12"])
    assert code == 0, err
    values = _table_values(out)
    assert values["success rate"] == "100.0%" and values["truncation rate"] == "0.0% of episodes"


def test_play_shows_a_person_the_board_the_model_sees(capsys):
    """Sudoku keeps its grid in info['suffix']: `gem-core play` shows it after reset and every step."""
    from gem_core.cli import main

    assert main(["play", "game:Sudoku-v0-easy", "--policy", "random", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    env = gem_core.make("game:Sudoku-v0-easy")
    env.reset(seed=0)
    assert env.unwrapped.render_board() in out.split("[turn 1]")[0]
