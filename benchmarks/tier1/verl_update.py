"""verl 0.9.1 in the Tier 1 check: the recorded batch and weights through verl's own v1 trainer step, its
``ActorRolloutRefWorker`` and its FSDP engine (losses, optimizer, scheduler), on CPU.

The configuration is the plugin's mapping of the experiment (``gem_integrations.verl.experiment.overrides``: what
``gem-core experiment FILE --trainer verl`` writes) composed by hydra into verl's ``ppo_trainer`` config, with ``$MODEL``
the actor's checkpoint and the precision's variables float32's, then :data:`CPU_OVERRIDES`; verl's ``validate_config``
checks it as ``main_ppo`` does. Everything below reads it from there. What runs is verl's:

* each recorded episode as the plugin's ``gem_env`` loop returns it (``GemEnvAgentLoop.to_output``: the sequence view,
  each turn's reward in ``rm_scores``, the turn ids, the infra flag), put into TransferQueue by verl's own
  ``AgentLoopWorkerTQ._agent_loop_postprocess`` (its fields, position ids and tags, under verl's keys
  ``{uid}_{session_id}_0``: a uid per group of ``rollout.n``);
* the v1 trainer of ``trainer.v1.trainer_mode`` (``PPOTrainerSync``, built by its own constructor, the plugin's start-up
  check in it) for one step from the sampled batch on: ``_balance_batch``, ``_compute_old_log_prob`` (the actor worker's
  forward: the old log-probs), ``_compute_ref_log_prob`` (the reference worker's), ``_compute_advantage`` as the plugin
  patches it (turn ids and infra flags read from TransferQueue, the failed row kept out of verl's
  ``compute_advantage_for_multi_trajectories``, which calls the plugin's ``rebn`` from verl's estimator registry), and
  ``_update_actor``;
* the workers: verl's ``ActorRolloutRefWorker`` as role ``actor`` and as role ``ref``, each by its own ``init_model``
  (a ``TrainingWorker`` over ``FSDPEngine``: the HF model loaded in ``model_dtype`` fp32 under FSDP's mixed precision,
  ``build_optimizer``'s ``torch.optim.AdamW``, ``get_constant_schedule_with_warmup``); ``update_actor`` runs
  ``train_mini_batch`` (``make_iterator``: mini-batches of ``ppo_mini_batch_size x rollout.n`` rows, ``ppo_epochs``
  passes, no shuffle) and, per mini-batch, ``train_batch``: ``forward_backward_batch`` (micro-batches of
  ``ppo_micro_batch_size_per_gpu`` rows, the mini-batch's token count as ``batch_num_tokens``, ``ppo_loss``:
  ``compute_policy_loss_vanilla``, ``agg_loss``, ``kl_penalty`` times ``kl_loss_coef``, each backward), then
  ``optimizer_step`` (``fsdp2_clip_grad_norm_`` to ``optim.clip_grad``, AdamW's step) and, after the update's last
  mini-batch, ``lr_scheduler_step``.

Replaced, and why (nothing of the update's maths):

* **Ray and TransferQueue**: verl's workers run in Ray actors and TransferQueue's controller and storage units are Ray
  actors. The check runs in this process: :class:`InProcessTransferQueue` answers ``kv_batch_put``,
  ``async_kv_batch_put`` and ``kv_batch_get`` (each field kept per sample, as the storage units keep it, and packed back
  by TransferQueue's own ``_pack_field_values``: nested jagged tensors, ``NonTensorStack``), and :class:`LocalWorkerGroup`
  calls the worker's own methods where a ``RayWorkerGroup`` would, turning the ``KVBatchMeta`` into the worker's
  ``TensorDict`` and its output back as verl's ``tqbridge`` does. Not run: generation (the recorded episodes), the reward
  loop (the loop's own rewards), ``ReplayBuffer.sample`` (the batch is the recorded episodes in order), weight sync.
* **the platform**: verl has no CPU platform: ``tests/integrations/verl/verl_cpu_platform.py`` answers its device calls
  (devices ``cpu``, collectives gloo, no memory statistics), ``VERL_ENGINE_DEVICE=cuda`` takes verl's FSDP engine from
  its registry's CUDA entry, and ``torch.distributed`` is a one-process gloo group (``tier1.cpu``).
* **FSDP2 for FSDP1** (:data:`CPU_OVERRIDES`): verl's default ``strategy=fsdp`` wraps with ``sync_module_states=True``,
  which refuses CPU parameters; on one rank FSDP2 (verl's ``fsdp2``) holds every parameter whole and computes the same.
  The reference worker's FSDP2 ``CPUOffloadPolicy(pin_memory=True)``: pinned memory needs an accelerator, so it is made
  with ``pin_memory=False`` (its parameters are on the CPU either way).
* **precision**: the mapping's float32 variables (``PRECISION["float32"]``: fp32 under FSDP's mixed precision, sdpa
  attention) whatever the file's ``training.precision``: bf16's rounding is far above the check's 1e-3.
* **the checkpoints**: verl loads the actor and the reference model from ``actor_rollout_ref.model.path``; the check
  gives the reference worker ``ref/`` (a run whose actor has moved from its start, so that the KL has a gradient), and
  the tokenizer from a folder of its own (``verl-tokenizer/``; beside a Qwen2 ``config.json`` transformers 5 would read
  it as a ``Qwen2Tokenizer``).

Observed, not changed: the advantages ``_compute_advantage`` stores, the rows of each ``train_batch`` call (by their
``uid`` and ``session_id``), its loss, the plugin's ``gem/*`` metrics of the step and the scheduler's step count.

verl's declared semantics (:func:`semantics`), each a documented difference from gem-core train's:

* old log-probs: recomputed by the actor at the update's start (``_compute_old_log_prob``; the rollout's are used only
  by ``algorithm.rollout_correction``, whose defaults add no weight);
* ``token-mean``: each optimizer step's token sum over the step's model tokens (``batch_num_tokens``);
  ``seq-mean-*``: over ``global_batch_size`` = ``ppo_mini_batch_size x rollout.n``, every row of the mini-batch, the
  infra-failed row (no model token) counted (as TRL; OpenRLHF and ROLL count the rows with a model token);
* the KL: ``low_var_kl`` (k3; verl clamps the log-ratio to [-20, 20] and the KL to [-10, 10], not reached here)
  reduced by the loss's own aggregation, times ``kl_loss_coef``, in the loss; none in the reward;
* the advantages are float32 (the plugin computes ReBN in float64 and casts to ``rm_scores``' dtype);
* AdamW with weight decay on every parameter (no exclusion of biases and norm weights); the scheduler steps once an
  update, after its last mini-batch: every optimizer step of an update has the same rate, and a warm-up gives the first
  update the rate 0 (:func:`semantics` refuses ``warmup_updates`` > 0: there would be nothing to compare).

Found by this check and fixed: the plugin mapped ``optimizer.warmup_updates`` to ``optim.lr_warmup_steps`` =
``warmup_updates x optimizer_steps_per_update``, but verl's scheduler counts updates (above), so with several
optimizer steps an update verl's warm-up lasted that many times the experiment's; it writes ``warmup_updates`` now
(``tests/integrations/verl/test_same_update.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import os
import socket
import sys
from pathlib import Path
from typing import Any

from gem_core.experiment import Experiment
from tier1.reference import Semantics, Update, experiment_semantics

TRAINER = "verl"
ROOT = Path(__file__).resolve().parents[2]
PLATFORM = ROOT / "tests" / "integrations" / "verl"  # verl_cpu_platform.py: verl's platform interface on the CPU
#: What a user passes through the script's ``"$@"`` on this machine (sizes and devices, no semantics).
CPU_OVERRIDES = [
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.actor.strategy=fsdp2",  # FSDP1 (verl's default) refuses CPU parameters (sync_module_states)
    "actor_rollout_ref.ref.strategy=fsdp2",
]
PARTITION = "train"


def semantics(experiment: Experiment) -> Semantics:
    """The update verl declares for ``experiment``: the experiment's values (not the plugin's mapping of them, which
    is what is checked) under verl's rules (see the module docstring)."""
    if experiment.warmup_updates:
        raise ValueError(
            "tier1 for verl: warmup_updates > 0: verl steps its scheduler once an update, so the first update runs "
            "at lr 0 whatever the warm-up's length (nothing to compare)"
        )
    return experiment_semantics(
        TRAINER,
        experiment,
        advantage_dtype="float32",
        token_mean_over="step",
        seq_rows="all",
        kl_aggregation="",
        old_logprobs="start",
        no_decay_bias_and_norm=False,
        warmup="hf",
    )


