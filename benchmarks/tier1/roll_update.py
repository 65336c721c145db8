"""ROLL (alibaba/ROLL 8eb27cc, from its source) in the Tier 1 check: the recorded batch and weights through ROLL's own
agentic pipeline step, its workers' log-prob, loss and optimizer code and its FSDP2 strategy, on CPU.

The configuration is the plugin's mapping of the experiment (``gem_integrations.roll.experiment.render``) composed by
Hydra and built into ROLL's ``AgenticConfig`` by dacite, as ROLL's ``examples/start_agentic_pipeline.py`` does;
everything below reads it from there. What runs is ROLL's:

* each recorded episode as ROLL's rollout of it: the ``env_manager_cls`` the config names (ROLL's
  ``StepConcatEnvManager``) turns the episode's turns into per-turn samples with its own ``formulate_rollouts``
  (each turn's context then its response, padded to ``sequence_length``; the env's step metrics as the plugin's
  ``GemCoreEnv`` reports them, ``infra_error`` 1 on the flagged episode's last turn), with the trajectory ids
  ``run_rollout_loop`` gives them; the ``group_filter_cls`` the config names (the plugin's
  ``InfraErrorGroupFilter``) asked of every group as ROLL's ``GroupQueue.put`` does, and the groups it keeps
  concatenated as the rollout scheduler's ``get_batch`` does;
* ``AgenticPipeline.run`` of the ``pipeline_cls`` the config names (the plugin's, ROLL's with a ``delete`` that
  runs) for one global step: ``compute_discounted_returns`` (``step_reinforce``'s per-turn returns),
  ``adjust_batch`` (the remainder of ``turns_per_step`` dropped at random), the reference log-probs
  (``compute_ref_log_probs_with_routing`` to the reference worker), the old log-probs (the actor worker's
  ``compute_log_probs``: the actor at the update's start), ``compute_response_level_rewards``,
  ``compute_token_reward``, ``agentic_compute_advantage``, ``apply_train_infer_correction_to_batch``,
  ``batch_balance``, then the actor worker's ``train_step``;
* the workers, built by their own constructors and ``initialize``: the reference is ROLL's
  ``base_worker.ActorWorker`` with the ``hf_infer`` strategy; the actor is ROLL's agentic ``ActorWorker`` with
  ``FSDP2TrainStrategy`` (``fsdp2_train``: the model wrapped by ``fully_shard`` over a one-process gloo group, its
  ``torch.optim.AdamW``, the HF ``get_scheduler``); ``train_step`` shuffles the batch (``make_iterator``, seeded)
  into steps of ``per_device_train_batch_size x gradient_accumulation_steps`` samples, and the strategy's
  ``train_step`` runs each micro-batch's forward, the agentic ``loss_func`` (clipped ratio, ``agg_loss`` over the
  step's tokens or samples, the k3 KL to the reference times ``kl_loss_coef``), ``loss_scale`` and
  ``1 / gradient_accumulation_steps``, the backward, ``clip_grad_norm_`` to ``max_grad_norm``, the optimizer step
  and the scheduler step.

Replaced, and why (nothing of the update's maths):

* **the GPU cluster around the workers**: ROLL runs each worker in a Ray actor on its GPUs; here each runs in this
  process (``LocalCluster``: the calls ``AgenticPipeline.run`` makes of a ``Cluster``, answered by the worker's own
  methods in the worker's grad mode, on, as in its own process (``run`` is ``torch.no_grad()``), results handed back
  through ``ray.put`` as Ray would). ROLL's ``SharedStorage`` actor (its model-path cache) needs a Ray instance: a
  local one (one CPU) is started when none is, and this driver creates and holds the actor as ROLL's driver does.
  The inference engine, its weight sync (``model_update``), the rollout scheduler (its ``get_batch`` answers the
  recorded batch), the checkpoint and the tracker are stand-ins that do nothing else; the strategies'
  ``load_states``/``offload_states`` (the moves to and from the GPU) leave the states where they are (ROLL's
  ``load_hf_model`` would build the device string ``cpu:cpu`` from the reference's CPU device map).
* **ROLL's CPU platform**: ``roll.platforms.CpuPlatform`` forwards memory bookkeeping to ``torch.cpu``, which has no
  ``empty_cache``, ``memory_allocated``, ``reset_peak_memory_stats``... (the worker decorators and
  ``state_offload_manger`` call them): they answer 0 while the check runs.
* **trl**: ROLL's ``offload_states`` imports ``trl.AutoModelForCausalLMWithValueHead`` for an ``isinstance`` test
  (no value-head model here); where trl is not installed (ROLL's light dependencies hold none) an import stub for
  that one class stands in.
* **precision**: the check runs the experiment with ``training.precision = "float32"`` (the plugin's float32
  mapping: FSDP2's ``param_dtype`` fp32, the reference in fp32, sdpa attention); bf16 (turn_steps.toml's) computes
  the forward and backward in bfloat16, whose rounding is far above the check's 1e-3.
* **the checkpoints**: the actor worker loads ``actor/`` and the reference worker ``ref/`` (ROLL loads both from
  ``pretrain``): a run whose actor has moved from the checkpoint it started from, so that the KL has a gradient. Each
  is copied with the test tokenizer saved by ROLL's Python (``roll-actor/``, ``roll-ref/``): the command's own Python
  may save it with transformers 5, whose tokenizer class ROLL's transformers 4 does not have.

Observed, not changed: the batch ``train_step`` is handed (its advantages), the rows of each optimizer step (the
``sample_uuid`` of every row of every ``strategy.train_step`` call) and ROLL's ``actor/total_loss@sum`` per step.

ROLL's declared semantics (:func:`semantics`), each a documented difference from gem-core train's:

* rows: a row per turn (``view = "turn"``: the turn's context, then its response); an optimizer step per
  ``turns_per_step`` turn samples, the update's turns shuffled each epoch and their remainder (turns mod
  ``turns_per_step``) dropped at random before the advantages (the reference follows the rows ROLL chose; the
  dropped rows have no advantage: NaN in :attr:`Update.advantages`, not compared);
* the estimator: ``reinforce`` (``A_t = G_t``), ROLL's ``step_reinforce`` with identity normalisation, the returns
  computed in float32 (``compute_discounted_returns``): the advantages are float32;
* old log-probs: recomputed by the actor at the update's start (``step_reinforce`` forces
  ``enable_old_logprobs_recompute``), the same for every epoch; the rollout's are not used;
* ``token-mean``: each step's token sum over the step's model tokens; ``seq-mean-*``: over the step's samples that
  have a model token (an infra-failed episode never reaches the batch: the plugin's group filter drops its group);
* the KL: k3 in the loss, reduced by the loss's own aggregation (ROLL clamps it to [-10, 10]; not reached here);
* AdamW on every parameter with the experiment's weight decay (no groups), torch's eps; a constant rate.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import os
import random
import shutil
import sys
import types
from pathlib import Path
from typing import Any

from gem_core.experiment import Experiment
from tier1.reference import Semantics, Update, experiment_semantics

TRAINER = "roll"
ROOT = Path(__file__).resolve().parents[2]
#: ROLL's source at the pinned commit, beside every checkout (noxfile.py's ROLL_SHARED_SRC); ROLL_SRC wins.
ROLL_SHARED_SRC = ROOT.parent / "shared" / "third_party" / "ROLL"
#: The precision the check runs (see the module docstring).
PRECISION = "float32"
#: torch.cpu lacks these memory calls that ROLL's workers make through its platform object: 0 while the check runs.
CPU_MEMORY_CALLS = (
    "empty_cache",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_memory_stats",
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "max_memory_reserved",
    "device_memory_used",
)


def semantics(experiment: Experiment) -> Semantics:
    """The update ROLL declares for ``experiment``: the experiment's values (not the plugin's mapping of them, which
    is what is checked) under ROLL's rules (see the module docstring)."""
    return experiment_semantics(
        TRAINER,
        experiment,
        advantage_dtype="float32",
        token_mean_over="step",
        seq_rows="healthy",
        old_logprobs="start",
        no_decay_bias_and_norm=False,
        warmup="hf",
    )


