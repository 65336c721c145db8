"""One verl training step from ``examples/verl/run_gem_sudoku.sh``, on CPU (run by test_whole_step.py).

``python whole_step.py EXAMPLE_SCRIPT WORKDIR OUT_JSON``. The script is read, not copied: its two
``gem-core make-dataset verl`` lines run as written (``$DATA`` = WORKDIR/data), and the
``python -m verl.trainer.main_ppo`` overrides are composed by hydra into verl's ``ppo_trainer`` config
followed by :data:`CPU_OVERRIDES`, which is what a user passes through the script's ``"$@"`` (the
script says "adjust GPUs and batch sizes"); ``$MODEL`` is a tiny Qwen2 with the test tokenizer. Then
``validate_config`` (as ``main_ppo`` runs it) and verl's own v1 trainer, as ``TaskRunnerV1.run`` drives
it, for one ``PPOTrainer.step``:

* what runs as verl wrote it: ``PPOTrainerSync.__init__`` (with the plugin's start-up check), the
  tokenizer, dataset and ``StatefulDataLoader`` from the parquet (``_init_tokenizer``,
  ``_init_dataloader``), ``RewardLoopManager`` (rule-based, reward workers as Ray actors),
  ``AgentLoopManagerTQ.create`` (an ``AgentLoopWorkerTQ`` Ray actor running the ``gem_env`` loop)
  with ``LLMServerClient`` over verl's load balancer, TransferQueue, and ``step``: the dataloader's
  batch submitted, the replay buffer's sample, ``_balance_batch`` (batch padding), ``_compute_old_log_prob``
  (the actor's forward pass), ``_compute_advantage`` (``rebn``), ``_update_actor`` (``ppo_loss``, backward,
  AdamW step) on verl's ``ActorRolloutRefWorker`` (role ``actor``: its FSDP2 engine on the CPU, gloo,
  world size 1); then ``_compute_metrics``.
* the stand-ins, named: the rollout server (a Ray actor, :class:`verl_server.FaithfulVerlServer`: verl's
  vLLM server rules over a scripted Sudoku player, no vLLM on CPU), so nothing syncs weights to it
  (``checkpoint_manager``: no replicas); the actor worker runs in this process instead of behind a
  ``RayWorkerGroup`` (whose GPU placement groups and NCCL set-up are what a GPU run adds), on
  verl_cpu_platform (verl has no CPU platform); ``_get_n_gpus_for_throughput`` reads 1.

It writes what it saw to OUT_JSON: the make-dataset output, every row of the step's batch (tags, tokens,
masks, rewards, turn ids, advantages, logprobs, env columns), the step's metrics and how much the
optimizer step moved the weights.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parents[1]) not in sys.path:  # tests/ (its helpers), where this file runs as a script
    sys.path.append(str(HERE.parents[1]))

from helpers.scripts import script_precision  # noqa: E402

#: The script's ``"$@"``: CPU sizes. 3 prompts x rollout.n 4 = 12 episodes; the actor's mini-batch of
#: 2 prompts x 4 = 8 rows makes verl pad the batch to 16.
CPU_OVERRIDES = [
    "actor_rollout_ref.model.tokenizer_path=$MODEL/tokenizer",  # the tiny model keeps gem_core's test tokenizer apart
    "data.train_batch_size=3",
    "data.dataloader_num_workers=0",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "trainer.n_gpus_per_node=1",
    "trainer.device=cpu",
    "trainer.logger=[console]",
    "transfer_queue.enable=True",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
]

ENV = {
    "VERL_PLATFORM": "cpu",  # verl_cpu_platform (imported below and by VERL_USE_EXTERNAL_MODULES in workers)
    "VERL_USE_EXTERNAL_MODULES": "verl_cpu_platform",
    "VERL_ENGINE_DEVICE": "cuda",  # verl registers its FSDP engine for cuda/npu: take it on the CPU
    "PYTHONHASHSEED": "0",
    "TOKENIZERS_PARALLELISM": "false",
}


def script_commands(script: str) -> tuple[list[list[str]], list[str]]:
    """The ``gem-core make-dataset`` argument lists and the ``main_ppo`` overrides of the example script,
    with ``$MODEL``/``$DATA`` left for the caller and a written experiment's precision variables (its
    ``# training.precision`` lines) set as they are here (tests/helpers/scripts.py: script_precision)."""
    text = script.replace("\\\n", " ")
    datasets = [shlex.split(line.split("gem-core", 1)[1]) for line in text.splitlines() if line.strip().startswith("gem-core make-dataset")]
    block = re.split(r"python\s+-m\s+verl\.trainer\.main_ppo", text, maxsplit=1)[1].split('"$@"', 1)[0]  # `python \` + `-m ...` too
    return datasets, substitute(shlex.split(block), **script_precision(script))  # the precision the script picks here


