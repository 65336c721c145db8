"""RL2's env contracts on gem_core's runner: each dataset row's episode (a :class:`gem_core.tasks.TaskSpec`
in ``extra_info["gem_task"]``, written by ``gem-core make-dataset rl2``) is played by
:func:`gem_core.rollout.play_row`.

Checked against real code: rl-square 0.0.2 from PyPI (``RL2/workers/rollout.py``: ``Rollout.rollout``
calls ``await env.reset(extra_info)`` for rows without ``prompt``/``messages``, then per turn
``await env.step(state_text, action_text, extra_info)`` and reads ``next_state``, ``reward``, ``score``,
``done``, ``extra_info``; it appends the SGLang answer's token ids and tokenises only
``next_state[len(state + action):]`` when ``next_state`` extends the text, else starts a new sequence).
The nox ``rl2`` session runs that code. RL2 HEAD (github ChenmienTan/RL2 at 9161ede, read, not
installable here: its setup.py still says 0.0.2) calls ``await env.generate(config, tokenizer,
router_url, sample)`` per sample (``SampleGroup.generate``) and reads ``sample.state_dicts`` (lists
``states``/``actions``/``action_mask``/``logps``/``rewards``, the reward on each turn's last token),
``sample.metrics``, ``sample.status``, ``sample.state_text``/``action_text``; the SGLang router answers
``POST /generate`` (``input_ids``, ``sampling_params``, ``return_logprob``) with ``meta_info``
(``output_token_logprobs`` as ``(logp, id, text)``, ``finish_reason.type``, ``completion_tokens``).
Its ``generate`` is tested against that contract as read (a stand-in ``Sample`` with HEAD's fields),
not against HEAD's code.

* HEAD (:func:`generate`): token in, token out. The runner's policy is the SGLang router
  (:class:`SGLangRouterPolicy`); the whole episode is written into the sample as one sequence from the
  runner's token ids (nothing re-tokenised), each turn's reward on its last model token, logprobs as
  SGLang returned them. RL2's partial rollout (an ``abort`` answer, resumed later) is not supported:
  an aborted episode ends there (``Trajectory.infra_error``) and is returned done, with no action
  token and no reward (out of the loss and of ReBN), counted in ``gem/infra_failed_episodes``. A
  cancelled ``generate`` closes its env (the runner runs inside ``try``/``finally``).
* 0.0.2 (:func:`reset` / :func:`step`): RL2 drives the loop and talks to SGLang itself; the env module
  sees text only. Each episode runs on gem_core's runner with a bridge policy: the runner's request is
  handed back to RL2 as ``state``/``next_state`` text (the decoded context; ``next_state`` always
  extends the previous text, so RL2 keeps one sequence), and RL2's action text is the response,
  tokenised once. RL2 must return the end-of-turn token in the text: the launcher sets SGLang's
  ``skip_special_tokens=false`` (with RL2's default ``no_stop_trim=true``), else a stopped response
  looks cut. 0.0.2 needs the tokenizer here (RL2 does not pass it): :func:`configure`, or the model
  path in ``GEM_RL2_TOKENIZER`` (the launcher sets it from ``actor.model_name``). A response longer than
  what is left of ``max_context_tokens`` ends the episode as ``context_limit`` without stepping the env
  (RL2 keeps that response with reward 0). RL2 0.0.2 stops an episode after ``rollout.max_turns``
  turns (default 1) without telling the env module: the launcher sets it (``gem-core rl2 train``), and
  whatever RL2 stops early is closed here when RL2's task for that sample ends (counted in
  ``gem/abandoned_episodes``, warned once). An episode the infrastructure failed (a step's
  ``info["infra_error"]``) ends with the reward marker of :mod:`gem_integrations.rl2.metrics`, which
  the launcher's advantage step turns into a masked row.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Awaitable, Callable, Mapping

from gem_core.core import Wrapper
from gem_core.plugins import finish_reason
from gem_core.rollout import ContextLimitExceeded, Generation, RunConfig, SamplingParams, Trajectory, cached_formatter, play_row, row_config
from gem_core.tasks import TaskSpec
from gem_integrations.rl2 import metrics
from gem_integrations.rl2.plugin_spec import PLUGIN

TASK_KEY = "gem_task"
EPISODE_KEY = "gem_episode"
TOKENIZER_ENV = "GEM_RL2_TOKENIZER"
DEFAULT_MAX_TOKENS = 1024

log = logging.getLogger(__name__)


def task_spec(row: Mapping[str, Any]) -> TaskSpec:
    """The episode a row names: ``row["extra_info"]["gem_task"]`` (or ``row["gem_task"]``)."""
    extra = row.get("extra_info") if isinstance(row, Mapping) else None
    label = extra.get(TASK_KEY) if isinstance(extra, Mapping) else None
    if label is None and isinstance(row, Mapping):
        label = row.get(TASK_KEY)
    if label is None:
        raise ValueError(f"the RL2 row has no extra_info['{TASK_KEY}'] (write the dataset with `gem-core make-dataset rl2`); keys: {sorted(row)[:20]}")
    return TaskSpec.from_json(label)


# ------------------------------------------------------------------------------------------------
# RL2 HEAD: generate(config, tokenizer, router_url, sample).
# ------------------------------------------------------------------------------------------------

Post = Callable[[str, str, dict], Awaitable[dict]]


async def _rl2_post(url: str, endpoint: str, payload: dict) -> dict:
    from RL2.utils.communication import async_request  # RL2 HEAD's own client (retries included)

    return await async_request(url, endpoint, json=payload)


def sglang_params(base: Mapping[str, Any], params: SamplingParams) -> dict[str, Any]:
    """SGLang sampling params for one turn: RL2's ``rollout.*.sampling_params``, then gem_core's fields
    (``max_new_tokens``, the template's stop tokens, temperature/top-p/top-k) and ``no_stop_trim``."""
    out = dict(base)
    out.update(max_new_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p, no_stop_trim=True)
    if params.top_k > 0:
        out["top_k"] = params.top_k
    if params.stop_token_ids:
        out["stop_token_ids"] = list(dict.fromkeys([*(out.get("stop_token_ids") or ()), *params.stop_token_ids]))
    out.update(params.extra)
    return out


def generation_from_sglang(response: Mapping[str, Any], params: SamplingParams) -> Generation:
    """A SGLang ``/generate`` answer as a :class:`Generation`: the token ids and logprobs of
    ``meta_info.output_token_logprobs`` (never the text), SGLang's finish reason. An error answer
    (``{"error": {"message": ...}}``, e.g. SGLang's refusal of an input longer than the model's context,
    which the runner ends as the episode's context limit) is raised with SGLang's message."""
    error = response.get("error")
    if error is not None or "meta_info" not in response:
        message = error.get("message", error) if isinstance(error, Mapping) else (error or response)
        raise RuntimeError(f"SGLang refused the request: {message}")
    meta = response["meta_info"]
    triples = meta.get("output_token_logprobs") or []
    ids = [int(t[1]) for t in triples]
    logprobs = [float(t[0]) for t in triples]
    reason = (meta.get("finish_reason") or {}).get("type")
    return Generation(ids, logprobs or None, finish_reason(SimpleNamespace(finish_reason=reason), ids, params))


class SGLangRouterPolicy:
    """A gem_core policy over RL2's SGLang router (``POST {router_url}/generate``)."""

    def __init__(self, router_url: str, base_params: Mapping[str, Any] | None = None, post: Post | None = None):
        self.router_url = router_url
        self.base_params = dict(base_params or {})
        self.post = post or _rl2_post

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "") -> Generation:
        payload = {"input_ids": list(prompt_ids), "sampling_params": sglang_params(self.base_params, params), "return_logprob": True}
        return generation_from_sglang(await self.post(self.router_url, "generate", payload), params)


