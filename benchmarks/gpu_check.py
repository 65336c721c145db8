"""The GPU check: the default run of `gem-core train` on CUDA for several seeds at once, then TRL's GRPOTrainer with
gem-core's rollout beside the reference trainer on the same GPU, written to one folder.

    bash scripts/gpu_check.sh --out runs/gpu_check            # on a machine with a CUDA GPU
    bash scripts/gpu_check.sh --dry-run --out /tmp/gpu_dry   # the same steps on CPU at a tiny size (CI runs this)

Phase 1, the seeds: ``gem-core train --seed S --device DEVICE --out OUT/runs/seedS`` for every seed at once, each a
process of its own (the default run, bf16 where the GPU computes in it, the held-out evaluation before and after RL).
Read back from each run's ``metrics.jsonl``: seconds per update (the rollout and the learning part apart), peak GPU
memory (torch's allocator), held-out success after RL, sampled and greedy; beside the CPU figures of the same
settings (the committed records ``benchmarks/results/default_run_seeds/default-seedS``, one run at a time on two
cores). Runs still going at ``--seeds-budget-s`` are stopped and reported as far as they got.

Phase 2, TRL: ``examples/trl/train_gtn_rebn.py``'s trainer (GRPOTrainer, gem-core's rollout through TRL's generation,
ReBN) for ``--trl-steps`` updates, each update timed by a callback, then the reference trainer alone with the same
model, episodes per update, group size, tokens per turn, every weight trained, no KL and no warm start. Skipped (said
so) where TRL is not installed.

Written to OUT: ``results.json`` (every figure, the machine and the versions), ``results.md`` (the tables),
``gpu_check.png`` (success per seed and seconds per update) and ``runs.tar.gz`` (each run's config, metrics and log).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import time
from typing import Any

from default_run_seeds import run_record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_RECORDS = os.path.join(ROOT, "benchmarks", "results", "default_run_seeds")
TRL_EXAMPLE = os.path.join(ROOT, "examples", "trl", "train_gtn_rebn.py")

# (seeds, gem-core train options, TRL and reference comparison sizes) of a full check and of a dry run
FULL = {"seeds": [0, 1, 2, 3, 4], "train": [], "trl": {"steps": 4, "batch_size": 32, "num_generations": 8, "max_turn_tokens": 16}}
DRY = {
    "seeds": [0, 1],
    "train": ["--updates", "2", "--episodes-per-update", "4", "--warm-start-steps", "1", "--eval-episodes", "4"],
    "trl": {"steps": 1, "batch_size": 4, "num_generations": 2, "max_turn_tokens": 8},
}


def versions() -> dict[str, Any]:
    """The machine and the packages the figures come from."""
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "trl", "accelerate", "datasets"):
        if importlib.util.find_spec(name) is not None:
            found[name] = __import__(name).__version__
    found["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    found["cpus"] = os.cpu_count()
    return found


def train_command(seed: int, model: str, device: str, out: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "gem_core.cli", "train", "--seed", str(seed), "--model", model, "--device", device, "--out", out, "--no-progress", *extra]


def run_all(commands: dict[str, list[str]], logs: dict[str, str], budget_s: float) -> dict[str, dict[str, Any]]:
    """Start every command at once; stop those still going after ``budget_s``. Each one's return code and wall seconds."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // max(len(commands), 1)))}
    started = time.perf_counter()
    running = {}
    for name, command in commands.items():
        print("+", " ".join(command), flush=True)
        running[name] = subprocess.Popen(command, cwd=ROOT, env=env, stdout=open(logs[name], "w"), stderr=subprocess.STDOUT)
    outcome: dict[str, dict[str, Any]] = {}
    while running:
        for name, process in list(running.items()):
            if process.poll() is not None:
                outcome[name] = {"returncode": process.returncode, "seconds": round(time.perf_counter() - started, 1), "stopped": False}
                del running[name]
        if running and time.perf_counter() - started > budget_s:
            for name, process in running.items():
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                outcome[name] = {"returncode": process.returncode, "seconds": round(time.perf_counter() - started, 1), "stopped": True}
            running = {}
        time.sleep(0.5)
    return outcome


