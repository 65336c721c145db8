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
  turn), which :class:`~gem_integrations.trl.advantage.GemGRPOTrainer` turns into ReBN advantages;
* ``gem_return`` (the episode's return: :func:`episode_return` hands it to TRL as the reward),
  ``gem_success``, ``gem_num_turns``, ``gem_truncation`` (``""`` or the reason), ``gem_episode_id``,
  ``gem_group_id`` (TRL's prompt group: the global row index // ``num_generations``), ``gem_env_id``,
  ``gem_infra_error`` (``""`` or why the infrastructure failed the episode).

An episode the infrastructure failed (``Trajectory.infra_error``: the engine aborted a request, a step's
info carried :data:`gem_core.errors.INFRA_ERROR`, e.g. a dead sandbox worker; DESIGN.md contract 8)
keeps its row, since TRL's batch has one row per prompt, but carries nothing: ``env_mask`` 0 on every
token (no loss), turn ids -1 and no turn rewards (out of ReBN's statistics), and :func:`episode_return`
gives TRL None for it (TRL leaves it out of its reward statistics and baselines, advantage 0).

The policy is TRL's own generation: :class:`TRLGeneratePolicy` (the training model's ``generate``
with TRL's ``generation_config``, in rounds: every process makes the same number of ``generate`` calls
and forwards, which FSDP and ZeRO-3 need, as every forward there is a collective) unless ``use_vllm``;
then :class:`TRLVLLMPolicy` over TRL's vLLM client (server mode, HTTP per process: no collective) or
its colocated ``LLM`` (one engine per process with ``vllm_tensor_parallel_size`` 1, vLLM's data
parallel size 1: no collective between processes; TRL syncs the weights before calling the rollout
function). Limits: each response within the spec's ``max_turn_tokens``, else the rollout's,
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
import contextlib
import copy
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gem_core.plugins import EnginePolicy, PluginError
from gem_core.rollout import Generation, HFPolicy, RunConfig, SamplingParams, Trajectory, answer_each, cached_formatter, play_row, resolve_in_thread
from gem_integrations.trl.dataset import task_of

TURN_IDS = "gem_turn_ids"
TURN_REWARDS = "gem_turn_rewards"
RETURN = "gem_return"
GROUP_ID = "gem_group_id"
INFRA = "gem_infra_error"


# ------------------------------------------------------------------------------------------------
# Policies: TRL's generation as a gem_core Policy.
# ------------------------------------------------------------------------------------------------


@dataclass
class _Pending:
    """A request waiting for its batch."""

    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    request_id: str = ""


class TRLGeneratePolicy(HFPolicy):
    """The training model's ``generate`` with TRL's ``generation_config`` (what ``GRPOTrainer`` samples
    with when ``use_vllm`` is off).

    Per turn, a copy of the config gets the request's ``max_tokens`` (``max_new_tokens``), temperature,
    top-p and top-k, and the request's stop tokens next to TRL's ``eos_token_id``; the response is cut
    after its first stop token, as TRL cuts after EOS. ``logprobs``: the chosen tokens'
    ``log_softmax(logits / temperature)`` from the raw logits, the same quantity TRL's loss recomputes.

    Rounds (:meth:`open_rounds`, what :class:`GemRollout` uses): the episodes are played in rounds, each
    round one turn of every episode still running, generated together (``max_batch_size`` rows per
    ``generate`` call). Under FSDP or ZeRO-3 every forward is a collective, so with several processes
    (``process_max``: the max of an int over every process) the processes first agree on the round's
    number of ``generate`` calls and a process with fewer makes idle ones (one pad token, one new token,
    output dropped), and one that has finished its episodes joins the others' rounds the same way until
    none has any left; every call passes ``synced_gpus=True``, so the forwards inside one call line up
    too (HF's generate keeps stepping a finished process until all are done). Every process thus makes
    the same number of ``generate`` calls and forwards per rollout, as TRL's own path (one call per step).
    """

    def __init__(
        self,
        model: Any,
        generation_config: Any,
        *,
        max_batch_size: int = 64,
        pad_token_id: int | None = None,
        process_max: Callable[[int], int] | None = None,
    ):
        super().__init__(model, max_batch_size=max_batch_size, pad_token_id=pad_token_id)
        self.generation_config = generation_config
        self.process_max = process_max
        self.generate_calls = 0  # every model.generate call, idle ones included
        self._live: int | None = None  # episodes not yet done, while rounds are open
        self._waiting: list[_Pending] = []
        self._round: asyncio.Task | None = None

    # -- rounds ------------------------------------------------------------------------------------
    def open_rounds(self, episodes: int) -> None:
        """Play the next ``episodes`` episodes in rounds; each calls :meth:`episode_done` when it ends."""
        self._live, self._waiting = int(episodes), []

    def episode_done(self) -> None:
        """One episode ended (however): the round may now be complete without it."""
        if self._live is not None:
            self._live -= 1
            self._start_round_if_ready()

    def stop_rounds(self) -> None:
        """No further round starts (this process is failing: it raises, and its launcher ends the others)."""
        self._live = None

    async def close_rounds(self) -> None:
        """After this process's last episode: join the other processes' rounds until none has any left."""
        self._live = None
        if self.process_max is not None:
            while await asyncio.to_thread(self._idle_round):
                pass

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "") -> Generation:
        if self._live is None:
            return await super().generate(prompt_ids, params, request_id=request_id)
        if not prompt_ids:
            raise ValueError("TRLGeneratePolicy needs a non-empty prompt")
        pending = _Pending(list(prompt_ids), params, asyncio.get_running_loop().create_future(), request_id)
        self._waiting.append(pending)
        self._start_round_if_ready()
        return await pending.future

    def _start_round_if_ready(self) -> None:
        if self._waiting and self._live is not None and len(self._waiting) >= self._live and self._round is None:
            self._round = asyncio.get_running_loop().create_task(self._play_round())

    async def _play_round(self) -> None:
        batch = sorted(self._waiting, key=lambda p: p.request_id)  # the same chunks however the episodes arrived
        self._waiting = []
        chunks = [batch[i : i + self.max_batch_size] for i in range(0, len(batch), self.max_batch_size)]
        try:
            await resolve_in_thread([p.future for p in batch], lambda: list(itertools.chain.from_iterable(self._round_calls(chunks))))
        finally:
            self._round = None
        self._start_round_if_ready()

    def _round_calls(self, chunks: list[list[_Pending]]) -> list[list[Generation]]:
        """One round's ``generate`` calls (in the generation thread): as many on every process."""
        total = len(chunks) if self.process_max is None else self.process_max(len(chunks))
        results = []
        for i in range(total):
            if i < len(chunks):
                results.append(self._generate_batch(chunks[i]))
            else:
                self._idle_generate()
        return results

    def _idle_round(self) -> bool:
        """A round of another process's, joined with idle calls; False once no process has any left."""
        total = self.process_max(0)
        for _ in range(total):
            self._idle_generate()
        return total > 0

    def _idle_generate(self) -> None:
        """A ``generate`` call whose output is dropped: this process's part in the others' collective one."""
        torch = self.torch
        config = copy.deepcopy(self.generation_config)
        config.max_new_tokens, config.min_new_tokens = 1, None
        ids = torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=self.device)
        self._use_device()
        with torch.no_grad():
            self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config, synced_gpus=self._synced())
        self.generate_calls += 1

    def _synced(self) -> bool | None:
        return True if self.process_max is not None else None  # None: transformers decides (one process)

    def _use_device(self) -> None:
        # the generation thread's current CUDA device is device 0 unless set (ZeRO-3 hooks read it)
        if self.device.type == "cuda":
            self.torch.cuda.set_device(self.device)

    # -- one generate call -------------------------------------------------------------------------
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
        config.return_dict_in_generate, config.output_logits = True, True
        self._use_device()
        with torch.no_grad():  # as TRL generates (thread-local: set here, in the generation thread)
            out = self.model.generate(
                input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device), generation_config=config, synced_gpus=self._synced()
            )
        self.generate_calls += 1
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