def state_dict(trajectory: Trajectory) -> dict[str, list]:
    """The episode as one RL2 state dict (``states``, ``actions``, ``action_mask``, ``logps``,
    ``rewards``: the prompt and env tokens with mask 0, each turn's reward on its last model token).
    An episode the infrastructure failed (``trajectory.infra_error``) keeps its tokens but carries no
    action and no reward, so it stays out of RL2's loss and out of ReBN (DESIGN.md contract 8)."""
    sequence = trajectory.as_sequence()
    prompt = list(sequence.prompt_ids)
    response = list(sequence.response_ids)
    failed = trajectory.infra_error is not None
    mask = [0 if failed else int(m) for m in sequence.loss_mask]
    logps = list(sequence.logprobs) if sequence.logprobs is not None else [0.0] * len(response)
    rewards = [0.0] * len(response) if failed else [float(r) for r in sequence.token_rewards()]
    return {
        "states": prompt + response,
        "actions": [0] * len(prompt) + [t if m else 0 for t, m in zip(response, mask)],
        "action_mask": [0] * len(prompt) + mask,
        "logps": [0.0] * len(prompt) + [float(lp) if m else 0.0 for lp, m in zip(logps, mask)],
        "rewards": [0.0] * len(prompt) + rewards,
    }


def fill_sample(sample: Any, trajectory: Trajectory, tokenizer: Any) -> None:
    """Write the finished episode into RL2 HEAD's ``Sample`` (done, one sequence)."""
    sample.state_dict = state_dict(trajectory)
    sample.state_dicts = [sample.state_dict]
    sample.state_text = tokenizer.decode(trajectory.prompt_ids, skip_special_tokens=False)
    sample.action_text = trajectory.turns[-1].response_text if trajectory.turns else ""
    sample.turn = trajectory.num_turns
    for turn in trajectory.turns:
        sample.metrics["response_length"].append(len(turn.response_ids))
        sample.metrics["length_clip_ratio"].append(turn.finish_reason == "length")
    sample.metrics["turns"].append(trajectory.num_turns)
    sample.metrics["rewards"].append(0.0 if trajectory.infra_error is not None else float(sum(trajectory.rewards)))
    if trajectory.infra_error is not None:
        metrics.count(metrics.INFRA_FAILED)
    else:
        metrics.count_outcome(trajectory.success)
    sample.status = type(sample).Status.DONE


