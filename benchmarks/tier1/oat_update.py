"""oat 0.2.4 in the Tier 1 check: the recorded batch and weights through oat's own multi-turn learner update.

The arguments are the plugin's mapping of the experiment (``gem_integrations.oat.experiment.arguments``, float32:
``training.precision``'s ``--no-bf16 --no-flash-attn``) parsed by the launcher's ``build_args`` (oat's own
``get_default_args`` and ``default_args_validation``, with ``rebn_args``); everything below reads them from there.
What runs is oat's and the plugin's:

* the actor: :class:`gem_integrations.oat.rollout.GemActor`'s ``collect_experience`` (its drop of infra-failed
  episodes, :func:`~gem_integrations.oat.rollout.transitions`) under oat's ``PPOMultiTurnActor.step``, called by
  oat's ``MultiTurnFeedbackCollector.collect_feedback``;
* the learner: :class:`gem_integrations.oat.advantage.GemLearner` over oat's ``PPOMultiTurnLearner``:
  ``process_feedback_data`` (``compute_advantages``: discounted turn returns, no critic), into a policy buffer
  made as oat's ``LearnerBase._init`` makes it (``deque(maxlen=--pi-buffer-maxlen-per-device)``), then oat's
  ``PPOLearner.learn`` (``MultiTurnTransitionDataset``, its ``collate_fn``, the DataLoader) and
  ``learning_step``: the plugin's whitening (ReBN), oat's recomputed old log-probs and reference log-probs
  (``get_batch_logps``, its fused LM head), its PPO loss with truncated importance sampling, its k3 KL term
  (``--beta``), each reduced by its ``masked_aggregator`` (``masked_mean`` for ``--critic-type grpo``), a
  backward and an optimizer step call per turn row (``--train-batch-size-per-device 1``), ``--num-ppo-epochs``
  passes, under the accumulation ``GemLearner`` sets for the step (DeepSpeed's ``set_train_batch_size`` to the
  step's rows: one optimizer step per pass); the models are oat's ``oat.model.LLM`` (``--pretrain``,
  ``--ref-pretrain``).

Replaced, and why (the rest is oat's code as a user runs it):

* **the generation**: ``gem_integrations.oat.rollout.play`` returns the recorded episodes (the actor's vLLM
  engine is GPU-only); everything the actor does with them is its own;
* **the DeepSpeed engine** (``deepspeed.initialize``, ``DeepSpeedEngine``, ``FusedAdam``): DeepSpeed does not
  run on CPU here. :class:`CPUStrategy` (oat's ``DeepspeedStrategy``, its ``setup_distributed``,
  ``create_optimizer``, ``prepare`` and ``get_gradient_norm`` replaced; ``backward``, ``optimizer_step``,
  ``all_reduce``, ``setup_dataloader``, ``get_ds_train_config``, ``set_seed`` are oat's) wraps the policy in
  :class:`CPUEngine`, which behaves as DeepSpeed 0.16.8's ``DeepSpeedEngine`` does with the config oat gives it
  (read in DeepSpeed's ``runtime/engine.py``): ``train_batch_size`` must divide by
  ``train_micro_batch_size_per_gpu x world`` and the quotient is the gradient accumulation, the same rule in
  ``set_train_batch_size``, which changes it; ``backward`` scales each micro-batch's loss by 1/that; ``step``
  steps at the accumulation boundary only, ``(micro_steps + 1) % accumulation == 0`` with its micro-step
  counter running since the engine was built, after clipping the gradient's global norm to
  ``gradient_clipping`` (``--max-norm``); attributes pass through to the model. The optimizer is torch
  ``AdamW`` (FusedAdam's ``adam_w_mode``, eps 1e-8) over oat's own parameter groups
  (``get_optimizer_grouped_parameters``: no decay on biases and norm weights) with oat's ``create_optimizer``
  arguments, the scheduler transformers' ``get_scheduler`` as oat's ``LearnerBase._init`` builds it;
* **the learner's construction**: oat's ``_init`` launches DeepSpeed, wandb and launchpad; the attributes its
  methods read are set here as ``_init`` sets them (``tests/integrations/oat/oat_harness.py`` does the same);
* **bf16, flash-attention, CUDA**: float32 and eager attention (``--no-bf16 --no-flash-attn``, the float32
  precision's flags); ``torch.cuda`` device calls answered for the CPU; ``deepspeed.zero.GatheredParameters``
  (ZeRO-3 only; off at oat's ZeRO-2) a no-op; deepspeed, vllm, launchpad and pyarrow.plasma import stubs
  (``tests/integrations/oat/oat_stubs.py``); ``torch.distributed`` a one-process gloo group.

Added to the plugin's arguments: ``--gpus 1`` (oat's validation counts the machine's GPUs; the launchpad options
are the user's) and ``--ref-pretrain ref/`` (oat's reference model is ``--pretrain`` by default: here the actor has
moved from the checkpoint the run started from).

Found and fixed in the plugin's learner (issue 64): the plugin maps ``--train-batch-size`` to every turn an update
can hold (``episodes_per_update x`` the turn limit, or x ``TURN_CAP`` = 100 without one) so that oat never
subsamples; but oat's ``--train-batch-size`` is also DeepSpeed's accumulation count (``train_batch_size /
micro-batch / world`` micro-batches a step), and an update has fewer turn rows than that. With its rows times
``--num-ppo-epochs`` fewer, DeepSpeed stepped no weight and oat's ``learning_step`` then failed on its metrics of the
steps made (``torch.tensor([]).max()``: turn.toml's first update raised); with more, the steps fell where the count
did, across passes and updates, each micro-batch's loss divided by the count. A fixed number cannot follow an
update's turns: ``GemLearner`` now sets the engine's accumulation (``set_train_batch_size``, and oat's
``grad_acc_step``) to each learning step's rows, its micro-step counter at a boundary, padding a device's rows to
the largest device's on several (``gem_integrations.oat.advantage``'s docstring). The check runs the plugin's own
``--train-batch-size`` (8 x 100 turns on turn.toml's 8 episodes): one optimizer step per pass.

Found and fixed in the plugin's mapping: it left ``--pi-buffer-maxlen-per-device`` at oat's 16, and oat's policy
buffer is a deque of that length, so an update trained its last 16 turns only (it is now the rollout batch).

Observed, not changed: the advantages ``learning_step`` applies (after the plugin's whitening) and the rows of
each optimizer step (the micro-batches between two accumulation boundaries; oat permutes them each pass).

oat's declared semantics (:func:`semantics`), each a documented difference from gem-core train's:

* rows: one per turn (``view = "turn"``: the context at the turn's start, then the turn's response), each the
  mean of its tokens' loss, the step's loss the mean of those over its rows (``seq-mean-token-mean``; DeepSpeed's
  1/gas times one row a micro-batch); the KL term (k3, log-ratio clamped at +-40, not reached) is reduced the same
  way, inside each row's mean; an infra-failed episode never reaches the learner;
* old log-probs: the actor's at the update's start (the learner recomputes them once, before the passes), and oat's
  truncated importance sampling on the policy loss, ``min(exp(old - rollout), tis_c)`` with ``--tis-c``'s default
  2.0, which the plugin leaves (:attr:`tier1.reference.Semantics.tis_cap`);
* ReBN with oat's whitening: population std, eps 1e-9, over the turns the learner got (no subsampling: the
  plugin's rollout batch holds the update); the advantages are float32 (oat's ``compute_advantages`` writes the
  returns in float32; the plugin whitens them in float64 and casts to float32);
* AdamW with no weight decay on biases and norm weights; a constant rate (oat's ``constant`` schedule, no warm-up).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import types
from collections import deque
from pathlib import Path
from typing import Any

from gem_core.experiment import Experiment
from tier1.cpu import one_process_group
from tier1.reference import Semantics, Update, experiment_semantics

TRAINER = "oat"
ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "tests" / "integrations" / "oat"  # oat_stubs.py: deepspeed, vllm, launchpad, pyarrow.plasma
OAT_TIS_C = 2.0  # oat's --tis-c default (PPOArgs.tis_c), which the plugin's arguments leave
OAT_EPS = 1e-9  # oat's whitening: (A - mean) / (std + 1e-9)


def semantics(experiment: Experiment) -> Semantics:
    """The update oat declares for ``experiment``: the experiment's values (not the plugin's mapping of them,
    which is what is checked) under oat's rules (see the module docstring)."""
    return experiment_semantics(
        TRAINER,
        experiment,
        view="turn",
        eps=OAT_EPS,
        ddof=0,
        advantage_dtype="float32",
        seq_rows="healthy",
        old_logprobs="start",
        tis_cap=OAT_TIS_C,
        no_decay_bias_and_norm=True,
        warmup="hf",
    )