def substitute(args: list[str], **values: str) -> list[str]:
    """``$NAME``/``${NAME}`` in each argument replaced by ``values``."""

    def one(arg: str) -> str:
        return re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: values.get(m.group(1), m.group(0)), arg)

    return [one(arg) for arg in args]


def tiny_model(directory: Path) -> str:
    """A 1-layer Qwen2 with gem_core's test tokenizer (in tokenizer/), weights saved: what verl's
    engine loads as actor_rollout_ref.model.path."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from gem_core.testing import build_test_tokenizer, save_test_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    save_test_tokenizer(str(directory / "tokenizer"))
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(build_test_tokenizer()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        architectures=["Qwen2ForCausalLM"],
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(str(directory))
    return str(directory)


class NoReplicas:
    """verl's CheckpointEngineManager with no rollout replicas to sleep or sync (the CPU server stand-in
    keeps no weights)."""

    def sleep_replicas(self) -> None:
        return None

    def update_weights(self, global_steps: int | None = None) -> None:
        return None


class OneCpu:
    """The resource pool manager's GPU count for verl's throughput metrics."""

    def get_n_gpus(self) -> int:
        return 1


class InProcessActorGroup:
    """verl's actor worker group with one rank, in this process: ``compute_log_prob`` / ``update_actor``
    go to verl's ``ActorRolloutRefWorker`` through its own register/TransferQueue bridge, and
    ``_balance_batch`` reads one data-parallel rank."""

    def __init__(self, worker):
        self.worker = worker
        self._dispatch_info = {"actor": [0]}

    def compute_log_prob(self, batch):
        return self.worker.compute_log_prob(batch)

    def update_actor(self, batch):
        return self.worker.update_actor(batch)

    def compute_ref_log_prob(self, batch):  # a worker of role "ref": verl's Role.RefPolicy group
        return self.worker.compute_ref_log_prob(batch)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _jsonable(value):
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def main(example: str, workdir: str, out: str) -> None:
    os.environ.update(ENV)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    sys.path.insert(0, str(HERE))
    pythonpath = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    os.environ["PYTHONPATH"] = pythonpath
    import verl_cpu_platform  # noqa: F401  (registers the cpu platform before verl picks one)

    started = time.monotonic()
    report: dict = {"timing": {}}
    work = Path(workdir)
    data_dir = work / "data"
    model_dir = tiny_model(work / "model")

    # 1. the script's datasets, its commands as written
    from gem_core.cli import main as gem_core_main

    datasets, overrides = script_commands(Path(example).read_text())
    data_dir.mkdir(parents=True, exist_ok=True)  # the script's `mkdir -p "$DATA"`
    report["make_dataset"] = []
    for args in datasets:
        argv = substitute(args, DATA=str(data_dir), MODEL=model_dir)
        assert gem_core_main(argv) == 0, argv
        report["make_dataset"].append(argv)
    report["timing"]["datasets"] = time.monotonic() - started

    # 2. the script's overrides + the CPU "$@", composed as main_ppo's hydra would, and validated as it does
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    overrides = substitute(overrides + CPU_OVERRIDES, DATA=str(data_dir), MODEL=model_dir)
    report["overrides"] = overrides
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))

    # 3. what TaskRunnerV1.run does, with the CPU's pieces (see the module docstring)
    import ray
    import torch.distributed as dist
    import transfer_queue as tq

    ray.init(
        num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {**ENV, "PYTHONPATH": pythonpath, "TRANSFER_QUEUE_ENABLE": "1"}}
    )
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        config.transfer_queue.enable = True
        OmegaConf.resolve(config)
        tq.init(config.transfer_queue)
        report["timing"]["ray_tq"] = time.monotonic() - started
        _one_step(config, model_dir, report, started)
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()
            dist.destroy_process_group()
    report["timing"]["total"] = time.monotonic() - started
    Path(out).write_text(json.dumps(_jsonable(report)))


def _one_step(config, model_dir: str, report: dict, started: float) -> None:
    import ray
    import torch
    import transfer_queue as tq
    import verl.utils.transferqueue_utils as tq_utils
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ, get_trainer_cls
    from verl.utils.debug import marked_timer
    from verl.utils.skip import SkipManager
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    from gem_integrations.verl.plugin_spec import CONFIG_PATCH, INFRA_PATCH, TURN_IDS_PATCH
    from verl_server import FaithfulVerlServer, sudoku_respond

    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    report["patches_applied"] = [CONFIG_PATCH.applied, TURN_IDS_PATCH.applied, INFRA_PATCH.applied]
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer.resource_pool_manager = OneCpu()
    trainer.ref_in_actor = False
    trainer.teacher_model_manager = None
    trainer.distillation_config = None
    trainer.checkpoint_manager = NoReplicas()
    trainer.reward_loop_manager = RewardLoopManager(config=config)

    # the actor: verl's worker, role "actor", FSDP2 engine on the CPU; TQ is already up in this process
    tq_utils.TQ_INITIALIZED = True
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    trainer.actor_rollout_wg = InProcessActorGroup(worker)
    weights_before = {name: p.detach().clone() for name, p in worker.actor.engine.module.named_parameters()}
    report["timing"]["actor_init"] = time.monotonic() - started

    rollout = config.actor_rollout_ref.rollout
    server = ray.remote(num_cpus=0)(FaithfulVerlServer).remote(
        f"{model_dir}/tokenizer", prompt_length=rollout.prompt_length, response_length=rollout.response_length, respond=sudoku_respond
    )
    client = LLMServerClient(config, load_balancer_handle=get_router_handle(servers={"cpu-server-0": server}))
    trainer.agent_loop_manager = AgentLoopManagerTQ.create(
        config=config, llm_client=client, teacher_client=None, reward_loop_worker_handles=trainer.get_reward_handles()
    )

    # fit()'s set-up for its first step, then verl's own step and metrics
    SkipManager.init(config)
    trainer.global_steps = 1
    SkipManager.set_step(1)
    trainer.curr_step_profile = False
    metrics: dict = {}
    timing_raw: dict = {}
    with marked_timer("step", timing_raw):  # as fit() times it
        batch = trainer.step(metrics, timing_raw)
    report["timing"]["step"] = time.monotonic() - started
    trainer._compute_metrics(batch, metrics, timing_raw, global_steps=1, epoch=0)

    fields = [
        "prompts",
        "responses",
        "response_mask",
        "rm_scores",
        "gem_turn_ids",
        "gem_infra_error",
        "advantages",
        "old_log_probs",
        "rollout_log_probs",
        "env_id",
        "env_seed",
        "uid",
    ]
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    rows = []
    for i, (key, tag) in enumerate(zip(batch.keys, batch.tags)):
        row = {"key": key, "is_padding": bool(tag.get("is_padding", False))}
        for name in fields:
            value = data[name][i]
            row[name] = value.tolist() if isinstance(value, torch.Tensor) else value
        rows.append(row)
    weights_after = dict(worker.actor.engine.module.named_parameters())
    report["rows"] = rows
    report["metrics"] = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) or getattr(v, "ndim", 1) == 0}
    report["weight_change"] = max(float((weights_after[n].detach() - w).abs().max()) for n, w in weights_before.items())
    report["train_dataset_size"] = len(trainer.train_dataset)
    report["val_dataset_size"] = len(trainer.val_dataset)
    report["config"] = {
        "n": int(rollout.n),
        "train_batch_size": int(config.data.train_batch_size),
        "ppo_mini_batch_size": int(config.actor_rollout_ref.actor.ppo_mini_batch_size),
        "response_length": int(rollout.response_length),
        "prompt_length": int(rollout.prompt_length),
    }


if __name__ == "__main__":
    main(*sys.argv[1:4])