async def generate(config: Any, tokenizer: Any, router_url: str, sample: Any, *, post: Post | None = None) -> None:
    """RL2 HEAD's env contract: play ``sample``'s episode with gem_core's runner over the router."""
    status = getattr(sample, "status", None)
    if status is not None and getattr(status, "value", status) == "done":
        return
    spec = task_spec(sample.sample)
    base = _container(getattr(config, "sampling_params", None) or {})
    max_tokens = int(base.get("max_new_tokens") or DEFAULT_MAX_TOKENS)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=float(base.get("temperature", 1.0)),
        top_p=float(base.get("top_p", 1.0)),
        top_k=max(int(base.get("top_k", 0) or 0), 0),
    )
    policy = SGLangRouterPolicy(router_url, {k: v for k, v in base.items() if k not in ("max_new_tokens",)}, post)
    formatter = cached_formatter(tokenizer, system_prompt=spec.system_prompt)
    trajectory = await play_row(spec, policy, formatter, RunConfig(params=params))
    fill_sample(sample, trajectory, tokenizer)


def _container(value: Any) -> dict[str, Any]:
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return dict(OmegaConf.to_container(value, resolve=True))
    except ImportError:  # pragma: no cover - RL2 brings omegaconf
        pass
    return dict(value)


# ------------------------------------------------------------------------------------------------
# rl-square 0.0.2: reset(extra_info) / step(state, action, extra_info).
# ------------------------------------------------------------------------------------------------


#: The 0.0.2 bridge's default per-turn cap: none of its own. RL2 0.0.2 asks SGLang itself, with its
#: ``max_new_tokens``; a response is cut here only by a row's ``max_turn_tokens`` or its context budget.
UNCAPPED_TURN_TOKENS = 1 << 30


@dataclass
class _Settings:
    tokenizer: Any = None
    params: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=UNCAPPED_TURN_TOKENS))
    max_context_tokens: int | None = None


_SETTINGS = _Settings()


def configure(tokenizer: Any = None, params: SamplingParams | None = None, max_context_tokens: int | None = None) -> None:
    """Settings of the 0.0.2 path: the tokenizer (RL2's model's), the runner's sampling params (their
    ``max_tokens`` is a per-turn cap the bridge checks on top of RL2's ``max_new_tokens``; default: none,
    :data:`UNCAPPED_TURN_TOKENS`) and a default ``max_context_tokens`` (a row's own wins)."""
    if tokenizer is not None:
        _SETTINGS.tokenizer = tokenizer
    if params is not None:
        _SETTINGS.params = params
    _SETTINGS.max_context_tokens = max_context_tokens