def composed_config(experiment: Experiment, work: Path, overrides: dict[str, Any] | None = None) -> Any:
    """verl's ``ppo_trainer`` config composed by hydra from the plugin's overrides for ``experiment``
    (``gem_integrations.verl.experiment.overrides``: what ``gem-core experiment FILE --trainer verl`` writes), ``$MODEL``
    the actor's checkpoint, the precision's variables float32's (see the module docstring), then :data:`CPU_OVERRIDES`
    and the tokenizer's folder; validated by verl's ``validate_config`` as ``main_ppo`` validates it. ``overrides``:
    config keys set over the mapping."""
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from gem_integrations.verl.experiment import PRECISION
    from gem_integrations.verl.experiment import overrides as mapped

    values = {"MODEL": str(work / "actor"), "DATA": str(work), **PRECISION["float32"]}
    argv = []
    for override in mapped(experiment):
        for name, value in values.items():
            override = override.replace(f"${name}", value)
        argv.append(override)
    argv += [*CPU_OVERRIDES, f"actor_rollout_ref.model.tokenizer_path={_tokenizer_dir(work)}"]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose("ppo_trainer", overrides=argv)
    for key, value in (overrides or {}).items():
        OmegaConf.update(config, key, value, force_add=True)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return config


def _tokenizer_dir(work: Path) -> Path:
    """The test tokenizer in a folder of its own (beside a Qwen2 ``config.json``, transformers 5 would load it as a
    ``Qwen2Tokenizer``, another pre-tokenisation), saved by this Python."""
    from gem_core.testing import save_test_tokenizer
    from tier1.batch import TEMPLATE

    out = work / "verl-tokenizer"
    if not (out / "tokenizer.json").exists():
        save_test_tokenizer(str(out), TEMPLATE)
    return out


