"""An env-neutral trainer: what `gem-core train` reports beyond success, return and turns comes from the env's
report hook (gem_core.envs.report) and nothing else. Another game and a task env print the common table
alone; an env that implements the hook gets its own columns, baselines and ceiling line; GuessTheNumber keeps
its hint-use columns, its scripted baselines and its hint-blind ceiling."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from gem_core.envs.games.wordle import Wordle  # noqa: E402
from gem_core.envs.report import BlindCeiling, EnvReport, MetricColumn, ScriptedBaseline  # noqa: E402
from gem_core.registry import make, register, registry  # noqa: E402

COMMON = ["", "success rate", "mean return", "turns / episode", "turns / solved", "malformed turns", "illegal turns"]
HINT_COLUMNS = ["consistent with hints", "right way after a hint", "after lower", "after higher"]
HINT_KEYS = ["hint_consistent_rate", "hint_right_way_rate", "hint_right_after_lower_rate", "hint_right_after_higher_rate"]


def _train(tiny, tmp_path, capsys, env: str) -> tuple[list[str], list[str], list[dict], str]:
    """`gem-core train` on ``env`` with the tiny model through the CLI: the table's header cells, its row
    labels, the metrics.jsonl lines and the whole output."""
    from gem_core.cli import main

    out = tmp_path / "run"
    argv = ["train", "--env", env, "--model", tiny[0], "--updates", "1", "--episodes-per-update", "2", "--eval-episodes", "2"]
    assert main([*argv, "--warm-start-steps", "0", "--out", str(out), "--no-progress"]) == 0
    output = capsys.readouterr().out
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("success rate"))
    header = [""] + re.split(r"\s{2,}", lines[at].strip())
    rows = []
    for line in lines[at + 2 :]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip())[0])
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return header, rows, metrics, output


@pytest.mark.parametrize("env", ["game:Wordle-v0-easy", "math:Arithmetic-v0"])
def test_another_game_and_a_task_env_print_their_own_table(tiny, tmp_path, capsys, env):
    """A game and a task env that report nothing of their own: the common columns, no baseline rows, no
    ceiling line, and no GuessTheNumber field in metrics.jsonl."""
    header, rows, metrics, output = _train(tiny, tmp_path, capsys, env)
    assert header == COMMON
    assert rows == ["at the start, greedy", "at the start, sampled (T=1)", "after 1 RL updates, greedy", "after 1 RL updates, sampled (T=1)"]
    assert "hint" not in output and "ceiling" not in output
    assert metrics[0]["baselines"] == {}
    for line in metrics:
        assert not [key for key in line if "hint" in key]
        assert {"success_rate", "mean_return", "mean_turns"} <= {key.removeprefix("eval_greedy_").removeprefix("eval_") for key in line}


def test_guess_the_number_keeps_its_table(tiny, tmp_path, capsys):
    """GuessTheNumber reports through the hook what the trainer printed for it before: the four hint-use
    columns, its three scripted players and the hint-blind ceiling line; the same metrics.jsonl names."""
    header, rows, metrics, output = _train(tiny, tmp_path, capsys, "game:GuessTheNumber-v0-easy")
    assert header == COMMON + HINT_COLUMNS
    names = ["random valid guesses", "hint-blind ceiling (random, no repeats)", "binary search"]
    assert rows[4:] == [f"baseline: {name}" for name in names]
    assert re.search(r"^hint-blind ceiling on these seeds: 0\.\d{3} \(the expected success of the best player that ignores the hints", output, re.M)
    assert set(metrics[0]["baselines"]) == set(names)
    assert set(metrics[0]["baselines"]["binary search"]) == {"name", "success_rate", "turns_when_solved", *HINT_KEYS}
    rl = [line for line in metrics if line["phase"] == "rl"][-1]
    for prefix in ("", "eval_", "eval_greedy_"):
        assert {prefix + key for key in HINT_KEYS} <= rl.keys()


class ScoredWordle(Wordle):
    """Wordle with a report of its own: one metric, one scripted player that is also its blind ceiling."""

    episode_metric_columns = (MetricColumn("letters_per_move", "letters / move"),)
    episode_metrics_title = "typing"
    blind_ceiling = BlindCeiling("the same word each turn", "same-word ceiling", "what one fixed word wins", "a fixed word does as well")

    def episode_metrics(self, trajectories):
        actions = [turn.action for t in trajectories for turn in t.turns]
        return {"letters_per_move": sum(map(len, actions)) / len(actions) if actions else None}

    def scripted_baselines(self, seeds):
        return [ScriptedBaseline("the same word each turn", 0.125, 1.0, {"letters_per_move": 3.0})]


@pytest.fixture
def scored_wordle():
    env_id = "game:ScoredWordle-v0"
    register(env_id, ScoredWordle, word_length=3, max_turns=15)
    yield env_id
    registry.pop(env_id)


def test_the_trainer_prints_whatever_the_env_reports(tiny, tmp_path, capsys, scored_wordle):
    header, rows, metrics, output = _train(tiny, tmp_path, capsys, scored_wordle)
    assert header == [*COMMON, "letters / move"]
    assert rows[4:] == ["baseline: the same word each turn"]
    assert "same-word ceiling on these seeds: 0.125 (what one fixed word wins)" in output
    assert metrics[0]["baselines"] == {
        "the same word each turn": {"name": "the same word each turn", "success_rate": 0.125, "turns_when_solved": 1.0, "letters_per_move": 3.0}
    }
    rl = [line for line in metrics if line["phase"] == "rl"][-1]
    assert {"letters_per_move", "eval_letters_per_move", "eval_greedy_letters_per_move"} <= rl.keys()
    assert not [key for key in rl if "hint" in key]


def test_an_env_without_the_hook_reports_nothing_of_its_own():
    env = make("game:Wordle-v0-easy")
    try:
        report = EnvReport.of(env)
        assert (report.columns, report.ceiling, report.metrics([]), report.baselines([1, 2])) == ((), None, {}, [])
    finally:
        env.close()


def test_columns_without_their_metrics_are_refused():
    class Half(Wordle):
        episode_metric_columns = (MetricColumn("x", "x"),)

    with pytest.raises(TypeError, match="episode_metrics"):
        EnvReport.of(Half())


def test_greedy_evaluation_plays_each_start_state_once_and_counts_it_as_the_set_does(tiny, tmp_path):
    """GuessTheNumber names its start states (target and range): greedy evaluation of 40 balanced episodes plays
    its 10 targets once each, and the trajectories (so every statistic) equal playing all 40; an env without the
    hook, or a run with a tool between turns, plays every seed."""
    import dataclasses

    from transformers import AutoModelForCausalLM

    from gem_core.train.trainer import Trainer, TrainConfig

    from gem_core.rollout import ScriptedPolicy

    def step_from_the_last_hint(context: str) -> str:  # a player that reads the hints: each target its own game
        hints = re.findall(r"you guessed (\d+), and the target number is (lower|higher)", context)
        if not hints:
            return "\\boxed{5}"
        guess, hint = hints[-1]
        return f"\\boxed{{{int(guess) + (3 if hint == 'higher' else -3)}}}"

    path, _, tokenizer = tiny
    config = TrainConfig(model=path, out=str(tmp_path / "run"), episodes_per_update=8, eval_episodes=40, warm_start_steps=0)
    trainer = Trainer(config, AutoModelForCausalLM.from_pretrained(path), tokenizer, log=lambda _: None)
    trainer.policy = lambda batch_size: ScriptedPolicy(tokenizer, step_from_the_last_hint)
    try:
        seeds = trainer.eval_seeds()
        greedy = dataclasses.replace(trainer.run_config, params=dataclasses.replace(trainer.run_config.params, temperature=0.0))
        played: list[int] = []
        rollout = trainer.rollout

        def counting(seeds, **kwargs):
            played.append(len(seeds))
            return rollout(seeds, **kwargs)

        trainer.rollout = counting
        once = trainer.greedy_rollout(seeds, greedy)
        assert played == [10]
        every = rollout(seeds, prefix="eval-greedy-", run_config=greedy)
        assert [[turn.action for turn in t.turns] for t in once] == [[turn.action for turn in t.turns] for t in every]
        assert len({tuple(t.rewards) for t in every}) > 1  # the check compares different episodes

        played.clear()
        trainer.config = dataclasses.replace(config, tools=("python",))
        trainer.greedy_rollout(seeds, greedy)
        assert played == [40]
    finally:
        trainer.close()
    assert EnvReport.of(make("game:Wordle-v0-easy")).start_states([1, 2]) is None
