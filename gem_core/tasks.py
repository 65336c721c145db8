"""TaskSpec: the dataset-row schema that ``make-dataset``, every trainer plugin and evaluation share.

One row of a trainer's dataset names one episode to play: the env id, its ``make`` kwargs, the reset
seed, the tools to wrap it with, and optional limits (turns, tokens per response, whole context) and a
system prompt. :class:`TaskSpec` is that row; each plugin stores it in its trainer's own format
(verl: parquet columns, :meth:`TaskSpec.to_columns`/:meth:`TaskSpec.from_columns`; OpenRLHF: a JSON
label, :meth:`TaskSpec.to_json`/:meth:`TaskSpec.from_json`) and builds the env with
:meth:`TaskSpec.make_env`, so the same row builds the same env everywhere. The first prompt a dataset
shows is :meth:`TaskSpec.first_message`: the env's reset through :func:`gem_core.model_message`, the
same text the runner puts in the model's context.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gem_core.core import Env, model_message
from gem_core.experiment import EVAL_SEED_START, run_start_seeds
from gem_core.multimodal import MultimodalObservation
from gem_core.registry import make
from gem_core.rollout import RunConfig, row_config
from gem_core.tools.factory import make_tool, parse_tools
from gem_core.wrappers import ToolEnvWrapper


def parse_env_kwargs(value: Any) -> dict[str, Any]:
    """Env kwargs from a row: a mapping, a JSON object string, or nothing."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"env kwargs are not JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"env kwargs must be a JSON object, got {type(value).__name__}")
    return dict(value)


def make_task_env(env_id: str, env_kwargs: Any = None, tools: Iterable[str] | str | None = None) -> Env:
    """``gem_core.make(env_id, **env_kwargs)``, wrapped in a ToolEnvWrapper when ``tools`` names any."""
    env = make(str(env_id), **parse_env_kwargs(env_kwargs))
    names = parse_tools(tools)
    if names:
        env = ToolEnvWrapper(env, [make_tool(name) for name in names])
    return env


_SPEC_FIELDS = ("env_id", "seed", "env_kwargs", "tools", "max_turns", "max_turn_tokens", "max_context_tokens", "system_prompt", "stop_after_box")