def run(work: str | Path, experiment: Experiment, fault: str | None = None, overrides: dict[str, Any] | None = None) -> Update:
    """One update of verl on the recorded batch in ``work``; ``fault`` injects one mistake on verl's side, in its
    composed config (``lr``: twice the rate; ``kl``: ``kl_loss_coef`` 0; ``clip``: half the clip ratios;
    ``aggregation``: the other ``loss_agg_mode``; ``infra``: the failed episode's flag dropped, so its row counts);
    ``overrides``: verl config keys set over the plugin's mapping (tests: what a default the mapping pins would do)."""
    from omegaconf import open_dict

    from gem_integrations.verl.plugin_spec import PLUGIN
    from tier1.batch import INFRA_EPISODE, load, tokenizer

    work = Path(work)
    recorded = load(work)
    trajectories = list(recorded.trajectories)
    if fault == "infra":
        trajectories[INFRA_EPISODE] = dataclasses.replace(trajectories[INFRA_EPISODE], infra_error=None)
    config = composed_config(experiment, work, overrides)
    actor_config = config.actor_rollout_ref.actor
    with open_dict(config):
        if fault == "lr":
            actor_config.optim.lr *= 2
        elif fault == "kl":
            actor_config.kl_loss_coef = 0.0
        elif fault == "clip":
            actor_config.clip_ratio_low /= 2
            actor_config.clip_ratio_high /= 2
        elif fault == "aggregation":
            actor_config.loss_agg_mode = "seq-mean-token-mean" if actor_config.loss_agg_mode == "token-mean" else "token-mean"
        elif fault not in (None, "infra"):
            raise ValueError(f"unknown fault {fault!r}")
    tok = tokenizer()
    installed = PLUGIN.is_installed
    PLUGIN.install()  # what verl's entry point does in its driver (the trainer patches once verl's trainer module loads)
    try:
        with _on_cpu(), InProcessTransferQueue().installed() as store:
            return _step(work, config, trajectories, experiment, tok, store)
    finally:
        if not installed:
            PLUGIN.uninstall()


