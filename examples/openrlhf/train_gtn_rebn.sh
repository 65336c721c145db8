#!/usr/bin/env bash
# GEM GuessTheNumber with OpenRLHF 0.11.x and ReBN advantages (gem-core's launcher adds `rebn`).
#
#   pip install torch==2.13.0 && pip install flash-attn==2.8.3 --no-build-isolation  # a CUDA machine
#   pip install -e '.[openrlhf]'        # openrlhf[vllm]==0.11.2: OpenRLHF, vllm 0.29.0, deepspeed 0.19.6
#   bash examples/openrlhf/train_gtn_rebn.sh
#
# Runs from any folder (the prompt file's folder is created). Needs 4 GPUs (vLLM engines and the DeepSpeed
# actor, colocated). The prompt file holds one row per episode: the env's first message (unused by the
# agent, handy to read) and a JSON label, gem_core's TaskSpec ({"env_id", "seed", "env_kwargs",
# "max_turn_tokens", ...}); all n_samples_per_prompt samples of a row start from one state.
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen3-1.7B}
ENV_ID=${ENV_ID:-game:GuessTheNumber-v0-easy}
OUT=${OUT:-./ckpt/gtn-rebn}
DATA=${DATA:-./data/gtn_prompts.jsonl}

MAX_TURN_TOKENS=${MAX_TURN_TOKENS:-1024}

mkdir -p "$(dirname "$DATA")"
gem-core make-dataset openrlhf --env "$ENV_ID" --n 4096 --max-turn-tokens "$MAX_TURN_TOKENS" --out "$DATA"

# Multi-turn: --data.max_len bounds the whole episode (prompt + every turn); the agent ends an episode
# as truncated (`context_limit`) when the next observation would not fit. Each response is capped at the
# label's max_turn_tokens (else GEM_OPENRLHF_MAX_TURN_TOKENS, else --rollout.max_new_tokens per turn).
gem-core openrlhf train \
  --actor.model_name_or_path "$MODEL" \
  --train.agent_func_path "$(gem-core openrlhf agent-path)" \
  --data.prompt_dataset "$DATA" --data.input_key prompt --data.label_key label \
  --data.max_len 4096 \
  --algo.advantage.estimator rebn --algo.advantage.gamma 0.9 \
  --algo.advantage.rebn_ddof 0 --algo.advantage.rebn_eps 1e-6 \
  --algo.kl.init_coef 0 \
  --rollout.n_samples_per_prompt 4 \
  --actor.num_nodes 1 --actor.num_gpus_per_node 4 \
  --ref.num_nodes 1 --ref.num_gpus_per_node 4 \
  --vllm.num_engines 4 --vllm.tensor_parallel_size 1 \
  --train.colocate_all \
  --ckpt.path "$OUT" \
  "$@"