def parsed_arguments(experiment: Experiment, work: Path, extra: list[str] = ()) -> Any:
    """The plugin's arguments for ``experiment`` (float32) through the launcher's ``build_args`` (oat's parser and
    validation, the ReBN settings), with ``--gpus 1`` and ``--ref-pretrain ref/`` added (see the module docstring)."""
    import torch

    from gem_integrations.oat.experiment import PRECISION, arguments
    from gem_integrations.oat.launch import build_args

    values = {"MODEL": str(work / "actor"), "DATA": str(work), **PRECISION["float32"]}
    argv = []
    for arg in arguments(experiment):
        for name, value in values.items():
            arg = arg.replace(f"${name}", value)
        argv.append(arg)
    saved = torch.cuda.device_count
    torch.cuda.device_count = lambda: 1  # oat's validation counts the GPUs --gpus asks for
    try:
        return build_args([*argv, "--gpus", "1", "--ref-pretrain", str(work / "ref"), *extra])
    finally:
        torch.cuda.device_count = saved


def _cpu_strategy_class() -> type:
    import torch
    from oat.model import LLM
    from oat.utils.deepspeed import DeepspeedStrategy, get_optimizer_grouped_parameters

    class CPUEngine(torch.nn.Module):
        """STAND-IN for DeepSpeed 0.16.8's ``DeepSpeedEngine`` with oat's config (see the module docstring);
        ``rows`` are the ids of the micro-batches since the last optimizer step, ``step_rows`` those of each step."""

        def __init__(self, module: Any, optimizer: Any, scheduler: Any, config: dict[str, Any], world_size: int):
            super().__init__()
            self.module = module
            self.optimizer, self.lr_scheduler = optimizer, scheduler
            self.clip = float(config["gradient_clipping"])
            self.micro, self.dp_world_size = config["train_micro_batch_size_per_gpu"], world_size
            self.micro_steps = 0
            self.rows: list[tuple[int, ...]] = []
            self.step_rows: list[list[tuple[int, ...]]] = []
            self.set_train_batch_size(config["train_batch_size"])  # deepspeed.initialize's batch check: the same rule

        def __getattr__(self, name: str) -> Any:
            try:
                return super().__getattr__(name)
            except AttributeError:  # DeepSpeedEngine.__getattr__: the model's attributes pass through
                return getattr(super().__getattr__("module"), name)

        def train_micro_batch_size_per_gpu(self) -> int:
            return self.micro

        def gradient_accumulation_steps(self) -> int:
            return self.accumulation

        def set_train_batch_size(self, train_batch_size: int) -> None:
            if train_batch_size % (self.micro * self.dp_world_size):
                raise ValueError("Train batch size must be divisible by micro-batch data parallelism")
            self.accumulation = train_batch_size // (self.micro * self.dp_world_size)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.module(*args, **kwargs)

        def backward(self, loss: Any) -> None:
            (loss / self.accumulation).backward()  # each micro-batch's loss by 1/gas

        def step(self) -> None:
            if (self.micro_steps + 1) % self.accumulation == 0:  # the accumulation boundary only
                if self.clip > 0:
                    torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clip)
                self.optimizer.step()
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step_rows.append(self.rows)
                self.rows = []
            self.micro_steps += 1

    class CPUStrategy(DeepspeedStrategy):
        """STAND-IN for the DeepSpeed parts of oat's strategy (see the module docstring); every other method is oat's."""

        def setup_distributed(self, timeout: Any = None) -> None:
            import torch.distributed as dist

            self.set_seed(self.seed)
            self.world_size = dist.get_world_size()
            self.grad_acc_step = self.train_batch_size // self.train_batch_size_per_device // self.world_size  # oat's own

        def create_optimizer(self, model: Any, **kwargs: Any) -> Any:
            module = model.model if isinstance(model, LLM) else model
            groups = get_optimizer_grouped_parameters(module, kwargs["weight_decay"])
            return torch.optim.AdamW(groups, lr=kwargs["lr"], betas=kwargs["betas"], eps=1e-8)  # FusedAdam's adam_w_mode

        def prepare(self, *pairs: Any) -> Any:
            out = []
            for pair in pairs:
                if not isinstance(pair, tuple):
                    out.append(pair)  # a frozen model: float32 on one CPU, forward only
                    continue
                model, optimizer, scheduler = pair
                wrapped = isinstance(model, LLM)
                engine = CPUEngine(model.model if wrapped else model, optimizer, scheduler, self.get_ds_train_config(wrapped), self.world_size)
                if wrapped:
                    model.model = engine
                else:
                    model = engine
                out.append((model, optimizer, scheduler))
            return out[0] if len(out) == 1 else out

        def get_gradient_norm(self, model: Any, **_: Any) -> Any:
            grads = [p.grad.detach().norm(2) ** 2 for p in self._unwrap_model(model).parameters() if p.grad is not None]
            return torch.stack(grads).sum().sqrt() if grads else torch.tensor(0.0)

    return CPUStrategy


