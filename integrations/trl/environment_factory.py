"""gem-core envs for TRL's ``GRPOTrainer(environment_factory=...)`` (TRL 1.16): an env class whose public,
typed, documented methods are the model's tools.

    from gem_integrations.trl.environment_factory import environment_factory, environment_dataset

    factory = environment_factory("game:GuessTheNumber-v0")         # games: a move(move) tool
    factory = environment_factory("game:GuessTheNumber-v0", tools="python")   # + python(code)
    trainer = GRPOTrainer(model, args=GRPOConfig(max_steps=..., ...), processing_class=tokenizer,
                          train_dataset=environment_dataset("game:GuessTheNumber-v0", 256),
                          environment_factory=factory)                # reward: get_reward, the episode's return

Each instance holds one gem-core env (built by :func:`gem_core.tasks.make_task_env`, as a training row
builds it); TRL pools instances and calls ``reset(**row)`` before each rollout: a ``seed`` column picks the
episode, and the reset's message (the observation and ``info["suffix"]``: :func:`gem_core.model_message`) is
appended to the prompt. A row without a seed takes :func:`seedless_seed`: ``seed_start + rank + world_size *
k``, ``k`` counting this process's seedless resets of the factory's class (all its instances together), so
every rollout of a batch, every batch and every rank plays its own episode, and a rerun the same ones (TRL
resets the pool's instances one after another, in order). The seed an episode was reset with is ``seed``. The tools
turn the model's calls into the env's own action text, so the episode is the one gem-core plays:

* a game (``game:*``): ``move(move)`` steps ``\\boxed{move}``; another env: ``answer(answer)`` does;
* the Python tool: ``python(code)`` steps ``<python>code</python>`` (a tool turn of ToolEnvWrapper);
* search: ``search(query)`` steps ``<search>query</search>``.

A tool returns what the model is shown next (the end of the episode is said in it); a call after the end
raises, which TRL reports to the model as the tool's error. ``get_reward`` is the sum of the env's rewards.
An episode whose infrastructure failed (``info["infra_error"]``) gets ``None`` from ``get_reward`` (TRL
leaves a ``None`` reward out); ``environment_factory`` cannot take it out of the loss as the ``rollout_func``
path (GemRollout) does. TRL never closes an instance: :func:`close_environments` closes a trainer's pool.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch.distributed as dist

from gem_core.core import model_message
from gem_core.errors import infra_error
from gem_core.registry import check_kwargs, spec
from gem_core.tasks import make_task_env, parse_env_kwargs
from gem_core.tools.factory import parse_tools

#: The note a tool's reply ends with once the episode is over.
EPISODE_OVER = "The episode is over."
#: The user message of every :func:`environment_dataset` row; the env's first message is appended to it.
INSTRUCTION = "Play by calling the tools. The environment says:\n\n"


class GemEnvironment:
    """The base of the classes :func:`environment_factory` makes (one per env id). TRL exposes every public
    function of the class as a tool, so everything here but ``reset`` and ``get_reward`` is private."""

    env_id: str = ""
    env_kwargs: Mapping[str, Any] = {}
    tools: tuple[str, ...] = ()
    seed_start: int = 0

    #: This process's count of seedless resets, shared by every instance of the class (see seedless_seed).
    _seedless_resets: itertools.count = itertools.count()

    def __init__(self) -> None:
        self._env = make_task_env(self.env_id, dict(self.env_kwargs), list(self.tools))
        self.seed: int | None = None  # the seed of the episode last reset (not a tool: TRL takes functions only)
        self._rewards: list[float] = []
        self._done = True
        self._infra_error: str | None = None
        self._closed = False

    def reset(self, seed: int | None = None, **row: Any) -> str:
        """Start an episode (TRL passes the dataset row: a ``seed`` column picks it, else :func:`seedless_seed`);
        returns the first message."""
        seed = seedless_seed(self.seed_start, next(type(self)._seedless_resets)) if seed is None else int(seed)
        self.seed = seed
        obs, info = self._env.reset(seed=seed)
        self._rewards, self._done, self._infra_error = [], False, None
        return model_message(self._without_tool_protocol(obs), info)

    def get_reward(self) -> float | None:
        """The episode's return (the sum of the env's rewards); ``None`` if its infrastructure failed."""
        return None if self._infra_error is not None else float(sum(self._rewards))

    def _step(self, action: str) -> str:
        if self._done:
            raise ValueError(f"{EPISODE_OVER} No more calls: give your final reply.")
        obs, reward, terminated, truncated, info = self._env.step(action)
        self._rewards.append(float(reward))
        self._done = bool(terminated or truncated)
        failure = infra_error(info)
        if failure is not None:
            self._infra_error, self._done = failure, True
        text = model_message(obs, info) if isinstance(obs, str) else str(obs)
        return f"{text}\n\n{EPISODE_OVER}" if self._done else text

    def _without_tool_protocol(self, obs: Any) -> Any:
        """The first observation without ToolEnvWrapper's instructions for calling tools in text
        (``<python>...</python>``): here the tools are functions, and their schemas tell the model."""
        tools = getattr(self._env, "tools", None)
        if not self.tools or not isinstance(obs, str) or not tools:
            return obs
        instructions = "\n\n".join(tool.instructions() for tool in tools)
        if len(tools) > 1:
            instructions = "Tools available:\n\n" + instructions
        return obs[: -len(instructions) - 2] if obs.endswith("\n\n" + instructions) else obs

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()

    def __del__(self) -> None:
        try:
            self._close()
        except Exception:  # interpreter shutdown: the env's resources go with the process
            pass


def process_rank() -> tuple[int, int]:
    """``(rank, world size)`` of this process: torch.distributed's once initialised (TRL's accelerator joins
    the process group when the trainer is built), else the launcher's ``RANK``/``WORLD_SIZE``, else ``(0, 1)``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), max(int(os.environ.get("WORLD_SIZE", 1)), 1)


