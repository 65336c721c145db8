"""An experiment (:mod:`gem_core.experiment`) as TRL 1.16's own configuration: ``GRPOConfig`` keyword
arguments, the ``GemGRPOTrainer``/``GemRollout`` arguments, and a script that trains with them.

Imports nothing from TRL: it writes text. TRL's defaults that would change the run are pinned:
``gradient_checkpointing`` (TRL True), ``beta`` and ``loss_type`` (TRL "dapo"), ``use_bias_correction_kl`` (TRL True:
the KL times the ratio, another gradient), ``scale_rewards``,
``epsilon_high``, ``shuffle_dataset`` (TRL True: the rows play in order), the scheduler (HF "linear" decay),
``top_k``/``top_p``, the seed, the precision (``bf16``: TRL's default, accelerate's autocast; the model loaded in
float32, which transformers would not do for a bfloat16 checkpoint; ``auto`` decided where the script runs, as
``gem-core train`` does: ``gem_core.precision``); the script picks the device as ``gem-core train`` does (TRL's defaults, bf16 without ``use_cpu``, refuse any machine
without a GPU).
``tests/integrations/trl/test_experiment.py`` builds ``GRPOConfig(**kwargs)``
and checks its fields.
"""

from __future__ import annotations

import pprint
from typing import Any

from gem_core.experiment import Experiment, require, require_portable
from gem_core.experiment_scripts import dataset_command, eval_command, script, shell_command, shell_word, warmup_optimizer_steps

TRAINER = "trl"
#: ``loss_type`` per aggregation: dapo = over the active tokens of the accumulated (optimizer-step) batch.
LOSS_TYPE = {"token-mean": "dapo", "seq-mean-token-mean": "grpo"}
#: The plugin's estimator and TRL's reward scaling per experiment estimator (rebn: the plugin's advantages
#: replace TRL's, whose scaling is then unused).
ESTIMATOR = {"rebn": ("rebn", "none"), "grpo": ("trl", "group"), "drgrpo": ("trl", "none")}


def check(experiment: Experiment) -> None:
    """Refuse, naming the key, what TRL cannot run."""
    require_portable(TRAINER, experiment)
    e = experiment
    require(TRAINER, e, "algorithm.estimator", e.estimator in ESTIMATOR, "TRL's GRPOTrainer has group advantages (grpo, drgrpo) and the plugin's rebn")
    require(TRAINER, e, "rollout.group_size", e.group_size >= 2, "TRL's GRPOConfig needs num_generations >= 2 (each start state played 2+ times)")
    require(
        TRAINER,
        e,
        "algorithm.loss_aggregation",
        e.loss_aggregation in LOSS_TYPE,
        "TRL's loss types have no per-sequence token sum (dr_grpo divides by a constant)",
    )
    require(TRAINER, e, "algorithm.kl_estimator", e.kl_estimator == "k3" or e.kl_coef == 0, "TRL's KL (beta) is k3")
    require(TRAINER, e, "rollout.logprob_temperature", e.logprob_temperature == e.temperature, "TRL recomputes logprobs at its sampling temperature")
    if e.view == "turn" and e.loss_aggregation != "token-mean":
        require(TRAINER, e, "algorithm.view", False, "TRL's completion is one whole episode (sequence); per-turn rows differ under seq-mean losses")


