"""Wrappers: exact behaviour of each, composition, live delegation, state through wrappers."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

import gem_core
from gem_core.core import Env, Wrapper
from gem_core.errors import ResetNeeded
from gem_core.wrappers import EpisodeStatistics, EpisodeTotals, HistoryWrapper, TimeLimit

GTN = "game:GuessTheNumber-v0-hard"
GTN_EASY = "game:GuessTheNumber-v0-easy"


class ScriptEnv(Env[str, str]):
    """A toy env whose action text decides what happens, so every info flag can be driven.

    ``"done"`` wins (reward 1, terminated); ``"bad"`` is a format error (-0.1); ``"illegal"`` an
    invalid action (0); anything else earns 0.25. The env truncates itself after ``limit`` turns.
    """

    def __init__(self, limit: int = 10, suffix: str | None = "Your move.", task: str = "Task: say done."):
        self.limit = limit
        self.suffix = suffix
        self.task = task
        self.turn = 0
        self.extra_info: dict[str, Any] = {}

    def _info(self, **flags: Any) -> dict[str, Any]:
        info = dict(self.extra_info, **flags)
        if self.suffix is not None:
            info["suffix"] = self.suffix
        return info

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.turn = 0
        return self.task, self._info()

    def step(self, action: str):
        self.turn += 1
        reward = {"done": 1.0, "bad": -0.1, "illegal": 0.0}.get(action, 0.25)
        terminated = action == "done"
        truncated = not terminated and self.turn >= self.limit
        info = self._info(success=terminated, format_error=action == "bad", invalid_action=action == "illegal", turn=self.turn)
        self.last_info = info
        return f"echo {action}", reward, terminated, truncated, info

    def sample_random_action(self) -> str:
        return ["a", "b", "done"][int(self.np_random.integers(3))]


class BoardEnv(ScriptEnv):
    """Observations with an indented first line and surrounding blank lines (a board)."""

    def step(self, action: str):
        _, *rest = super().step(action)
        return "\n   1 2\n A . x\n\n", *rest


# -- HistoryWrapper ----------------------------------------------------------------------------------


def test_history_full_with_actions_exact_text():
    env = HistoryWrapper(ScriptEnv())
    obs, info = env.reset(seed=0)
    assert obs == "Task: say done.\n\nYour move."
    assert info["suffix"] == "Your move."
    obs, *_ = env.step("a")
    assert obs == "Task: say done.\n\n[Turn 1]\nAction: a\nObservation: echo a\n\nYour move."
    obs, *_ = env.step("b")
    assert obs == ("Task: say done.\n\n[Turn 1]\nAction: a\nObservation: echo a\n\n[Turn 2]\nAction: b\nObservation: echo b\n\nYour move.")


def test_history_without_actions_exact_text():
    env = HistoryWrapper(ScriptEnv(), include_actions=False)
    env.reset()
    env.step("a")
    obs, *_ = env.step("b")
    assert obs == "Task: say done.\n\n[Turn 1]\nObservation: echo a\n\n[Turn 2]\nObservation: echo b\n\nYour move."


def test_history_last_k_keeps_task_and_marks_omitted_turns():
    env = HistoryWrapper(ScriptEnv(), mode="last_k", k=2)
    env.reset()
    texts = [env.step(a)[0] for a in ["a", "b", "c", "d"]]
    assert texts[1] == ("Task: say done.\n\n[Turn 1]\nAction: a\nObservation: echo a\n\n[Turn 2]\nAction: b\nObservation: echo b\n\nYour move.")
    assert texts[2] == (
        "Task: say done.\n\n[Turn 1 omitted]\n\n[Turn 2]\nAction: b\nObservation: echo b\n\n[Turn 3]\nAction: c\nObservation: echo c\n\nYour move."
    )
    assert texts[3] == (
        "Task: say done.\n\n[Turns 1-2 omitted]\n\n[Turn 3]\nAction: c\nObservation: echo c\n\n[Turn 4]\nAction: d\nObservation: echo d\n\nYour move."
    )


def test_history_last_is_the_latest_turn_only():
    env = HistoryWrapper(ScriptEnv(), mode="last", include_actions=False)
    env.reset()
    assert env.step("a")[0] == "Task: say done.\n\n[Turn 1]\nObservation: echo a\n\nYour move."
    env.step("b")
    assert env.step("c")[0] == "Task: say done.\n\n[Turns 1-2 omitted]\n\n[Turn 3]\nObservation: echo c\n\nYour move."


def test_history_last_k_zero_shows_task_and_count_only():
    env = HistoryWrapper(ScriptEnv(), mode="last_k", k=0)
    env.reset()
    env.step("a")
    assert env.step("b")[0] == "Task: say done.\n\n[Turns 1-2 omitted]\n\nYour move."


def test_history_suffix_absent_and_dropped_on_last_step():
    env = HistoryWrapper(ScriptEnv(suffix=None))
    assert env.reset()[0] == "Task: say done."
    assert env.step("a")[0] == "Task: say done.\n\n[Turn 1]\nAction: a\nObservation: echo a"

    env = HistoryWrapper(ScriptEnv(limit=2))
    env.reset()
    env.step("a")
    obs, _, terminated, truncated, info = env.step("b")  # truncated by the env's own limit
    assert truncated and info["suffix"] == "Your move."
    assert obs.endswith("Observation: echo b")
    env.reset()
    obs, _, terminated, _, _ = env.step("done")
    assert terminated and obs == "Task: say done.\n\n[Turn 1]\nAction: done\nObservation: echo done"


def test_history_prefix_replaces_task_and_parsed_action_replaces_action():
    inner = ScriptEnv()
    inner.extra_info = {"prefix": "Rules: win.", "parsed_action": "A"}
    env = HistoryWrapper(inner)
    assert env.reset()[0] == "Rules: win.\n\nYour move."
    assert env.step("long reasoning ... a")[0] == "Rules: win.\n\n[Turn 1]\nAction: A\nObservation: echo long reasoning ... a\n\nYour move."
    inner.extra_info = {"prefix": "Rules changed."}  # a prefix at a later step replaces the task too
    assert env.step("b")[0].startswith("Rules changed.\n\n[Turn 1]\nAction: A\n")


def test_history_cleans_blank_lines_but_keeps_board_indentation():
    env = HistoryWrapper(BoardEnv(task="\nTask\n"))
    assert env.reset()[0] == "Task\n\nYour move."
    assert env.step("  x  \n")[0] == "Task\n\n[Turn 1]\nAction:   x\nObservation:    1 2\n A . x\n\nYour move."


def test_history_reset_clears_history():
    env = HistoryWrapper(ScriptEnv(), mode="last_k", k=1)
    env.reset()
    env.step("a")
    env.step("b")
    assert env.reset()[0] == "Task: say done.\n\nYour move."
    assert env.step("c")[0] == "Task: say done.\n\n[Turn 1]\nAction: c\nObservation: echo c\n\nYour move."


def test_history_on_guess_the_number_matches_bare_env():
    bare = gem_core.make(GTN)
    task, _ = bare.reset(seed=3)
    first = bare.step("\\boxed{25}")[0]
    second = bare.step("I think \\boxed{12}")[0]

    env = gem_core.make(GTN, wrappers=[HistoryWrapper])
    obs, _ = env.reset(seed=3)
    assert obs == task  # the instructions already ask for the first guess: no reset suffix
    assert task.endswith("Enter your first guess to start the game.")
    env.step("\\boxed{25}")
    obs, *_ = env.step("I think \\boxed{12}")
    assert obs == (
        f"{task}\n\n[Turn 1]\nAction: \\boxed{{25}}\nObservation: {first}\n\n"
        f"[Turn 2]\nAction: I think \\boxed{{12}}\nObservation: {second}\n\nEnter your next guess."
    )


@pytest.mark.parametrize(
    "kwargs",
    [dict(mode="window"), dict(mode="last_k"), dict(mode="last_k", k=-1), dict(mode="last_k", k=1.5), dict(mode="full", k=3)],
)
def test_history_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        HistoryWrapper(ScriptEnv(), **kwargs)


def test_history_rejects_non_text_observations():
    class DictEnv(ScriptEnv):
        def reset(self, seed=None, options=None):
            return {"text": "hi"}, {}

    with pytest.raises(TypeError, match="string observations"):
        HistoryWrapper(DictEnv()).reset()


# -- EpisodeStatistics -------------------------------------------------------------------------------


def test_episode_statistics_counts_the_episode():
    inner = ScriptEnv()
    env = EpisodeStatistics(inner)
    env.reset()
    for action in ["a", "bad", "illegal", "illegal"]:
        info = env.step(action)[4]
        assert "episode" not in info
    obs, reward, terminated, truncated, info = env.step("done")
    assert terminated and not truncated
    episode = info["episode"]
    assert set(episode) == {"return", "length", "success", "time", "format_errors", "invalid_actions", "truncated"}
    assert episode["truncated"] is False
    assert episode["return"] == pytest.approx(0.25 - 0.1 + 0.0 + 0.0 + 1.0)
    assert isinstance(episode["return"], float)
    assert episode["length"] == 5 and episode["success"] is True
    assert episode["format_errors"] == 1 and episode["invalid_actions"] == 2
    assert isinstance(episode["time"], float) and 0.0 <= episode["time"] < 5.0
    assert "episode" not in inner.last_info  # the env's own dict is not mutated
    assert obs == "echo done" and reward == 1.0


def test_episode_statistics_on_truncation_and_reset_starts_over():
    env = EpisodeStatistics(ScriptEnv(limit=3))
    env.reset()
    env.step("a")
    env.step("a")
    info = env.step("bad")[4]
    assert info["episode"]["success"] is False and info["episode"]["length"] == 3
    assert info["episode"]["return"] == pytest.approx(0.4) and info["episode"]["truncated"] is True
    env.reset()
    info = env.step("done")[4]
    assert info["episode"]["length"] == 1 and info["episode"]["return"] == 1.0
    assert info["episode"]["format_errors"] == 0


def test_episode_statistics_missing_flags_count_as_zero():
    class Quiet(ScriptEnv):
        def step(self, action):
            obs, r, te, tr, _ = super().step(action)
            return obs, r, te, tr, {}

    env = EpisodeStatistics(Quiet())
    env.reset()
    episode = env.step("done")[4]["episode"]
    assert episode["success"] is False and episode["format_errors"] == 0 and episode["invalid_actions"] == 0


def test_episode_statistics_on_guess_the_number_oracle():
    env = gem_core.make(GTN, wrappers=[EpisodeStatistics])
    env.reset(seed=7)
    turns = 0
    while True:
        turns += 1
        _, _, terminated, truncated, info = env.step(env.oracle_action())  # oracle_action via delegation
        if terminated or truncated:
            break
    assert info["episode"]["success"] is True and info["episode"]["length"] == turns
    assert info["episode"]["return"] == 1.0


# -- TimeLimit ---------------------------------------------------------------------------------------


def test_time_limit_truncates_without_terminating():
    env = TimeLimit(ScriptEnv(), max_turns=3)
    env.reset()
    for _ in range(2):
        _, _, terminated, truncated, info = env.step("a")
        assert not terminated and not truncated and "time_limit" not in info
    _, _, terminated, truncated, info = env.step("a")
    assert truncated is True and terminated is False and info["time_limit"] is True
    assert env.elapsed_turns == 3 and env.turn_limit == 3
    with pytest.raises(ResetNeeded):
        env.step("a")
    env.reset()
    assert env.elapsed_turns == 0
    assert env.step("a")[3] is False


def test_time_limit_termination_on_the_last_turn_wins():
    env = TimeLimit(ScriptEnv(), max_turns=2)
    env.reset()
    env.step("a")
    _, _, terminated, truncated, info = env.step("done")
    assert terminated and not truncated and "time_limit" not in info


def test_time_limit_composes_with_an_env_limit():
    inner_first = TimeLimit(ScriptEnv(limit=2), max_turns=5)
    inner_first.reset()
    inner_first.step("a")
    _, _, terminated, truncated, info = inner_first.step("a")
    assert truncated and not terminated and "time_limit" not in info  # the env's own limit

    both = TimeLimit(ScriptEnv(limit=3), max_turns=3)
    both.reset()
    both.step("a")
    both.step("a")
    _, _, terminated, truncated, info = both.step("a")
    assert truncated and not terminated and info["time_limit"] is True

    nested = TimeLimit(TimeLimit(ScriptEnv(), max_turns=5), max_turns=2)
    nested.reset()
    nested.step("a")
    assert nested.step("a")[3] is True

    game = gem_core.make(GTN, wrappers=[partial(TimeLimit, max_turns=2)])
    assert game.max_turns == 7  # the game's own limit is not hidden by the wrapper
    game.reset(seed=0)
    game.step("\\boxed{1}")
    _, _, terminated, truncated, info = game.step("\\boxed{2}")
    assert truncated and not terminated and info["time_limit"] is True and game.max_turns == 7


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None])
def test_time_limit_rejects_bad_limits(bad):
    with pytest.raises(ValueError):
        TimeLimit(ScriptEnv(), max_turns=bad)


# -- composition, delegation, state ------------------------------------------------------------------


def _stack(env_id: str = GTN) -> Env:
    return gem_core.make(
        env_id,
        wrappers=[partial(TimeLimit, max_turns=3), EpisodeStatistics, partial(HistoryWrapper, mode="last")],
    )


def test_wrappers_compose():
    env = _stack()
    task, _ = env.reset(seed=0)
    assert task.endswith("Enter your first guess to start the game.")
    env.step("\\boxed{1}")
    env.step("\\boxed{2}")
    obs, _, terminated, truncated, info = env.step("\\boxed{3}")
    assert truncated and not terminated and info["time_limit"]
    assert info["episode"]["length"] == 3 and info["episode"]["success"] is False
    assert "[Turns 1-2 omitted]\n\n[Turn 3]\nAction: \\boxed{3}\nObservation: At turn 3" in obs
    assert not obs.endswith("Enter your next guess.")
    assert isinstance(env, HistoryWrapper) and isinstance(env.env, EpisodeStatistics)
    assert isinstance(env.env.env, TimeLimit) and env.unwrapped is env.env.env.env


def test_delegation_is_live():
    env = _stack()
    game = env.unwrapped
    env.reset(seed=0)
    game.max_number = 42  # changed on the inner env after wrapping
    assert env.max_number == 42
    game.new_attribute = "fresh"
    assert env.new_attribute == "fresh"
    assert env.spec.id == GTN and env.np_random is game.np_random
    assert env.sample_random_action().startswith("\\boxed{")
    with pytest.raises(AttributeError):
        getattr(env, "_private_thing")  # private names are not forwarded


def test_wrappers_do_not_copy_inner_attributes():
    for wrapper in (HistoryWrapper, EpisodeStatistics, partial(TimeLimit, max_turns=2)):
        env = wrapper(ScriptEnv())
        assert "limit" not in vars(env) and "task" not in vars(env)
        env.unwrapped.limit = 99
        assert env.limit == 99


def test_state_roundtrip_through_wrappers():
    env = _stack()
    env.reset(seed=5)
    # Three guesses that miss, whatever number the seed drew: the episode must still be running.
    first, *rest = [f"\\boxed{{{g}}}" for g in (10, 20, 30, 40) if g != env.unwrapped.target][:3]
    env.step(first)
    state = env.get_state()
    later = [env.step(a) for a in rest]
    env.set_state(state)
    replay = [env.step(a) for a in rest]
    for (o1, r1, te1, tr1, i1), (o2, r2, te2, tr2, i2) in zip(later, replay):
        assert (o1, r1, te1, tr1) == (o2, r2, te2, tr2)
        i1 = {**i1, "episode": {**i1["episode"], "time": 0}} if "episode" in i1 else i1
        i2 = {**i2, "episode": {**i2["episode"], "time": 0}} if "episode" in i2 else i2
        assert i1 == i2
    assert replay[-1][3] and replay[-1][4]["episode"]["length"] == 3  # TimeLimit's counter came back too


def test_state_covers_history_and_clone_is_independent():
    env = HistoryWrapper(ScriptEnv())
    env.reset()
    env.step("a")
    state = env.get_state()
    env.step("b")
    env.set_state(state)
    assert env.render("S") == "Task: say done.\n\n[Turn 1]\nAction: a\nObservation: echo a\n\nS"

    copy = env.clone()
    copy.step("c")
    assert "echo c" not in env.render() and "echo c" in copy.render()
    assert copy.env is not env.env


def test_wrapper_base_class_is_used():
    for wrapper in (HistoryWrapper, EpisodeStatistics, TimeLimit):
        assert issubclass(wrapper, Wrapper)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_wrappers_inside_a_vector_env(mode):
    vec = gem_core.make_vec(GTN_EASY, 2, vectorization_mode=mode, wrappers=[EpisodeStatistics, partial(HistoryWrapper, mode="last")])
    try:
        obs, _ = vec.reset(seed=0)
        assert all(o.endswith("Enter your first guess to start the game.") for o in obs)
        episodes = []
        for _ in range(4):  # the easy variant ends within 4 turns
            _, _, terminated, truncated, infos = vec.step(vec.call("sample_random_action"))
            episodes += [info["episode"] for info, end in zip(infos, terminated | truncated) if end]
        assert len(episodes) == 2 and all(1 <= e["length"] <= 4 for e in episodes)
    finally:
        vec.close()


def test_episode_totals_sum_the_summaries():
    summaries = [
        {"return": 1.0, "length": 2, "success": True, "format_errors": 1, "invalid_actions": 0, "truncated": False},
        {"return": -0.5, "length": 4, "success": False, "format_errors": 0, "invalid_actions": 2, "truncated": True},
        {"return": 0.5, "length": 3, "success": True},  # the flags absent: zero
    ]
    totals = EpisodeTotals.of(summaries)
    assert totals.episodes == 3 and totals.successes == 2 and totals.success_rate == pytest.approx(2 / 3)
    assert totals.mean_return == pytest.approx(1.0 / 3) and totals.mean_length == pytest.approx(3.0)
    assert totals.length_when_solved == pytest.approx(2.5) and totals.turns == 9
    assert totals.format_error_turn_rate == pytest.approx(1 / 9) and totals.invalid_action_turn_rate == pytest.approx(2 / 9)
    assert totals.format_error_rate == pytest.approx(1 / 3) and totals.truncation_rate == pytest.approx(1 / 3)
    empty = EpisodeTotals.of([])
    assert (empty.episodes, empty.success_rate, empty.mean_return, empty.length_when_solved, empty.format_error_turn_rate) == (0, 0.0, 0.0, None, 0.0)


def test_a_trajectory_summary_is_the_wrappers():
    """The trainer's statistics (from trajectories) and `gem-core play`'s (from the wrapper) count alike."""
    from gem_core.rollout import Trajectory, Turn

    env = EpisodeStatistics(ScriptEnv())
    env.reset()
    turns = []
    for index, action in enumerate(["a", "bad", "illegal", "done"]):
        _, reward, terminated, truncated, info = env.step(action)
        turns.append(Turn(index, 0, [], None, [], float(reward), terminated, truncated, info=info))
    trajectory = Trajectory(episode_id="e", prompt_ids=[], turns=turns, terminated=True)
    wrapper_summary = {k: v for k, v in info["episode"].items() if k != "time"}
    assert trajectory.episode_summary() == wrapper_summary
