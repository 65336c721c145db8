"""What a run's numbers rest on: the seeds it evaluates on (balanced, held-out apart from validation),
greedy and sampled evaluation, the weights it records, a --resume that refuses what it cannot honour,
and updates without a learning signal reported as such."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import gem_core  # noqa: E402
from gem_core.train.trainer import EVAL_SEED_BASE, VALIDATION_SEED_BASE, Trainer, TrainConfig, evaluation_seeds  # noqa: E402

ENV = "game:GuessTheNumber-v0-easy"


def _targets(seeds: list[int]) -> Counter:
    game = gem_core.make(ENV).unwrapped
    found: Counter = Counter()
    for seed in seeds:
        game.reset(seed=seed)
        found[game.target] += 1
    return found


def test_the_default_held_out_set_is_balanced_and_apart_from_validation_and_training():
    count = TrainConfig().eval_episodes
    assert count >= 200
    heldout, validation = evaluation_seeds(ENV, {}, count), evaluation_seeds(ENV, {}, count, "validation")
    assert _targets(heldout) == Counter({target: count // 10 for target in range(1, 11)})
    assert _targets(validation) == Counter({target: count // 10 for target in range(1, 11)})
    assert min(heldout) >= EVAL_SEED_BASE and min(validation) >= VALIDATION_SEED_BASE > max(heldout)
    with pytest.raises(ValueError, match="eval_set"):
        evaluation_seeds(ENV, {}, 10, "test")


def test_an_evaluation_plays_the_set_greedy_and_sampled(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    path, _, tokenizer = tiny
    config = TrainConfig(out=str(tmp_path / "run"), episodes_per_update=4, eval_episodes=10, eval_set="validation", temperature=0.7)
    trainer = Trainer(config, AutoModelForCausalLM.from_pretrained(path), tokenizer, log=lambda _: None)
    played = []
    rollout = trainer.rollout

    def recording(seeds, *, prefix, group_size=1, run_config=None):
        played.append((list(seeds), (run_config or trainer.run_config).params.temperature))
        return rollout(seeds, prefix=prefix, group_size=group_size, run_config=run_config)

    trainer.rollout = recording
    try:
        evaluation = trainer.evaluate()
    finally:
        trainer.close()
    seeds = evaluation_seeds(ENV, {}, 10, "validation")
    assert sorted(played, key=lambda p: p[1]) == [(seeds, 0.0), (seeds, 0.7)]
    assert _targets(seeds) == Counter(range(1, 11))
    consistent = evaluation.greedy.env_metrics["hint_consistent_rate"]  # GuessTheNumber's hint use (its report hook)
    assert consistent is None or 0 <= consistent <= 1


def test_config_json_records_the_weights_loaded(tiny, tmp_path):
    from gem_core.train.run import train

    train(TrainConfig(model=tiny[0], updates=1, episodes_per_update=2, eval_episodes=2, out=str(tmp_path / "r")), progress=False, log=lambda _: None)
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    file = f"{tiny[0]}/model.safetensors"
    with open(file, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    assert saved["weights"]["source"].startswith("path:") and saved["weights"]["source"].endswith(tiny[0].rstrip("/").split("/")[-1])
    assert saved["weights"]["files"] == {"model.safetensors": digest}
    assert saved["evaluation"] == {"set": "heldout", "seeds": evaluation_seeds(ENV, {}, 2)}


def test_the_weights_record_names_the_gguf_an_alias_was_converted_from(tmp_path, monkeypatch):
    """The alias loads the hub's bf16 weights or the GGUF's dequantised ones: the record says which."""
    from gem_core import models

    monkeypatch.setenv("GEM_CORE_CACHE", str(tmp_path))
    folder = models.checkpoint_dir(models.SMOLLM2)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_bytes(b"{}")  # not a weight file
    record = models.weights_record("smollm2-135m-instruct", str(folder))
    assert record["source"] == "gguf:SmolLM2-135M-Instruct.Q4_1.gguf"
    assert record["gguf"]["sha256"] == models.SMOLLM2.gguf_sha256
    assert record["files"] == {"model.safetensors": hashlib.sha256(b"weights").hexdigest()}


@pytest.mark.parametrize(
    "option, shown",
    [(["--lr", "0.001"], "--lr 0.001"), (["--episodes-per-update", "4"], "--episodes-per-update 4"), (["--estimator", "reinforce"], "--estimator 'reinforce'")],
)
def test_resume_refuses_an_option_it_cannot_honour(tiny, tmp_path, capsys, option, shown):
    """--resume continues the saved run with its saved settings: any other option given is one line, not
    silently dropped (it used to keep only --steps)."""
    from gem_core.cli import main

    common = ["--model", tiny[0], "--out", str(tmp_path / "r"), "--no-progress", "--episodes-per-update", "2", "--eval-episodes", "2"]
    assert main(["train", "--updates", "1", *common]) == 0
    capsys.readouterr()
    resumed = [*common[:-4], "--eval-episodes", "2", *option] if option[0] == "--episodes-per-update" else [*common, *option]
    assert main(["train", "--resume", "--updates", "2", *resumed]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "only --updates can change" in err and shown in err
    lines = [json.loads(line) for line in open(tmp_path / "r" / "metrics.jsonl")]
    assert max(line["step"] for line in lines) == 1  # nothing ran
    # the same options as saved (given again, or not given) continue the run
    assert main(["train", "--resume", "--updates", "2", *common]) == 0


def test_resume_through_the_api_refuses_a_changed_setting(tiny, tmp_path):
    from gem_core.train.run import TrainError, train

    common = dict(model=tiny[0], episodes_per_update=2, eval_episodes=2, out=str(tmp_path / "r"))
    train(TrainConfig(updates=1, **common), progress=False, log=lambda _: None)
    with pytest.raises(TrainError, match="temperature"):
        train(TrainConfig(updates=2, resume=True, temperature=0.5, **common), progress=False, log=lambda _: None)


def test_an_update_without_signal_is_reported_and_spends_no_step(tiny, tmp_path):
    """Every advantage 0 (here: every reward 0): no optimizer step, the LR warm-up not advanced, and the
    metrics say so."""
    from transformers import AutoModelForCausalLM

    path, _, tokenizer = tiny
    logs: list[str] = []
    trainer = Trainer(
        TrainConfig(out=str(tmp_path / "run"), episodes_per_update=4, eval_episodes=2, kl_coef=0.0),  # a KL term would be a signal
        AutoModelForCausalLM.from_pretrained(path),
        tokenizer,
        log=logs.append,
    )
    rollout = trainer.rollout

    def no_reward(*args, **kwargs):
        trajectories = rollout(*args, **kwargs)
        for trajectory in trajectories:
            for turn in trajectory.turns:
                turn.reward = 0.0
        return trajectories

    trainer.rollout = no_reward
    before = [p.detach().clone() for p in trainer.model.parameters()]
    try:
        metrics = trainer.update()
    finally:
        trainer.close()
    assert metrics["no_signal"] is True and metrics["step"] == trainer.step == 1
    assert trainer.scheduler.last_epoch == 0 and not trainer.optimizer.state
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert any("no learning signal" in line for line in logs)


@pytest.mark.parametrize("skip", [True, False])
def test_an_update_without_signal_steps_as_every_trainer_when_asked(tiny, tmp_path, skip):
    """``skip_zero_signal`` False (an experiment file's default, what every other trainer does): after an update
    with a signal, an update whose every advantage is 0 still takes its optimizer step: the schedule advances and
    Adam's momentum moves the weights. True (the default run's): neither."""
    from transformers import AutoModelForCausalLM

    path, _, tokenizer = tiny
    config = TrainConfig(out=str(tmp_path / "run"), episodes_per_update=4, eval_episodes=2, kl_coef=0.0, skip_zero_signal=skip)
    trainer = Trainer(config, AutoModelForCausalLM.from_pretrained(path), tokenizer, log=lambda _: None)
    rollout = trainer.rollout
    rewards = iter([[1.0, 0.0, 0.5, 0.2], [0.0, 0.0, 0.0, 0.0]])  # a signal, then none

    def with_rewards(*args, **kwargs):
        trajectories = rollout(*args, **kwargs)
        for trajectory, reward in zip(trajectories, next(rewards)):
            for turn in trajectory.turns:
                turn.reward = 0.0
            trajectory.turns[-1].reward = reward
        return trajectories

    trainer.rollout = with_rewards
    try:
        first = trainer.update()
        before = [p.detach().clone() for p in trainer.model.parameters()]
        second = trainer.update()
    finally:
        trainer.close()
    assert first["no_signal"] is False and second["no_signal"] is True and trainer.step == 2
    moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert trainer.scheduler.last_epoch == (1 if skip else 2) and moved is not skip and ("loss" in second) is not skip
