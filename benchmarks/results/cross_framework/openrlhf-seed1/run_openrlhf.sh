#!/usr/bin/env bash
# openrlhf's configuration of the experiment /work/main/benchmarks/results/cross_framework/openrlhf-seed1/experiment.toml (gem-core experiment /work/main/benchmarks/results/cross_framework/openrlhf-seed1/experiment.toml --trainer openrlhf).
# 12 updates of 8 episodes (4 start states x group 2) on game:GuessTheNumber-v0-easy; rebn, gamma 0.9; lr 0.0001.
# Training start states: seeds 0 .. (one dataset row each, in order); held-out: 200 seeds from 1000000 (on GuessTheNumber each target equally often: --balanced).
# Weights: sha256 00475ffe137222f150f274b9d9febdfe918b15d56bda579eba4b6a93bb31a927 (gem_core.experiment.weights_sha256 of the model directory).
set -euo pipefail
MODEL=${MODEL:-/work/main/benchmarks/results/cross_framework/start/train/model}
DATA=${DATA:-./data/experiment}
mkdir -p "$DATA"
gem-core make-dataset openrlhf \
  --env game:GuessTheNumber-v0-easy \
  --n 48 \
  --seed-start 0 \
  --max-turn-tokens 16 \
  --max-context-tokens 1024 \
  --out "$DATA/train.jsonl"
gem-core make-dataset openrlhf \
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
  bf16) PARAM_DTYPE=bf16 ;;
  float32) echo 'training.precision auto is float32 on this machine, which openrlhf cannot train in (OpenRLHF 0.11'"'"'s --ds.param_dtype is bf16 or fp16 and its vLLM engine bfloat16); set training.precision = bf16' >&2; exit 2 ;;
  *) echo "python -m gem_core.precision gave '$PRECISION', not bf16 or float32" >&2; exit 2 ;;
esac
# OpenRLHF shuffles the prompt rows (seeded by --train.seed); its Ray, vLLM and GPU options are yours to add:
gem-core openrlhf train \
  --actor.model_name_or_path "$MODEL" \
  --train.agent_func_path "$(gem-core openrlhf agent-path)" \
  --data.prompt_dataset "$DATA/train.jsonl" \
  --data.input_key prompt \
  --data.label_key label \
  --data.max_samples 48 \
  --data.max_len 1024 \
  --eval.dataset "$DATA/eval.jsonl" \
  --eval.steps 6 \
  --eval.temperature 1.0 \
  --eval.n_samples_per_prompt 1 \
  --algo.advantage.estimator rebn \
  --algo.advantage.gamma 0.9 \
  --rollout.batch_size 4 \
  --rollout.n_samples_per_prompt 2 \
  --rollout.temperature 1.0 \
  --rollout.top_p 1.0 \
  --train.batch_size 8 \
  --train.max_epochs 1 \
  --train.num_episodes 1 \
  --train.seed 1 \
  --actor.optim adam \
  --actor.adam.lr 0.0001 \
  --actor.adam.betas 0.9 0.999 \
  --actor.adam.eps 1e-08 \
  --actor.adam.weight_decay 0.0 \
  --actor.lr_scheduler constant_with_warmup \
  --actor.lr_warmup_ratio 0.0 \
  --actor.max_norm 1.0 \
  --actor.policy_loss_type ppo \
  --actor.eps_clip_low_high 0.2 0.2 \
  --actor.loss_agg_mode token-mean \
  --actor.entropy_coef 0.0 \
  --algo.kl.init_coef 0.0 \
  --algo.kl.estimator k3 \
  --reward.clip_range \
  -1000000000.0 1000000000.0 \
  --ds.param_dtype "$PARAM_DTYPE" \
  --algo.advantage.rebn_ddof 0 \
  --algo.advantage.rebn_eps 1e-06 \
  "$@"
