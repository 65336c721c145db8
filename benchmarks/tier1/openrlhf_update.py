"""OpenRLHF 0.11.2 in the Tier 1 check: the recorded batch and weights through OpenRLHF's own PPO actor update.

The arguments are the plugin's mapping of the experiment (``gem_integrations.openrlhf.experiment.arguments``)
parsed by the launcher's parser (``gem_integrations.openrlhf.train_ppo_ray.parse_args``, OpenRLHF's own with
``rebn``); everything below reads them from there. What runs is OpenRLHF's:

* each recorded episode as the GEM agent file returns it (:func:`gem_integrations.openrlhf.rollout.openrlhf_result`,
  with ``GEM_OPENRLHF_TURNS=1`` as the launcher sets it), turned into an ``Experience`` by
  ``SamplesGenerator._process_response_into_experience`` and split into micro-batches by
  ``RemoteExperienceMaker.split_rollout_samples``;
* ``RemoteExperienceMaker.make_experience``: the old log-probs (the actor at the update's start) and the
  reference log-probs, each by ``openrlhf.models.Actor``'s forward, and its KL bookkeeping; then
  ``compute_advantages_and_returns`` as the plugin patches it (``gem_integrations.openrlhf.advantage``: ReBN);
* ``ActorPPOTrainer``: the replay buffer (``NaiveReplayBuffer``), ``ppo_train`` (its shuffled ``DataLoader``,
  its epochs, ``iter_grad_accum_global_norm``'s per-optimizer-step normalisers) and ``training_step``
  (``Actor`` forward, ``PolicyLoss``, the KL loss by ``compute_approx_kl`` and ``aggregate_loss``, times
  ``kl_ctl`` from a ``FixedKLController(--algo.kl.init_coef)``), then the strategy's backward and step;
  ``training_step`` as the plugin patches it (``gem_integrations.openrlhf.training_step``: the metrics of a
  micro-batch with no action token).

Replaced, and why (the rest is OpenRLHF's code as a user runs it):

* **the DeepSpeed engine** (``deepspeed.initialize``, ``engine.backward``, ``engine.step``): DeepSpeed does not
  run on CPU here. :class:`CPUStrategy` (OpenRLHF's ``DeepspeedStrategy``, its ``prepare``, ``backward`` and
  ``optimizer_step`` replaced, as in ``tests/integrations/openrlhf/ray_step_actors.py``) keeps float32 master
  copies in a torch ``AdamW`` over OpenRLHF's own parameter groups (``_get_model_parameters``: no decay on biases
  and norm weights), scales each micro-batch's loss by 1/gas as DeepSpeed does, steps every gas micro-batches
  after clipping the masters' gradient to ``--actor.max_norm``, and builds the same HF scheduler
  (``get_scheduler`` with ``ceil(steps * lr_warmup_ratio)`` warm-up steps);
* **bf16**: OpenRLHF loads the actor in ``--ds.param_dtype`` (bf16 or fp16, no float32); the check runs in
  float32, so ``Actor`` loads the actor and reference checkpoints with ``--ds.param_dtype`` read as float32
  (``openrlhf.utils.utils.convert_to_torch_dtype`` answers float32 while it loads) and eager attention
  (flash-attn is GPU-only);
* **Ray**: ``make_experience`` dispatches its forwards to Ray actor groups; here ``_dispatch_forward`` calls
  the same ``Actor`` forward in this process (what ``PolicyModelActor.forward`` does: eval mode, no grad),
  ``ray.put``/``ray.get`` are the identity, and ``torch.distributed`` is a one-process gloo group. vllm,
  deepspeed and flash_attn are import stubs (``tests/integrations/openrlhf/openrlhf_import_stubs.py``).

The training micro-batch size is left to the user by the plugin's arguments (a memory option); the check runs
OpenRLHF's default, 1 (the command's; gas 8 on the 8-episode batch), and 4 (gas 2) appended as a user would
(:data:`MICRO_BATCH_SIZES`; ``tests/integrations/openrlhf/test_same_update.py``), so DeepSpeed's 1/gas scaling
acts in both. At 1 the infra-failed row (no action token) is a micro-batch of its own: found by this check,
``ppo_train``'s metric averaging divided by zero there (``merged_status[k] = value / denom``) and stopped the
trainer; the plugin's patch of ``training_step`` (:mod:`gem_integrations.openrlhf.training_step`, installed with
the ReBN patch) fixes it without changing a weight.

Observed, not changed: the advantages ``compute_advantages_and_returns`` returns, and the rows of each
``training_step`` (OpenRLHF shuffles the replay buffer: the reference takes the same rows).

OpenRLHF's declared semantics (:func:`semantics`), each a documented difference from gem-core train's:

* old log-probs: OpenRLHF recomputes them with the actor at the update's start (the rollout's are only used by
  its off-policy correction, off by default); the reference model is ``--ref``'s checkpoint (here ``ref/``);
* ``token-mean``: each optimizer step's token sum over the step's model tokens (``batch_num_tokens``, the
  window's tokens over gas, times DeepSpeed's 1/gas); ``seq-mean-token-mean``: over the step's rows that have a
  model token (``global_batch_size``): an infra-failed row is not counted;
* the KL term with ``--algo.kl.use_loss``: ``actor_loss + kl_coef * aggregate_loss(kl, ...)``, and
  ``training_step`` calls ``aggregate_loss`` for the KL without ``token_level_loss``: the KL is always a
  token-mean over the step's model tokens, whatever ``--actor.loss_agg_mode`` (under ``seq-mean-token-mean``
  the weight change differs by 2.3 % from a KL averaged like the policy loss, measured on the 8-episode batch;
  ``Semantics.kl_aggregation``); OpenRLHF clamps the k3 log-ratio at -10 and the KL to [-10, 10],
  and the PPO log-ratio to [-20, 20] (none is reached on this batch);
* the advantages are float32 (the plugin computes ReBN in float64 and casts to the rewards' dtype);
* AdamW with no weight decay on biases and norm weights; warm-up ``lr * k / W`` (HF ``constant_with_warmup``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Any

from gem_core.experiment import Experiment
from tier1.cpu import one_process_group
from tier1.reference import Semantics, Update, experiment_semantics

TRAINER = "openrlhf"
ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "tests" / "integrations" / "openrlhf"  # openrlhf_import_stubs.py: vllm, deepspeed, flash_attn
#: The training micro-batch sizes the check runs (see the module docstring): OpenRLHF's default (nothing appended
#: to the plugin's arguments; the command runs it) and 4 rows, which a user appends (a memory option, no semantics).
MICRO_BATCH_SIZES = (1, 4)


def user_args(micro_batch_size: int | None) -> list[str]:
    """What a user appends to the plugin's arguments: ``--train.micro_batch_size`` (None: OpenRLHF's default)."""
    return [] if micro_batch_size is None else ["--train.micro_batch_size", str(micro_batch_size)]


def semantics(experiment: Experiment) -> Semantics:
    """The update OpenRLHF declares for ``experiment``: the experiment's values (not the plugin's mapping of
    them, which is what is checked) under OpenRLHF's rules (see the module docstring)."""
    return experiment_semantics(
        TRAINER,
        experiment,
        advantage_dtype="float32",
        token_mean_over="step",
        seq_rows="healthy",
        kl_aggregation="token-mean",
        old_logprobs="start",
        no_decay_bias_and_norm=True,
        warmup="hf",
    )