class _HandBack:
    """STAND-IN for oat's plasma IPC client (no plasma store on CPU): the object itself crosses."""

    def serialize_ipc(self, data: Any) -> Any:
        return data

    def deserialize_ipc(self, data: Any) -> Any:
        return data


class _NoZeRO3Gather:
    """STAND-IN for ``deepspeed.zero.GatheredParameters``, which oat enables at ZeRO-3 only (its default is 2)."""

    def __init__(self, params: Any, enabled: bool = True):
        if enabled:
            raise NotImplementedError("ZeRO-3 gathering does not run on CPU")

    def __enter__(self) -> _NoZeRO3Gather:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


@contextlib.contextmanager
def _on_cpu() -> Any:
    """A one-process gloo group (unless one is up), CUDA's device calls answered for the CPU, DeepSpeed's ZeRO-3
    gather a no-op in oat's PPO module; all put back afterwards."""
    import oat.algorithms.ppo as oat_ppo

    saved_deepspeed = oat_ppo.deepspeed
    oat_ppo.deepspeed = types.SimpleNamespace(zero=types.SimpleNamespace(GatheredParameters=_NoZeRO3Gather))
    try:
        with one_process_group():
            yield
    finally:
        oat_ppo.deepspeed = saved_deepspeed


def _actor(args: Any, trajectories: list[Any], tokenizer: Any) -> Any:
    """GemActor as oat's ``ActorBase.__init__``/``init`` leave it, its task cycle the recorded episodes' starts."""
    from gem_core.tasks import TaskSpec
    from gem_core.testing.vllm_engine import VLLMSamplingParams
    from gem_integrations.oat.rollout import GemActor, TaskCycle

    actor = GemActor(ipc_server=None, vllm_args={}, args=args)  # oat's own __init__
    actor.sampling_params = VLLMSamplingParams(
        max_tokens=args.generate_max_length, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, n=1, logprobs=1
    )
    actor.llm = None  # no engine: the generation is replayed (the window is then the episodes' own)
    actor.tokenizer = tokenizer
    actor.ipc_client = _HandBack()
    actor.gem_tasks = TaskCycle([TaskSpec(t.env_id, seed=t.seed) for t in trajectories])
    return actor