def roll_source() -> Path:
    """ROLL's checkout: ``ROLL_SRC``, else :data:`ROLL_SHARED_SRC`; a clear error when it is not one."""
    source = Path(os.environ.get("ROLL_SRC") or ROLL_SHARED_SRC).resolve()
    if not (source / "roll" / "pipeline" / "agentic").is_dir():
        raise FileNotFoundError(f"no ROLL checkout (roll/pipeline/agentic) at {source}: set ROLL_SRC=path/to/ROLL")
    return source


def importable() -> bool:
    """Whether ROLL's agentic pipeline imports here (its source found and its light dependencies installed)."""
    try:
        source = str(roll_source())
    except FileNotFoundError:
        return False
    if source not in sys.path:
        sys.path.insert(0, source)
    return importlib.util.find_spec("roll") is not None and importlib.util.find_spec("ray") is not None


def roll_config(experiment: Experiment, work: Path) -> Any:
    """ROLL's ``AgenticConfig`` of the plugin's YAML for ``experiment`` (Hydra compose, dacite, ``set_max_steps``), as
    ``examples/start_agentic_pipeline.py`` and ``AgenticPipeline.__init__`` build it; logs and outputs under ``work``."""
    import dacite
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from roll.pipeline.agentic.agentic_config import AgenticConfig

    from gem_integrations.roll.experiment import render

    folder = work / "roll-config"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gem_core_experiment.yaml").write_text(render(experiment, source=str(work / "experiment.toml")))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        composed = compose(config_name="gem_core_experiment")
    data = OmegaConf.to_container(composed, resolve=True)
    data["logging_dir"], data["output_dir"] = str(work / "roll-logs"), str(work / "roll-output")
    saved = random.getstate()
    try:
        config = dacite.from_dict(data_class=AgenticConfig, data=data)
    finally:
        random.setstate(saved)
    config.set_max_steps(max_steps=config.max_steps)
    config.pipeline_cls = composed.get("pipeline_cls")
    return config