def _step(work: Path, config: Any, trajectories: list[Any], experiment: Experiment, tok: Any, store: InProcessTransferQueue) -> Update:
    """The rollout's rows into TransferQueue, verl's workers, then the trainer's step from its batch on (see the
    module docstring)."""
    import numpy as np

    from gem_core.batch import sequence_batch

    batch, row_of = _rollout(trajectories, experiment, tok, store)
    batch.extra_info["temperature"] = config.actor_rollout_ref.rollout.temperature  # as _step_once sets it
    actor, ref = _workers(config, work)
    engine = actor.actor.engine
    start = {name: _full(p).detach().clone() for name, p in engine.module.named_parameters()}
    seen: dict[str, Any] = {"steps": [], "losses": []}
    real_train_batch = actor.actor.train_batch

    def train_batch(data: Any) -> Any:
        """``TrainingWorker.train_batch`` (one optimizer step), the rows of its mini-batch read as they pass."""
        seen["steps"].append([row_of[(str(u), int(s))] for u, s in zip(_values(data, "uid"), _values(data, "session_id"))])
        output = real_train_batch(data)
        seen["losses"].append(float(output["metrics"]["loss"]))
        return output

    actor.actor.train_batch = train_batch
    trainer = _trainer(config, tok, LocalWorkerGroup(actor, store), LocalWorkerGroup(ref, store))
    metrics: dict[str, Any] = {}
    batch = trainer._balance_batch(batch, metrics=metrics)
    batch = trainer._compute_old_log_prob(batch, metrics=metrics)
    batch = trainer._compute_ref_log_prob(batch, metrics=metrics)
    batch = trainer._compute_advantage(batch, metrics=metrics)
    keys = sorted(row_of, key=row_of.get)
    stored = store.kv_batch_get(keys=[_key(*k) for k in keys], partition_id=PARTITION, select_fields=["advantages", "responses"])
    trainer._update_actor(batch, metrics=metrics)
    deltas = {name: (_full(p).detach() - start[name]).double().numpy() for name, p in engine.module.named_parameters()}
    recorded = sequence_batch(trajectories, pad_id=tok.pad_token_id)  # the reference's completion layout
    advantages = np.zeros(recorded.response_ids.shape, dtype=np.float64)
    for i, (values, responses) in enumerate(zip(stored["advantages"].unbind(0), stored["responses"].unbind(0))):
        if responses.tolist() != recorded.response_ids[i, : recorded.lengths[i]].tolist():
            raise ValueError(f"row {i}: verl's response is not the recorded episode's")
        advantages[i, : values.numel()] = values.double().numpy()  # each row's advantages on its response tokens
    step_info = {key: float(value) for key, value in metrics.items() if key.startswith("gem/")}  # the plugin's counts
    step_info["scheduler_steps"] = float(engine.lr_scheduler.last_epoch)
    stats = [{"loss": loss, **step_info} for loss in seen["losses"]]
    return Update(advantages, deltas, seen["steps"], str(stored["advantages"].dtype).replace("torch.", ""), stats)