def _learner(args: Any, strategy: Any, tokenizer: Any, actor: Any) -> Any:
    """GemLearner with what oat's ``LearnerBase``/``RLLearner``/``PPOLearner``/``PPOMultiTurnLearner._init`` set,
    through oat's own classes and functions (the DeepSpeed parts replaced: see the module docstring)."""
    import math

    from oat.algorithms.ppo_multiturn import MultiTurnFeedbackCollector, MultiTurnTransitionDataset
    from oat.model import LLM
    from oat.utils.ops import disable_dropout, masked_mean, masked_sum
    from transformers.trainer import get_scheduler

    from gem_integrations.oat.advantage import GemLearner

    learner = GemLearner.__new__(GemLearner)  # oat's __init__/_init launch DeepSpeed and launchpad
    learner.args, learner.strategy, learner.tokenizer, learner.actors = args, strategy, tokenizer, [actor]
    learner.model = LLM(args.pretrain, use_flash_attention_2=args.flash_attn, bf16=args.bf16, fp16=args.fp16)
    disable_dropout(learner.model)
    learner.pi_buffer = deque(maxlen=args.pi_buffer_maxlen_per_device)
    learner.all_buffer = deque(maxlen=int(1e9))
    learner.optimizer = strategy.create_optimizer(learner.model, lr=args.learning_rate, betas=(args.adam_beta_1, args.adam_beta_2), weight_decay=args.l2)
    steps = 1_000_000  # the schedule's length (oat: epochs of its prompt data); the mapping's constant schedule ignores it
    learner.scheduler = get_scheduler(args.lr_scheduler, learner.optimizer, num_warmup_steps=math.ceil(steps * args.lr_warmup_ratio), num_training_steps=steps)
    learner.ref_model = None
    if args.beta > 0 or args.kl_penalty_coef > 0:  # RLLearner._init's condition
        learner.ref_model = LLM(args.ref_pretrain, use_flash_attention_2=args.flash_attn, bf16=args.bf16, fp16=args.fp16)
        disable_dropout(learner.ref_model)
        learner.ref_model.eval()
    learner.model, learner.optimizer, learner.scheduler = strategy.prepare((learner.model, learner.optimizer, learner.scheduler))
    learner.critic = None  # --critic-type grpo: no critic
    learner.masked_aggregator = (  # PPOLearner._init's choice
        functools.partial(masked_sum, constant_normalizer=args.generate_max_length) if args.critic_type == "drgrpo" else masked_mean
    )
    learner.dataset_builder = MultiTurnTransitionDataset  # PPOMultiTurnLearner._init
    learner.collector = MultiTurnFeedbackCollector(args, [actor], _HandBack())
    learner.global_step = learner.policy_sgd_step = learner.query_step = 0
    learner.gradient_update_st = 0.0
    return learner