def run_summary(out: str) -> dict[str, Any]:
    """One run's seconds per update (rollout, learning), peak memory and held-out results, as far as it got."""
    lines = []
    if os.path.exists(os.path.join(out, "metrics.jsonl")):
        lines = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") if line.strip()]
    rl = [line for line in lines if line.get("phase") == "rl" and "rollout_seconds" in line]
    mean = lambda values: round(statistics.fmean(values), 3) if values else None  # noqa: E731
    summary: dict[str, Any] = {
        "updates": len(rl),
        "rollout_s": mean([line["rollout_seconds"] for line in rl]),
        "learning_s": mean([line["update_seconds"] - line["rollout_seconds"] for line in rl]),
        "update_s": mean([line["update_seconds"] for line in rl]),
        "peak_gpu_gb": max((line.get("peak_gpu_gb") or 0.0 for line in lines), default=0.0) or None,
        "peak_rss_gb": max((line.get("peak_rss_gb") or 0.0 for line in lines), default=0.0) or None,
    }
    record = run_record(out)
    if record is not None:
        summary.update({key: record[key] for key in ("start_sampled", "start_greedy", "sampled", "greedy", "higher_sampled", "lower_sampled", "ceiling")})
    return summary


def cpu_figures(seed: int) -> dict[str, Any] | None:
    """The committed CPU run of the same seed and settings (None where there is none)."""
    folder = os.path.join(CPU_RECORDS, f"default-seed{seed}")
    return run_summary(folder) if os.path.isdir(folder) else None