def inject(config: Any, fault: str | None) -> None:
    """One mistake on ROLL's side (:data:`tier1.reference.FAULTS`; ``infra`` is injected in the batch)."""
    if fault == "lr":
        config.actor_train.training_args.learning_rate *= 2
    elif fault == "kl":
        config.kl_loss_coef = 0.0
    elif fault == "clip":
        config.pg_clip, config.pg_clip_low, config.pg_clip_high = config.pg_clip / 2, config.pg_clip_low / 2, config.pg_clip_high / 2
    elif fault == "aggregation":
        config.loss_agg_mode = "seq-mean-token-mean" if config.loss_agg_mode == "token-mean" else "token-mean"
    elif fault not in (None, "infra"):
        raise ValueError(f"unknown fault {fault!r}")


def run(work: str | Path, experiment: Experiment, fault: str | None = None) -> Update:
    """One update of ROLL on the recorded batch in ``work``; ``fault`` injects one mistake on ROLL's side (``lr``:
    twice the rate; ``kl``: ``kl_loss_coef`` 0; ``clip``: half the clip; ``aggregation``: the other ``loss_agg_mode``;
    ``infra``: the failed episode's flag dropped, so the group filter lets it in; where ROLL's random remainder then
    drops the failed episode's turns, as on turn_steps.toml's 32-episode batch, that update is a correct one and no
    check can fail it: the test's 26-episode batch trains them)."""
    if not importable():
        raise FileNotFoundError(f"ROLL does not import here (source: {os.environ.get('ROLL_SRC') or ROLL_SHARED_SRC}): run it in nox -s roll_src's Python")
    work = Path(work)
    os.environ.setdefault("ROLL_LOG_DIR", str(work / "roll-logs"))
    import ray

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with _cpu_platform(), _trl_import_stub(), _one_process_group():
            return _run(work, dataclasses.replace(experiment, precision=PRECISION), fault)
    finally:
        if started_ray:
            _SHARED_STORAGE.clear()
            ray.shutdown()