def _key(uid: str, session: int) -> str:
    """The TransferQueue key verl's agent loop gives an episode: ``{uid}_{session_id}_{output index}``."""
    return f"{uid}_{session}_0"


def _rollout(trajectories: list[Any], experiment: Experiment, tok: Any, store: InProcessTransferQueue) -> tuple[Any, dict[tuple[str, int], int]]:
    """Each recorded episode as the ``gem_env`` loop returns it (``GemEnvAgentLoop.to_output``), put into TransferQueue
    by verl's own ``AgentLoopWorkerTQ._agent_loop_postprocess`` (its fields, position ids and tags) under the keys verl
    gives it (a prompt's ``uid`` per group, a ``session_id`` per member); the batch ``ReplayBuffer.sample`` would hand
    the step (the recorded order) and the recorded row of each (uid, session_id)."""
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from gem_core.tasks import TaskSpec
    from gem_integrations.verl.rollout import GemEnvAgentLoop

    loop = GemEnvAgentLoop.__new__(GemEnvAgentLoop)  # to_output reads the tokenizer (an episode with no turn) alone
    loop.tokenizer, loop.gem_mm_processor_kwargs = tok, {}
    worker_cls = AgentLoopWorkerTQ.__ray_metadata__.modified_class  # the Ray actor's own class
    worker = worker_cls.__new__(worker_cls)  # no reward workers (the loop scores), no processor, no teacher
    worker.processor, worker.reward_loop_worker_handles, worker.distillation_enabled = None, None, False
    size = experiment.group_size
    row_of: dict[tuple[str, int], int] = {}

    async def put_all() -> None:
        for i, trajectory in enumerate(trajectories):
            uid, session = f"tier1g{i // size}", i % size
            row_of[(uid, session)] = i
            columns = {**TaskSpec(trajectory.env_id, seed=trajectory.seed).to_columns(), "index": i // size}
            await worker._agent_loop_postprocess(loop.to_output(trajectory), False, uid=uid, session_id=session, global_steps=1, **columns)

    asyncio.run(put_all())
    keys = [_key(*pair) for pair in sorted(row_of, key=row_of.get)]
    batch = KVBatchMeta(keys=keys, tags=store.tags_of(keys, PARTITION), partition_id=PARTITION)
    return batch, row_of


def _workers(config: Any, work: Path) -> tuple[Any, Any]:
    """verl's ``ActorRolloutRefWorker`` as role ``actor`` (the actor's checkpoint) and as role ``ref`` (the reference
    model's, see the module docstring), each built by its own ``init_model``."""
    from omegaconf import open_dict
    from verl.workers.engine_workers import ActorRolloutRefWorker

    actor = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    actor.init_model()
    ref_config = copy.deepcopy(config.actor_rollout_ref)
    with open_dict(ref_config):
        ref_config.model.path = str(work / "ref")
    ref = ActorRolloutRefWorker(ref_config, role="ref")
    ref.init_model()
    return actor, ref


def _trainer(config: Any, tok: Any, actor: LocalWorkerGroup, ref: LocalWorkerGroup) -> Any:
    """verl's v1 trainer of the config's ``trainer_mode`` (its constructor: the plugin's start-up check runs), with the
    worker groups, tokenizer and step counter ``PPOTrainer._setup`` and ``fit`` would give it for its first step."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    trainer.tokenizer = tok
    trainer.actor_rollout_wg, trainer.ref_policy_wg = actor, ref
    trainer.ref_in_actor = False  # no LoRA: the reference model is its own worker group
    trainer.distillation_config = None
    trainer.global_steps = 1
    return trainer


class InProcessTransferQueue:
    """STAND-IN for TransferQueue's key-value store (its controller and storage units are Ray actors; see the module
    docstring): ``kv_batch_put`` splits each field per sample as the storage units keep it, ``kv_batch_get`` packs the
    samples back with TransferQueue's own ``AsyncSimpleStorageManager._pack_field_values`` (nested jagged tensors, dense
    scalars, ``NonTensorStack``), the fields present in every key in their order, tags merged as ``update_custom_meta``."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}
        self.tags: dict[tuple[str, str], dict[str, Any]] = {}

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: list[dict] | None = None, data_parser: Any = None) -> Any:
        import torch
        from transfer_queue import KVBatchMeta

        if fields is None and tags is None:
            raise ValueError("Please provide at least one parameter of `fields` or `tags`.")
        if data_parser is not None:
            raise NotImplementedError("tier1's TransferQueue stand-in takes no data_parser")
        for key in keys:
            self.rows.setdefault((partition_id, key), {})
            self.tags.setdefault((partition_id, key), {})
        if fields is not None:
            if fields.batch_size[0] != len(keys):
                raise ValueError(f"{len(keys)} keys for a TensorDict of batch size {fields.batch_size[0]}")
            for name in fields.keys():
                values = fields[name]
                samples = list(values.unbind(0)) if isinstance(values, torch.Tensor) else list(values)
                for key, sample in zip(keys, samples, strict=True):
                    copied = sample.detach().clone() if isinstance(sample, torch.Tensor) else copy.deepcopy(sample)
                    self.rows[(partition_id, key)][name] = copied  # a copy, as TransferQueue's serialisation makes
        for key, tag in zip(keys, tags or [{} for _ in keys], strict=True):
            self.tags[(partition_id, key)].update(tag)
        names = [name for name in self.rows[(partition_id, keys[0])] if all(name in self.rows[(partition_id, k)] for k in keys)]
        return KVBatchMeta(keys=list(keys), tags=self.tags_of(keys, partition_id), partition_id=partition_id, fields=names)

    async def async_kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: list[dict] | None = None, data_parser: Any = None) -> Any:
        return self.kv_batch_put(keys, partition_id, fields, tags, data_parser)

    def kv_batch_get(self, keys: list[str] | str, partition_id: str, select_fields: list[str] | str | None = None) -> Any:
        from tensordict import TensorDict
        from transfer_queue.storage.managers.simple_storage_manager import AsyncSimpleStorageManager

        keys = [keys] if isinstance(keys, str) else list(keys)
        if not keys or any((partition_id, key) not in self.rows for key in keys):
            raise ValueError("keys or partition were not found!")
        rows = [self.rows[(partition_id, key)] for key in keys]
        known = list(dict.fromkeys(name for row in rows for name in row))
        wanted = known if select_fields is None else [select_fields] if isinstance(select_fields, str) else list(select_fields)
        names = [name for name in wanted if name in known]  # BatchMeta.select_fields keeps the fields it knows
        if any(name not in row for name in names for row in rows):
            raise ValueError("Some fields are not ready in all the requested keys!")
        data = {name: AsyncSimpleStorageManager._pack_field_values([copy.copy(row[name]) for row in rows]) for name in names}
        return TensorDict(data, batch_size=len(keys))

    def tags_of(self, keys: list[str], partition_id: str) -> list[dict[str, Any]]:
        return [dict(self.tags[(partition_id, key)]) for key in keys]

    @contextlib.contextmanager
    def installed(self) -> Any:
        """This store as ``transfer_queue``'s key-value functions while the block runs (put back afterwards)."""
        import transfer_queue

        names = ("kv_batch_put", "async_kv_batch_put", "kv_batch_get")
        saved = {name: getattr(transfer_queue, name) for name in names}
        for name in names:
            setattr(transfer_queue, name, getattr(self, name))
        try:
            yield self
        finally:
            for name, value in saved.items():
                setattr(transfer_queue, name, value)


