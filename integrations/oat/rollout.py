"""oat's ``PPOMultiTurnActor`` over gem_core's runner (oat-llm 0.2.4, ``oat/algorithms/ppo_multiturn.py``).

Checked against real code: oat's ``PPOMultiTurnActor.step`` calls the one abstract method
``collect_experience() -> (episodes, info)``, each episode a list of ``oat.types.Transition`` (``obs,
action, rewards, done, prompt, prompt_ids, response, response_ids, response_logprobs,
response_is_truncated, action_is_formatted, loss_mask, info``), then ``transition.info.update(...)`` on
every transition (``info`` must be a dict) and oat's collector averages every ``info`` key over all
transitions (``tree.map_structure(np.mean, ...)``): so every transition's ``info`` has the same keys,
all numbers. The engine is oat's own ``ActorBase.generate(prompt_token_ids, sampling_params)`` over its
``vllm.LLM`` (vLLM 0.8.4's offline API, token prompts in one batch).

* :class:`OatEnginePolicy`: the runner's requests of one loop iteration go to vLLM as one batch, each
  with its own copy of oat's ``sampling_params`` (gem_core's ``max_tokens`` and the template's stop
  tokens, ``n=1``, ``logprobs``); the answer is read from ``token_ids`` (the stop token kept). vLLM
  refuses a whole batch for one prompt that leaves no room in its ``max_model_len``: such a prompt is
  refused alone, and its episode ends as the runner's context limit (truncated, ``"context_limit"``),
  the others' requests answered.
* :func:`transitions`: a trajectory as oat's episode, one ``Transition`` per turn (the per-turn view:
  ``prompt_ids`` is the context at the turn's start, ``response_ids`` the model's tokens only).
* :class:`GemActor`: ``collect_experience`` plays ``gem_episodes_per_step`` task specs per call, under
  ``--gem-max-turns``, ``--gem-max-context-tokens`` and ``--gem-system-prompt`` where a spec (a
  ``--gem-dataset`` row) leaves them unset; a context left unset by both is capped at the engine's
  ``max_model_len``.
  Episodes the infrastructure failed (``Trajectory.infra_error``: the engine aborted a request, a
  sandbox or env worker died) are dropped there, so they are in neither oat's loss nor its whitening
  statistics, and counted: ``gem/infra_failed_episodes`` (and ``_fraction``) on every transition's
  ``info``, which oat's collector turns into the step's metrics. Episodes that played no turn (a
  context limit at the start) are dropped too. A step left with no episode raises (oat cannot take
  an empty batch).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from oat.algorithms.ppo_multiturn import PPOMultiTurnActor
from oat.types import Transition

from gem_core.batch import infra_metrics
from gem_core.plugins import EnginePolicy, copy_params, sampling_from_vllm
from gem_core.rollout import (
    ContextLimitExceeded,
    RunConfig,
    SamplingParams,
    Trajectory,
    answer_each,
    cached_formatter,
    engine_max_model_len,
    play_row,
)
from gem_core.tasks import TaskSpec

#: The keys of every transition's ``info`` (numbers only: oat averages them over the batch).
INFO_KEYS = (
    "gem/turn",
    "gem/num_turns",
    "gem/episode_return",
    "gem/terminated",
    "gem/truncated",
    "gem/context_limit",
    "gem/response_truncated",
    "gem/format_error",
)


class OatEnginePolicy(EnginePolicy):
    """A gem_core policy over oat's ``generate(list of prompt token ids, vllm.SamplingParams)``.

    Requests made in one event-loop iteration (every episode waiting on the model) are sent together,
    one ``generate`` call per distinct set of sampling params. ``base_params``: oat's sampling params
    (kept; each batch gets a copy). ``max_model_len``: the engine's window; a prompt that leaves no room
    in it is refused alone (:class:`ContextLimitExceeded`) instead of going to vLLM, which would refuse
    the whole batch (and a batch vLLM still refuses as over its window is split until the refusal is
    down to its own request: :func:`gem_core.rollout.answer_each`)."""

    def __init__(self, generate: Callable[[list[list[int]], Any], Sequence[Any]], base_params: Any, max_model_len: int | None = None):
        self._generate = generate
        self.base_params = base_params
        self.max_model_len = max_model_len
        self._pending: list[tuple[list[int], dict[str, Any], asyncio.Future]] = []
        self._scheduled = False
        self.batches: list[int] = []  # sizes of the generate calls made (for the actor's metrics)

    def turn_params(self, params: SamplingParams) -> dict[str, Any]:
        changes = self.vllm_params(params)
        changes["n"] = 1
        if getattr(self.base_params, "logprobs", None) is None:
            changes["logprobs"] = 1  # oat's learner needs the sampled tokens' logprobs
        return changes

    async def request(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((list(prompt_ids), self.turn_params(params), future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        groups: dict[str, list[tuple[list[int], dict[str, Any], asyncio.Future]]] = {}
        for item in pending:
            groups.setdefault(json.dumps(item[1], sort_keys=True, default=str), []).append(item)
        for items in groups.values():
            fitting = []
            for ids, changes, future in items:
                if self.max_model_len is not None and len(ids) >= self.max_model_len and not future.done():
                    future.set_exception(ContextLimitExceeded(f"a prompt of {len(ids)} tokens for max_model_len {self.max_model_len}"))
                else:
                    fitting.append((ids, changes, future))
            if not fitting:
                continue
            params = copy_params(self.base_params, fitting[0][1])
            try:
                outputs = answer_each(fitting, lambda part, params=params: self._call([ids for ids, _, _ in part], params))
            except BaseException as exc:  # every waiting episode gets the error
                for _, _, future in fitting:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, _, future), output in zip(fitting, outputs):
                if not future.done():
                    if isinstance(output, ContextLimitExceeded):
                        future.set_exception(output)  # this episode alone ends at its context limit
                    else:
                        future.set_result(output)

    def _call(self, prompts: list[list[int]], params: Any) -> list[Any]:
        outputs = list(self._generate(prompts, params))
        self.batches.append(len(prompts))
        return outputs


def transitions(trajectory: Trajectory, tokenizer: Any) -> list[Transition]:
    """The episode as oat's ``Transition`` list, every field filled and ``info`` with :data:`INFO_KEYS`."""
    out = []
    last = len(trajectory.turns) - 1
    for turn in trajectory.turns:
        context = trajectory.context_ids(turn.index)
        obs = trajectory.initial_message if turn.index == 0 else trajectory.turns[turn.index - 1].message
        info = {
            "gem/turn": float(turn.index),
            "gem/num_turns": float(len(trajectory.turns)),
            "gem/episode_return": float(trajectory.episode_return),
            "gem/terminated": float(trajectory.terminated),
            "gem/truncated": float(trajectory.truncated),
            "gem/context_limit": float(trajectory.truncation_reason == "context_limit"),
            "gem/response_truncated": float(turn.finish_reason == "length"),
            "gem/format_error": float(bool(turn.info.get("format_error", False))),
        }
        out.append(
            Transition(
                obs=obs,
                action=turn.action,
                rewards=float(turn.reward),
                done=bool(turn.index == last and trajectory.done),
                prompt=tokenizer.decode(context, skip_special_tokens=False),
                prompt_ids=list(context),
                response=turn.response_text,
                response_ids=list(turn.response_ids),
                response_logprobs=list(turn.logprobs) if turn.logprobs is not None else [0.0] * len(turn.response_ids),
                response_is_truncated=turn.finish_reason == "length",
                action_is_formatted=not turn.info.get("format_error", False),
                loss_mask=True,
                info=info,
            )
        )
    return out


async def play(
    specs: Sequence[TaskSpec],
    policy: Any,
    tokenizer: Any,
    params: SamplingParams,
    *,
    episode_ids: Sequence[str] | None = None,
    max_context_tokens: int | None = None,
) -> list[Trajectory]:
    """Every spec's episode at once on gem_core's runner (each spec's own limits and system prompt;
    ``max_context_tokens`` for the specs that set none)."""
    loop = asyncio.get_running_loop()

    async def one(index: int, spec: TaskSpec) -> Trajectory:
        env = await loop.run_in_executor(None, spec.make_env)  # made off the loop: a task env may load its data
        try:
            formatter = cached_formatter(tokenizer, system_prompt=spec.system_prompt)
            episode_id = episode_ids[index] if episode_ids else f"ep{index}"
            config = RunConfig(params=params, max_context_tokens=max_context_tokens)
            return await play_row(spec, policy, formatter, config, env=env, episode_id=episode_id)
        finally:
            env.close()

    return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(specs))))


class TaskCycle:
    """The specs the actor plays: a dataset's rows in order, or env ids round robin with rising seeds.
    ``fields`` (``max_turns``, ``max_context_tokens``, ``system_prompt``: the ``--gem-*`` flags) fill what a
    row leaves unset; a row's own value wins."""

    def __init__(self, specs: Sequence[TaskSpec] = (), env_ids: Sequence[str] = (), *, seed_start: int = 0, **fields: Any):
        if not specs and not env_ids:
            raise ValueError("the GEM actor needs --gem-dataset FILE or --gem-env ID [ID ...]")
        self.env_ids, self.fields, self.position, self.seed = list(env_ids), fields, 0, seed_start
        self.specs = [dataclasses.replace(spec, **{k: v for k, v in fields.items() if getattr(spec, k) is None}) for spec in specs]

    def take(self, n: int) -> list[TaskSpec]:
        out = []
        for _ in range(n):
            if self.specs:
                out.append(self.specs[self.position % len(self.specs)])
            else:
                out.append(TaskSpec(self.env_ids[self.position % len(self.env_ids)], seed=self.seed, **self.fields))
                self.seed += 1
            self.position += 1
        return out

    @classmethod
    def from_args(cls, args: Any) -> TaskCycle:
        fields = {
            k: v
            for k, v in (("max_turns", args.gem_max_turns), ("max_context_tokens", args.gem_max_context_tokens), ("system_prompt", args.gem_system_prompt))
            if v is not None
        }
        if args.gem_dataset:
            from gem_integrations.oat.dataset import read_specs

            return cls(read_specs(args.gem_dataset), **fields)
        return cls(env_ids=args.gem_env, seed_start=args.gem_seed_start, **fields)


class GemActor(PPOMultiTurnActor):
    """oat's multi-turn actor playing GEM envs. ``init`` is oat's (vLLM, tokenizer, sampling params),
    then the task cycle from the args (:class:`~gem_integrations.oat.args.GemArgs`)."""

    def init(self, actor_id: Any, save_path: Any) -> None:
        super().init(actor_id, save_path)
        self.gem_tasks = TaskCycle.from_args(self.args)

    def collect_experience(self) -> tuple[list[list[Transition]], dict[str, Any]]:
        specs = self.gem_tasks.take(int(self.args.gem_episodes_per_step))
        window = engine_max_model_len(self.llm)  # the default context cap: what the engine can take
        policy = OatEnginePolicy(self.generate, self.sampling_params, max_model_len=window)
        params = sampling_from_vllm(self.sampling_params, self.sampling_params.max_tokens)
        trajectories = asyncio.run(play(specs, policy, self.tokenizer, params, max_context_tokens=window))
        kept = [t for t in trajectories if t.infra_error is None and t.turns]  # no turn: no transition for oat
        if not kept:
            failed = [t.infra_error for t in trajectories if t.infra_error is not None]
            why = f"{len(failed)} failed on the infrastructure (e.g. {failed[0]})" if failed else "none played a turn"
            raise RuntimeError(f"no GEM episode of this step ({len(trajectories)}) can be trained on: {why}")
        episodes = [transitions(t, self.tokenizer) for t in kept]
        info = {
            "actor/gem_num_episodes": float(len(trajectories)),
            "actor/gem_truncated": float(np.mean([t.truncated for t in trajectories])),
            "actor/gem_generate_calls": float(len(policy.batches)),
            "actor/gem_mean_batch": float(np.mean(policy.batches)) if policy.batches else math.nan,
            **infra_metrics(trajectories),
        }
        return episodes, info
