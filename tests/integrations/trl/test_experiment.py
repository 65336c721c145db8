"""An experiment's TRL configuration (gem_integrations.trl.experiment) through TRL 1.16's own code: GRPOConfig
takes the keyword arguments and the fields it ends with equal the experiment's; GemGRPOTrainer built from them
has the experiment's estimator, optimizer and schedule (TRL's own create_optimizer_and_scheduler)."""

from __future__ import annotations

import dataclasses

import pytest
from trl import GRPOConfig

from gem_core.experiment import parse_experiment
from gem_integrations.trl.experiment import grpo_config, trainer_arguments

EXPERIMENT = parse_experiment(
    "[rollout]\nepisodes_per_update = 8\ngroup_size = 2\ntemperature = 0.9\nlogprob_temperature = 0.9\n"
    "[algorithm]\nclip_low = 0.25\nclip_high = 0.28\nkl_coef = 0.05\nentropy_coef = 0.01\ngamma = 0.8\n"
    "[optimizer]\nlr = 3e-4\nwarmup_updates = 2\nbetas = [0.9, 0.95]\neps = 1e-7\nweight_decay = 0.01\nmax_grad_norm = 0.5\n"
    "[training]\nupdates = 3\nepochs = 2\nmini_batches = 2\neval_every = 1\n[env]\nmax_turn_tokens = 8\nmax_context_tokens = 160\n"
)


def config_of(experiment, tmp_path) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, **grpo_config(experiment))


def test_grpo_config_holds_the_experiment(tmp_path):
    e = EXPERIMENT
    config = config_of(e, tmp_path)
    # the batch: each update generates episodes_per_update completions, group_size per prompt, in mini_batches steps
    assert config.generation_batch_size == e.episodes_per_update == 8
    assert config.num_generations == e.group_size and config.steps_per_generation == e.mini_batches
    assert config.per_device_train_batch_size * config.steps_per_generation == e.episodes_per_update
    assert config.num_iterations == e.ppo_epochs and config.gradient_accumulation_steps == 1
    assert config.max_steps == e.updates * e.mini_batches * e.ppo_epochs
    # the loss
    assert (config.epsilon, config.epsilon_high, config.beta) == (e.clip_low, e.clip_high, e.kl_coef)
    assert config.loss_type == "dapo" and config.entropy_coef == e.entropy_coef and config.importance_sampling_level == "token"
    assert config.temperature == e.temperature and (config.top_p, config.top_k) == (1.0, 0)
    # TRL's own defaults that would change the run, pinned
    assert config.gradient_checkpointing is False and config.shuffle_dataset is False and config.scale_rewards == "none"
    assert config.seed == e.seed and config.max_completion_length == e.max_context_tokens


def test_trl_builds_the_experiments_optimizer_and_schedule(tmp_path, tokenizer, tiny_model):
    """TRL's own trainer, built from the written arguments, makes the experiment's AdamW and warm-up (no KL
    here: TRL would load the reference model by the tiny model's name, which it has not)."""
    from gem_integrations.trl import GemGRPOTrainer, GemRollout, make_dataset

    e = dataclasses.replace(EXPERIMENT, kl_coef=0.0)
    arguments = trainer_arguments(e)
    rollout = arguments.pop("rollout")
    args = config_of(e, tmp_path)
    trainer = GemGRPOTrainer(
        tiny_model,
        args=args,
        processing_class=tokenizer,
        train_dataset=make_dataset("game:GuessTheNumber-v0-easy", 4),
        rollout_func=GemRollout(**rollout),
        **arguments,
    )
    assert (trainer.gem_estimator, trainer.gem_gamma, trainer.gem_eps, trainer.gem_ddof, trainer.gem_group_by) == ("rebn", e.gamma, 1e-6, 0, None)
    assert rollout == {"max_turn_tokens": 8, "max_context_tokens": 160, "max_turns": None}
    trainer.create_optimizer_and_scheduler(num_training_steps=trainer.args.max_steps)
    group = trainer.optimizer.param_groups[0]
    assert group["betas"] == e.betas and group["eps"] == e.eps
    assert {g["weight_decay"] for g in trainer.optimizer.param_groups} <= {e.weight_decay, 0.0}  # HF: none on biases/norms
    steps_per_update = e.mini_batches * e.ppo_epochs
    rates = []
    for _ in range(trainer.args.max_steps):
        rates.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    warmup = e.warmup_updates * steps_per_update
    assert all(rate < e.lr for rate in rates[:warmup]) and rates[warmup:] == pytest.approx([e.lr] * (len(rates) - warmup))


def test_estimators_map_to_trls_own_scaling(tmp_path):
    grpo = parse_experiment('[rollout]\ngroup_size = 2\n[algorithm]\nestimator = "grpo"\nloss_aggregation = "seq-mean-token-mean"\n')
    drgrpo = parse_experiment('[rollout]\ngroup_size = 2\n[algorithm]\nestimator = "drgrpo"\n')
    assert (config_of(grpo, tmp_path).scale_rewards, config_of(grpo, tmp_path).loss_type, trainer_arguments(grpo)["estimator"]) == ("group", "grpo", "trl")
    assert (config_of(drgrpo, tmp_path).scale_rewards, trainer_arguments(drgrpo)["estimator"]) == ("none", "trl")


