"""Two verl training steps from ``examples/verl/run_gem_sudoku.sh`` on the real vLLM and the real model, the
weights each step trained reaching the engine before the next rollout, and the core runner on the same engine
(run by test_verl_real_step.py): ``python real_two_updates.py EXAMPLE_SCRIPT MODEL_DIR WORKDIR OUT_JSON``.

real_step.py's run (:func:`real_step.main`: the script's datasets and overrides, the CPU ``"$@"``, the Ray
cluster, TransferQueue, the CPU PATCHes, greedy decoding) with :data:`TWO_UPDATE_OVERRIDES` and :func:`two_steps`
(:func:`set_up`, then :func:`one_update` per step; experiment_run.py runs them for a whole experiment). What it adds:

* PATCH (GPU weight sync): verl 0.9.1's sync trainer (``PPOTrainerSync.on_step_end``, what ``fit()`` calls after
  each ``step``) calls ``self.checkpoint_manager.update_weights(global_steps)``; verl's
  ``CheckpointEngineManager`` would have the actor worker send its weights to the vLLM replicas by CUDA IPC or
  NCCL. Here the trainer's ``checkpoint_manager`` is :class:`ReloadingCheckpointManager`: it takes the actor's
  full weights the way verl's own ``ActorRolloutRefWorker.update_weights`` does
  (``actor.engine.get_per_tensor_param()``: the FSDP2 state dict, HF keys, each DTensor's ``full_tensor()``),
  writes them as a Hugging Face checkpoint (safetensors, the converted model's config), and the running engine
  reloads them in place with vLLM's own ``Worker.reload_weights`` through ``AsyncLLM.collective_rpc``, then
  redoes its tied LM head's weight processing (gem_core.testing.vllm_cpu_reload.py) and resets its prefix cache
  (:class:`ReloadingVerlServer`). Test machinery, not the plugin.
* Each update moves the weights whatever the rewards: ``actor.entropy_coeff`` (verl's entropy bonus) and
  ``actor.optim.lr`` :data:`LR` (constant schedule, no warm-up: step 1's lr is :data:`LR`). The greedy rows of
  seeds 0-3 all end at -0.1 (test_verl_real_step.py), so update 1's advantages are 0 and its policy-gradient loss
  too: the entropy bonus alone moves the weights.
* ``trainer.total_training_steps=2``: steps 1 and 2 over the parquet's first 8 prompts (unshuffled).
* After update 1's rollout and before its weights reach the engine (``one_update``'s ``before_sync``), the core
  runner (real_step.core_runner, temperature 0) plays each of update 1's tasks on the engine that generated them.

One run serves every check of the real tier's step (it was two runs, a greedy step and two sampled updates, until
the CI's minutes asked for one: the experiment arm, experiment_run.py, runs sampled with reloads).

The report (OUT_JSON) holds, per update, verl's rows (engine and actor log-probs), the metrics, the optimizer's
lr; the core runner's trajectories of update 1's tasks; the reloads (folder, the change of the weights since the
engine's last ones, the engine's answer); and the engine's prompt log-probs of update 2's sequences after update 2's
reload.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _path in (str(HERE), str(HERE.parent)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import real_step  # noqa: E402
from real_server import RealVerlServer  # noqa: E402
from whole_step import InProcessActorGroup, NoReplicas, OneCpu  # noqa: E402

LR = 1e-5
ENTROPY_COEFF = 0.01
SYNC_DIR = "gem-test-weight-sync"  # under WORKDIR: one checkpoint folder per update, update-<n>

#: real_step.CPU_OVERRIDES (greedy), two steps, an lr and an entropy bonus that move the log-probs in one update, no
#: lr warm-up.
TWO_UPDATE_OVERRIDES = real_step.CPU_OVERRIDES + [
    "trainer.total_training_steps=2",
    f"actor_rollout_ref.actor.optim.lr={LR}",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
    "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
    f"actor_rollout_ref.actor.entropy_coeff={ENTROPY_COEFF}",
]


class ReloadingVerlServer(RealVerlServer):
    """:class:`real_server.RealVerlServer` that can reload its engine's weights in place (see the module docstring)."""

    reloads = 0

    async def reload_weights_from(self, path: str) -> dict:
        """PATCH (GPU weight sync): vLLM's in-place reload from the checkpoint folder ``path``, the tied LM head's
        processing redone (gem_core.testing.vllm_cpu_reload), the prefix cache (KV of the old weights) reset; the number of reloads
        so far and per worker whether the head was tied (re-processed)."""
        from gem_core.testing.vllm_cpu_reload import repack_tied_lm_head

        llm = self.engine.llm
        await llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        tied = await llm.collective_rpc(repack_tied_lm_head)
        await llm.reset_prefix_cache()  # on by default (verl's rollout.enable_prefix_caching, vLLM V1's)
        self.reloads += 1
        return {"reloads": self.reloads, "tied_lm_head_repacked": list(tied)}