def run(work: str | Path, experiment: Experiment, fault: str | None = None) -> Update:
    """One update of oat on the recorded batch in ``work``; ``fault`` injects one mistake on oat's side, in its
    parsed arguments (``lr``: twice the rate; ``kl``: ``--beta`` 0; ``clip``: half ``--cliprange``;
    ``aggregation``: the other critic-free loss, ``--critic-type drgrpo`` (each row's token sum over
    ``--generate-max-length``); ``infra``: the failed episode's flag dropped, so the actor keeps it). The stats
    record the ``--train-batch-size`` oat ran with (the plugin's)."""
    if str(STUBS) not in sys.path:
        sys.path.insert(0, str(STUBS))
    import oat_stubs  # noqa: F401  (IMPORT STUB: installs the placeholders before oat's modules load)

    import numpy as np
    import torch
    from oat.algorithms.ppo_multiturn import PPOMultiTurnLearner

    import gem_integrations.oat.rollout as oat_rollout
    from gem_core.batch import turn_batch
    from tier1.batch import INFRA_EPISODE, load, tokenizer

    work = Path(work)
    e = experiment
    recorded = load(work)
    trajectories = recorded.trajectories
    if fault == "infra":
        trajectories[INFRA_EPISODE] = dataclasses.replace(trajectories[INFRA_EPISODE], infra_error=None)
    args = parsed_arguments(e, work)
    if fault == "lr":
        args.learning_rate *= 2
    elif fault == "kl":
        args.beta = 0.0
    elif fault == "clip":
        args.cliprange /= 2
    elif fault == "aggregation":
        args.critic_type = "drgrpo" if args.critic_type == "grpo" else "grpo"
    elif fault not in (None, "infra"):
        raise ValueError(f"unknown fault {fault!r}")
    tok = tokenizer()
    rows = turn_batch(recorded.trajectories, pad_id=tok.pad_token_id)  # the reference's layout (flags as recorded)
    keys = [tuple(p) + tuple(rows.response_ids[i, : rows.lengths[i]].tolist()) for i, p in enumerate(rows.prompt_ids)]

    async def replay(specs: Any, policy: Any, tokenizer: Any, params: Any, **kwargs: Any) -> list[Any]:
        if [(s.env_id, s.seed) for s in specs] != [(t.env_id, t.seed) for t in trajectories]:
            raise ValueError("the actor asked for other episodes than the recorded ones")
        return list(trajectories)

    seen: dict[str, Any] = {}
    oat_step = PPOMultiTurnLearner.learning_step

    def observed_step(self: Any, trajectory: Any) -> Any:
        seen["advantages"] = [float(a) for a in trajectory["advantages"]]
        seen["dtype"] = str(torch.tensor(trajectory["advantages"]).dtype).replace("torch.", "")
        seen["batch"] = trajectory
        return oat_step(self, trajectory)

    saved_play = oat_rollout.play
    with _on_cpu():
        oat_rollout.play = replay
        PPOMultiTurnLearner.learning_step = observed_step
        try:
            actor = _actor(args, trajectories, tok)
            feedback, _ = _collect(actor, args)
            from oat.utils.deepspeed import get_strategy

            _, made = get_strategy(args)  # oat's own: DeepspeedStrategy from the args
            strategy = _cpu_strategy_class()(
                seed=made.seed,
                max_norm=made.max_norm,
                train_batch_size_per_device=made.train_batch_size_per_device,
                train_batch_size=made.train_batch_size,
                zero_stage=made.stage,
                bf16=made.bf16,
                fp16=made.fp16,
                args=args,
            )
            strategy.setup_distributed()
            learner = _learner(args, strategy, tok, actor)
            engine, policy = learner.model.model, strategy._unwrap_model(learner.model)  # CPUEngine, the model in it
            start = {name: p.detach().clone() for name, p in policy.named_parameters()}
            oat_logps = learner.get_batch_logps

            def logps(model: Any, input_ids: Any, att_mask: Any, temperature: float = 1.0, compute_entropy: bool = False) -> Any:
                if compute_entropy and model is learner.model:  # the policy's forward of a micro-batch that trains
                    engine.rows.extend(tuple(ids[mask.bool()].tolist()) for ids, mask in zip(input_ids, att_mask))
                return oat_logps(model=model, input_ids=input_ids, att_mask=att_mask, temperature=temperature, compute_entropy=compute_entropy)

            learner.get_batch_logps = logps
            learner.process_feedback_data(feedback)  # GemLearner's, then oat's: returns, (no) subsampling, the buffer
            info = learner.learn(1)
            deltas = {name: (p.detach() - start[name]).double().numpy() for name, p in policy.named_parameters()}
        finally:
            oat_rollout.play = saved_play
            PPOMultiTurnLearner.learning_step = oat_step

    # the advantages learning_step applied, on the reference's layout (turn rows x response tokens)
    batch = seen["batch"]
    advantages = np.zeros(rows.response_ids.shape, dtype=np.float64)
    used: set[int] = set()
    applied = []
    for k in range(batch["input_ids"].shape[0]):
        key = tuple(batch["input_ids"][k][batch["attention_mask"][k].bool()].tolist())
        i = _match(key, keys, used, batch["action_logprobs"][k], rows)
        applied.append(i)
        advantages[i, : rows.lengths[i]] = seen["advantages"][k]
    # each optimizer step's micro-batches (their ids) as oat's batch rows, then as the reference's rows
    ids = [tuple(batch["input_ids"][k][batch["attention_mask"][k].bool()].tolist()) for k in range(len(applied))]
    steps = [[applied[k] for k in _step_rows(step, ids)] for step in engine.step_rows]
    if engine.rows:
        raise ValueError(f"{len(engine.rows)} micro-batches trained after the last optimizer step")
    stats = [{"pg_loss": float(info.get("train/pg_loss", float("nan"))), "turn_rows": float(len(applied)), "train_batch_size": float(args.train_batch_size)}]
    return Update(advantages, deltas, steps, seen["dtype"], stats)