def trl_child(args: argparse.Namespace) -> None:
    """Phase 2's TRL arm, in a process of its own: the example's trainer, each update timed."""
    from transformers import TrainerCallback

    spec = importlib.util.spec_from_file_location("train_gtn_rebn", TRL_EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    options = [
        "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--num-generations", str(args.num_generations),
        "--max-turn-tokens", str(args.max_turn_tokens), "--prompts", str(args.steps * args.batch_size), "--out", args.out,
    ]  # fmt: skip
    if args.model != "tiny":
        options += ["--model", args.model]
    if args.device.startswith("cuda"):
        options.append("--bf16")  # the example runs on the GPU with bf16, on the CPU without
    trainer = example.build_trainer(example.parse_args(options))
    seconds: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            seconds.append(time.perf_counter() - self.started)

    trainer.add_callback(Timer())
    trainer.train()
    peak = None
    import torch

    if torch.cuda.is_available():
        peak = round(torch.cuda.max_memory_allocated() / 1e9, 3)
    with open(os.path.join(args.out, "trl.json"), "w", encoding="utf-8") as handle:
        json.dump({"step_seconds": seconds, "device": str(trainer.model.device), "peak_gpu_gb": peak}, handle)


def compare_trl(model: str, device: str, out: str, sizes: dict[str, int], budget_s: float) -> dict[str, Any]:
    """TRL's trainer, then the reference trainer alone, on the same settings: seconds per update of each."""
    if importlib.util.find_spec("trl") is None:
        return {"skipped": "trl is not installed (pip install -e '.[trl]')"}
    trl_out, ref_out = os.path.join(out, "trl"), os.path.join(out, "runs", "reference-as-trl")
    os.makedirs(trl_out, exist_ok=True)
    child = [sys.executable, os.path.abspath(__file__), "--trl-child", "--model", model, "--device", device, "--out", trl_out]
    child += [f"--{key.replace('_', '-')}={value}" for key, value in sizes.items()]
    reference = train_command(0, model, device, ref_out, [])
    reference += ["--updates", str(sizes["steps"]), "--episodes-per-update", str(sizes["batch_size"]), "--group-size", str(sizes["num_generations"])]
    reference += ["--max-turn-tokens", str(sizes["max_turn_tokens"]), "--warm-start-steps", "0", "--kl-coef", "0", "--trained-layers", "0"]
    reference += ["--mini-batches", "1", "--no-skip-zero-signal", "--eval-episodes", "4"]
    logs = {"trl": os.path.join(out, "runs", "trl.log"), "reference": os.path.join(out, "runs", "reference-as-trl.log")}
    result: dict[str, Any] = {"settings": sizes}
    result["trl_run"] = run_all({"trl": child}, logs, budget_s / 2)["trl"]
    result["reference_run"] = run_all({"reference": reference}, logs, budget_s / 2)["reference"]
    if os.path.exists(os.path.join(trl_out, "trl.json")):
        timed = json.load(open(os.path.join(trl_out, "trl.json"), encoding="utf-8"))
        steps = timed["step_seconds"]
        result["trl"] = {
            "updates": len(steps),
            "update_s": round(statistics.fmean(steps), 3) if steps else None,
            "update_s_each": steps,
            "peak_gpu_gb": timed["peak_gpu_gb"],
            "device": timed["device"],
        }
    result["reference"] = run_summary(ref_out)
    return result


def markdown(results: dict[str, Any]) -> str:
    cell = lambda value, digits=3: "-" if value is None else f"{value:.{digits}f}"  # noqa: E731
    lines = [
        f"GPU check, {results['date']}: {results['machine'].get('gpu') or 'no GPU'} (torch {results['machine']['torch']}, CUDA {results['machine']['cuda']}); {results['command']}",
        "",
    ]
    lines.append(f"Seeds at once ({len(results['seeds'])} processes on one device), then each seed's committed CPU run (two cores, one run at a time):")
    lines.append("")
    lines.append(
        "| seed | updates | s/update (rollout + learning) | peak GPU GB | held-out sampled | greedy | CPU s/update (rollout + learning) | CPU sampled | CPU greedy |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for seed, row in results["seeds"].items():
        cpu = row.get("cpu") or {}
        lines.append(
            f"| {seed} | {row['updates']}{' (stopped)' if row['run'].get('stopped') else ''} | {cell(row['update_s'], 2)} ({cell(row['rollout_s'], 2)} + {cell(row['learning_s'], 2)}) "
            f"| {cell(row['peak_gpu_gb'], 2)} | {cell(row.get('sampled'))} | {cell(row.get('greedy'))} "
            f"| {cell(cpu.get('update_s'), 2)} ({cell(cpu.get('rollout_s'), 2)} + {cell(cpu.get('learning_s'), 2)}) | {cell(cpu.get('sampled'))} | {cell(cpu.get('greedy'))} |"
        )
    finished = [row for row in results["seeds"].values() if row.get("sampled") is not None]
    if finished:
        sampled, greedy = [row["sampled"] for row in finished], [row["greedy"] for row in finished]
        lines.append(
            f"| median [range] | | | | {statistics.median(sampled):.3f} [{min(sampled):.3f}, {max(sampled):.3f}] | {statistics.median(greedy):.3f} [{min(greedy):.3f}, {max(greedy):.3f}] | | | |"
        )
    lines.append("")
    lines.append(f"{len(finished)} of {len(results['seeds'])} runs finished; phase wall {results['seeds_wall_s']:.0f} s.")
    trl = results.get("trl") or {}
    lines.append("")
    if "skipped" in trl:
        lines.append(f"TRL: skipped ({trl['skipped']}).")
    else:
        settings = trl.get("settings", {})
        lines.append(f"TRL's GRPOTrainer (gem-core rollout, ReBN) and the reference trainer alone, same GPU and settings ({settings}):")
        lines.append("")
        lines.append("| trainer | updates | s/update | peak GPU GB |")
        lines.append("|---|---|---|---|")
        for name in ("trl", "reference"):
            row = trl.get(name) or {}
            lines.append(f"| {name} | {row.get('updates', 0)} | {cell(row.get('update_s'), 2)} | {cell(row.get('peak_gpu_gb'), 2)} |")
    return "\n".join(lines) + "\n"


def figure(results: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = list(results["seeds"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for offset, (label, pick) in enumerate(
        [
            ("GPU sampled", lambda r: r.get("sampled")),
            ("GPU greedy", lambda r: r.get("greedy")),
            ("CPU sampled", lambda r: (r.get("cpu") or {}).get("sampled")),
            ("CPU greedy", lambda r: (r.get("cpu") or {}).get("greedy")),
        ]
    ):
        left.bar([i + 0.2 * offset for i in range(len(seeds))], [pick(results["seeds"][s]) or 0.0 for s in seeds], width=0.2, label=label)
    left.axhline(0.4, color="grey", linestyle="--", label="hint-blind ceiling")
    left.set_xticks([i + 0.3 for i in range(len(seeds))], seeds)
    left.set(xlabel="seed", ylabel="held-out success after RL", ylim=(0, 1))
    left.legend(fontsize=7)
    for offset, (label, pick) in enumerate([("GPU", lambda r: r), ("CPU", lambda r: r.get("cpu") or {})]):
        rows = [pick(results["seeds"][s]) for s in seeds]
        xs = [i + 0.4 * offset for i in range(len(seeds))]
        right.bar(xs, [r.get("rollout_s") or 0.0 for r in rows], width=0.4, label=f"{label} rollout")
        right.bar(xs, [r.get("learning_s") or 0.0 for r in rows], width=0.4, bottom=[r.get("rollout_s") or 0.0 for r in rows], label=f"{label} learning")
    right.set_xticks([i + 0.2 for i in range(len(seeds))], seeds)
    right.set(xlabel="seed", ylabel="seconds per update")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "gpu_check"))
    parser.add_argument(
        "--dry-run", action="store_true", help="the same steps at a tiny size, on the CPU and gem-core train's tiny model unless --device/--model say otherwise"
    )
    parser.add_argument("--device", default=None, help="default cuda (cpu with --dry-run)")
    parser.add_argument("--model", default=None, help="default smollm2-135m-instruct (tiny with --dry-run)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--seeds-budget-s", type=float, default=420.0, help="runs still going after this are stopped and reported as far as they got")
    parser.add_argument("--trl-budget-s", type=float, default=150.0)
    parser.add_argument("--trl-child", action="store_true", help=argparse.SUPPRESS)
    for name in ("steps", "batch-size", "num-generations", "max-turn-tokens"):
        parser.add_argument(f"--{name}", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trl_child:
        trl_child(args)
        return 0
    plan = DRY if args.dry_run else FULL
    device = args.device or ("cpu" if args.dry_run else "cuda")
    model = args.model or ("tiny" if args.dry_run else "smollm2-135m-instruct")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print(f"gpu_check: --device {device} but torch {torch.__version__} sees no CUDA device (--dry-run runs on the CPU)", file=sys.stderr)
            return 2
    if model not in ("tiny",):
        from gem_core.models import resolve_model

        model = resolve_model(model)  # converted once here, not by every seed's process at once
    out = os.path.abspath(args.out)
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    seeds = args.seeds if args.seeds is not None else plan["seeds"]
    command = " ".join(["bash scripts/gpu_check.sh", *(argv if argv is not None else sys.argv[1:])])
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": versions(),
        "device": device,
        "model": model,
    }
    commands = {f"seed{s}": train_command(s, model, device, os.path.join(out, "runs", f"seed{s}"), plan["train"]) for s in seeds}
    logs = {name: os.path.join(out, "runs", f"{name}.log") for name in commands}
    started = time.perf_counter()
    outcome = run_all(commands, logs, args.seeds_budget_s)
    results["seeds_wall_s"] = round(time.perf_counter() - started, 1)
    results["seeds"] = {}
    for s in seeds:
        row = run_summary(os.path.join(out, "runs", f"seed{s}"))
        row["run"] = outcome[f"seed{s}"]
        row["cpu"] = cpu_figures(s) if not args.dry_run else None
        results["seeds"][str(s)] = row
    results["trl"] = compare_trl(model, device, out, plan["trl"], args.trl_budget_s)
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    text = markdown(results)
    with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    if importlib.util.find_spec("matplotlib") is not None:
        figure(results, os.path.join(out, "gpu_check.png"))
    else:
        print("gpu_check: no figure (matplotlib is not installed)", file=sys.stderr)
    with tarfile.open(os.path.join(out, "runs.tar.gz"), "w:gz") as archive:
        for root, folders, files in os.walk(os.path.join(out, "runs")):
            folders[:] = [name for name in folders if name != "model"]  # a run's saved model: not a record
            for name in files:
                if name in ("metrics.jsonl", "config.json") or name.endswith(".log"):
                    path = os.path.join(root, name)
                    archive.add(path, arcname=os.path.relpath(path, out))
        if os.path.exists(os.path.join(out, "trl", "trl.json")):
            archive.add(os.path.join(out, "trl", "trl.json"), arcname="trl/trl.json")
    print(text)
    runs = {**outcome, **{name: results["trl"][f"{name}_run"] for name in ("trl", "reference") if f"{name}_run" in results["trl"]}}
    failed = [name for name, run in runs.items() if run["returncode"] != 0 and not run["stopped"]]
    if failed:
        print(f"gpu_check: {', '.join(failed)} failed; see {out}/runs/*.log", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