class TRLVLLMPolicy(EnginePolicy):
    """TRL's vLLM generation (``trainer.vllm_generation``) as a gem_core policy.

    Server mode: the requests of one tick with the same ``max_tokens`` go to TRL's ``VLLMClient.generate``
    as one call (prompts as token ids, ``n=1``, ``logprobs=0``, TRL's sampling settings, the turn's stop
    tokens in ``generation_kwargs``), in a thread; each process calls its server itself (no collective).
    Colocate mode: the same batches go to the colocated ``vllm.LLM.generate`` with a
    ``vllm.SamplingParams``. The answer is read from its token ids (vLLM keeps the stop token there),
    never its text. vLLM refuses a whole call for one prompt over its window (the server answers 400 in
    its words, which the client raises): the call is split until the refusal is that request's alone,
    whose episode ends as the runner's context limit (:func:`gem_core.rollout.answer_each`). Sleep mode and tensor parallelism in colocate mode need collectives around every
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
                sampling = self.sampling(group[0].params)
                # one prompt over the engine's window makes vLLM refuse the whole call: that request alone is refused
                await resolve_in_thread(
                    [p.future for p in group],
                    lambda group=group, sampling=sampling: answer_each([p.prompt_ids for p in group], lambda part: self._call(part, sampling)),
                )

    def _call(self, prompts: list[list[int]], sampling: dict[str, Any]) -> list[Any]:
        if self.mode == "server":
            keys = ("n", "repetition_penalty", "temperature", "top_p", "top_k", "min_p", "max_tokens", "logprobs")
            answer = self.vg.vllm_client.generate(
                prompts=prompts, **{k: sampling[k] for k in keys}, generation_kwargs={k: v for k, v in sampling.items() if k not in keys}
            )
            logprobs = answer.get("logprobs")
            return [_Answer(ids, None if logprobs is None else [row[0] for row in logprobs[i]]) for i, ids in enumerate(answer["completion_ids"])]
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
    of TRL's generation (tests, or an external server; not played in rounds). ``max_batch_size``:
    requests per ``generate`` call of the training model (a round's turns are split into calls of at
    most this many). ``step_in_thread``: as :class:`~gem_core.rollout.RunConfig`. ``last_trajectories`` holds the
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
        """Episodes on the training model, unwrapped for generation as TRL unwraps it (and, under FSDP 1,
        its root parameters summoned as TRL summons them), played in rounds (:class:`TRLGeneratePolicy`)."""
        from trl.models.utils import unwrap_model_for_generation

        model = trainer.model_wrapped
        was_training = trainer.model.training
        backend = getattr(trainer, "_dist", None)  # TRL's DistributedBackend (pinned in the tests)
        with (
            unwrap_model_for_generation(
                model,
                trainer.accelerator,
                gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                generation_kwargs=trainer.generation_kwargs,
                gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
            ) as unwrapped,
            backend.summon_full_params(model, recurse=False) if backend is not None else contextlib.nullcontext(),
        ):
            policy = TRLGeneratePolicy(
                unwrapped,
                trainer.generation_config,
                max_batch_size=self.max_batch_size,
                pad_token_id=_pad_id(trainer),
                process_max=process_max(trainer.accelerator),
            )
            try:
                return asyncio.run(self._play_in_rounds(jobs, policy, sampling, trainer.max_completion_length))
            finally:
                unwrapped.train(was_training)

    async def _play(self, jobs: list[tuple], policy: Any, sampling: SamplingParams, max_completion_length: int) -> list[Trajectory]:
        return list(await asyncio.gather(*(self._episode(job, policy, sampling, max_completion_length) for job in jobs)))

    async def _play_in_rounds(self, jobs: list[tuple], policy: TRLGeneratePolicy, sampling: SamplingParams, max_completion_length: int) -> list[Trajectory]:
        """Every episode of this process in rounds; then this process joins the others' until all are done."""
        policy.open_rounds(len(jobs))

        async def play(job: tuple) -> Trajectory:
            try:
                return await self._episode(job, policy, sampling, max_completion_length)
            finally:
                policy.episode_done()

        try:
            trajectories = list(await asyncio.gather(*(play(job) for job in jobs)))
        except BaseException:
            policy.stop_rounds()
            raise
        await policy.close_rounds()
        return trajectories

    async def _episode(self, job: tuple, policy: Any, sampling: SamplingParams, max_completion_length: int) -> Trajectory:
        spec, formatter, episode_id, group_id = job
        return await play_row(
            spec,
            policy,
            formatter,
            self.run_config(sampling, max_completion_length),
            response_budget=int(max_completion_length),
            episode_id=episode_id,
            group_id=group_id,
        )

    def run_config(self, sampling: SamplingParams, max_completion_length: int) -> RunConfig:
        """The rollout's defaults for rows that leave a limit unset (see the module docstring); each response
        and the whole completion stay within ``max_completion_length`` (:func:`gem_core.rollout.play_row`)."""
        return RunConfig(
            params=sampling.replace(max_tokens=self.max_turn_tokens or int(max_completion_length)),
            max_turns=self.max_turns,
            max_context_tokens=self.max_context_tokens,
            step_in_thread=self.step_in_thread,
        )