class LocalWorkerGroup:
    """A verl worker group of one rank in this process: the trainer's calls (``compute_log_prob``,
    ``compute_ref_log_prob``, ``update_actor``) answered by the worker's own methods, its ``KVBatchMeta`` turned into
    the worker's ``TensorDict`` and the output written back as verl's ``tqbridge`` does (see the module docstring)."""

    def __init__(self, worker: Any, store: InProcessTransferQueue):
        self.worker = worker
        self.store = store
        self._dispatch_info = {"actor": [0]}  # _balance_batch: one data-parallel rank

    def _bridged(self, method: Any, batch: Any) -> Any:
        import torch
        from tensordict import NonTensorData, NonTensorStack
        from verl.utils import tensordict_utils as tu

        data = self.store.kv_batch_get(batch.keys, batch.partition_id, batch.fields)
        for key, value in copy.deepcopy(batch.extra_info or {}).items():  # tqbridge's _async_meta_to_realdata
            if isinstance(value, (NonTensorData, NonTensorStack)):
                data[key] = value
            else:
                tu.assign_non_tensor_data(tensor_dict=data, key=key, val=value)
        output = method(data)
        if not (hasattr(output, "batch_size") and output.batch_size):
            return output
        fields, extra = [], {}
        for key, value in output.items():  # tqbridge's _async_update_meta_with_output
            if isinstance(value, (torch.Tensor, NonTensorStack)):
                fields.append(key)
            elif isinstance(value, NonTensorData):
                extra[key] = value.data
            else:
                raise ValueError(f"Unsupported type {type(value)} for key {key} in output TensorDict.")
        updated = self.store.kv_batch_put(batch.keys, batch.partition_id, output.select(*fields))
        updated.tags, updated.extra_info = batch.tags, extra
        return updated

    def compute_log_prob(self, batch: Any) -> Any:
        return self._bridged(self.worker.compute_log_prob, batch)

    def compute_ref_log_prob(self, batch: Any) -> Any:
        return self._bridged(self.worker.compute_ref_log_prob, batch)

    def update_actor(self, batch: Any) -> Any:
        return self._bridged(self.worker.update_actor, batch)