def parsed_arguments(experiment: Experiment, work: Path, micro_batch_size: int | None = None) -> Any:
    """The plugin's arguments for ``experiment`` through the launcher's parser (OpenRLHF's, with rebn), plus
    :func:`user_args`."""
    from gem_integrations.openrlhf import agent_path, train_ppo_ray
    from gem_integrations.openrlhf.experiment import arguments

    argv = [
        a.replace("$MODEL", str(work / "actor"))
        .replace("$DATA", str(work))
        .replace("$(gem-core openrlhf agent-path)", agent_path())
        .replace("$PARAM_DTYPE", "bf16")
        for a in arguments(experiment)
    ]
    return train_ppo_ray.parse_args([*argv, *user_args(micro_batch_size)])


def _cpu_strategy_class() -> type:
    import torch
    from openrlhf.utils.deepspeed import DeepspeedStrategy

    class CPUStrategy(DeepspeedStrategy):
        """STAND-IN for the DeepSpeed engine (see the module docstring); every other method is OpenRLHF's."""

        def setup_distributed(self, timeout: Any = None) -> None:
            import transformers

            transformers.set_seed(self.seed)  # as DeepspeedStrategy.setup_distributed
            self.world_size = 1
            self.accumulated_gradient = self.train_batch_size // self.micro_train_batch_size
            self.micro_steps, self.grad_norms = 0, []

        def prepare(self, *models: Any) -> Any:
            from transformers.trainer import get_scheduler

            ((model, cfg),) = models
            if cfg["optim"] != "adam":
                raise NotImplementedError("the CPU strategy replaces DeepSpeed's AdamW only")
            adam = cfg["adam"]
            _, groups = self._get_model_parameters(model, optim="adam", weight_decay=adam["weight_decay"])
            self.masters = []
            master_groups = []
            for group in groups:
                masters = [p.detach().float().clone() for p in group["params"]]
                self.masters.extend(zip(group["params"], masters))
                master_groups.append({**group, "params": masters})
            optimizer = torch.optim.AdamW(master_groups, lr=adam["lr"], betas=tuple(adam["betas"]), eps=adam["eps"])
            steps = cfg["scheduler_steps"]
            name = cfg["lr_scheduler"]
            kwargs = {"min_lr_rate": cfg.get("min_lr_ratio", 0.1)} if "min_lr" in name else {}
            warmup = math.ceil(steps * cfg["lr_warmup_ratio"])
            scheduler = get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=steps, scheduler_specific_kwargs=kwargs)
            self.max_norm = cfg["max_norm"]
            return model, optimizer, scheduler

        def backward(self, loss: Any, model: Any, optimizer: Any, **kwargs: Any) -> None:
            (loss / self.accumulated_gradient).backward()  # DeepSpeed scales each micro-batch's loss by 1/gas

        def optimizer_step(self, optimizer: Any, model: Any, scheduler: Any, name: str = "model", **kwargs: Any) -> None:
            self.micro_steps += 1
            if self.micro_steps % self.accumulated_gradient:
                return  # DeepSpeed's engine.step() steps at the accumulation boundary only
            for param, master in self.masters:
                master.grad = None if param.grad is None else param.grad.detach().float()
            norm = torch.nn.utils.clip_grad_norm_([m for _, m in self.masters], self.max_norm if self.max_norm > 0 else float("inf"))
            optimizer.step()
            scheduler.step()
            with torch.no_grad():
                for param, master in self.masters:
                    param.copy_(master)
                    param.grad = None
                    master.grad = None
            self.grad_norms.append(float(norm))

        def get_grad_norm(self, model: Any) -> float:
            return self.grad_norms[-1] if self.grad_norms else 0.0

        def all_reduce(self, data: Any, op: str = "mean") -> Any:
            return data  # one process

    return CPUStrategy