def grpo_config(experiment: Experiment) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments (``output_dir`` and the device options are the script's)."""
    check(experiment)
    e = experiment
    return {
        "learning_rate": e.lr,
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": warmup_optimizer_steps(e),
        "optim": "adamw_torch",
        "adam_beta1": e.betas[0],
        "adam_beta2": e.betas[1],
        "adam_epsilon": e.eps,
        "weight_decay": e.weight_decay,
        "max_grad_norm": e.max_grad_norm,
        "max_steps": e.updates * e.optimizer_steps_per_update,
        "per_device_train_batch_size": e.mini_batch_episodes,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": e.mini_batches,
        "num_iterations": e.ppo_epochs,
        "num_generations": e.group_size,
        "temperature": e.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "max_completion_length": e.max_context_tokens or 32768,
        "epsilon": e.clip_low,
        "epsilon_high": e.clip_high,
        "beta": e.kl_coef,
        "loss_type": LOSS_TYPE[e.loss_aggregation],
        "scale_rewards": ESTIMATOR[e.estimator][1],
        "entropy_coef": e.entropy_coef,
        "mask_truncated_completions": False,
        "importance_sampling_level": "token",
        # TRL 1.16 multiplies the k3 KL by the (differentiable) ratio by default, which changes the KL's gradient
        # even on-policy; the experiment's KL is the plain k3 loss (found by the Tier 1 check, benchmarks/same_update.py)
        "use_bias_correction_kl": False,
        "gradient_checkpointing": e.gradient_checkpointing,
        "shuffle_dataset": False,
        "seed": e.seed,
        "save_strategy": "steps" if e.eval_every else "no",
        "save_steps": max(e.eval_every, 1) * e.optimizer_steps_per_update,
        "logging_steps": 1,
        "report_to": "none",
    }


def trainer_arguments(experiment: Experiment) -> dict[str, Any]:
    """``GemGRPOTrainer`` keyword arguments (the estimator's) and ``GemRollout``'s (the row limits' defaults)."""
    check(experiment)
    e = experiment
    return {
        "estimator": ESTIMATOR[e.estimator][0],
        "gamma": e.gamma,
        "eps": 1e-6,
        "ddof": 0,
        "group_by": None,
        "rollout": {"max_turn_tokens": e.max_turn_tokens, "max_context_tokens": e.max_context_tokens or None, "max_turns": e.max_turns or None},
    }


SCRIPT = '''
python - "$MODEL" "$DATA/train.jsonl" "$@" <<'PY'
"""TRL's GRPOTrainer with gem_core's rollout on the experiment's settings (written by gem-core experiment)."""
import sys

import datasets
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from gem_core.precision import machine_precision
from gem_integrations.trl import GemGRPOTrainer, GemRollout

CONFIG = {config}
TRAINER = {trainer}
PRECISION = {precision}  # training.precision
model_path, rows = sys.argv[1], sys.argv[2]
output_dir = sys.argv[3] if len(sys.argv) > 3 else "runs/trl-experiment"
rollout = TRAINER.pop("rollout")
# the device gem-core train would pick here (TRL's own defaults refuse a machine without a GPU); "auto" is the
# precision gem-core train picks on it (gem_core.precision); bf16 is accelerate's autocast over float32 weights
device = "cuda" if torch.cuda.is_available() else "cpu"
precision = machine_precision() if PRECISION == "auto" else PRECISION
trainer = GemGRPOTrainer(
    # float32 master weights whatever the checkpoint's dtype (transformers would keep a bfloat16 checkpoint's)
    AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32),
    args=GRPOConfig(output_dir=output_dir, use_cpu=device == "cpu", bf16=precision == "bf16", fp16=False, **CONFIG),
    processing_class=AutoTokenizer.from_pretrained(model_path),
    train_dataset=datasets.load_dataset("json", data_files=rows, split="train"),
    rollout_func=GemRollout(**rollout),
    **TRAINER,
)
trainer.train()
trainer.save_model(output_dir)  # the trained model, for gem-core eval --model OUTPUT_DIR
PY'''


def render(experiment: Experiment, source: str = "experiment.toml") -> str:
    """The script: the training rows in order, then TRL's trainer; the checkpoints (every ``eval_every``
    updates) are evaluated with ``gem-core eval`` on the held-out seeds."""
    train = dataset_command(TRAINER, experiment, "$DATA/train.jsonl")
    config = pprint.pformat(grpo_config(experiment), sort_dicts=False)
    trainer = pprint.pformat(trainer_arguments(experiment), sort_dicts=False)
    evaluate = "# Held-out success of a saved checkpoint: " + " ".join(shell_word(arg) for arg in eval_command(experiment))
    code = SCRIPT.replace("{config}", config).replace("{trainer}", trainer).replace("{precision}", repr(experiment.precision))
    body = [shell_command(train), evaluate, code.strip()]
    return script(TRAINER, experiment, source, body)