def _pad_id(trainer: Any) -> int:
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def process_max(accelerator: Any) -> Callable[[int], int] | None:
    """``n -> max of n over every process`` (a ``torch.distributed`` all-reduce on the accelerator's
    device), or None with one process."""
    if accelerator.num_processes <= 1:
        return None
    import torch
    import torch.distributed as dist

    device = accelerator.device

    def agree(n: int) -> int:
        value = torch.tensor([int(n)], dtype=torch.long, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item())

    return agree


def trl_fields(trajectories: Sequence[Trajectory], pad_id: int) -> dict[str, Any]:
    """The rollout function's dict (see the module docstring) from the runner's trajectories."""
    out: dict[str, list[Any]] = {
        key: []
        for key in (
            "prompt_ids",
            "completion_ids",
            "logprobs",
            "env_mask",
            TURN_IDS,
            TURN_REWARDS,
            RETURN,
            "gem_success",
            "gem_num_turns",
            "gem_truncation",
            "gem_episode_id",
            GROUP_ID,
            "gem_env_id",
            INFRA,
        )
    }
    have_logprobs = True
    for trajectory in trajectories:
        view = trajectory.as_sequence()
        ids, mask, turns = list(view.response_ids), list(view.loss_mask), list(view.turn_ids)
        logprobs = view.logprobs
        if not ids:  # no turn: TRL needs one completion token; it carries no loss
            ids, mask, turns, logprobs = [pad_id], [0], [-1], [0.0]
        failed = trajectory.infra_error is not None
        if failed:  # the infrastructure failed: the row stays (TRL's batch keeps its shape) but carries nothing
            mask, turns = [0] * len(ids), [-1] * len(ids)
        have_logprobs = have_logprobs and logprobs is not None
        last = trajectory.turns[-1] if trajectory.turns else None
        out["prompt_ids"].append(list(view.prompt_ids))
        out["completion_ids"].append(ids)
        out["logprobs"].append(None if logprobs is None else [float(x) for x in logprobs])
        out["env_mask"].append(mask)
        out[TURN_IDS].append(turns)
        out[TURN_REWARDS].append([] if failed else [float(r) for r in trajectory.rewards])
        out[RETURN].append(0.0 if failed else float(trajectory.episode_return))
        out["gem_success"].append(float(bool(last is not None and last.info.get("success", False))))
        out["gem_num_turns"].append(len(trajectory.turns))
        out["gem_truncation"].append(trajectory.truncation_reason or "")
        out["gem_episode_id"].append(trajectory.episode_id)
        out[GROUP_ID].append(trajectory.group_id)
        out["gem_env_id"].append(trajectory.env_id)
        out[INFRA].append(trajectory.infra_error or "")
    result: dict[str, Any] = dict(out)
    if not have_logprobs:
        result["logprobs"] = None
    return result


def episode_return(
    prompts: Any = None, completions: Any = None, gem_return: Sequence[float] | None = None, gem_infra_error: Sequence[str] | None = None, **kwargs: Any
) -> list[float | None]:
    """A TRL reward function: each completion's episode return (the sum of its turns' rewards), which TRL
    logs as the reward; :class:`~gem_integrations.trl.advantage.GemGRPOTrainer` replaces TRL's advantages from
    it with ReBN over the turns, a plain ``GRPOTrainer`` uses it for its group advantages. None for an
    episode the infrastructure failed: TRL leaves such a completion out of its reward statistics and
    baselines and gives it advantage 0."""
    if gem_return is None:
        raise ValueError("episode_return needs the gem rollout's 'gem_return' field: pass rollout_func=GemRollout()")
    failed = list(gem_infra_error) if gem_infra_error is not None else [""] * len(gem_return)
    return [None if failure else float(r) for r, failure in zip(gem_return, failed)]
