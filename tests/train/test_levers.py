"""Options that change how a run spends its tokens: --stop-after-box ends a response at its move."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gem_core.train.trainer import Trainer, TrainConfig, closing_brace_ids  # noqa: E402


def _brace_loving_model(tokenizer, brace: int):
    """A tiny model whose every next token is ``brace`` (a bias on the output layer): where a response stops
    then shows whether the brace ends it."""
    from gem_core.testing import build_tiny_model

    model = build_tiny_model(len(tokenizer), hidden_size=32, num_layers=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    head = torch.nn.Linear(32, len(tokenizer), bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-30.0)
        head.bias[brace] = 30.0
    model.lm_head = head
    return model


@pytest.mark.parametrize("stop_after_box", [False, True])
def test_stop_after_box_ends_each_response_at_its_closing_brace(tmp_path, stop_after_box):
    from gem_core.testing import build_test_tokenizer

    tokenizer = build_test_tokenizer("chatml")
    brace = tokenizer.convert_tokens_to_ids("}")
    config = TrainConfig(out=str(tmp_path / "run"), episodes_per_update=2, eval_episodes=2, max_turn_tokens=6, stop_after_box=stop_after_box)
    trainer = Trainer(config, _brace_loving_model(tokenizer, brace), tokenizer, log=lambda _: None)
    try:
        trajectories = trainer.rollout([1, 2], prefix="t")
        stops = trainer.run_config.params.stop_token_ids
        if stop_after_box:  # the template's end of turn first: a scripted policy's responses still end with it
            assert stops[0] == trainer.formatter.stop_token_ids[0] and brace in stops
    finally:
        trainer.close()
    responses = [turn.response_ids for t in trajectories for turn in t.turns]
    assert responses and all(set(r) == {brace} for r in responses)
    assert all(len(r) == (1 if stop_after_box else 6) for r in responses)
    assert brace in closing_brace_ids(tokenizer) and tokenizer.convert_tokens_to_ids("{") not in closing_brace_ids(tokenizer)


def test_stop_after_box_is_a_cli_flag(tmp_path):
    from gem_core.cli import build_parser
    from gem_core.train.cli import config_from_args

    parse = build_parser().parse_args
    assert config_from_args(parse(["train", "--out", str(tmp_path / "r")])).stop_after_box is True  # the default run's
    assert config_from_args(parse(["train", "--out", str(tmp_path / "r"), "--no-stop-after-box"])).stop_after_box is False
    assert config_from_args(parse(["train", "--out", str(tmp_path / "r"), "--stop-after-box"])).stop_after_box is True


def test_kl_schedule_linear_falls_from_kl_coef_to_zero_over_the_run():
    from gem_core.train.trainer import kl_coef_at

    assert [kl_coef_at(0.1, "constant", step, 4) for step in range(4)] == [0.1] * 4
    assert [kl_coef_at(0.2, "linear", step, 4) for step in range(4)] == pytest.approx([0.2, 0.15, 0.1, 0.05])
    assert kl_coef_at(0.0, "linear", 1, 4) == 0.0
    with pytest.raises(ValueError, match="reference.kl_schedule='cosine' is not allowed: expected one of 'constant', 'linear'"):
        TrainConfig(kl_schedule="cosine")


def test_kl_final_is_where_the_linear_schedule_ends_and_at_0_the_numbers_are_the_old_ones():
    from gem_core.train.trainer import kl_coef_at

    assert [kl_coef_at(0.2, "linear", step, 4, 0.04) for step in range(4)] == pytest.approx([0.2, 0.16, 0.12, 0.08])
    assert kl_coef_at(0.2, "linear", 10, 4, 0.04) == pytest.approx(0.04)  # past the end: the floor, not below it
    # kl_final 0 is the schedule every earlier run used, bit for bit (the default run's recorded numbers stand)
    assert all(kl_coef_at(0.1, "linear", step, 40, 0.0) == 0.1 * max(0.0, 1.0 - step / 40) for step in range(40))
    assert TrainConfig().kl_final == 0.0
    with pytest.raises(ValueError, match=r"reference.kl_final=0.05 is not allowed: expected 0 unless reference.kl_schedule = \"linear\""):
        TrainConfig(kl_schedule="constant", kl_final=0.05)
    with pytest.raises(ValueError, match=r"reference.kl_final=0.2 is not allowed: expected at most algorithm.kl_coef \(0.1\)"):
        TrainConfig(kl_coef=0.1, kl_final=0.2)
    with pytest.raises(ValueError, match="reference.kl_final=-0.1"):
        TrainConfig(kl_final=-0.1)
    # the experiment file says the same in one line naming the key
    from gem_core.experiment import parse_experiment

    with pytest.raises(ValueError, match=r"^exp.toml: reference.kl_final=0.05 is not allowed: expected 0 unless"):
        parse_experiment("[reference]\nkl_final = 0.05\n", "exp.toml")


def test_the_cli_runs_the_linear_kl_schedule_its_coefficient_in_the_loss_and_kept_on_resume(tiny, tmp_path, capsys):
    """`gem-core train --kl-coef 0.3 --kl-schedule linear`: each update's loss is its policy-gradient term plus
    that update's coefficient (0.3, 0.2, 0.1 over 3 updates) times its KL, the coefficient is in metrics.jsonl,
    a resume keeps the schedule and refuses another; a bad schedule is one line."""
    import json

    from gem_core.cli import main

    out = tmp_path / "r"
    common = ["--model", tiny[0], "--out", str(out), "--no-progress", "--episodes-per-update", "2", "--eval-episodes", "2", "--warm-start-steps", "0"]
    # the tiny model plays no valid move (every advantage alike): an entropy bonus moves it off its start
    schedule = ["--kl-coef", "0.3", "--kl-schedule", "linear", "--entropy-coef", "1.0", "--lr", "0.01"]
    assert main(["train", "--updates", "3", *schedule, *common]) == 0
    lines = [json.loads(line) for line in open(out / "metrics.jsonl") if '"rl"' in line]
    assert [line["kl_coef"] for line in lines] == pytest.approx([0.3, 0.2, 0.1])
    for line in lines:
        assert line["loss"] == pytest.approx(line["pg_loss"] + line["kl_coef"] * line["kl"] - line["entropy"], abs=1e-5)
    assert any(line["kl"] > 0 for line in lines[1:])  # the policy moved off its start: the term is not vacuous
    assert json.loads((out / "config.json").read_text())["kl_schedule"] == "linear"
    capsys.readouterr()
    assert main(["train", "--resume", "--kl-schedule", "constant", *common]) == 2
    assert "kl" in capsys.readouterr().err.lower()
    assert main(["train", "--updates", "1", "--kl-schedule", "cosine", "--out", str(tmp_path / "bad"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--kl-schedule" in err and "Traceback" not in err
    # a floor the flags contradict is one line, exit 2, nothing trained
    assert main(["train", "--updates", "1", "--kl-final", "0.05", "--kl-schedule", "constant", "--out", str(tmp_path / "bad2"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "reference.kl_final=0.05" in err and "Traceback" not in err
    assert not (tmp_path / "bad2").exists()
    # --kl-final: the fall ends there, the coefficient the loss used is the logged one, a resume keeps it
    floor = tmp_path / "floor"
    floored = [*common[:2], "--out", str(floor), *common[4:]]
    assert main(["train", "--updates", "3", *schedule, "--kl-final", "0.15", *floored]) == 0
    lines = [json.loads(line) for line in open(floor / "metrics.jsonl") if '"rl"' in line]
    assert [line["kl_coef"] for line in lines] == pytest.approx([0.3, 0.25, 0.2])
    for line in lines:
        assert line["loss"] == pytest.approx(line["pg_loss"] + line["kl_coef"] * line["kl"] - line["entropy"], abs=1e-5)
    assert json.loads((floor / "config.json").read_text())["kl_final"] == 0.15
    capsys.readouterr()
    assert main(["train", "--resume", *schedule, "--kl-final", "0.1", *floored]) == 2
    assert "not --kl-final 0.1 (saved: 0.15)" in capsys.readouterr().err


@pytest.mark.parametrize("stop_after_box", [False, True])
def test_a_row_that_stops_at_the_move_stops_every_trainers_rollout_there(stop_after_box):
    # every plugin plays its rows through gem_core.rollout.play_row: the row's stop_after_box (make-dataset
    # --stop-after-box) reaches the engine as stop ids, the template's end of turn first
    import asyncio

    from gem_core.rollout import ChatFormatter, HFPolicy, RunConfig, SamplingParams, play_row
    from gem_core.tasks import TaskSpec
    from gem_core.testing import build_test_tokenizer

    tokenizer = build_test_tokenizer("chatml")
    brace = tokenizer.convert_tokens_to_ids("}")
    formatter = ChatFormatter(tokenizer)
    seen = []

    class Watched(HFPolicy):
        async def generate(self, prompt_ids, params, *, request_id=None):
            seen.append(params.stop_token_ids)
            return await super().generate(prompt_ids, params, request_id=request_id)

    policy = Watched(_brace_loving_model(tokenizer, brace), seed=0)
    row = TaskSpec("game:GuessTheNumber-v0-easy", seed=3, stop_after_box=stop_after_box)
    trajectory = asyncio.run(play_row(row, policy, formatter, RunConfig(params=SamplingParams(max_tokens=6))))
    responses = [turn.response_ids for turn in trajectory.turns]
    assert responses and all(set(r) == {brace} for r in responses)
    assert all(len(r) == (1 if stop_after_box else 6) for r in responses)
    if stop_after_box:
        assert all(stops[0] == formatter.stop_token_ids[0] and brace in stops for stops in seen)
    else:
        assert all(brace not in stops for stops in seen)
