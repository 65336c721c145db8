"""Builds oat's actor and learner objects around test stand-ins, without vLLM, DeepSpeed or a GPU.

What is oat's own code: ``PPOMultiTurnActor.step`` and ``ActorBase.generate`` (the actor), and
``PPOMultiTurnLearner.process_feedback_data``, ``compute_advantages``, ``MultiTurnTransitionDataset`` and
its ``collate_fn``, ``learning_step`` and ``DeepspeedStrategy.all_reduce`` (the learner). Stand-ins: the
vLLM ``LLM`` (gem_core.testing's VLLMFaithfulLLM), the plasma IPC client (hands the episodes back), the
model's log-probabilities (``get_batch_logps``: zeros, so every PPO ratio is 1 and the loss per token is
``-advantage``), the backward (a no-op: those losses have no gradient), DeepSpeed's engine (:class:`EngineStandIn`,
over no weights: its accumulation, so that the optimizer steps oat's ``optimizer_step`` calls are counted where
DeepSpeed would take them) and ``torch.cuda.current_device`` (``"cpu"``).
"""

from __future__ import annotations

import types
from typing import Any

import oat_stubs  # noqa: F401
import torch

from gem_core.testing.golden import golden_respond
from gem_core.testing.vllm_engine import ScriptedModel, VLLMFaithfulEngine, VLLMFaithfulLLM, VLLMSamplingParams


def gem_args(**changes: Any) -> Any:
    from gem_integrations.oat.args import GemArgs

    args = GemArgs()
    args.beta = 0.0  # no reference model here (the KL term does not touch the advantages)
    args.num_samples = 1  # one response per request, as the launcher sets it
    for name, value in changes.items():
        setattr(args, name, value)
    return args


class _HandBack:
    """Stand-in for oat's PlasmaShmClient: serialize_ipc returns the object itself."""

    def serialize_ipc(self, data: Any) -> Any:
        return data


def make_actor(tokenizer: Any, specs: list, *, max_tokens: int, max_model_len: int = 8192) -> Any:
    """A GemActor as oat's ``ActorBase.__init__`` and ``init`` leave it, with a vLLM-faithful LLM whose
    context window is ``max_model_len``."""
    from gem_integrations.oat.rollout import GemActor, TaskCycle

    args = gem_args(generate_max_length=max_tokens, gem_episodes_per_step=len(specs))
    actor = GemActor(ipc_server=None, vllm_args={}, args=args)  # oat's own __init__
    actor.sampling_params = VLLMSamplingParams(max_tokens=max_tokens, temperature=1.0, top_p=1.0, top_k=-1, n=1)
    actor.sampling_params.logprobs = 1  # as oat's RewardActor.init sets it
    actor.llm = VLLMFaithfulLLM(VLLMFaithfulEngine(ScriptedModel(tokenizer, golden_respond), max_model_len=max_model_len))
    actor.tokenizer = tokenizer
    actor.use_lora_req = False
    actor.ipc_client = _HandBack()
    actor.gem_tasks = TaskCycle(specs)
    return actor


class EngineStandIn(torch.nn.Module):
    """STAND-IN for DeepSpeed 0.16.8's ``DeepSpeedEngine`` where oat's learner meets it (DeepSpeed is an import stub
    here), read in DeepSpeed's ``runtime/engine.py``: it wraps the model (``module``; other attributes pass through,
    as the engine's ``__getattr__`` lets them); ``train_batch_size`` must divide by micro-batch x devices and the
    quotient is the gradient accumulation (``deepspeed.initialize``'s check, and ``set_train_batch_size``'s, which
    changes it); ``backward`` divides the loss by the accumulation; ``step`` clips the gradient's norm to
    ``max_norm``, steps the optimizer and the scheduler and zeroes the gradients at the accumulation boundary only,
    ``(micro_steps + 1) % accumulation == 0``, its micro-step counter running since it was built. Not DeepSpeed's:
    ``steps``, the micro-batches (``step`` calls) each optimizer step took."""

    def __init__(self, module, optimizer=None, scheduler=None, *, train_batch_size: int, micro_batch_size: int = 1, world_size: int = 1, max_norm: float = 0.0):
        super().__init__()
        self.module = module
        self.optimizer, self.lr_scheduler, self.max_norm = optimizer, scheduler, max_norm
        self.micro_batch_size, self.dp_world_size = micro_batch_size, world_size
        self.micro_steps = self.global_steps = 0
        self.steps: list[int] = []
        self._calls = 0
        self.set_train_batch_size(train_batch_size)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("module"), name)

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.micro_batch_size

    def gradient_accumulation_steps(self) -> int:
        return self._accumulation

    def set_train_batch_size(self, train_batch_size: int) -> None:
        if train_batch_size % (self.micro_batch_size * self.dp_world_size):
            raise ValueError("Train batch size must be divisible by micro-batch data parallelism")
        self._accumulation = train_batch_size // (self.micro_batch_size * self.dp_world_size)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss) -> None:
        (loss / self._accumulation).backward()

    def step(self) -> None:
        self._calls += 1
        if (self.micro_steps + 1) % self._accumulation == 0:
            if self.optimizer is not None:
                if self.max_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            self.global_steps += 1
            self.steps.append(self._calls)
            self._calls = 0
        self.micro_steps += 1