@contextlib.contextmanager
def _in_process() -> Any:
    """A one-process gloo group, CUDA's device calls answered for the CPU, Ray's put/get the identity in
    OpenRLHF's experience maker (see the module docstring); all put back afterwards."""
    import openrlhf.trainer.ppo_utils.experience_maker as experience_maker

    saved = experience_maker.ray

    class _Ray:
        @staticmethod
        def put(value: Any) -> Any:
            return value

        @staticmethod
        def get(value: Any) -> Any:
            return value

    experience_maker.ray = _Ray
    try:
        with one_process_group():
            yield
    finally:
        experience_maker.ray = saved


def run(work: str | Path, experiment: Experiment, fault: str | None = None, micro_batch_size: int | None = None) -> Update:
    """One update of OpenRLHF on the recorded batch in ``work``, at ``--train.micro_batch_size``
    ``micro_batch_size`` (None: OpenRLHF's default, 1); ``fault`` injects one mistake on OpenRLHF's
    side, in its parsed arguments (``lr``: twice the rate; ``kl``: ``--algo.kl.init_coef`` 0; ``clip``: half
    the clip; ``aggregation``: the other ``--actor.loss_agg_mode``; ``infra``: the failed episode's flag
    dropped, so its row counts)."""
    if str(STUBS) not in sys.path:
        sys.path.insert(0, str(STUBS))
    import openrlhf_import_stubs

    openrlhf_import_stubs.install()
    os.environ["GEM_OPENRLHF_TURNS"] = "1"  # what the launcher sets in every Ray worker
    import numpy as np
    import torch
    from openrlhf.models import Actor
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.utils import get_strategy
    from openrlhf.utils import utils

    from gem_core.batch import sequence_batch
    from gem_core.tasks import TaskSpec
    from gem_integrations.openrlhf import advantage as rebn_patch
    from gem_integrations.openrlhf.rollout import openrlhf_result
    from tier1.batch import INFRA_EPISODE, load, tokenizer

    work = Path(work)
    e = experiment
    recorded = load(work)
    trajectories = recorded.trajectories
    if fault == "infra":
        trajectories[INFRA_EPISODE] = dataclasses.replace(trajectories[INFRA_EPISODE], infra_error=None)
    args = parsed_arguments(e, work, micro_batch_size)
    if fault == "lr":
        args.actor.adam.lr *= 2
    elif fault == "kl":
        args.algo.kl.init_coef = 0.0
    elif fault == "clip":
        args.actor.eps_clip_low_high = [c / 2 for c in args.actor.eps_clip_low_high]
    elif fault == "aggregation":
        args.actor.loss_agg_mode = "seq-mean-token-mean" if args.actor.loss_agg_mode == "token-mean" else "token-mean"
    elif fault not in (None, "infra"):
        raise ValueError(f"unknown fault {fault!r}")
    tok = tokenizer()
    max_len = args.data.max_len

    def loaded(name: str) -> Any:
        """OpenRLHF's ``Actor`` loading the checkpoint as ``PolicyModelActor`` does, in float32 (``--ds.param_dtype``
        read as float32, see the module docstring) with eager attention (flash-attn is GPU-only)."""
        saved = utils.convert_to_torch_dtype
        utils.convert_to_torch_dtype = lambda param_dtype: torch.float32
        try:
            return Actor(
                str(work / name),
                attn_implementation="eager",
                param_dtype=args.ds.param_dtype,
                packing_samples=args.ds.packing_samples,
                temperature=args.rollout.temperature,
            )
        finally:
            utils.convert_to_torch_dtype = saved

    rebn_patch.install()
    try:
        with _in_process():
            strategy = _cpu_strategy_class()(**_strategy_kwargs(get_strategy(args)))
            strategy.setup_distributed()
            actor, ref = loaded("actor"), loaded("ref")
            start = {name: p.detach().clone() for name, p in actor.model.named_parameters()}
            steps_per_update = len(trajectories) // args.train.batch_size * args.train.max_epochs
            trainer, actor = actor_trainer(strategy, actor, args, steps_per_update * e.updates, tokenizer=tok)

            # the rollout: the recorded episodes as the agent file returns them, then OpenRLHF's Experience
            generator = object.__new__(SamplesGenerator)
            samples = []
            for t in trajectories:
                label = TaskSpec(t.env_id, seed=t.seed).to_json()
                response = openrlhf_result(t, f"(row prompt of {t.episode_id})", label, None, with_logprobs=True, max_length=max_len)
                samples.append(generator._process_response_into_experience(response, max_len=max_len))
            kl_ctl = FixedKLController(args.algo.kl.init_coef)
            maker = _maker_class(RemoteExperienceMaker)(actor, ref, kl_ctl, strategy, tok)
            experiences = maker.make_experience_batch(samples)
            advantages = _completion_advantages(experiences, trajectories, tok.pad_token_id, sequence_batch)

            if [int(i) for ex in experiences for i in ex.index] != list(range(len(trajectories))):
                raise ValueError("OpenRLHF's micro-batches are not the recorded rows in order")
            keys = [_row_key(s, a, v) for ex in experiences for s, a, v in zip(ex.sequences, ex.attention_mask, ex.advantages)]
            for experience in experiences:  # what PPOTrainer.fit does: each experience into the actor's buffer
                trainer.replay_buffer.append(experience)
            seen: dict[str, Any] = {"rows": [], "losses": []}
            real_step = trainer.training_step

            def training_step(experience: Any, kl: Any, step: int, loss_batch_info: Any = None) -> Any:
                seen["rows"].append([_row_key(s, a, v) for s, a, v in zip(experience.sequences, experience.attention_mask, experience.advantages)])
                status = real_step(experience, kl, step, loss_batch_info)
                seen["losses"].append(float(status["metrics"]["policy_loss"]))
                return status

            trainer.training_step = training_step
            trainer.ppo_train(kl_ctl.value)
            deltas = {name: (p.detach() - start[name]).double().numpy() for name, p in actor.model.named_parameters()}
    finally:
        rebn_patch.uninstall()

    # the rows of each optimizer step (gas micro-batches), matched per epoch (each row once in an epoch)
    gas, size = strategy.accumulated_gradient, len(keys)
    flat = [key for micro in seen["rows"] for key in micro]
    rows = [i for k in range(0, len(flat), size) for i in _match_rows(flat[k : k + size], keys)]
    sizes = [len(micro) for micro in seen["rows"]]
    steps, at = [], 0
    for k in range(0, len(sizes), gas):
        n = sum(sizes[k : k + gas])
        steps.append(rows[at : at + n])
        at += n
    dtype = str(experiences[0].advantages.dtype).replace("torch.", "")
    stats = [{"policy_loss": loss} for loss in seen["losses"]]
    return Update(np.asarray(advantages, dtype=np.float64), deltas, steps, dtype, stats)