class ReloadingCheckpointManager(NoReplicas):
    """verl's ``CheckpointEngineManager`` for the trainer's ``on_step_end``: ``update_weights`` writes the actor's
    weights as a checkpoint and the engine reloads it (PATCH (GPU weight sync), see the module docstring)."""

    def __init__(self, worker, server, model_dir: str, sync_dir: Path):
        self.worker, self.server, self.model_dir, self.sync_dir = worker, server, Path(model_dir), sync_dir
        self.synced = self._weights()  # what the engine holds: the model both started from
        self.reloads: list[dict] = []

    def _weights(self) -> dict:
        """The actor's full weights, HF keys, as verl's weight sync reads them (``get_per_tensor_param``)."""
        per_tensor_param, _ = self.worker.actor.engine.get_per_tensor_param()
        return {name: param.detach().to("cpu").contiguous().clone() for name, param in per_tensor_param}

    def update_weights(self, global_steps: int | None = None) -> dict:
        import ray
        from safetensors.torch import save_file
        from transformers import AutoConfig

        current = self._weights()
        if AutoConfig.from_pretrained(self.model_dir).tie_word_embeddings:
            current.pop("lm_head.weight", None)  # as save_pretrained writes a tied model (the embedding's)
        path = self.sync_dir / f"update-{global_steps}"
        path.mkdir(parents=True)
        save_file(current, str(path / "model.safetensors"), metadata={"format": "pt"})
        for name in ("config.json", "generation_config.json"):
            if (self.model_dir / name).is_file():
                shutil.copy(self.model_dir / name, path / name)
        change = sum(float((current[name] - self.synced[name]).double().pow(2).sum()) for name in current) ** 0.5
        self.synced = current
        engine = ray.get(self.server.reload_weights_from.remote(str(path)), timeout=600)
        self.reloads.append({"global_steps": global_steps, "path": str(path), "weight_change_norm": change, "engine": engine})
        return {}


def read_rows(batch) -> list[dict]:
    """verl's rows of a step's batch, from TransferQueue (real_step.ROW_FIELDS)."""
    import torch
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=real_step.ROW_FIELDS)
    rows = []
    for i, (key, tag) in enumerate(zip(batch.keys, batch.tags)):
        row = {"key": key, "is_padding": bool(tag.get("is_padding", False))}
        for name in real_step.ROW_FIELDS:
            value = data[name][i]
            row[name] = value.tolist() if isinstance(value, torch.Tensor) else value
        rows.append(row)
    return rows


