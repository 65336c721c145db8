"""TRL's GRPOTrainer with gem-core's rollout and ReBN against the reference trainer (`gem-core train`), on CPU.

Both start from the same model: the reference trainer's toy scale (``TINY_RUN``: a tiny transformer and the
project's tokenizer, built locally) after its warm start (supervised steps on well-formed random moves).
Then each runs RL on the default task (`game:GuessTheNumber-v0-easy`) with the toy scale's settings:
64 episodes per update, ReBN (gamma 0.9, population std, eps 1e-6, the whole batch), lr 5e-4 reached
linearly over 20 updates, PPO clip 0.2, no KL, gradient clipping 1.0, 8 tokens per response, temperature
1.0. TRL needs groups of 2+ (`num_generations`): 32 prompts x 2, the prompts' seeds the first 32 of the
reference's seeds for that update. Both are evaluated with the reference trainer's `evaluate()` (the same
held-out seeds, the same seeded sampling) every `--eval-every` updates. Prints a Markdown table and,
with `--plot`, writes both success curves to a PNG. Needs the `trl` extra (`nox -s trl` builds a venv).

    python benchmarks/trl_vs_reference.py --steps 100 --eval-every 25 --plot trl_vs_reference.png
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def warm_model(config):
    """The reference trainer's model after its warm start (and the tokenizer)."""
    import torch

    from gem_core.train.run import tiny_model, warm_start
    from gem_core.train.trainer import Trainer

    torch.manual_seed(config.seed)
    model, tokenizer = tiny_model(config.seed)
    trainer = Trainer(config, model, tokenizer, log=lambda _: None)
    if config.warm_start_steps:
        warm_start(trainer, config.warm_start_steps, config.warm_start_batch)
    state = copy.deepcopy(trainer.model.state_dict())
    trainer.close()
    return state, tokenizer


def evaluator(config, model, tokenizer):
    from gem_core.train.trainer import Trainer

    return Trainer(config, model, tokenizer, log=lambda _: None)


def run_reference(config, state, tokenizer, steps: int, eval_every: int) -> list[tuple[int, float, float]]:
    from gem_core.train.run import tiny_model
    from gem_core.train.trainer import Trainer

    model, _ = tiny_model(config.seed)
    model.load_state_dict(state)
    trainer = Trainer(config, model, tokenizer, log=lambda _: None)
    curve = [(0, *_stats(trainer.evaluate()))]
    while trainer.step < steps:
        trainer.update()
        if trainer.step % eval_every == 0 or trainer.step == steps:
            curve.append((trainer.step, *_stats(trainer.evaluate())))
            print(f"reference  step {trainer.step:4d}  held-out success {curve[-1][1]:.3f}", flush=True)
    trainer.close()
    return curve


def run_trl(config, state, tokenizer, steps: int, eval_every: int, out: str) -> list[tuple[int, float, float]]:
    import numpy as np
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from gem_core.tasks import TaskSpec
    from gem_core.train.run import tiny_model
    from gem_integrations.trl import GemGRPOTrainer, GemRollout
    from gem_integrations.trl.dataset import rows_for

    generations = 2
    prompts = config.episodes_per_update // generations
    model, _ = tiny_model(config.seed)
    model.load_state_dict(state)
    seeds = []
    for step in range(steps):
        rng = np.random.default_rng([config.seed, step])  # the reference trainer's seeds for this update
        seeds += [int(s) for s in rng.integers(0, 1_000_000, size=config.episodes_per_update)][:prompts]
    dataset = Dataset.from_list(list(rows_for(TaskSpec(config.env_id, seed=s) for s in seeds)))
    args = GRPOConfig(
        output_dir=out,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=config.seed,
        logging_steps=10,
        per_device_train_batch_size=config.episodes_per_update,
        num_generations=generations,
        shuffle_dataset=False,
        max_steps=steps,
        learning_rate=config.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=config.warmup_updates,
        weight_decay=0.0,
        epsilon=config.clip_low,
        beta=config.kl_coef,
        max_grad_norm=config.max_grad_norm,
        temperature=config.temperature,
        max_completion_length=config.max_context_tokens,
    )
    rollout = GemRollout(max_turn_tokens=config.max_tokens, max_context_tokens=config.max_context_tokens)
    trainer = GemGRPOTrainer(model, args=args, train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout, gamma=config.gamma)
    judge = evaluator(config, trainer.model, tokenizer)
    curve = [(0, *_stats(judge.evaluate()))]
    trainer.model.train()

    class Evaluate(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % eval_every == 0 or state.global_step == steps:
                curve.append((state.global_step, *_stats(judge.evaluate())))
                trainer.model.train()
                print(f"trl        step {state.global_step:4d}  held-out success {curve[-1][1]:.3f}", flush=True)

    trainer.add_callback(Evaluate())
    trainer.train()
    judge.close()
    return curve


def _stats(evaluation) -> tuple[float, float]:
    """Success and return of an evaluation, sampled at the run's temperature (as this benchmark's figures were taken)."""
    return evaluation.sampled.success_rate, evaluation.sampled.mean_return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/trl-vs-reference")
    parser.add_argument("--plot", default=None, help="PNG path for both success curves")
    args = parser.parse_args()

    from gem_core.train.trainer import TINY_RUN, TrainConfig

    config = TrainConfig(**{**TINY_RUN, "seed": args.seed, "updates": args.steps, "out": args.out})
    os.makedirs(args.out, exist_ok=True)
    started = time.perf_counter()
    state, tokenizer = warm_model(config)
    warm_seconds = time.perf_counter() - started
    t0 = time.perf_counter()
    reference = run_reference(config, state, tokenizer, args.steps, args.eval_every)
    reference_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    trl_curve = run_trl(config, state, tokenizer, args.steps, args.eval_every, os.path.join(args.out, "trl"))
    trl_seconds = time.perf_counter() - t0
    with open(os.path.join(args.out, "curves.json"), "w") as handle:
        json.dump(
            {"reference": reference, "trl": trl_curve, "seconds": {"warm_start": warm_seconds, "reference": reference_seconds, "trl": trl_seconds}},
            handle,
            indent=2,
        )

    print(f"\nheld-out success rate on {config.eval_episodes} fixed seeds of {config.env_id} (warm start {warm_seconds:.0f} s)\n")
    print("| updates | reference (gem-core train) | TRL GRPOTrainer + gem-core ReBN |")
    print("|---|---|---|")
    for (step, ref_success, _), (_, trl_success, _) in zip(reference, trl_curve):
        print(f"| {step} | {ref_success:.2f} | {trl_success:.2f} |")
    print(f"| seconds for {args.steps} updates | {reference_seconds:.0f} | {trl_seconds:.0f} |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, curve in (("reference (gem-core train)", reference), ("TRL GRPOTrainer + gem-core ReBN", trl_curve)):
            ax.plot([c[0] for c in curve], [c[1] for c in curve], marker="o", label=name)
        ax.set_xlabel("RL updates (64 episodes each)")
        ax.set_ylabel("held-out success rate")
        ax.set_title(config.env_id)
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