def actor_trainer(strategy: Any, actor: Any, args: Any, scheduler_steps: int, tokenizer: Any = None) -> tuple[Any, Any]:
    """OpenRLHF's ``ActorPPOTrainer`` over ``actor`` as ``PolicyModelActor`` builds it: ``strategy.prepare`` with the
    optimizer settings ``init_model_from_pretrained`` passes (from the parsed ``args``), then the trainer; returns
    ``(trainer, prepared actor)``. The replay buffer asks for ``cuda:<current device>`` (unused) while it is made."""
    import torch
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    actor_cfg = dict(
        optim=args.actor.optim,
        muon=vars(args.actor.muon),
        adam=vars(args.actor.adam),
        lr_scheduler=args.actor.lr_scheduler,
        lr_warmup_ratio=args.actor.lr_warmup_ratio,
        min_lr_ratio=args.actor.min_lr_ratio,
        max_norm=args.actor.max_norm,
        scheduler_steps=scheduler_steps,
    )
    actor, optimizer, scheduler = strategy.prepare((actor, actor_cfg))
    torch.cuda.current_device = lambda: 0
    try:
        trainer = ActorPPOTrainer(
            strategy,
            actor,
            ema_model=None,
            actor_optim=optimizer,
            actor_scheduler=scheduler,
            micro_train_batch_size=args.train.micro_batch_size,
            tokenizer=tokenizer,
            eps_clip=args.actor.eps_clip,
            ema_beta=args.train.ema_beta,
            vllm_engines=None,
        )
    finally:
        torch.cuda.current_device = lambda: "cpu"
    return trainer, actor