def engine_prompt_logprobs(server, sequences: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """Each (prompt, response)'s response-token log-probs from the engine as it is now: vLLM's prompt log-probs
    of prompt + response (``raw_logprobs``: the model's own)."""
    import ray
    import vllm

    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outputs = ray.get(server.generate_batch.remote([p + r for p, r in sequences], [params] * len(sequences)), timeout=600)
    return [
        [output.prompt_logprobs[len(prompt) + j][token].logprob for j, token in enumerate(response)] for (prompt, response), output in zip(sequences, outputs)
    ]


def set_up(config, model_dir: str, data_dir: Path, report: dict, started: float):
    """real_step._one_step's set-up (the same pieces), the engine reloaded after each update
    (:class:`ReloadingCheckpointManager`, its checkpoints under WORKDIR/gem-test-weight-sync); returns the trainer,
    the actor worker, the server actor and the checkpoint manager, ready for :func:`one_update`."""
    import ray
    import verl.utils.transferqueue_utils as tq_utils
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ, get_trainer_cls
    from verl.utils.skip import SkipManager
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    from gem_integrations.verl.plugin_spec import CONFIG_PATCH, TURN_IDS_PATCH

    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    report["trainer_cls"] = type(trainer).__name__
    report["patches_applied"] = [CONFIG_PATCH.applied, TURN_IDS_PATCH.applied]
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer._init_dump_executor()  # the rest of verl's _setup: fit() shuts it down at the end
    report["total_training_steps"] = int(trainer.total_training_steps)
    report["train_dataset_size"], report["val_dataset_size"] = len(trainer.train_dataset), len(trainer.val_dataset)
    trainer.resource_pool_manager = OneCpu()
    trainer.ref_in_actor = False
    trainer.teacher_model_manager = None
    trainer.distillation_config = None
    trainer.reward_loop_manager = RewardLoopManager(config=config)

    rollout = OmegaConf.to_container(config.actor_rollout_ref.rollout, resolve=True)
    # PATCH (GPU weight sync): collective_rpc with a callable (gem_core.testing.vllm_cpu_reload) needs vLLM's pickle fallback
    env_vars = {"OMP_NUM_THREADS": "2", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    server = ray.remote(num_cpus=0, runtime_env={"env_vars": env_vars})(ReloadingVerlServer).remote(model_dir, rollout)  # PATCH (no GPU server)
    report["engine_args"] = ray.get(server.engine_arguments.remote(), timeout=600)
    report["timing"]["engine"] = time.monotonic() - started

    tq_utils.TQ_INITIALIZED = True
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")  # PATCH (GPU placement)
    worker.init_model()
    report["actor_param_dtype"] = str(next(worker.actor.engine.module.parameters()).dtype)
    trainer.actor_rollout_wg = InProcessActorGroup(worker)
    if trainer.use_reference_policy:  # a KL term (use_kl_loss / use_kl_in_reward): the starting weights' log-probs
        # PATCH (GPU placement): verl's layout with the actor apart (Role.Actor) gives the reference its own worker,
        # Role.RefPolicy (ActorRolloutRefWorker, role "ref", the same model path, never trained); here in this process
        # PATCH (CPU: no pinned memory): verl's FSDP2 engine offloads a forward-only model (the reference) with
        # CPUOffloadPolicy(pin_memory=True); pinning needs an accelerator, so here the same policy unpinned
        import verl.workers.engine.fsdp.transformer_impl as fsdp_engine
        from torch.distributed.fsdp import CPUOffloadPolicy

        fsdp_engine.CPUOffloadPolicy = lambda pin_memory=True: CPUOffloadPolicy(pin_memory=False)
        ref_worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="ref")
        ref_worker.init_model()
        trainer.ref_policy_wg = InProcessActorGroup(ref_worker)
    report["reference_policy"] = bool(trainer.use_reference_policy)
    checkpoint_manager = ReloadingCheckpointManager(worker, server, model_dir, data_dir.parent / SYNC_DIR)
    trainer.checkpoint_manager = checkpoint_manager  # PATCH (GPU weight sync)
    trainer._load_checkpoint()  # the end of verl's _setup: global_steps 0 (from scratch: no checkpoint under default_local_dir)
    report["timing"]["actor_init"] = time.monotonic() - started

    client = LLMServerClient(config, load_balancer_handle=get_router_handle(servers={"cpu-vllm-0": server}))
    trainer.agent_loop_manager = AgentLoopManagerTQ.create(
        config=config, llm_client=client, teacher_client=None, reward_loop_worker_handles=trainer.get_reward_handles()
    )

    SkipManager.init(config)
    trainer.curr_step_profile = False
    return trainer, worker, server, checkpoint_manager


def one_update(trainer, worker, global_steps: int, with_rows: bool = True, before_sync=None) -> dict:
    """What ``fit()`` does for step ``global_steps``: ``step``, ``on_step_end`` (the weight sync), metrics,
    TransferQueue cleared; the update's rows (``with_rows``), the optimizer's lr and the metrics. ``before_sync(rows)``,
    if given, runs between the step and its weight sync (the engine still holds the weights that generated the rows)."""
    import transfer_queue as tq
    from verl.utils.debug import marked_timer
    from verl.utils.skip import SkipManager

    trainer.global_steps = global_steps
    SkipManager.set_step(global_steps)
    lr = [float(group["lr"]) for group in worker.actor.engine.optimizer.param_groups]
    metrics: dict = {}
    trainer.timing_raw = timing_raw = {}
    with marked_timer("step", timing_raw):
        batch = trainer.step(metrics, timing_raw)
        rows = read_rows(batch) if with_rows else []  # before the sync (nothing of it changes them) and before the cleanup
        if before_sync is not None:
            before_sync(rows)
        trainer.on_step_end()  # verl's: checkpoint_manager.update_weights(global_steps)
    trainer._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=0)
    tq.kv_clear(keys=batch.keys, partition_id=batch.partition_id)
    return {
        "rows": rows,
        "lr_used": lr,
        "metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) or getattr(v, "ndim", 1) == 0},
    }


