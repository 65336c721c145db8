#!/usr/bin/env bash
# trl's configuration of the experiment /work/main/benchmarks/results/cross_framework_learning/trl-seed4/experiment.toml (gem-core experiment /work/main/benchmarks/results/cross_framework_learning/trl-seed4/experiment.toml --trainer trl).
# 50 updates of 32 episodes (16 start states x group 2) on game:GuessTheNumber-v0-easy; rebn, gamma 0.9; lr 7e-05.
# Training start states: run seed 4's (one dataset row a group, update after update: what gem-core train --seed 4 plays); held-out: 200 seeds from 1000000 (on GuessTheNumber each target equally often: --balanced).
# Weights: sha256 154a0351e8bb40041a127d0573d6f2db5412f6a02090834ce5d953c16e87a6c3 (gem_core.experiment.weights_sha256 of the model directory).
set -euo pipefail
MODEL=${MODEL:-/work/main/benchmarks/results/cross_framework_learning/start/train/model}
DATA=${DATA:-./data/experiment}
mkdir -p "$DATA"
gem-core make-dataset trl \
  --env game:GuessTheNumber-v0-easy \
  --n 800 \
  --run-seed 4 \
  --per-update 16 \
  --seeds-below 1000000 \
  --max-turn-tokens 16 \
  --max-context-tokens 1024 \
  --stop-after-box \
  --out "$DATA/train.jsonl"
# Held-out success of a saved checkpoint: gem-core eval game:GuessTheNumber-v0-easy --policy hf --model CHECKPOINT --episodes 200 --seed-start 1000000 --balanced --seed 4 --temperature 1.0 --max-tokens 16 --max-context-tokens 1024 --stop-after-box
python - "$MODEL" "$DATA/train.jsonl" "$@" <<'PY'
"""TRL's GRPOTrainer with gem_core's rollout on the experiment's settings (written by gem-core experiment)."""
import sys

import datasets
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from gem_core.precision import machine_precision
from gem_integrations.trl import GemGRPOTrainer, GemRollout

CONFIG = {'learning_rate': 7e-05,
 'lr_scheduler_type': 'constant_with_warmup',
 'warmup_steps': 0,
 'optim': 'adamw_torch',
 'adam_beta1': 0.9,
 'adam_beta2': 0.999,
 'adam_epsilon': 1e-08,
 'weight_decay': 0.0,
 'max_grad_norm': 1.0,
 'max_steps': 100,
 'per_device_train_batch_size': 16,
 'gradient_accumulation_steps': 1,
 'steps_per_generation': 2,
 'num_iterations': 1,
 'num_generations': 2,
 'temperature': 1.0,
 'top_p': 1.0,
 'top_k': 0,
 'max_completion_length': 1024,
 'epsilon': 0.2,
 'epsilon_high': 0.2,
 'beta': 0.1,
 'loss_type': 'dapo',
 'scale_rewards': 'none',
 'entropy_coef': 0.0,
 'mask_truncated_completions': False,
 'importance_sampling_level': 'token',
 'use_bias_correction_kl': False,
 'gradient_checkpointing': False,
 'shuffle_dataset': False,
 'seed': 4,
 'save_strategy': 'steps',
 'save_steps': 50,
 'logging_steps': 1,
 'report_to': 'none'}
TRAINER = {'estimator': 'rebn',
 'gamma': 0.9,
 'eps': 1e-06,
 'ddof': 0,
 'group_by': None,
 'rollout': {'max_turn_tokens': 16,
             'max_context_tokens': 1024,
             'max_turns': None}}
PRECISION = 'auto'  # training.precision
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
PY