class _Strategy:
    """oat's DeepspeedStrategy where learning_step touches it: all_reduce and optimizer_step (the engine's step) are
    oat's own methods; backward does nothing (the stand-in log-probabilities carry no gradient); ``grad_acc_step`` as
    oat's ``setup_distributed`` sets it (:func:`make_learner`)."""

    def __init__(self, world_size: int):
        from oat.utils.deepspeed import DeepspeedStrategy

        self.world_size = world_size
        self.args = types.SimpleNamespace(dry_run=False)
        self.all_reduce = types.MethodType(DeepspeedStrategy.all_reduce, self)
        self.optimizer_step = types.MethodType(DeepspeedStrategy.optimizer_step, self)

    def is_rank_0(self) -> bool:
        return True

    def backward(self, loss, model, optimizer) -> None:
        pass

    def get_gradient_norm(self, model) -> float:
        return 0.0


def make_learner(args: Any, world_size: int = 1) -> Any:
    """A GemLearner with the attributes PPOMultiTurnLearner's methods read (oat's __init__ launches DeepSpeed); its
    model is DeepSpeed's engine (:class:`EngineStandIn`) over no weights, built from ``args.train_batch_size``."""
    from gem_integrations.oat.advantage import GemLearner

    learner = GemLearner.__new__(GemLearner)
    learner.args = args
    learner.critic = None
    learner.ref_model = None
    learner.model = EngineStandIn(
        torch.nn.Module(), train_batch_size=args.train_batch_size, micro_batch_size=args.train_batch_size_per_device, world_size=world_size
    )
    learner.optimizer = learner.scheduler = None
    learner.pi_buffer, learner.all_buffer, learner.query_step = [], [], 0
    learner.strategy = _Strategy(world_size)
    learner.strategy.grad_acc_step = args.train_batch_size // args.train_batch_size_per_device // world_size  # oat's setup_distributed
    from oat.utils.ops import masked_mean

    learner.masked_aggregator = masked_mean
    return learner


def learner_advantages(learner: Any, episodes: list, tokenizer: Any) -> list[tuple[tuple[int, ...], float]]:
    """oat's process_feedback_data, dataset, collate_fn and learning_step; returns, per transition kept,
    (its input ids, the advantage learning_step applied to its tokens)."""
    from oat.algorithms.ppo_multiturn import MultiTurnTransitionDataset

    learner.process_feedback_data(episodes)
    dataset = MultiTurnTransitionDataset(learner.pi_buffer, tokenizer, learner.strategy)
    batch = dataset.collate_fn([dataset[i] for i in range(len(dataset))])
    seen: list[tuple[int, ...]] = []
    applied: list[tuple[tuple[int, ...], float]] = []

    def get_batch_logps(model, input_ids, att_mask, temperature=1.0, compute_entropy=False):
        if compute_entropy:
            seen.append(tuple(int(t) for t in input_ids[0][att_mask[0].bool()]))
        zeros = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1)
        return zeros, (zeros.clone() if compute_entropy else None)

    def aggregate(values, mask, axis=None):
        per_token = values[mask.bool()]
        assert torch.isfinite(per_token).all(), f"a non-finite advantage reached the loss: {per_token.tolist()[:4]}"
        assert torch.allclose(per_token, per_token[0].expand_as(per_token)), "one advantage per turn, on every token"
        applied.append((seen[-1], -float(per_token[0])))
        return masked_mean_(values, mask, axis=axis)

    from oat.utils.ops import masked_mean as masked_mean_

    learner.get_batch_logps = get_batch_logps
    learner.masked_aggregator = aggregate
    original = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # stand-in: the learner's tensors stay on CPU
    try:
        learner.learning_step(batch)
    finally:
        torch.cuda.current_device = original
    return applied
