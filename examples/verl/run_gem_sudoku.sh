#!/usr/bin/env bash
# GRPO-style verl run on a GEM env with ReBN advantages: copy, set MODEL, adjust GPUs and batch sizes.
# Needs a GPU machine with verl's rollout engine: pip install -e ".[verl]" "vllm" (or sglang).
# The plugin is loaded by verl itself (entry point `verl.plugins`): no import, no env var.
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-1.7B}
DATA=${DATA:-$HOME/data/gem}
mkdir -p "$DATA"
gem-core make-dataset verl --env game:Sudoku-v0-easy --n 1024 --out "$DATA/train.parquet" --max-turn-tokens 1024
gem-core make-dataset verl --env game:Sudoku-v0-easy --n 64 --seed-start 100000 --split test --out "$DATA/test.parquet" --max-turn-tokens 1024

python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=rebn \
  +algorithm.rebn_gamma=0.9 \
  +algorithm.rebn_ddof=0 \
  +algorithm.rebn_group_by=null \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=64 \
  data.max_prompt_length=1024 \
  data.max_response_length=8192 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.prompt_length=1024 \
  actor_rollout_ref.rollout.response_length=8192 \
  actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.rollout.agent.default_agent_loop=gem_env \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
  trainer.use_v1=True \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes=1 \
  trainer.total_epochs=1 \
  "$@"
