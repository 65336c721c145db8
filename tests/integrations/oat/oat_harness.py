"""Builds oat's actor and learner objects around test stand-ins, without vLLM, DeepSpeed or a GPU.

What is oat's own code: ``PPOMultiTurnActor.step`` and ``ActorBase.generate`` (the actor), and
``PPOMultiTurnLearner.process_feedback_data``, ``compute_advantages``, ``MultiTurnTransitionDataset`` and
its ``collate_fn``, ``learning_step`` and ``DeepspeedStrategy.all_reduce`` (the learner). Stand-ins: the
vLLM ``LLM`` (gem_core.testing's VLLMFaithfulLLM), the plasma IPC client (hands the episodes back), the
model's log-probabilities (``get_batch_logps``: zeros, so every PPO ratio is 1 and the loss per token is
``-advantage``), the optimizer steps (no-ops) and ``torch.cuda.current_device`` (``"cpu"``).
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


class _Strategy:
    """oat's DeepspeedStrategy where learning_step touches it: all_reduce is oat's own method."""

    def __init__(self, world_size: int):
        from oat.utils.deepspeed import DeepspeedStrategy

        self.world_size = world_size
        self.grad_acc_step = 1
        self.args = types.SimpleNamespace(dry_run=False)
        self.all_reduce = types.MethodType(DeepspeedStrategy.all_reduce, self)

    def is_rank_0(self) -> bool:
        return True

    def backward(self, loss, model, optimizer) -> None:
        pass

    def optimizer_step(self, optimizer, model, scheduler) -> None:
        pass

    def get_gradient_norm(self, model) -> float:
        return 0.0


def make_learner(args: Any, world_size: int = 1) -> Any:
    """A GemLearner with the attributes PPOMultiTurnLearner's methods read (oat's __init__ launches DeepSpeed)."""
    from gem_integrations.oat.advantage import GemLearner

    learner = GemLearner.__new__(GemLearner)
    learner.args = args
    learner.critic = None
    learner.ref_model = None
    learner.model = None
    learner.optimizer = learner.scheduler = None
    learner.pi_buffer, learner.all_buffer, learner.query_step = [], [], 0
    learner.strategy = _Strategy(world_size)
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
