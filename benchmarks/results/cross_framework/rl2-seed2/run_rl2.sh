#!/usr/bin/env bash
# rl2's configuration of the experiment /work/main/benchmarks/results/cross_framework/rl2-seed2/experiment.toml (gem-core experiment /work/main/benchmarks/results/cross_framework/rl2-seed2/experiment.toml --trainer rl2).
# 12 updates of 8 episodes (4 start states x group 2) on game:GuessTheNumber-v0-easy; rebn, gamma 0.9; lr 0.0001.
# Training start states: seeds 0 .. (one dataset row each, in order); held-out: 200 seeds from 1000000 (on GuessTheNumber each target equally often: --balanced).
# Weights: sha256 00475ffe137222f150f274b9d9febdfe918b15d56bda579eba4b6a93bb31a927 (gem_core.experiment.weights_sha256 of the model directory).
set -euo pipefail
MODEL=${MODEL:-/work/main/benchmarks/results/cross_framework/start/train/model}
DATA=${DATA:-./data/experiment}
mkdir -p "$DATA"
gem-core make-dataset rl2 \
  --env game:GuessTheNumber-v0-easy \
  --n 48 \
  --seed-start 0 \
  --max-turn-tokens 16 \
  --max-context-tokens 1024 \
  --out "$DATA/train.jsonl"
gem-core make-dataset rl2 \
  --env game:GuessTheNumber-v0-easy \
  --n 200 \
  --seed-start 1000000 \
  --balanced \
  --max-turn-tokens 16 \
  --max-context-tokens 1024 \
  --out "$DATA/eval.jsonl"
# training.precision = "auto": bf16 where this machine computes in bfloat16 (a CUDA GPU with it, a CPU with AVX512-BF16 or AMX), float32 elsewhere ($GEM_PRECISION, where set, decides)
PRECISION=$(python -m gem_core.precision)
case "$PRECISION" in
  bf16) ROLLOUT_DTYPE=bfloat16 ;;
  float32) echo 'training.precision auto is float32 on this machine, which rl2 cannot train in (RL2 0.0.2'"'"'s FSDP mixed precision is bfloat16, fixed in its code); set training.precision = bf16' >&2; exit 2 ;;
  *) echo "python -m gem_core.precision gave '$PRECISION', not bf16 or float32" >&2; exit 2 ;;
esac
# RL2 shuffles the rows (its dataloader); torchrun, SGLang and GPU options are yours to add:
gem-core rl2 train \
  "train_data.path=$DATA/train.jsonl" \
  train_data.prompts_per_rollout=4 \
  train_data.responses_per_prompt=2 \
  "test_data.path=$DATA/eval.jsonl" \
  test_data.prompts_per_rollout=200 \
  test_data.responses_per_prompt=1 \
  "actor.model_name=$MODEL" \
  actor.gradient_checkpointing=false \
  actor.update_per_rollout=1 \
  actor.clip=0.2 \
  actor.avg_level=token \
  actor.lr=0.0001 \
  actor.weight_decay=0.0 \
  actor.max_grad_norm=1.0 \
  actor.scheduler=constant_with_warmup \
  actor.warmup_ratio=0.0 \
  actor.kl.coef=0.0 \
  actor.kl.type=null \
  actor.kl.loss_estimator=k3 \
  actor.entropy.coef=0.0 \
  rollout.train_sampling_params.temperature=1.0 \
  rollout.train_sampling_params.max_new_tokens=16 \
  rollout.test_sampling_params.temperature=1.0 \
  rollout.max_turns=1000 \
  "rollout.server_args.dtype=$ROLLOUT_DTYPE" \
  rollout.dynamic_filtering=false \
  "rollout.env_path=$(gem-core rl2 env-path)" \
  adv.estimator=reinforce \
  adv.gamma=0.9 \
  adv.global_norm=false \
  adv.norm_var=false \
  +adv.rebn=true \
  +adv.rebn_eps=1e-06 \
  +adv.rebn_ddof=0 \
  +adv.rebn_group_by=null \
  trainer.n_epochs=1 \
  trainer.test_freq=6 \
  trainer.save_freq=6 \
  "$@"