def seedless_seed(seed_start: int, k: int, rank: int | None = None, world_size: int | None = None) -> int:
    """The seed of a process's ``k``-th reset without a ``seed`` column: ``seed_start + rank + world_size * k``.
    Distinct for every reset of every process (rank ``r`` takes ``seed_start + r``, ``+ r + world_size``, ...),
    and the same in a rerun. ``rank``/``world_size`` default to :func:`process_rank`'s."""
    if rank is None or world_size is None:
        rank, world_size = process_rank()
    return int(seed_start) + int(rank) + int(world_size) * int(k)


# The tools, as plain functions; environment_factory puts the ones an env needs on its class. TRL builds
# each tool's JSON schema from its name, type hints and Google-style docstring (transformers'
# get_json_schema), so each has an ``Args:`` entry per parameter.


def _move(self, move: str) -> str:
    return self._step(f"\\boxed{{{move}}}")


def _answer(self, answer: str) -> str:
    return self._step(f"\\boxed{{{answer}}}")


def _python(self, code: str) -> str:
    """Run Python code in a sandbox and return what it prints (stdout, then stderr if any).

    Args:
        code: The Python source to run, e.g. print(sum(range(10))). Use print() to see a value.
    """
    return self._step(f"<python>{code}</python>")


def _search(self, query: str) -> str:
    """Search the document collection and return the best passages.

    Args:
        query: What to look for, in a few words.
    """
    return self._step(f"<search>{query}</search>")


def _tool(function: Callable[..., str], name: str, doc: str) -> Callable[..., str]:
    """``function`` under ``name`` with ``doc`` (a copy: the plain functions stay unchanged)."""
    copy = type(function)(function.__code__, function.__globals__, name, function.__defaults__, function.__closure__)
    copy.__doc__, copy.__annotations__, copy.__qualname__ = doc, dict(function.__annotations__), name
    return copy


def environment_factory(
    env_id: str,
    *,
    env_kwargs: Mapping[str, Any] | str | None = None,
    tools: Iterable[str] | str | None = None,
    seed_start: int = 0,
) -> type[GemEnvironment]:
    """The class TRL's ``environment_factory`` takes for ``env_id`` (a class is a zero-argument callable):
    its tools are ``move`` (games) or ``answer`` (other envs), plus ``python`` and ``search`` for the
    ``tools`` named. The id, kwargs and tools are checked here, before TRL builds anything."""
    kwargs = parse_env_kwargs(env_kwargs)
    check_kwargs(spec(env_id), kwargs)
    names = tuple(parse_tools(tools))
    if isinstance(seed_start, bool) or not isinstance(seed_start, int) or seed_start < 0:
        raise ValueError(f"environment_factory: seed_start must be an integer >= 0, got {seed_start!r}")
    game = env_id.split(":", 1)[0] == "game"
    namespace: dict[str, Any] = {
        "env_id": env_id,
        "env_kwargs": kwargs,
        "tools": names,
        "seed_start": seed_start,
        "_seedless_resets": itertools.count(),  # the class's own count: one factory's episodes do not move another's
        "__doc__": f"{env_id} for TRL's environment_factory: tools {', '.join(['move' if game else 'answer', *names])}.",
        "__module__": __name__,
    }
    if game:
        namespace["move"] = _tool(
            _move,
            "move",
            (
                f"Make your next move in the game ({env_id}); the game's messages say what a move looks like.\n\n"
                "Args:\n"
                "    move: The move itself, exactly what goes inside \\boxed{} in the game's examples (for instance 7, or 1 2 3).\n"
            ),
        )
    else:
        namespace["answer"] = _tool(
            _answer,
            "answer",
            (
                f"Give your final answer to the task ({env_id}); it is graded once and ends the episode.\n\n"
                "Args:\n"
                "    answer: The answer alone, exactly what goes inside \\boxed{} (for instance 42).\n"
            ),
        )
    if "python" in names:
        namespace["python"] = _tool(_python, "python", _python.__doc__ or "")
    if "search" in names:
        namespace["search"] = _tool(_search, "search", _search.__doc__ or "")
    class_name = "Gem_" + re.sub(r"[^0-9A-Za-z]+", "_", env_id).strip("_")
    return type(class_name, (GemEnvironment,), namespace)


def environment_dataset(env_id: str, n: int, *, seed_start: int = 0, instruction: str = INSTRUCTION) -> Any:
    """A ``datasets.Dataset`` of ``n`` rows for ``environment_factory`` training: a user prompt (the env's
    first message is appended by ``reset``) and the episode's ``seed`` (``seed_start + i``)."""
    from datasets import Dataset

    spec(env_id)  # an unknown id fails here
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"environment_dataset: n must be an integer >= 1, got {n!r}")
    return Dataset.from_list([{"prompt": [{"role": "user", "content": instruction}], "seed": seed_start + i} for i in range(n)])


def close_environments(trainer: Any) -> int:
    """Close every env instance in a GRPOTrainer's ``environment_factory`` pool (TRL never closes them);
    returns how many were closed."""
    closed = 0
    for pool in (getattr(trainer, "_environment_pool", None) or {}).values():
        for instance in pool:
            if isinstance(instance, GemEnvironment) and not instance._closed:
                instance._close()
                closed += 1
    return closed


__all__ = [
    "EPISODE_OVER",
    "INSTRUCTION",
    "GemEnvironment",
    "close_environments",
    "environment_dataset",
    "environment_factory",
    "process_rank",
    "seedless_seed",
]