def _strategy_kwargs(strategy: Any) -> dict[str, Any]:
    """The constructor arguments ``openrlhf.utils.get_strategy`` gave ``strategy``."""
    return {
        "seed": strategy.seed,
        "full_determinism": strategy.full_determinism,
        "max_norm": strategy.max_norm,
        "micro_train_batch_size": strategy.micro_train_batch_size,
        "train_batch_size": strategy.train_batch_size,
        "zero_stage": strategy.stage,
        "args": strategy.args,
    }


def _maker_class(base: type) -> type:
    class LocalExperienceMaker(base):
        """OpenRLHF's RemoteExperienceMaker whose model forwards run here instead of in Ray actor groups."""

        def __init__(self, actor: Any, ref: Any, kl_ctl: Any, strategy: Any, tok: Any):
            super().__init__(actor, None, None, ref, kl_ctl, strategy, tok)

        def _dispatch_forward(self, group: Any, sync_condition: Any, **kwargs: Any) -> Any:
            import torch

            out = []
            group.eval()  # as PolicyModelActor.forward
            with torch.no_grad():
                for sequences, action_mask, attention_mask in zip(kwargs["sequences"], kwargs["action_mask"], kwargs["attention_mask"]):
                    out.append([group(sequences, action_mask, attention_mask)])
            group.train()
            return out

    return LocalExperienceMaker


def _row_key(sequence: Any, attention: Any, advantages: Any) -> tuple[Any, ...]:
    """A row's tokens and its advantages on them (equal sequences of an infra-failed and a healthy row differ)."""
    mask = attention.bool()
    return (tuple(sequence[mask].tolist()), tuple(advantages[mask[1:]].tolist()))


def _match_rows(window: list[tuple[Any, ...]], keys: list[tuple[Any, ...]]) -> list[int]:
    """The recorded row of each training row of an epoch (identical rows: the first not yet taken)."""
    used: set[int] = set()
    out = []
    for key in window:
        match = next((i for i, k in enumerate(keys) if i not in used and k == key), None)
        if match is None:
            raise ValueError("a training row that is not in the recorded batch")
        used.add(match)
        out.append(match)
    return out


def _completion_advantages(experiences: list[Any], trajectories: list[Any], pad_id: int, sequence_batch: Any) -> Any:
    """OpenRLHF's advantages (action axis: index j is sequence position j + 1) on the reference's completion
    layout (rows x response positions of :func:`gem_core.batch.sequence_batch`)."""
    import numpy as np

    batch = sequence_batch(trajectories, pad_id=pad_id)
    by_index = {}
    for experience in experiences:
        for k, i in enumerate(experience.index):
            by_index[int(i)] = (experience.sequences[k], experience.attention_mask[k], experience.advantages[k])
    out = np.zeros(batch.response_ids.shape, dtype=np.float64)
    for i in range(len(batch)):
        sequence, attention, adv = by_index[i]
        ids = sequence[attention.bool()].tolist()
        prompt, n = len(batch.prompt_ids[i]), int(batch.lengths[i])
        if ids != list(batch.prompt_ids[i]) + batch.response_ids[i, :n].tolist():
            raise ValueError(f"row {i}: OpenRLHF's sequence is not the recorded episode's")
        first = int(attention.long().argmax())  # left padding, if any
        out[i, :n] = adv[first + prompt - 1 : first + prompt - 1 + n].double().numpy()
    return out