def _tokenizer() -> Any:
    if _SETTINGS.tokenizer is None:
        path = os.environ.get(TOKENIZER_ENV)
        if not path:
            raise RuntimeError(
                f"the RL2 0.0.2 env module needs the model's tokenizer: set {TOKENIZER_ENV} (the launcher does) or call configure(tokenizer=...)"
            )
        from transformers import AutoTokenizer

        _SETTINGS.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    return _SETTINGS.tokenizer


class _Rewards(Wrapper):
    """Keeps each step's reward, for the ``step`` answer (the runner's trajectory is returned at the end)."""

    def __init__(self, env: Any, rewards: list[float]):
        super().__init__(env)
        self.rewards = rewards

    def step(self, action: str) -> Any:
        result = self.env.step(action)
        self.rewards.append(float(result[1]))
        return result


class _BridgePolicy:
    """The runner's policy on the 0.0.2 path: each request goes to RL2 as text; RL2's action comes back."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.requests: asyncio.Queue = asyncio.Queue()
        self.actions: asyncio.Queue = asyncio.Queue()

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "") -> Generation:
        await self.requests.put(list(prompt_ids))
        text = await self.actions.get()
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if len(ids) > params.max_tokens:
            raise ContextLimitExceeded(f"{len(ids)} response tokens, {params.max_tokens} allowed")
        closed = bool(ids) and ids[-1] in params.stop_token_ids
        return Generation(ids, None, "stop" if closed else "length")


@dataclass
class _Episode:
    """One running 0.0.2 episode: the runner's task, its env (closed once, whoever ends it first) and
    the RL2 task that reset it (its ``owner``: when that task ends, RL2 is done with the episode)."""

    policy: _BridgePolicy
    env: Any
    rewards: list[float]
    label: str
    task: asyncio.Task | None = None
    context: list[int] = field(default_factory=list)
    actions: int = 0
    closed: bool = False

    def close(self) -> None:
        """Close the env, once (the runner's ``finally`` and an abandonment may both ask)."""
        if not self.closed:
            self.closed = True
            self.env.close()

    def stop(self) -> None:
        """Close the env now and cancel the runner's task (left waiting for an action RL2 will not send)."""
        try:
            self.close()
        finally:
            if self.task is not None and not self.task.done() and not self.task.get_loop().is_closed():
                self.task.cancel()


_EPISODES: dict[str, _Episode] = {}
_WARNED: set[str] = set()


def pending_episodes() -> int:
    """How many 0.0.2 episodes are running (started by ``reset``, not yet ended or closed)."""
    return len(_EPISODES)


def close_episodes() -> int:
    """Close every running 0.0.2 episode (envs closed, runner tasks cancelled); returns how many. RL2's
    own stop is caught without it (see :func:`reset`); this is for a process that ends its loop early."""
    keys = list(_EPISODES)
    for key in keys:
        _EPISODES.pop(key).stop()
    return len(keys)


atexit.register(close_episodes)


async def _next_request(episode: _Episode) -> list[int] | None:
    """The runner's next context, or None when the episode is over (its errors raise here)."""
    getter = asyncio.ensure_future(episode.policy.requests.get())
    done, _ = await asyncio.wait({getter, episode.task}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    episode.task.result()
    return None


def _drop_stale() -> None:
    """Episodes of an event loop that has been closed (their tasks can never run again)."""
    for key in [k for k, e in _EPISODES.items() if e.task.done() or e.task.get_loop().is_closed()]:
        _EPISODES.pop(key).stop()


def _abandoned(key: str, owner: Any = None) -> None:
    """RL2's task that reset episode ``key`` has ended: if the episode is still running, RL2 stopped it
    (0.0.2 stops at ``rollout.max_turns`` without a word to the env module): close it and count it."""
    episode = _EPISODES.pop(key, None)
    if episode is None:
        return
    metrics.count(metrics.ABANDONED)
    if "abandoned" not in _WARNED:
        _WARNED.add("abandoned")
        log.warning(
            "RL2 stopped a GEM episode (%s) after %d turn(s), before it ended: rollout.max_turns is too small "
            "for these envs (gem-core rl2 train sets it; RL2's own default is 1). The env module closed it; "
            "such episodes are counted in %s.", episode.label, episode.actions, metrics.ABANDONED,
        )  # fmt: skip
    episode.stop()


def _infra_reward(label: str) -> float:
    """The reward an infra-failed episode's last step answers: the marker the launcher's advantage step
    masks, or 0.0 (with a warning) when that step is not installed in this process."""
    if PLUGIN.is_installed:
        return metrics.INFRA_REWARD
    if "infra" not in _WARNED:
        _WARNED.add("infra")
        log.warning(
            "the infrastructure failed a GEM episode (%s), but RL2's advantage step is not the launcher's "
            "(run gem-core rl2 train / python -m gem_integrations.rl2.train): it cannot be kept out of the loss", label,
        )  # fmt: skip
    return 0.0


async def reset(extra_info: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """rl-square 0.0.2's ``env.reset``: start the row's episode; its first context as text.

    The episode belongs to the RL2 task that calls this (RL2 runs each sample's ``rollout`` as a task):
    when that task ends with the episode still running, RL2 has stopped it (``rollout.max_turns``), and
    the env is closed then (:func:`_abandoned`)."""
    _drop_stale()
    spec = task_spec({"extra_info": extra_info})
    tokenizer = _tokenizer()
    formatter = cached_formatter(tokenizer, system_prompt=spec.system_prompt)
    # the settings' context limit is a default: a row's own wins (play_row's rule)
    config = RunConfig(params=_SETTINGS.params, max_context_tokens=_SETTINGS.max_context_tokens, step_in_thread=False)
    rewards: list[float] = []
    episode = _Episode(_BridgePolicy(tokenizer), _Rewards(spec.make_env(), rewards), rewards, f"{spec.env_id} seed {spec.seed}")

    async def play() -> Trajectory:
        try:
            return await play_row(spec, episode.policy, formatter, config, env=episode.env)
        finally:
            episode.close()

    episode.task = asyncio.ensure_future(play())
    try:
        context = await _next_request(episode)
    except BaseException:
        episode.stop()
        raise
    if context is None:
        raise ValueError(f"{spec.env_id} (seed {spec.seed}): the first message does not fit max_context_tokens={row_config(spec, config).max_context_tokens}")
    episode.context = context
    key = uuid.uuid4().hex
    _EPISODES[key] = episode
    owner = asyncio.current_task()
    if owner is not None:
        owner.add_done_callback(functools.partial(_abandoned, key))
    return formatter.decode(context), {**dict(extra_info), EPISODE_KEY: key}


async def step(state: str, action: str, extra_info: Mapping[str, Any]) -> dict[str, Any]:
    """rl-square 0.0.2's ``env.step``: the runner steps the env with ``action``; ``next_state`` extends
    ``state + action`` by the observation's chat-template delta. An episode the infrastructure failed
    ends here with the :data:`~gem_integrations.rl2.metrics.INFRA_REWARD` marker (counted)."""
    key = extra_info.get(EPISODE_KEY)
    episode = _EPISODES.get(key) if key is not None else None
    if episode is None:
        raise RuntimeError(f"no running GEM episode for this sample (extra_info['{EPISODE_KEY}']={key!r}); reset must come first")
    await episode.policy.actions.put(action)
    index = episode.actions
    episode.actions += 1
    try:
        request = await _next_request(episode)
    except BaseException:
        _EPISODES.pop(key, None)
        episode.stop()
        raise
    reward = episode.rewards[index] if index < len(episode.rewards) else 0.0
    answer = {"reward": reward, "score": reward, "extra_info": dict(extra_info)}
    if request is None:
        _EPISODES.pop(key, None)
        trajectory = episode.task.result()
        if trajectory.infra_error is not None:
            metrics.count(metrics.INFRA_FAILED)
            answer.update(reward=_infra_reward(episode.label), score=0.0)
        else:
            metrics.count_outcome(trajectory.success)
        return {**answer, "next_state": state + action, "done": True}
    tokenizer = episode.policy.tokenizer
    previous = episode.context + list(tokenizer.encode(action, add_special_tokens=False))
    if request[: len(previous)] != previous:
        _EPISODES.pop(key, None)
        episode.stop()
        raise RuntimeError("the runner's context does not extend the previous one (a chat template that rewrites history?)")
    episode.context = request
    delta = tokenizer.decode(request[len(previous) :], skip_special_tokens=False)
    return {**answer, "next_state": state + action + delta, "done": False}