@contextlib.contextmanager
def _on_cpu() -> Any:
    """verl on this process's CPU (see the module docstring): rank 0 of a one-process job in the environment verl's
    ``Worker`` reads, a one-process gloo group, verl's platform the CPU one (``verl_cpu_platform``) and its FSDP engine
    taken from the CUDA entry of its registry (``VERL_ENGINE_DEVICE``); all put back afterwards."""
    from verl.plugin.platform import platform_manager
    from verl.workers.engine.fsdp import transformer_impl

    if str(PLATFORM) not in sys.path:
        sys.path.insert(0, str(PLATFORM))
    from verl_cpu_platform import PlatformCPU

    from tier1.cpu import one_process_group

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    env["VERL_ENGINE_DEVICE"] = "cuda"
    saved_env = {key: os.environ.get(key) for key in env}
    saved_platform = platform_manager._current_platform
    policy = transformer_impl.CPUOffloadPolicy
    os.environ.update(env)
    platform_manager._current_platform = PlatformCPU()
    transformer_impl.CPUOffloadPolicy = functools.partial(_unpinned, policy)
    try:
        with one_process_group():
            yield
    finally:
        transformer_impl.CPUOffloadPolicy = policy
        platform_manager._current_platform = saved_platform
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _unpinned(policy: type, pin_memory: bool = True) -> Any:
    """FSDP2's ``CPUOffloadPolicy`` (the reference model's: parameters kept on the CPU) without pinned memory, which
    needs an accelerator (see the module docstring)."""
    return policy(pin_memory=False)


def _values(data: Any, key: str) -> list[Any]:
    """A non-tensor column of a TensorDict, as a list."""
    value = data.get(key)
    return list(value.tolist() if hasattr(value, "tolist") else value)


def _full(parameter: Any) -> Any:
    """A parameter's whole value (FSDP2 holds DTensors)."""
    return parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter
