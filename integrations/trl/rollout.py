"""TRL's ``rollout_func`` over gem_core's runner: one GEM episode per completion, TRL's generation as the policy.

    trainer = GRPOTrainer(model, reward_funcs=episode_return, args=GRPOConfig(...),
                          train_dataset=make_dataset("game:GuessTheNumber-v0-easy", 256),
                          rollout_func=GemRollout())

TRL 1.16 calls ``rollout_func(prompts, trainer)`` with this process's prompts (each dataset row
repeated ``num_generations`` times) and takes ``prompt_ids``, ``completion_ids`` and ``logprobs``
from the dict it returns, ``env_mask`` as the loss mask of the completion (0 on environment tokens),
and hands every other key to the reward functions (and puts it on each input row). A completion here
is a whole episode in the sequence view (DESIGN.md contract 5): every response, then the tokens the
env added after it; the prompt is the first context (chat template of the env's first message).

What :class:`GemRollout` returns, one entry per prompt:

* ``prompt_ids``, ``completion_ids``, ``logprobs`` (0.0 on env tokens; ``None`` for the whole batch
  when the policy reports none), ``env_mask``;
* ``gem_turn_ids`` (each completion token's turn, -1 on none), ``gem_turn_rewards`` (one reward per
  turn), which :class:`~gem_integrations.trl.trainer.GemGRPOTrainer` turns into ReBN advantages;
* ``gem_return`` (the episode's return: :func:`episode_return` hands it to TRL as the reward),
  ``gem_success``, ``gem_num_turns``, ``gem_truncation`` (``""`` or the reason), ``gem_episode_id``,
  ``gem_group_id`` (TRL's prompt group: the global row index // ``num_generations``), ``gem_env_id``.

The policy is TRL's own generation: :class:`TRLGeneratePolicy` (the training model's ``generate``
with TRL's ``generation_config``) unless ``use_vllm``; then :class:`TRLVLLMPolicy` over TRL's vLLM
client (server mode, HTTP per process) or its colocated ``LLM`` (TRL syncs the weights before calling
the rollout function). Limits: each response within the spec's ``max_turn_tokens``, else the rollout's,
else TRL's ``max_completion_length``; the whole completion (responses and env tokens) within
``max_completion_length`` and the prompt plus completion within the spec's ``max_context_tokens``:
when the next observation would not fit, the episode ends as truncated (``context_limit``), every
reward earned before kept. An episode whose first message alone does not fit has no turn: its
completion is one pad token with ``env_mask`` 0 (TRL needs a token; it carries no loss).

Observation modes: TRL's one-row-per-trajectory shape is the sequence view, so the GEM envs fit whose
observations are text and whose messages are deltas appended to the context (every game, math, code,
QA and tool env through :func:`gem_core.model_message`). GEM's per-turn samples (one row per turn) do
not fit a ``rollout_func``, which returns one completion per prompt; ReBN's advantages are the same per
token either way. Multi-modal (dict) observations are refused by the runner.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gem_core.core import model_message
from gem_core.plugins import EnginePolicy, PluginError
from gem_core.rollout import ChatFormatter, Generation, HFPolicy, RunConfig, SamplingParams, Trajectory, cached_formatter, run_episode
from gem_core.rollout.runner import as_async_env
from gem_core.tasks import TaskSpec
from gem_integrations.trl.dataset import task_of

TURN_IDS = "gem_turn_ids"
TURN_REWARDS = "gem_turn_rewards"
RETURN = "gem_return"
GROUP_ID = "gem_group_id"


# ------------------------------------------------------------------------------------------------
# Policies: TRL's generation as a gem_core Policy.
# ------------------------------------------------------------------------------------------------


class TRLGeneratePolicy(HFPolicy):
    """The training model's ``generate`` with TRL's ``generation_config`` (what ``GRPOTrainer`` samples
    with when ``use_vllm`` is off), batched like :class:`~gem_core.rollout.HFPolicy`.

    Per turn, a copy of the config gets the request's ``max_tokens`` (``max_new_tokens``), temperature,
    top-p and top-k, and the request's stop tokens next to TRL's ``eos_token_id``; the response is cut
    after its first stop token, as TRL cuts after EOS. ``logprobs``: the chosen tokens'
    ``log_softmax(logits / temperature)`` from the raw logits, the same quantity TRL's loss recomputes.
    """

    def __init__(self, model: Any, generation_config: Any, *, max_batch_size: int = 64, pad_token_id: int | None = None):
        super().__init__(model, max_batch_size=max_batch_size, pad_token_id=pad_token_id)
        self.generation_config = generation_config

    def _generate_batch(self, batch: list[Any]) -> list[Generation]:
        torch = self.torch
        lengths = [len(r.prompt_ids) for r in batch]
        width = max(lengths)
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for b, request in enumerate(batch):
            input_ids[b, width - lengths[b] :] = torch.tensor(request.prompt_ids, dtype=torch.long)
            attention[b, width - lengths[b] :] = 1
        params: SamplingParams = batch[0].params
        config = copy.deepcopy(self.generation_config)
        eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id] if config.eos_token_id is not None else []
        stops = list(dict.fromkeys([*eos, *params.stop_token_ids]))
        config.eos_token_id = stops
        config.max_new_tokens = max(r.params.max_tokens for r in batch)
        if params.temperature == 0:
            config.do_sample = False
        else:
            config.temperature, config.top_p = params.temperature, params.top_p
        if params.top_k:
            config.top_k = params.top_k
        with torch.inference_mode():  # thread-local: set here, in the generation thread
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                generation_config=config,
                return_dict_in_generate=True,
                output_logits=True,
            )
        new = out.sequences[:, width:].cpu()
        temperature = params.temperature if params.temperature > 0 else 1.0
        logp = torch.stack([torch.log_softmax(step.float() / temperature, dim=-1) for step in out.logits], dim=1).cpu()
        stop_set = set(stops)
        results = []
        for b, request in enumerate(batch):
            ids: list[int] = []
            for token in new[b].tolist():
                ids.append(int(token))
                if token in stop_set or len(ids) >= request.params.max_tokens:
                    break
            chosen = logp[b, torch.arange(len(ids)), torch.tensor(ids, dtype=torch.long)].tolist()
            finish = "stop" if ids and ids[-1] in stop_set else "length"
            results.append(Generation(ids, chosen, finish))
        return results


@dataclass
class _Pending:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future


class TRLVLLMPolicy(EnginePolicy):
    """TRL's vLLM generation (``trainer.vllm_generation``) as a gem_core policy.

    Server mode: the requests of one tick with the same ``max_tokens`` go to TRL's ``VLLMClient.generate``
    as one call (prompts as token ids, ``n=1``, ``logprobs=0``, TRL's sampling settings, the turn's stop
    tokens in ``generation_kwargs``), in a thread; each process calls its server itself (no collective).
    Colocate mode: the same batches go to the colocated ``vllm.LLM.generate`` with a
    ``vllm.SamplingParams``. The answer is read from its token ids (vLLM keeps the stop token there),
    never its text. Sleep mode and tensor parallelism in colocate mode need collectives around every
    call and are refused.
    """

    def __init__(self, vllm_generation: Any):
        self.vg = vllm_generation
        self.mode = getattr(vllm_generation, "mode", None)
        if self.mode == "colocate":
            if getattr(vllm_generation, "enable_sleep_mode", False):
                raise PluginError("trl: the gem rollout does not support vllm_enable_sleep_mode in colocate mode")
            if getattr(vllm_generation, "tensor_parallel_size", 1) > 1:
                raise PluginError("trl: the gem rollout does not support vllm_tensor_parallel_size > 1 in colocate mode")
        elif self.mode != "server":
            raise PluginError(f"trl: unknown vLLM mode {self.mode!r} (expected 'server' or 'colocate')")
        self._queue: list[_Pending] = []
        self._dispatcher: asyncio.Task | None = None

    def sampling(self, params: SamplingParams) -> dict[str, Any]:
        """The sampling settings of one call: TRL's (repetition penalty, min-p, generation_kwargs), then the turn's."""
        extra = dict(getattr(self.vg, "generation_kwargs", None) or {})
        base = {
            "n": 1,
            "repetition_penalty": self.vg.repetition_penalty,
            "min_p": 0.0 if self.vg.min_p is None else self.vg.min_p,
            "logprobs": 0,
            **extra,
        }
        out = self.vllm_params(params, base)
        if out.get("top_k") == -1:
            out["top_k"] = 0  # TRL's "no truncation"
        return out

    async def request(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> Any:
        loop = asyncio.get_running_loop()
        pending = _Pending(list(prompt_ids), params, loop.create_future())
        self._queue.append(pending)
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = loop.create_task(self._dispatch())
        return await pending.future

    async def _dispatch(self) -> None:
        while self._queue:
            await asyncio.sleep(0)  # gather the requests of every episode that is ready this tick
            queue, self._queue = self._queue, []
            for _, group in itertools.groupby(sorted(queue, key=lambda p: repr(p.params)), key=lambda p: repr(p.params)):
                group = list(group)
                try:
                    outputs = await asyncio.to_thread(self._call, [p.prompt_ids for p in group], self.sampling(group[0].params))
                except Exception as exc:
                    for p in group:
                        if not p.future.done():
                            p.future.set_exception(exc)
                    continue
                for p, output in zip(group, outputs):
                    if not p.future.done():
                        p.future.set_result(output)

    def _call(self, prompts: list[list[int]], sampling: dict[str, Any]) -> list[Any]:
        if self.mode == "server":
            keys = ("n", "repetition_penalty", "temperature", "top_p", "top_k", "min_p", "max_tokens", "logprobs")
            answer = self.vg.vllm_client.generate(
                prompts=prompts, **{k: sampling[k] for k in keys}, generation_kwargs={k: v for k, v in sampling.items() if k not in keys}
            )
            logprobs = answer.get("logprobs")
            return [
                _Answer(ids, None if logprobs is None else [row[0] for row in logprobs[i]])
                for i, ids in enumerate(answer["completion_ids"])
            ]
        from vllm import SamplingParams as VLLMSamplingParams

        requests = [{"prompt_token_ids": ids} for ids in prompts]
        return list(self.vg.llm.generate(requests, sampling_params=VLLMSamplingParams(**sampling), use_tqdm=False))


@dataclass
class _Answer:
    """A server answer in the shape :meth:`EnginePolicy.generation` reads (no finish reason: inferred)."""

    token_ids: list[int]
    log_probs: list[float] | None = None


# ------------------------------------------------------------------------------------------------
# The rollout function.
# ------------------------------------------------------------------------------------------------


@dataclass
class GemRollout:
    """TRL's ``rollout_func``: plays each prompt's episode with gem_core's runner (see the module docstring).

    ``max_turn_tokens``/``max_context_tokens``/``max_turns``: defaults for specs that leave them unset.
    ``system_prompt``: for specs without one. ``chat_template_kwargs``: default TRL's
    (``args.chat_template_kwargs``). ``policy``: a gem_core :class:`~gem_core.rollout.Policy` to use instead
    of TRL's generation (tests, or an external server). ``max_batch_size``: requests per ``generate``
    call. ``step_in_thread``: as :class:`~gem_core.rollout.RunConfig`. ``last_trajectories`` holds the
    last call's episodes.
    """

    max_turn_tokens: int | None = None
    max_context_tokens: int | None = None
    max_turns: int | None = None
    system_prompt: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    policy: Any = None
    max_batch_size: int = 64
    step_in_thread: bool | str = "auto"
    last_trajectories: list[Trajectory] = field(default_factory=list, repr=False)
    calls: int = 0

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        specs = [task_of(prompt) for prompt in prompts]
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        training = trainer.model.training
        n = trainer.num_generations if training else (getattr(trainer, "num_generations_eval", None) or trainer.num_generations)
        offset = trainer.accelerator.process_index * len(prompts)
        prefix = f"trl-{'train' if training else 'eval'}{trainer.state.global_step}-{self.calls}-"
        self.calls += 1
        sampling = SamplingParams(
            max_tokens=int(trainer.max_completion_length),
            temperature=float(trainer.temperature),
            top_p=float(trainer.top_p),
            top_k=int(trainer.top_k or 0),
        )
        template_kwargs = self.chat_template_kwargs if self.chat_template_kwargs is not None else (getattr(trainer.args, "chat_template_kwargs", None) or {})
        jobs = []
        for i, spec in enumerate(specs):
            formatter = cached_formatter(tokenizer, system_prompt=spec.system_prompt or self.system_prompt, chat_template_kwargs=template_kwargs)
            index = offset + i
            jobs.append((spec, formatter, f"{prefix}{index}", f"{prefix}g{index // n}"))
        if self.policy is not None:
            trajectories = asyncio.run(self._play(jobs, self.policy, sampling, trainer.max_completion_length))
        elif trainer.use_vllm:
            trajectories = asyncio.run(self._play(jobs, TRLVLLMPolicy(trainer.vllm_generation), sampling, trainer.max_completion_length))
        else:
            trajectories = self._play_with_model(trainer, jobs, sampling)
        self.last_trajectories = trajectories
        return trl_fields(trajectories, _pad_id(trainer))

    def _play_with_model(self, trainer: Any, jobs: list[tuple], sampling: SamplingParams) -> list[Trajectory]:
        """Episodes on the training model, unwrapped for generation as TRL unwraps it."""
        from trl.models.utils import unwrap_model_for_generation

        model = trainer.model_wrapped
        was_training = trainer.model.training
        with unwrap_model_for_generation(
            model,
            trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            generation_kwargs=trainer.generation_kwargs,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as unwrapped:
            policy = TRLGeneratePolicy(unwrapped, trainer.generation_config, max_batch_size=self.max_batch_size, pad_token_id=_pad_id(trainer))
            try:
                return asyncio.run(self._play(jobs, policy, sampling, trainer.max_completion_length))
            finally:
                unwrapped.train(was_training)

    async def _play(self, jobs: list[tuple], policy: Any, sampling: SamplingParams, max_completion_length: int) -> list[Trajectory]:
        return list(await asyncio.gather(*(self._episode(job, policy, sampling, max_completion_length) for job in jobs)))

    async def _episode(self, job: tuple, policy: Any, sampling: SamplingParams, max_completion_length: int) -> Trajectory:
        spec, formatter, episode_id, group_id = job
        env = spec.make_env()
        aenv = as_async_env(env, None, self.step_in_thread)
        try:
            observation, info = await aenv.reset(seed=spec.seed)
            if not isinstance(observation, str):
                raise TypeError(f"{spec.env_id} returned a {type(observation).__name__} observation; the TRL rollout needs text")
            config = self.run_config(spec, formatter, model_message(observation, info), sampling, max_completion_length)
            return await run_episode(
                aenv, policy, formatter, config, seed=spec.seed, observation=observation, reset_info=info,
                episode_id=episode_id, group_id=group_id, env_id=spec.env_id,
            )
        finally:
            env.close()

    def run_config(self, spec: TaskSpec, formatter: ChatFormatter, first_message: str, sampling: SamplingParams, max_completion_length: int) -> RunConfig:
        """The runner's limits for one episode (see the module docstring)."""
        prompt_length = len(formatter.prompt_ids(first_message))
        context = prompt_length + int(max_completion_length)
        cap = spec.max_context_tokens or self.max_context_tokens
        if cap is not None:
            context = min(context, cap)
        per_turn = spec.max_turn_tokens or self.max_turn_tokens or int(max_completion_length)
        return RunConfig(
            params=sampling.replace(max_tokens=max(1, min(per_turn, int(max_completion_length)))),
            max_turns=spec.max_turns or self.max_turns,
            max_context_tokens=max(context, 2),
            step_in_thread=self.step_in_thread,
        )


def _pad_id(trainer: Any) -> int:
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def trl_fields(trajectories: Sequence[Trajectory], pad_id: int) -> dict[str, Any]:
    """The rollout function's dict (see the module docstring) from the runner's trajectories."""
    out: dict[str, list[Any]] = {key: [] for key in (
        "prompt_ids", "completion_ids", "logprobs", "env_mask", TURN_IDS, TURN_REWARDS, RETURN,
        "gem_success", "gem_num_turns", "gem_truncation", "gem_episode_id", GROUP_ID, "gem_env_id",
    )}
    have_logprobs = True
    for trajectory in trajectories:
        view = trajectory.as_sequence()
        ids, mask, turns = list(view.response_ids), list(view.loss_mask), list(view.turn_ids)
        logprobs = view.logprobs
        if not ids:  # no turn: TRL needs one completion token; it carries no loss
            ids, mask, turns, logprobs = [pad_id], [0], [-1], [0.0]
        have_logprobs = have_logprobs and logprobs is not None
        last = trajectory.turns[-1] if trajectory.turns else None
        out["prompt_ids"].append(list(view.prompt_ids))
        out["completion_ids"].append(ids)
        out["logprobs"].append(None if logprobs is None else [float(x) for x in logprobs])
        out["env_mask"].append(mask)
        out[TURN_IDS].append(turns)
        out[TURN_REWARDS].append([float(r) for r in trajectory.rewards])
        out[RETURN].append(float(trajectory.episode_return))
        out["gem_success"].append(float(bool(last is not None and last.info.get("success", False))))
        out["gem_num_turns"].append(len(trajectory.turns))
        out["gem_truncation"].append(trajectory.truncation_reason or "")
        out["gem_episode_id"].append(trajectory.episode_id)
        out[GROUP_ID].append(trajectory.group_id)
        out["gem_env_id"].append(trajectory.env_id)
    result: dict[str, Any] = dict(out)
    if not have_logprobs:
        result["logprobs"] = None
    return result


def episode_return(prompts: Any = None, completions: Any = None, gem_return: Sequence[float] | None = None, **kwargs: Any) -> list[float]:
    """A TRL reward function: each completion's episode return (the sum of its turns' rewards), which TRL
    logs as the reward; :class:`~gem_integrations.trl.trainer.GemGRPOTrainer` replaces TRL's advantages from
    it with ReBN over the turns, a plain ``GRPOTrainer`` uses it for its group advantages."""
    if gem_return is None:
        raise ValueError("episode_return needs the gem rollout's 'gem_return' field: pass rollout_func=GemRollout()")
    return [float(r) for r in gem_return]