def _run(work: Path, experiment: Experiment, fault: str | None) -> Update:
    import numpy as np
    import roll.utils.checkpoint_manager as checkpoint_manager
    from roll.utils.import_utils import safe_import_class

    from tier1.batch import load, tokenizer

    _hold_shared_storage()
    checkpoint_manager.shared_storage = None  # a handle left by an earlier Ray session of this process: opened again
    recorded = load(work)
    e = experiment
    config = roll_config(e, work)
    inject(config, fault)
    tok = tokenizer()
    config.actor_train.model_args.model_name_or_path = str(_checkpoint(work, "actor", tok))
    references = dict(config.reference_configs)
    for ref_config in references.values():
        ref_config.model_args.model_name_or_path = str(_checkpoint(work, "ref", tok))

    # the rollout: every recorded episode as ROLL's env manager makes its samples, filtered as its GroupQueue does
    batch, row_of_sample = _rollout_batch(config, recorded, tok, flag_failed=fault != "infra")

    # the workers, by their own constructors and initialize (the reference first: its strategy opens the group)
    workers = {name: safe_import_class(c.worker_cls)(worker_config=c) for name, c in references.items()}
    for worker in workers.values():
        worker.initialize(config)
    actor = safe_import_class(config.actor_train.worker_cls)(worker_config=config.actor_train)
    actor.initialize(config)
    for worker in [*workers.values(), actor]:  # the states' moves to and from the GPU: nowhere to move them on CPU
        worker.strategy.load_states = worker.strategy.offload_states = _stay
    start = {name: _full(p).detach().clone() for name, p in actor.strategy.model.named_parameters()}

    seen: dict[str, Any] = {"steps": [], "losses": []}
    real_step = actor.strategy.train_step

    def train_step(batch: Any, loss_func: Any, *args: Any, **kwargs: Any) -> Any:
        """The strategy's own train_step; the rows of the optimizer step read as they pass."""
        seen["steps"].append([row_of_sample[u] for u in batch.non_tensor_batch["sample_uuid"]])
        metrics = real_step(batch, loss_func, *args, **kwargs)
        seen["losses"].append(float(np.sum(metrics["actor/total_loss@sum"])))
        return metrics

    actor.strategy.train_step = train_step
    pipeline = _pipeline(config, actor, workers, batch, tok, seen)
    pipeline.run()

    deltas = {name: (_full(p).detach() - start[name]).double().numpy() for name, p in actor.strategy.model.named_parameters()}
    trained = seen["trained"]
    response = trained.batch["response_mask"][:, 1:].bool()
    advantages = np.full((len(_turn_rows(recorded)), _width(recorded)), np.nan)  # NaN: a row ROLL dropped
    for k, uuid in enumerate(trained.non_tensor_batch["sample_uuid"]):
        values = trained.batch["advantages"][k][response[k]]
        row = row_of_sample[uuid]
        advantages[row] = 0.0
        advantages[row, : len(values)] = values.double().numpy()
    dtype = str(trained.batch["advantages"].dtype).replace("torch.", "")
    return Update(advantages, deltas, seen["steps"], dtype, [{"loss": loss} for loss in seen["losses"]])


#: Ray session (its GCS address) -> the handle that created ROLL's SharedStorage actor there (see _hold_shared_storage).
_SHARED_STORAGE: dict[str, Any] = {}


