"""The gem-core env as a ``gem.Env`` for ROLL's agentic pipeline, and its registration in the ``gem`` registry.

Why registration, not an env manager of our own. ROLL (alibaba/ROLL, ``roll/pipeline/agentic/``) makes
every env the same way, in every one of its env managers (``TrajEnvManager.__init__``, inherited by
``StepEnvManager``/``StepConcatEnvManager``): ``gem.make(env_id=custom_envs.<tag>.env_type,
**env_config)``, from the ``gem`` registry of the ``gem-llm`` package ROLL pins (0.0.4). One registered
id, ``gem-core``, whose entry point is :class:`GemCoreEnv`, lets ROLL's own managers, rollout loop,
sample layout and advantage code run unchanged; an env manager of ours would have to copy or override
ROLL's rollout loop and follow its internals. The registration has to happen in the process where
ROLL's env manager calls ``gem.make`` (its ``EnvironmentWorker`` Ray actors), and the one module ROLL
imports there by name is ``env_manager_cls``: :mod:`gem_integrations.roll.env_manager` registers on
import and hands back ROLL's own manager classes (the same objects, not subclasses).

One id, not one per gem-core id: gem-llm 0.0.4 registers its own games under the same names
(``game:GuessTheNumber-v0-easy``...) and ``gem.register`` raises on a duplicate id, so the gem-core id
travels in the env config (``env:``), where ``gem_core.make`` checks it (unknown ids and kwargs are one
line with suggestions). :func:`register` is idempotent, so importing the module twice (ROLL's
``can_import_class`` then ``safe_import_class``, a reload, several env managers per worker) never
registers twice.

What ROLL reads, as read from its source, and what :class:`GemCoreEnv` gives it:

* ``reset(seed=group_seed + episode_id)`` -> ``(observation, info)`` with ``info["env_instruction"]``
  (``StepEnvManager.format_messages`` reads ``history[0]["env_instruction"]``: a missing key is a
  KeyError). It is ``""``: the first observation carries the env's rules (a GEM observation holds its
  own instructions, as ROLL's own GEM envs' do), and ``StepConcatEnvManager`` never reads the key.
* ``step(action=<decoded response>)`` by keyword; ROLL pops ``info["suffix"]`` into the next history
  entry and merges the rest of the info into the current one, reads ``use_tool`` (the next observation
  is a ``tool`` message), ``metrics`` (floats) and ``metrics_agg_mode``.
* Where gem-core's ``info["suffix"]`` (the board, the request for the next move) goes, ``suffix:``
  in the env config. ``observation`` (default): the observation is :func:`gem_core.model_message`
  (contract 4) and no ``suffix`` key is returned, so the board reaches the model under every ROLL
  manager, ``StepEnvManager`` too (it renders only ``observation``). ``info``: GEM's own split, the
  plain observation and ``info["suffix"]``, for ``StepConcatEnvManager`` (ROLL's GEM example): its
  prompt is every earlier observation (``history_length`` of them) then the current observation and
  the current suffix, so the current board is shown once and no stale board sits in the history.
* ROLL ends an episode only on ``terminated`` (or at ``max_steps``, or when the context is full);
  ``truncated=True`` alone keeps it stepping. A gem-core truncation (the env's own turn limit, or the
  config's ``max_turns``) is returned as ``terminated=True, truncated=True`` (gem-llm's own games end
  the same way), with ``metrics["truncated"] = 1.0``.
* gem-core's info goes under ``info["gem_info"]`` only, so none of its keys overwrite ROLL's history
  fields (``observation``, ``reward``, ``messages``, ``prompt_ids``...).
* An infrastructure failure (gem-core's ``info["infra_error"]``: a sandbox or env worker died, a pool
  shut down) ends ROLL's episode there (``terminated=True, truncated=True``, reward 0, no observation)
  and sets the step metric ``infra_error`` to 1.0 (``max`` over the episode: ROLL's rollout carries
  ``env/<tag>/infra_error``). ROLL has no per-sample mask ahead of its batch statistics, so
  :class:`gem_integrations.roll.group_filter.InfraErrorGroupFilter` (``group_filter_cls``) drops the
  group and ROLL plays a new one; without that filter the metric shows the rate that entered training.
* The action is the response without its thinking (``strip_thinking``, on by default), what gem-core's
  runner gives an env; ROLL decodes with ``skip_special_tokens=False``, so a trailing ``<|im_end|>``
  stays in the text (games and graders read the last ``\\boxed{}``/code block, unaffected).

Config (``custom_envs.<tag>.env_config``), the :class:`gem_core.tasks.TaskSpec` fields a ROLL env uses:
``env`` (the gem-core id, required), ``env_kwargs``, ``tools`` (``python``/``search``), ``max_turns``,
``strip_thinking``, and the bridge's ``suffix`` (``observation`` or ``info``, above). ROLL's own keys
cover the rest (``max_steps``, ``max_tokens_per_step``, ``sequence_length``, ``agent_system_template``);
``seed`` is refused because ROLL seeds ``reset``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gem

from gem_core.core import model_message
from gem_core.errors import INFRA_ERROR, GemError, InvalidArgumentError, infra_error
from gem_core.rollout import strip_thinking
from gem_core.tasks import TaskSpec

ENV_TYPE = "gem-core"  # custom_envs.<tag>.env_type
ENTRY_POINT = "gem_integrations.roll.rollout:GemCoreEnv"
CONFIG_KEYS = ("env", "env_kwargs", "tools", "max_turns", "strip_thinking", "suffix")
SUFFIX_MODES = ("observation", "info")  # where gem-core's info["suffix"] goes (module docstring)
_ROLL_KEYS = {
    "seed": "ROLL seeds every reset itself (group_seed + episode_id)",
    "env_id": "gem.make's own argument: name the gem-core id as env",
    "max_turn_tokens": "set max_tokens_per_step in custom_envs",
    "max_context_tokens": "set sequence_length in the pipeline config",
    "system_prompt": "set agent_system_template in custom_envs",
}
# ROLL's metric aggregation per episode (roll.utils.functionals.aggregate_metrics): every step's value
# is a float; these keys are present on every step.
METRICS_AGG_MODE = {
    "success": "last", "action_is_valid": "mean", "format_error": "mean", "tool_call": "mean", "truncated": "last",
    "infra_error": "max",
}  # fmt: skip


class GemCoreEnv(gem.Env):
    """A gem-core env (a :class:`~gem_core.tasks.TaskSpec` row) behind gem-llm's ``Env`` interface, the
    way ROLL's env managers call it (see the module docstring). Made by ``gem.make(env_id="gem-core",
    env=ID, ...)``; a bad config raises one :class:`~gem_core.errors.GemError` line at once."""

    def __init__(
        self, env: str | None = None, env_kwargs: Any = None, tools: Any = None, max_turns: int | None = None,
        strip_thinking: bool = True, suffix: str = "observation", **unknown: Any,
    ):  # fmt: skip
        super().__init__()
        check_config(env, unknown, strip_thinking, suffix)
        try:
            self.spec = TaskSpec(str(env), env_kwargs=env_kwargs or {}, tools=tools or (), max_turns=max_turns)
            core = self.spec.make_env()
        except GemError as exc:
            raise type(exc)(f"ROLL env_config for {ENV_TYPE} ({env}): {exc}") from None
        except (ValueError, TypeError) as exc:
            raise InvalidArgumentError(f"ROLL env_config for {ENV_TYPE} ({env}): {exc}") from None
        if self.spec.max_turns is not None:
            from gem_core.wrappers import TimeLimit

            core = TimeLimit(core, self.spec.max_turns)
        self.core = core
        self.strip_thinking = bool(strip_thinking)
        self.suffix_mode = suffix

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """ROLL's ``reset(seed=...)``: the first observation (the env's rules) and ``env_instruction`` (empty)."""
        observation, info = self.core.reset(seed=seed)
        shown, roll_info = self._shown(observation, info)
        return shown, {"env_instruction": "", **roll_info, "gem_info": dict(info)}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """ROLL's ``step(action=...)``: a truncation ends the episode (``terminated=True``), and so does an
        infrastructure failure (reward 0, metric ``infra_error`` 1: see the module docstring)."""
        text = strip_thinking(action) if self.strip_thinking else action
        observation, reward, terminated, truncated, info = self.core.step(text)
        failure = infra_error(info)
        if failure is not None:  # not the policy's doing: its reward and observation say nothing of it
            metrics = {**step_metrics(info, truncated=False), "infra_error": 1.0}
            roll_info = {"use_tool": False, "metrics": metrics, "metrics_agg_mode": dict(METRICS_AGG_MODE), INFRA_ERROR: failure, "gem_info": dict(info)}
            return "", 0.0, True, True, roll_info
        ended_by_limit = bool(truncated) and not bool(terminated)
        roll_info = {
            "use_tool": bool(info.get("tool_turn", False)),
            "metrics": step_metrics(info, truncated=ended_by_limit),
            "metrics_agg_mode": dict(METRICS_AGG_MODE),
            "gem_info": dict(info),
        }
        done = bool(terminated) or bool(truncated)
        if done:
            return "", float(reward), True, bool(truncated), roll_info
        shown, suffix_info = self._shown(observation, info)
        return shown, float(reward), False, bool(truncated), {**roll_info, **suffix_info}

    def _shown(self, observation: str, info: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
        """The observation ROLL gets and the ``suffix`` key beside it, under :attr:`suffix_mode`: the
        model message, or its two parts as :func:`gem_core.model_message` reads them (never shown twice)."""
        message = model_message(observation, info)
        if self.suffix_mode == "observation":
            return message, {}
        if message == observation:  # no suffix, or the observation already ends with it
            return observation, {"suffix": ""}
        return observation.rstrip("\n"), {"suffix": str(info["suffix"]).strip("\n")}

    def sample_random_action(self) -> str:
        """The gem-core env's random action (ROLL's ``random`` LLM proxy calls it)."""
        return self.core.sample_random_action()

    def close(self) -> None:
        self.core.close()


def check_config(env: Any, unknown: Mapping[str, Any], strip_thinking: Any, suffix: Any = "observation") -> None:
    """One clear line for a config ROLL would hand over wrong."""
    if unknown:
        hints = "; ".join(f"{k}: {_ROLL_KEYS[k]}" for k in unknown if k in _ROLL_KEYS)
        raise InvalidArgumentError(
            f"ROLL env_config for {ENV_TYPE}: unknown key(s) {sorted(unknown)}; allowed: {', '.join(CONFIG_KEYS)}" + (f" ({hints})" if hints else ""),
            name=sorted(unknown)[0], value=unknown[sorted(unknown)[0]], allowed=", ".join(CONFIG_KEYS),
        )  # fmt: skip
    if not isinstance(env, str) or not env.strip():
        raise InvalidArgumentError(
            f"ROLL env_config for {ENV_TYPE} needs env: a gem-core env id (e.g. game:Sudoku-v0-easy), got {env!r}", name="env", value=env
        )
    if not isinstance(strip_thinking, bool):
        raise InvalidArgumentError(
            f"ROLL env_config for {ENV_TYPE}: strip_thinking must be true or false, got {strip_thinking!r}", name="strip_thinking", value=strip_thinking
        )
    if suffix not in SUFFIX_MODES:
        raise InvalidArgumentError(
            f"ROLL env_config for {ENV_TYPE}: suffix must be one of {', '.join(SUFFIX_MODES)} (observation for StepEnvManager, info for StepConcatEnvManager), got {suffix!r}",
            name="suffix", value=suffix, allowed=", ".join(SUFFIX_MODES),
        )  # fmt: skip


def step_metrics(info: Mapping[str, Any], *, truncated: bool) -> dict[str, float]:
    """ROLL's per-step ``metrics`` (floats, the same keys every step) from gem-core's step info."""
    format_error = bool(info.get("format_error", False))
    return {
        "success": float(bool(info.get("success", False))),
        "action_is_valid": float(not (format_error or bool(info.get("invalid_action", False)))),
        "format_error": float(format_error),
        "tool_call": float(bool(info.get("tool_turn", False))),
        "truncated": float(truncated),
        "infra_error": 0.0,
    }


def register() -> None:
    """Register ``gem-core`` in gem-llm's registry, once per process (idempotent). An id already held
    by another entry point is an error, never overwritten."""
    from gem.envs.registration import ENV_REGISTRY

    spec = ENV_REGISTRY.get(ENV_TYPE)
    if spec is None:
        gem.register(ENV_TYPE, entry_point=ENTRY_POINT)
    elif spec.entry_point not in (ENTRY_POINT, GemCoreEnv):
        raise GemError(f"the gem registry already holds {ENV_TYPE!r} for {spec.entry_point!r}; gem-core's ROLL bridge needs that id")


def is_registered() -> bool:
    """Whether ``gem-core`` is in gem-llm's registry (with this bridge's entry point)."""
    from gem.envs.registration import ENV_REGISTRY

    spec = ENV_REGISTRY.get(ENV_TYPE)
    return spec is not None and spec.entry_point in (ENTRY_POINT, GemCoreEnv)
