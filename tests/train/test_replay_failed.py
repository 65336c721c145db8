"""[reference] replay_failed (gem-core train's --replay-failed F): F x an update's start states (rounded down) are drawn
from the previous update's failed ones, by the run's seed, in place of as many fresh ones; a resumed run replays what the
uninterrupted one does; other trainers refuse the key."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gem_core.train.trainer import Trainer, TrainConfig  # noqa: E402
from test_trainer import _rl_lines  # noqa: E402  (an update's line without the machine's timings and memory)


def _trainer(tiny, tmp_path, **overrides):
    from transformers import AutoModelForCausalLM

    path, _, tokenizer = tiny
    config = TrainConfig(**{"out": str(tmp_path / "run"), "episodes_per_update": 4, "eval_episodes": 4, "warm_start_steps": 0, **overrides})
    return Trainer(config, AutoModelForCausalLM.from_pretrained(path), tokenizer, log=lambda _: None)


def test_start_states_replay_the_last_updates_failures_by_the_runs_seed(tiny, tmp_path):
    trainer = _trainer(tiny, tmp_path, replay_failed=0.5)  # 2 of 4
    off = _trainer(tiny, tmp_path, replay_failed=0)
    try:
        fresh = trainer.train_seeds(3)
        assert trainer.start_states(3) == (fresh, 0)  # nothing failed yet: every start state fresh
        trainer.failed_start_states = [11, 12, 13]
        seeds, count = trainer.start_states(3)
        assert count == 2 and seeds[:2] == fresh[:2] and len(set(seeds[2:])) == 2 and set(seeds[2:]) <= {11, 12, 13}
        assert trainer.start_states(3) == (seeds, count)  # the run's seed draws them: the same again
        assert {tuple(trainer.start_states(step)[0][2:]) for step in range(3, 13)} != {tuple(seeds[2:])}  # each update its own draw
        trainer.failed_start_states = [11]  # fewer failures than asked: those, and fresh ones for the rest
        assert trainer.start_states(3) == (fresh[:3] + [11], 1)
        trainer.failed_start_states = [11, 12, 13, 14]
        assert len(trainer.start_states(3)[0]) == 4 and trainer.start_states(3)[1] == 2  # half of 4, whatever failed
    finally:
        trainer.close()
    for share, replayed in ((0.3, 1), (0.74, 2), (0.75, 3), (1.0, 4)):  # the share of 4 start states, rounded down
        rounded = _trainer(tiny, tmp_path, replay_failed=share)
        try:
            rounded.failed_start_states = [11, 12, 13, 14, 15]
            assert rounded.start_states(3)[1] == replayed, share
        finally:
            rounded.close()
    try:
        off.failed_start_states = [11, 12]  # off: the fresh start states whatever failed
        assert off.start_states(3) == (off.train_seeds(3), 0) == (fresh, 0)
    finally:
        off.close()


def test_an_update_keeps_its_failed_start_states_and_the_next_plays_them(tiny, tmp_path, monkeypatch):
    trainer = _trainer(tiny, tmp_path, replay_failed=0.5)
    played = trainer.rollout
    calls: list[list[int]] = []

    def rollout_with_one_success_and_one_dead_worker(seeds, *, prefix, group_size=1):
        calls.append(list(seeds))
        trajectories = played(seeds, prefix=prefix, group_size=group_size)
        if len(calls) == 1:
            trajectories[0].turns[-1].info["success"] = True  # solved: not replayed
            trajectories[1].infra_error = "python sandbox: worker 3 died"  # not the policy's failure: not replayed
        return trajectories

    monkeypatch.setattr(trainer, "rollout", rollout_with_one_success_and_one_dead_worker)
    try:
        first = trainer.update()
        assert trainer.failed_start_states == list(dict.fromkeys(calls[0][2:]))  # the tiny model solves nothing itself
        second = trainer.update()
    finally:
        trainer.close()
    assert first["replayed_start_states"] == 0 and calls[0] == trainer.train_seeds(0)
    assert second["replayed_start_states"] == 2
    assert calls[1][:2] == trainer.train_seeds(1)[:2] and sorted(calls[1][2:]) == sorted(calls[0][2:])


def test_a_resumed_run_replays_what_the_uninterrupted_one_does(tiny, tmp_path):
    from gem_core.train.run import train

    common = dict(
        model=tiny[0],
        episodes_per_update=4,
        eval_episodes=2,
        eval_every=1,
        warm_start_steps=0,
        checkpoint_every=1,
        seed=5,
        kl_schedule="constant",
        replay_failed=0.75,
    )
    train(TrainConfig(updates=3, out=str(tmp_path / "whole"), **common), progress=False, log=lambda _: None)
    train(TrainConfig(updates=1, out=str(tmp_path / "cut"), **common), progress=False, log=lambda _: None)
    train(TrainConfig(updates=3, out=str(tmp_path / "cut"), resume=True, **common), progress=False, log=lambda _: None)
    whole = _rl_lines(tmp_path / "whole" / "metrics.jsonl")
    assert [line["replayed_start_states"] for line in whole] == [0, 3, 3]  # the tiny model fails every episode
    assert _rl_lines(tmp_path / "cut" / "metrics.jsonl") == whole


def test_the_key_is_checked_and_other_trainers_refuse_it(tmp_path):
    from gem_core.experiment import parse_experiment, require_portable

    assert TrainConfig().replay_failed == 0.25 and parse_experiment("").replay_failed == 0  # the default run replays; a file, unless asked, not
    with pytest.raises(ValueError, match=r"reference.replay_failed=1.5 is not allowed: expected a number in 0..1"):
        TrainConfig(replay_failed=1.5)
    with pytest.raises(ValueError, match=r"^exp.toml: reference.replay_failed=-0.1 is not allowed"):
        parse_experiment("[reference]\nreplay_failed = -0.1\n", "exp.toml")
    experiment = parse_experiment("[reference]\nreplay_failed = 0.25\n", "exp.toml")
    assert experiment.replay_failed == 0.25
    with pytest.raises(ValueError, match="reference.replay_failed"):
        require_portable("verl", experiment)


def test_the_cli_flag_sets_it_and_a_bad_value_is_one_line(tmp_path, capsys):
    from gem_core.cli import build_parser, main
    from gem_core.train.cli import config_from_args

    parse = build_parser().parse_args
    assert config_from_args(parse(["train", "--out", str(tmp_path / "r"), "--replay-failed", "0.25"])).replay_failed == 0.25
    assert main(["train", "--updates", "1", "--replay-failed", "1.5", "--out", str(tmp_path / "bad"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].endswith("--replay-failed: expected a number in 0..1, got '1.5'") and "Traceback" not in err
    assert not (tmp_path / "bad").exists()


def test_a_run_saved_before_the_replay_existed_resumes_without_it(tmp_path):
    """config.json of a run from before --replay-failed has no such key: resumed, it keeps playing fresh start states
    (the default run's 0.25 would change the run it continues); a saved value is kept."""
    import json

    from gem_core.train.run import saved_config
    from gem_core.train.trainer import config_dict

    for name, record, want in (("old", {}, 0.0), ("new", {"replay_failed": 0.5}, 0.5)):
        out = tmp_path / name
        out.mkdir()
        saved = {k: v for k, v in config_dict(TrainConfig(out=str(out))).items() if k != "replay_failed"}
        (out / "config.json").write_text(json.dumps({**saved, **record, "weights": {}}))
        assert saved_config(str(out)).replay_failed == want, name