def _hold_shared_storage() -> None:
    """Create ROLL's named ``SharedStorage`` actor (its model-path cache and port registry) from this driver and hold
    the handle while the Ray session lasts, as ROLL's driver holds it. A named actor lives as long as the handle that
    created it: created by the first worker (``Worker.__init__``), it would die with the run's workers, and a later run
    in this process would meet it dying."""
    import ray
    from roll.distributed.scheduler.storage import SharedStorage
    from roll.utils.constants import RAY_NAMESPACE, STORAGE_NAME

    session = ray.get_runtime_context().gcs_address
    if session not in _SHARED_STORAGE:
        _SHARED_STORAGE.clear()
        _SHARED_STORAGE[session] = SharedStorage.options(name=STORAGE_NAME, get_if_exists=True, namespace=RAY_NAMESPACE).remote()


def _checkpoint(work: Path, name: str, tok: Any) -> Path:
    """``work/name`` as ROLL's Python loads it (``work/roll-name``): its weights and config, and the test tokenizer
    saved by this Python's transformers (one saved by transformers 5, as the command's own Python may be, names a
    tokenizer class ROLL's transformers 4 does not have)."""
    out = work / f"roll-{name}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for path in (work / name).iterdir():
        if path.name in ("config.json", "generation_config.json") or path.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copy2(path, out / path.name)
    tok.save_pretrained(out)
    return out


def _stay(*args: Any, **kwargs: Any) -> None:
    """A strategy's ``load_states``/``offload_states`` on CPU: the states stay where they are (ROLL's own
    ``load_hf_model`` turns a CPU device map into the device string ``cpu:cpu``, which torch refuses)."""


def _full(parameter: Any) -> Any:
    """A parameter's whole value (FSDP2 holds DTensors)."""
    return parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter


def _turn_rows(recorded: Any) -> list[tuple[int, int]]:
    """(episode, turn) of every row of the reference's turn view (:func:`gem_core.batch.turn_batch`'s order)."""
    return [(e, t) for e, trajectory in enumerate(recorded.trajectories) for t in range(trajectory.num_turns)]


def _width(recorded: Any) -> int:
    """The reference's completion width in the turn view: the longest response."""
    return max(len(turn.response_ids) for t in recorded.trajectories for turn in t.turns)