def test_the_written_script_trains_the_experiment_on_cpu(tmp_path, tokenizer, tiny_model):
    """`gem-core experiment FILE --trainer trl`'s script, run as a user runs it (bash, its make-dataset, TRL's
    train()) on this CPU with a local model: two updates, a checkpoint after each (`eval_every = 1`), TRL's
    arguments the experiment's, the device and precision gem-core train would pick here (the script once left
    TRL's defaults, bf16 without use_cpu, which GRPOConfig refuses with a ValueError on any machine without a GPU).
    The model is saved in bfloat16 and trained with float32 master weights all the same (transformers would keep
    the checkpoint's dtype)."""
    import copy
    import json
    import os
    import subprocess
    import sys

    import torch

    from gem_core.tiny import save_test_tokenizer
    from gem_core.precision import machine_precision

    model_dir = tmp_path / "model"
    copy.deepcopy(tiny_model).to(torch.bfloat16).save_pretrained(model_dir)
    save_test_tokenizer(model_dir, "qwen3")
    toml = tmp_path / "experiment.toml"
    toml.write_text(
        "[env]\nmax_turn_tokens = 8\nmax_context_tokens = 256\n[rollout]\nepisodes_per_update = 4\ngroup_size = 2\n"
        "[optimizer]\nlr = 1e-3\n[training]\nupdates = 2\neval_every = 1\n"
    )
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "MODEL": str(model_dir), "DATA": str(tmp_path / "data")}
    written = subprocess.run(
        [os.path.join(bin_dir, "gem-core"), "experiment", str(toml), "--trainer", "trl", "--out", str(tmp_path / "run.sh")], capture_output=True, text=True
    )
    assert written.returncode == 0, written.stderr
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(tmp_path / "run.sh"), str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and (out / "checkpoint-1").is_dir()
    logged = [entry for entry in state["log_history"] if "gem/success_rate" in entry]
    assert [entry["step"] for entry in logged] == [1, 2]
    args = torch.load(out / "checkpoint-2" / "training_args.bin", weights_only=False)
    assert args.use_cpu and args.bf16 == (machine_precision() == "bf16") and args.learning_rate == 1e-3 and args.num_generations == 2
    # the trained model is saved at the end (with eval_every 0 there is no checkpoint): the last checkpoint's
    from safetensors.torch import load_file

    final, last = load_file(out / "model.safetensors"), load_file(out / "checkpoint-2" / "model.safetensors")
    assert final.keys() == last.keys() and all(torch.equal(final[k], last[k]) for k in final)
    assert {t.dtype for t in final.values()} == {torch.float32}  # float32 master weights from a bfloat16 checkpoint
    assert (out / "tokenizer_config.json").exists()


def test_the_cross_framework_benchmark_runs_trl_and_evaluates_its_checkpoints(tmp_path, tiny_model):
    """benchmarks/cross_framework.py's TRL arm: the script ``gem-core experiment --trainer trl`` writes, run in this
    Python, 2 updates with a model saved after each; each checkpoint (its training state removed) and the
    starting weights evaluated by gem-core eval on the same held-out seeds; TRL's train_runtime read per update."""
    import json
    from pathlib import Path

    from helpers.scripts import script_module
    from gem_core.tiny import save_test_tokenizer

    root = Path(__file__).resolve().parents[3]
    with script_module(root / "benchmarks" / "cross_framework.py") as cross_framework:
        model_dir = tmp_path / "model"
        tiny_model.save_pretrained(model_dir)
        save_test_tokenizer(model_dir, "qwen3")
        out = tmp_path / "out"
        settings = [f'model.id="{model_dir}"', "training.updates=2", "rollout.episodes_per_update=4", "seeds.eval_episodes=6", "env.max_turn_tokens=8"]
        argv = ["--trainers", "trl", "--eval-every", "1", "--out", str(out), *(arg for s in settings for arg in ("--set", s))]
        assert cross_framework.main(argv) == 0
    record = json.loads((out / "trl-seed0" / "run.json").read_text())
    assert record["status"] == 0 and record["version"] == "1.16.0" and record["seconds_per_update"] > 0 and record["peak_rss_gb"] > 0.1
    assert record["checkpoints"] == {str(k): str(out / "trl-seed0" / "train" / f"checkpoint-{k}") for k in (1, 2)}
    assert len(record["batch_returns"]) == 2  # each update's batch return, from TRL's logged gem/episode_return
    assert len(record["batch_success"]) == 2 and all(0 <= rate <= 1 for rate in record["batch_success"])  # gem/success_rate
    for update, checkpoint in record["checkpoints"].items():
        assert (Path(checkpoint) / "model.safetensors").exists() and not (Path(checkpoint) / "optimizer.pt").exists()
        summary = json.loads((out / "trl-seed0" / "eval" / f"update-{update}.json").read_text())
        assert summary["model"] == checkpoint and summary["episodes"] == 6 and summary["errors"] == 0
    start = sorted(json.loads(line)["seed"] for line in open(out / "start" / "eval.jsonl"))
    assert sorted(json.loads(line)["seed"] for line in open(out / "trl-seed0" / "eval" / "update-2.jsonl")) == start
    assert "| trl 1.16.0 | 0 |" in (out / "cross_framework.md").read_text()


@pytest.mark.parametrize(("precision", "bf16"), [("bf16", True), ("float32", False)])
def test_a_pinned_precision_is_written_into_the_script(precision, bf16):
    """An explicit training.precision is the script's, whatever the machine: TRL's bf16 (accelerate's autocast
    over the float32 weights it loads) on or off."""
    from gem_integrations.trl.experiment import render

    script = render(dataclasses.replace(EXPERIMENT, precision=precision))
    assert f"PRECISION = {precision!r}  # training.precision" in script
    assert 'bf16=precision == "bf16"' in script and "dtype=torch.float32" in script