@dataclass(frozen=True)
class TaskSpec:
    """One episode to play, as a dataset row names it (see the module docstring).

    ``seed``: the reset seed (``None``: unseeded). ``max_turns``, ``max_turn_tokens`` (tokens per
    response), ``max_context_tokens`` (the whole context): ``None`` leaves the trainer's own limits.
    ``stop_after_box``: each response ends at the first token that holds a ``}`` (the one that closes its
    ``\\boxed{...}`` move), in every trainer that plays the row (:func:`gem_core.rollout.play_row`).
    Every field is checked when the spec is made; a bad value is one ``ValueError`` naming it.
    """

    env_id: str
    seed: int | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: tuple[str, ...] = ()
    max_turns: int | None = None
    max_turn_tokens: int | None = None
    max_context_tokens: int | None = None
    system_prompt: str | None = None
    stop_after_box: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.env_id, str) or not self.env_id.strip():
            raise ValueError(f"env_id must be a non-empty string, got {self.env_id!r}")
        object.__setattr__(self, "seed", _optional_int("seed", self.seed, low=0))
        object.__setattr__(self, "env_kwargs", parse_env_kwargs(self.env_kwargs))
        object.__setattr__(self, "tools", tuple(parse_tools(self.tools)))
        for name in ("max_turns", "max_turn_tokens", "max_context_tokens"):
            object.__setattr__(self, name, _optional_int(name, getattr(self, name), low=1))
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ValueError(f"system_prompt must be text, got {type(self.system_prompt).__name__}")
        if self.system_prompt == "":
            object.__setattr__(self, "system_prompt", None)
        if not isinstance(self.stop_after_box, bool):
            raise ValueError(f"stop_after_box must be true or false, got {self.stop_after_box!r}")

    # -- building ----------------------------------------------------------------------------------
    def make_env(self) -> Env:
        """The env this row names (``make`` with its kwargs, wrapped with its tools)."""
        return make_task_env(self.env_id, self.env_kwargs, self.tools)

    def first_message(self, env: Env | None = None) -> str:
        """What the model is shown first: the env reset with this seed, through :func:`gem_core.model_message`.
        ``env``: an env made from this spec to reuse (it is reset); default: a fresh one, closed after."""
        message = self.first_observation(env)
        if isinstance(message, MultimodalObservation):
            raise TypeError(
                f"{self.env_id} shows images; a text dataset cannot hold them: use first_observation() (text with <image> placeholders, and the images)"
            )
        return message

    def first_observation(self, env: Env | None = None) -> str | MultimodalObservation:
        """:meth:`first_message`, or for a vision env the :class:`~gem_core.multimodal.MultimodalObservation`
        (``.text`` with one ``<image>`` per image, verl's prompt convention; ``.images`` for the row's
        ``images`` column, e.g. as ``{"bytes": gem_core.multimodal.image_png_bytes(image)}``)."""
        own = env is None
        env = self.make_env() if own else env
        try:
            observation, info = env.reset(seed=self.seed)
            if not isinstance(observation, (str, MultimodalObservation)):
                raise TypeError(f"{self.env_id} returned a {type(observation).__name__} observation; datasets need text")
            return model_message(observation, info)
        finally:
            if own:
                env.close()

    def run_config(self, params: Any, **config: Any) -> RunConfig:
        """The runner's :class:`~gem_core.rollout.RunConfig` for this episode: ``params`` (a
        :class:`~gem_core.rollout.SamplingParams`) with this spec's ``max_turn_tokens`` as ``max_tokens`` when
        set, its ``max_turns`` and ``max_context_tokens``; ``config``: the other RunConfig fields."""
        return row_config(self, RunConfig(params=params, **config))

    # -- storing -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field as plain data (tools as a list)."""
        out = dataclasses.asdict(self)
        out["tools"] = list(self.tools)
        return out

    def to_json(self) -> str:
        """The spec as one JSON object, fields that are ``None``, empty or off left out (OpenRLHF's label)."""
        fields = {k: v for k, v in self.to_dict().items() if v is not None and v != [] and v != {}}
        if not self.stop_after_box:
            del fields["stop_after_box"]
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskSpec:
        """A spec from a mapping with :class:`TaskSpec`'s field names; unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a task spec must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_SPEC_FIELDS))
        if unknown:
            raise ValueError(f"unknown task spec field(s) {unknown}; known: {', '.join(_SPEC_FIELDS)}")
        if "env_id" not in data:
            raise ValueError("a task spec needs an 'env_id'")
        return cls(**{k: _plain(v) for k, v in data.items()})

    @classmethod
    def from_json(cls, text: Any) -> TaskSpec:
        """The inverse of :meth:`to_json` (also accepts a mapping)."""
        if isinstance(text, Mapping):
            return cls.from_dict(text)
        if not isinstance(text, str):
            raise ValueError(f"a task spec label must be a JSON string, got {type(text).__name__}")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the task spec label is not JSON: {exc}; got {text[:200]!r}") from None
        return cls.from_dict(data)

    def to_columns(self) -> dict[str, Any]:
        """Flat, parquet-friendly columns: ``env_id``, ``env_seed``, ``env_kwargs`` (JSON), ``env_tools``
        (comma-separated), ``max_turns``/``max_turn_tokens``/``max_context_tokens`` (0 = unset),
        ``system_prompt`` ("" = none), and ``stop_after_box`` only where on (a dataset's rows share their columns)."""
        columns = {
            "env_id": self.env_id,
            "env_seed": -1 if self.seed is None else self.seed,
            "env_kwargs": json.dumps(self.env_kwargs, sort_keys=True),
            "env_tools": ",".join(self.tools),
            "max_turns": self.max_turns or 0,
            "max_turn_tokens": self.max_turn_tokens or 0,
            "max_context_tokens": self.max_context_tokens or 0,
            "system_prompt": self.system_prompt or "",
        }
        if self.stop_after_box:
            columns["stop_after_box"] = True
        return columns

    @classmethod
    def from_columns(cls, row: Mapping[str, Any]) -> TaskSpec:
        """The inverse of :meth:`to_columns`, from a dataset row (numpy scalars and arrays accepted;
        columns other than the spec's are ignored, missing optional ones are unset)."""
        if "env_id" not in row:
            raise ValueError(f"the dataset row has no 'env_id' column (columns: {sorted(row)[:20]}); write it with `gem-core make-dataset`")
        seed = _plain(row.get("env_seed"))
        return cls(
            env_id=_plain(row["env_id"]),
            seed=None if seed is None or (isinstance(seed, (int, float)) and seed < 0) else seed,
            env_kwargs=_plain(row.get("env_kwargs")),
            tools=_plain(row.get("env_tools")),
            max_turns=_plain(row.get("max_turns")) or None,
            max_turn_tokens=_plain(row.get("max_turn_tokens")) or None,
            max_context_tokens=_plain(row.get("max_context_tokens")) or None,
            system_prompt=_plain(row.get("system_prompt")) or None,
            stop_after_box=bool(_plain(row.get("stop_after_box")) or False),
        )


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (from parquet/pandas rows) as plain Python values."""
    return value.tolist() if hasattr(value, "tolist") else value


def _optional_int(name: str, value: Any, *, low: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low} or unset, got {value!r}")
    return value


def specs_for(
    env_id: str,
    n: int,
    *,
    seed_start: int = 0,
    balanced: bool = False,
    run_seed: int | None = None,
    per_update: int | None = None,
    seeds_below: int = EVAL_SEED_START,
    **fields: Any,
) -> list[TaskSpec]:
    """``n`` specs of ``env_id`` with seeds ``seed_start .. seed_start + n - 1`` (the make-dataset rows), or
    with ``balanced`` the :func:`episode_seeds` that balance GuessTheNumber's targets, or with ``run_seed`` the
    start states a run with that seed plays, ``per_update`` an update, drawn below ``seeds_below``
    (:func:`gem_core.experiment.run_start_seeds`: an experiment's training rows, what ``gem-core train --seed``
    plays)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if isinstance(seed_start, bool) or not isinstance(seed_start, int) or seed_start < 0:
        raise ValueError(f"seed_start must be an integer >= 0, got {seed_start!r}")
    if run_seed is not None:
        if seed_start or balanced:
            raise ValueError("run_seed draws the start states itself: give it without seed_start or balanced")
        if per_update is None:
            raise ValueError("run_seed needs per_update: the start states of one update (its groups)")
        return [TaskSpec(env_id, seed=seed, **fields) for seed in run_start_seeds(run_seed, n, per_update, seeds_below)]
    if per_update is not None:
        raise ValueError("per_update is the run's groups an update: it goes with run_seed")
    seeds = list(range(seed_start, seed_start + n))
    if balanced:
        env = TaskSpec(env_id, env_kwargs=dict(fields.get("env_kwargs") or {})).make_env()
        try:
            seeds = episode_seeds(env, n, seed_start, balanced=True)
        finally:
            env.close()
    return [TaskSpec(env_id, seed=seed, **fields) for seed in seeds]


def episode_seeds(env: Any, n: int, seed_start: int, *, balanced: bool = False) -> list[int]:
    """The reset seeds of ``n`` episodes of ``env`` from ``seed_start``: consecutive; with ``balanced``, an env
    whose unwrapped env offers ``balanced_seeds(count, start)`` picks them (GuessTheNumber: the first seeds whose
    targets are every number equally often; ``gem-core train``'s evaluation sets, ``gem-core eval --balanced``,
    ``make-dataset --balanced``); other envs have no start states to balance."""
    balance = getattr(getattr(env, "unwrapped", env), "balanced_seeds", None)
    if balanced and callable(balance):
        return list(balance(n, seed_start))
    return list(range(seed_start, seed_start + n))