def _collect(actor: Any, args: Any) -> tuple[list[list[Any]], dict[str, Any]]:
    """oat's ``MultiTurnFeedbackCollector.collect_feedback``: the actor's ``step`` (oat's), its episodes handed back."""
    from oat.algorithms.ppo_multiturn import MultiTurnFeedbackCollector

    collector = MultiTurnFeedbackCollector(args, [actor], _HandBack())
    return collector.collect_feedback([""], [""], [""], None)


def _match(key: tuple[int, ...], keys: list[tuple[int, ...]], used: set[int], logprobs: Any, rows: Any) -> int:
    """The reference's turn row of oat's row ``key`` (ids), told apart from an identical one by its rollout
    log-probs; the first not yet taken."""
    import numpy as np

    for i, k in enumerate(keys):
        if i in used or k != key:
            continue
        n = rows.lengths[i]
        if rows.logprobs is None or np.allclose(np.asarray(logprobs, dtype=np.float64), rows.logprobs[i, :n], atol=1e-6):
            used.add(i)
            return i
    raise ValueError("a row oat trained on that is not a recorded turn")


def _step_rows(step: list[tuple[int, ...]], ids: list[tuple[int, ...]]) -> list[int]:
    """oat's batch row of each micro-batch of one optimizer step (identical rows: the first not yet taken; each
    row trains once a pass, so any choice among identical rows gives the step the same rows)."""
    used: set[int] = set()
    out = []
    for key in step:
        match = next((k for k, other in enumerate(ids) if k not in used and other == key), None)
        if match is None:
            raise ValueError("an optimizer step's row that is not in oat's batch")
        used.add(match)
        out.append(match)
    return out
