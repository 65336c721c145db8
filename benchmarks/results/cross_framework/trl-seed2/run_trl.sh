#!/usr/bin/env bash
# trl's configuration of the experiment /work/main/benchmarks/results/cross_framework/trl-seed2/experiment.toml (gem-core experiment /work/main/benchmarks/results/cross_framework/trl-seed2/experiment.toml --trainer trl).
# 12 updates of 8 episodes (4 start states x group 2) on game:GuessTheNumber-v0-easy; rebn, gamma 0.9; lr 0.0001.
# Training start states: seeds 0 .. (one dataset row each, in order); held-out: 200 seeds from 1000000 (on GuessTheNumber each target equally often: --balanced).
# Weights: sha256 00475ffe137222f150f274b9d9febdfe918b15d56bda579eba4b6a93bb31a927 (gem_core.experiment.weights_sha256 of the model directory).
set -euo pipefail
MODEL=${MODEL:-/work/main/benchmarks/results/cross_framework/start/train/model}
DATA=${DATA:-./data/experiment}
mkdir -p "$DATA"
gem-core make-dataset trl \
  --env game:GuessTheNumber-v0-easy \
  --n 48 \
  --seed-start 0 \
  --max-turn-tokens 16 \
  --max-context-tokens 1024 \
  --out "$DATA/train.jsonl"
# Held-out success of a saved checkpoint: gem-core eval game:GuessTheNumber-v0-easy --policy hf --model CHECKPOINT --episodes 200 --seed-start 1000000 --balanced --seed 2 --temperature 1.0 --max-tokens 16 --max-context-tokens 1024
python - "$MODEL" "$DATA/train.jsonl" "$@" <<'PY'
"""TRL's GRPOTrainer with gem_core's rollout on the experiment's settings (written by gem-core experiment)."""
import sys

import datasets
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from gem_core.precision import machine_precision
from gem_integrations.trl import GemGRPOTrainer, GemRollout

CONFIG = {'learning_rate': 0.0001,
 'lr_scheduler_type': 'constant_with_warmup',
 'warmup_steps': 0,
 'optim': 'adamw_torch',
 'adam_beta1': 0.9,
 'adam_beta2': 0.999,
 'adam_epsilon': 1e-08,
 'weight_decay': 0.0,
 'max_grad_norm': 1.0,
 'max_steps': 12,
 'per_device_train_batch_size': 8,
 'gradient_accumulation_steps': 1,
 'steps_per_generation': 1,
 'num_iterations': 1,
 'num_generations': 2,
 'temperature': 1.0,
 'top_p': 1.0,
 'top_k': 0,
 'max_completion_length': 1024,
 'epsilon': 0.2,
 'epsilon_high': 0.2,
 'beta': 0.0,
 'loss_type': 'dapo',
 'scale_rewards': 'none',
 'entropy_coef': 0.0,
 'mask_truncated_completions': False,
 'importance_sampling_level': 'token',
 'gradient_checkpointing': False,
 'shuffle_dataset': False,
 'seed': 2,
 'save_strategy': 'steps',
 'save_steps': 6,
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