def two_steps(config, model_dir: str, data_dir: Path, report: dict, started: float) -> None:
    """:func:`set_up`, then what ``fit()`` does for two steps (:func:`one_update`), the core runner over update 1's
    tasks before its weight sync (see the module docstring)."""
    import ray

    trainer, worker, server, checkpoint_manager = set_up(config, model_dir, data_dir, report, started)
    report["config"] = {
        "n": int(config.actor_rollout_ref.rollout.n),
        "train_batch_size": int(config.data.train_batch_size),
        "ppo_mini_batch_size": int(config.actor_rollout_ref.actor.ppo_mini_batch_size),
        "response_length": int(config.actor_rollout_ref.rollout.response_length),
        "prompt_length": int(config.actor_rollout_ref.rollout.prompt_length),
        "temperature": float(config.actor_rollout_ref.rollout.temperature),
        "top_k": int(config.actor_rollout_ref.rollout.top_k),
    }

    def core_runner_on_the_same_engine(rows: list[dict]) -> None:
        seeds = sorted({int(row["env_seed"]) for row in rows if not row["is_padding"]})
        max_model_len = report["engine_args"]["max_model_len"]
        played = real_step.core_runner(server, max_model_len, model_dir, data_dir / "train.parquet", seeds)
        report["core"] = {str(seed): trajectory for seed, trajectory in played.items()}
        report["timing"]["core"] = time.monotonic() - started

    report["updates"] = []
    for global_steps in (1, 2):
        report["updates"].append(one_update(trainer, worker, global_steps, before_sync=core_runner_on_the_same_engine if global_steps == 1 else None))
        report["timing"][f"step_{global_steps}"] = time.monotonic() - started
    report["reloads"] = checkpoint_manager.reloads
    # after update 2's reload: the engine's prompt log-probs of update 2's sequences (the test compares them with
    # update 2's and update 1's checkpoints)
    sequences = [(row["prompts"], row["responses"]) for row in report["updates"][1]["rows"] if not row["is_padding"]]
    report["engine_after_update_2"] = engine_prompt_logprobs(server, sequences)
    report["engine_reloads"] = ray.get(server.__ray_call__.remote(lambda actor: actor.reloads), timeout=60)
    report["server_calls"] = len(ray.get(server.get_calls.remote()))
    ray.kill(server)


def main(example: str, model_dir: str, workdir: str, out: str) -> None:
    real_step.main(example, model_dir, workdir, out, steps=two_steps, cpu_overrides=TWO_UPDATE_OVERRIDES)


if __name__ == "__main__":
    main(*sys.argv[1:5])