def _rollout_batch(config: Any, recorded: Any, tok: Any, flag_failed: bool) -> tuple[Any, dict[str, int]]:
    """The batch ROLL's rollout scheduler hands the pipeline for the recorded episodes, and the reference's turn row of
    each sample (by the ``sample_uuid`` ``AgenticPipeline.run`` gives it: ``{traj_id}_{position}``)."""
    import numpy as np
    from roll.distributed.scheduler.protocol import DataProto
    from roll.pipeline.agentic.env_manager.base_env_manager import RolloutCache
    from roll.utils.import_utils import safe_import_class

    from gem_integrations.roll.experiment import TAG
    from gem_integrations.roll.rollout import METRICS_AGG_MODE, step_metrics

    env = config.custom_envs[TAG]
    manager = safe_import_class(env["env_manager_cls"]).__new__(safe_import_class(env["env_manager_cls"]))
    manager.pipeline_config, manager.tokenizer = config, tok
    group_filter = safe_import_class(config.train_env_manager.group_filter_cls)(config, config.train_env_manager, "train")
    size = config.train_env_manager.group_size
    rows = {pair: k for k, pair in enumerate(_turn_rows(recorded))}
    kept, owners = [], []
    for group in range(len(recorded.trajectories) // size):
        rollouts = []
        for index in range(group * size, (group + 1) * size):
            trajectory = recorded.trajectories[index]
            cache = RolloutCache(env_id=index, group_id=group, tag=TAG)
            for sample, turn in zip(trajectory.per_turn_samples(), trajectory.turns):
                last = turn.index == trajectory.num_turns - 1
                metrics = step_metrics(turn.info or {}, truncated=last and trajectory.truncated and not trajectory.terminated)
                cache.history.append({
                    "observation": "", "prompt_ids": list(sample.prompt_ids), "response_ids": list(sample.response_ids),
                    "infer_logprobs": list(sample.logprobs or []), "reward": float(sample.reward), "metrics": metrics,
                    "metrics_agg_mode": dict(METRICS_AGG_MODE), "state_hash": f"{index}-{turn.index}",
                })  # fmt: skip
            if flag_failed and trajectory.infra_error is not None:  # what GemCoreEnv.step reports on the failure
                cache.history[-1]["metrics"]["infra_error"] = 1.0
            cache.history.append({"observation": "", "actions_left": 0, "messages": None})  # step()'s next entry
            cache.step, cache.terminated = trajectory.num_turns, True
            manager.rollout_cache = cache
            rollout = manager.formulate_rollouts(cache)
            group_seed = trajectory.seed or 0
            traj_group_id = f"{TAG}_{group}_0_{group_seed}"  # run_rollout_loop's ids (episode 0 of each env)
            traj_id = f"{traj_group_id}_{index}"
            rollout.non_tensor_batch["traj_group_id"] = np.array([traj_group_id] * len(rollout), dtype=object)
            rollout.non_tensor_batch["traj_id"] = np.array([traj_id] * len(rollout), dtype=object)
            rollouts.append(rollout)
            owners.append([rows[(index, t)] for t in range(len(rollout))])
        if group_filter.filter(group, 0, rollouts):  # True drops the group (GroupQueue.put)
            owners = owners[: len(owners) - size]
            continue
        kept += rollouts
    metrics: dict[str, list] = {}
    for rollout in kept:
        for key, value in rollout.meta_info.get("metrics", {}).items():
            metrics.setdefault(key, []).append(value)
    batch = DataProto.concat(kept)
    batch.meta_info["metrics"] = metrics
    row_of_sample = {}
    position = 0
    for rollout, owned in zip(kept, owners):
        for k in range(len(rollout)):
            row_of_sample[f"{rollout.non_tensor_batch['traj_id'][k]}_{position}"] = owned[k]
            position += 1
    return batch, row_of_sample


class LocalCluster:
    """A ROLL ``Cluster`` of one worker in this process: the calls ``AgenticPipeline.run`` makes, answered by the
    worker's own methods; results go back through ``ray.put`` as a Ray actor's would."""

    def __init__(self, worker: Any, seen: dict[str, Any] | None = None):
        self.worker = worker
        self.worker_config = worker.worker_config
        self.dp_size = 1
        self.seen = seen

    @staticmethod
    def _answer(value: Any, blocking: bool) -> Any:
        import ray

        return value if blocking else [ray.put(value)]

    @staticmethod
    def _in_worker(method: Any, *args: Any) -> Any:
        """A worker method as its Ray actor runs it: in the actor's own grad mode (on, whatever the driver's:
        ``AgenticPipeline.run`` is ``torch.no_grad()``)."""
        import torch

        with torch.enable_grad():
            return method(*args)

    def offload_states(self, *args: Any, blocking: bool = True, **kwargs: Any) -> None:
        """Moving the states off the GPU: nothing to move on CPU."""

    def load_states(self, *args: Any, blocking: bool = True, **kwargs: Any) -> None:
        """Moving the states onto the GPU: nothing to move on CPU."""

    def compute_log_probs(self, data: Any, blocking: bool = True) -> Any:
        return self._answer(self._in_worker(self.worker.compute_log_probs, data), blocking)

    def train_step(self, data: Any, blocking: bool = True) -> Any:
        if self.seen is not None:
            self.seen["trained"] = copy.deepcopy(data)  # the batch as the pipeline hands it to the actor
        return self._answer(self._in_worker(self.worker.train_step, data), blocking)

    def get_metrics(self, *args: Any, **kwargs: Any) -> Any:
        from roll.distributed.scheduler.protocol import DataProto

        return DataProto(meta_info={"metrics": {}})


class _Remote:
    """``obj.method.remote(...)`` of a Ray actor, answered in this process (a ``ray.put`` of ``value(...)``)."""

    def __init__(self, value: Any):
        self.value = value

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        import ray

        return ray.put(self.value(*args, **kwargs))


def _pipeline(config: Any, actor: Any, references: dict[str, Any], batch: Any, tok: Any, seen: dict[str, Any]) -> Any:
    """The ``pipeline_cls`` the config names, its clusters the workers here (see the module docstring); one step."""
    from roll.utils.functionals import RunningMoments
    from roll.utils.import_utils import safe_import_class
    from roll.utils.kl_controller import get_kl_controller
    from roll.utils.worker_state import WorkerState

    cls = safe_import_class(config.pipeline_cls)
    pipeline = cls.__new__(cls)
    config.max_steps = 1  # one update (the schedule was sized by set_max_steps for the run's)
    pipeline.pipeline_config = config
    pipeline.use_ref_model = config.enable_reference
    pipeline.partial_gpu_mode = False
    pipeline.kl_ctrl = get_kl_controller(init_kl_coef=config.init_kl_coef, target_kl=config.target_kl, kl_horizon=config.kl_horizon)
    pipeline.actor_train = LocalCluster(actor, seen)
    pipeline.actor_infer = LocalCluster(types.SimpleNamespace(worker_config=config.actor_infer))
    pipeline.references = {name: LocalCluster(worker) for name, worker in references.items()}
    pipeline.reference = next(iter(pipeline.references.values()))
    pipeline.reward = None
    pipeline.tokenizer = tok
    pipeline.state = WorkerState()
    pipeline.running = RunningMoments()
    pipeline.tracker = types.SimpleNamespace(log=lambda values, step: None)
    pipeline.model_update = lambda global_step: {}  # the weight sync to the inference engine: none here
    pipeline.do_checkpoint = lambda global_step, is_last_step=None: None
    scheduler = types.SimpleNamespace(
        suspend=_Remote(lambda: None), shutdown=_Remote(lambda: None), get_batch=_Remote(lambda data, size: _with_meta(batch, data))
    )
    pipeline.train_rollout_scheduler = scheduler
    pipeline.val_rollout_scheduler = types.SimpleNamespace(shutdown=_Remote(lambda: None))
    return pipeline


def _with_meta(batch: Any, data: Any) -> Any:
    """The recorded batch with the meta_info the pipeline sent for it (its global step)."""
    out = copy.deepcopy(batch)
    out.meta_info = {**data.meta_info, **out.meta_info}
    return out


@contextlib.contextmanager
def _cpu_platform():
    """ROLL's ``current_platform`` with :data:`CPU_MEMORY_CALLS` answering 0 (see the module docstring)."""
    from roll.platforms import current_platform

    added = [name for name in CPU_MEMORY_CALLS if name not in vars(current_platform)]
    for name in added:
        setattr(current_platform, name, lambda *args, **kwargs: 0)
    had_info = "mem_get_info" in vars(current_platform)
    if not had_info:
        current_platform.mem_get_info = lambda *args, **kwargs: (0, 0)
    try:
        yield
    finally:
        for name in added + ([] if had_info else ["mem_get_info"]):
            delattr(current_platform, name)


@contextlib.contextmanager
def _trl_import_stub():
    """An import stub for ``trl`` alone where it is not installed (see the module docstring)."""
    if importlib.util.find_spec("trl") is not None or "trl" in sys.modules:
        yield
        return
    stub = types.ModuleType("trl")
    stub.__doc__ = "tier1.roll_update's import stub: only AutoModelForCausalLMWithValueHead, for ROLL's isinstance test"
    stub.AutoModelForCausalLMWithValueHead = type("AutoModelForCausalLMWithValueHead", (), {})
    sys.modules["trl"] = stub
    try:
        yield
    finally:
        sys.modules.pop("trl", None)


@contextlib.contextmanager
def _one_process_group():
    """The environment of rank 0 of a one-process job (ROLL's workers read it); the default process group the
    strategies open is closed afterwards, so that another run can open its own."""
    import torch.distributed as dist

    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
