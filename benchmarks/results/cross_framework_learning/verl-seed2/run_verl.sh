#!/usr/bin/env bash
# verl's configuration of the experiment /work/main/benchmarks/results/cross_framework_learning/verl-seed2/experiment.toml (gem-core experiment /work/main/benchmarks/results/cross_framework_learning/verl-seed2/experiment.toml --trainer verl).
# 50 updates of 32 episodes (16 start states x group 2) on game:GuessTheNumber-v0-easy; rebn, gamma 0.9; lr 7e-05.
# Training start states: run seed 2's (one dataset row a group, update after update: what gem-core train --seed 2 plays); held-out: 200 seeds from 1000000 (on GuessTheNumber each target equally often: --balanced).
# Weights: sha256 a7a2beffbd00347cd2bbbcb99fa0519905563ca2b659bd321aeffe3cef02280c (gem_core.experiment.weights_sha256 of the model directory).
set -euo pipefail
MODEL=${MODEL:-/work/main/benchmarks/results/cross_framework_learning/start/train/model}
DATA=${DATA:-./data/experiment}
mkdir -p "$DATA"
gem-core make-dataset verl \
  --env game:GuessTheNumber-v0-easy \
  --n 800 \
  --run-seed 2 \
  --per-update 16 \
  --seeds-below 1000000 \
  --max-turn-tokens 16 \
  --max-context-tokens 1024 \
  --stop-after-box \
  --out "$DATA/train.parquet"
gem-core make-dataset verl \
  --env game:GuessTheNumber-v0-easy \
  --n 200 \
  --seed-start 1000000 \
  --balanced \
  --max-turn-tokens 16 \
  --max-context-tokens 1024 \
  --stop-after-box \
  --split test \
  --out "$DATA/eval.parquet"
# training.precision = "auto": bf16 where this machine computes in bfloat16 (a CUDA GPU with it, a CPU with AVX512-BF16 or AMX), float32 elsewhere ($GEM_PRECISION, where set, decides)
PRECISION=$(python -m gem_core.precision)
case "$PRECISION" in
  bf16) ACTOR_DTYPE=bf16 ROLLOUT_DTYPE=bfloat16 ATTENTION=flash_attention_2 ;;
  float32) ACTOR_DTYPE=fp32 ROLLOUT_DTYPE=float32 ATTENTION=sdpa ;;
  *) echo "python -m gem_core.precision gave '$PRECISION', not bf16 or float32" >&2; exit 2 ;;
esac
python \
  -m verl.trainer.main_ppo \
  algorithm.adv_estimator=rebn \
  algorithm.use_kl_in_reward=False \
  "data.train_files=$DATA/train.parquet" \
  "data.val_files=$DATA/eval.parquet" \
  data.train_batch_size=16 \
  data.val_batch_size=200 \
  data.shuffle=False \
  data.seed=2 \
  data.max_prompt_length=1024 \
  data.max_response_length=1024 \
  "actor_rollout_ref.model.path=$MODEL" \
  actor_rollout_ref.model.enable_gradient_checkpointing=False \
  "+actor_rollout_ref.model.override_config.attn_implementation=$ATTENTION" \
  actor_rollout_ref.actor.fsdp_config.model_dtype=fp32 \
  "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:$ACTOR_DTYPE,reduce_dtype:fp32,buffer_dtype:fp32}" \
  actor_rollout_ref.ref.fsdp_config.model_dtype=fp32 \
  "+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:$ACTOR_DTYPE,reduce_dtype:fp32,buffer_dtype:fp32}" \
  "actor_rollout_ref.rollout.dtype=$ROLLOUT_DTYPE" \
  actor_rollout_ref.actor.optim.optimizer=AdamW \
  actor_rollout_ref.actor.optim.lr=7e-05 \
  actor_rollout_ref.actor.optim.lr_warmup_steps=0 \
  actor_rollout_ref.actor.optim.lr_scheduler_type=constant \
  actor_rollout_ref.actor.optim.weight_decay=0.0 \
  'actor_rollout_ref.actor.optim.betas=[0.9,0.999]' \
  actor_rollout_ref.actor.optim.clip_grad=1.0 \
  actor_rollout_ref.actor.grad_clip=1.0 \
  actor_rollout_ref.actor.policy_loss.loss_mode=vanilla \
  actor_rollout_ref.actor.clip_ratio_low=0.2 \
  actor_rollout_ref.actor.clip_ratio_high=0.2 \
  actor_rollout_ref.actor.clip_ratio_c=1000000000.0 \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.1 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0.0 \
  actor_rollout_ref.actor.ppo_epochs=1 \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 \
  actor_rollout_ref.actor.shuffle=False \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.rollout.n=2 \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.top_p=1.0 \
  actor_rollout_ref.rollout.top_k=-1 \
  actor_rollout_ref.rollout.seed=2 \
  actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.rollout.agent.default_agent_loop=gem_env \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=null \
  actor_rollout_ref.rollout.val_kwargs.do_sample=True \
  actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
  actor_rollout_ref.rollout.val_kwargs.top_p=1.0 \
  actor_rollout_ref.rollout.val_kwargs.top_k=-1 \
  actor_rollout_ref.rollout.val_kwargs.n=1 \
  trainer.use_v1=True \
  trainer.total_epochs=1 \
  trainer.total_training_steps=50 \
  trainer.val_before_train=True \
  trainer.test_freq=25 \
  +algorithm.rebn_gamma=0.9 \
  +algorithm.rebn_eps=1e-06 \
  +algorithm.rebn_ddof=0 \
  +algorithm.rebn_group_by=null \
  "$@"
