#!/usr/bin/env bash
# openrlhf's configuration of the experiment /work/main/benchmarks/results/cross_framework_learning/openrlhf-seed3/experiment.toml (gem-core experiment /work/main/benchmarks/results/cross_framework_learning/openrlhf-seed3/experiment.toml --trainer openrlhf).
# 50 updates of 32 episodes (16 start states x group 2) on game:GuessTheNumber-v0-easy; rebn, gamma 0.9; lr 7e-05.
# Training start states: run seed 3's (one dataset row a group, update after update: what gem-core train --seed 3 plays); held-out: 200 seeds from 1000000 (on GuessTheNumber each target equally often: --balanced).
# Weights: sha256 a7a2beffbd00347cd2bbbcb99fa0519905563ca2b659bd321aeffe3cef02280c (gem_core.experiment.weights_sha256 of the model directory).
set -euo pipefail
MODEL=${MODEL:-/work/main/benchmarks/results/cross_framework_learning/start/train/model}
DATA=${DATA:-./data/experiment}
mkdir -p "$DATA"
gem-core make-dataset openrlhf \
  --env game:GuessTheNumber-v0-easy \
  --n 800 \
  --run-seed 3 \
  --per-update 16 \
  --seeds-below 1000000 \
  --max-turn-tokens 16 \
  --max-context-tokens 1024 \
  --stop-after-box \
  --out "$DATA/train.jsonl"
gem-core make-dataset openrlhf \
  --env game:GuessTheNumber-v0-easy \
  --n 200 \
  --seed-start 1000000 \
  --balanced \
  --max-turn-tokens 16 \
  --max-context-tokens 1024 \
  --stop-after-box \
  --out "$DATA/eval.jsonl"
# training.precision = "auto": bf16 where this machine computes in bfloat16 (a CUDA GPU with it, a CPU with AVX512-BF16 or AMX), float32 elsewhere ($GEM_PRECISION, where set, decides)
PRECISION=$(python -m gem_core.precision)
case "$PRECISION" in
  bf16) PARAM_DTYPE=bf16 ;;
  float32) echo 'training.precision auto is float32 on this machine, which openrlhf cannot train in (OpenRLHF 0.11'"'"'s --ds.param_dtype is bf16 or fp16 and its vLLM engine bfloat16); set training.precision = bf16' >&2; exit 2 ;;
  *) echo "python -m gem_core.precision gave '$PRECISION', not bf16 or float32" >&2; exit 2 ;;
esac
# OpenRLHF plays the rows in order (--data.shuffle false: the plugin's launcher); its Ray, vLLM and GPU options are yours to add:
gem-core openrlhf train \
  --actor.model_name_or_path "$MODEL" \
  --train.agent_func_path "$(gem-core openrlhf agent-path)" \
  --data.prompt_dataset "$DATA/train.jsonl" \
  --data.input_key prompt \
  --data.label_key label \
  --data.max_samples 800 \
  --data.shuffle false \
  --data.max_len 1024 \
  --eval.dataset "$DATA/eval.jsonl" \
  --eval.steps 25 \
  --eval.temperature 1.0 \
  --eval.n_samples_per_prompt 1 \
  --algo.advantage.estimator rebn \
  --algo.advantage.gamma 0.9 \
  --rollout.batch_size 16 \
  --rollout.n_samples_per_prompt 2 \
  --rollout.temperature 1.0 \
  --rollout.top_p 1.0 \
  --train.batch_size 16 \
  --train.max_epochs 1 \
  --train.num_episodes 1 \
  --train.seed 3 \
  --actor.optim adam \
  --actor.adam.lr 7e-05 \
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
  --algo.kl.init_coef 0.1 \
  --algo.kl.estimator k3 \
  --reward.clip_range \
  -1000000000.0 1000000000.0 \
  --ds.param_dtype "$PARAM_DTYPE" \
  --algo.advantage.rebn_ddof 0 \
  --algo.advantage.rebn_eps 1e-06 \
  --algo.kl.use_loss \
  "$@"
