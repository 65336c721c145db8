"""Which episodes an evaluation plays: env ids (or patterns such as ``game:*``) into a fixed list of jobs.

Every job is a :class:`~gem_core.tasks.TaskSpec` (the dataset row the trainer plugins play), so an
evaluated episode is built exactly as a training episode is. Seeds are fixed: episode ``i`` of an env
is reset with seed ``seed_start + i``, so two models evaluated with the same arguments see the same
episodes. An *evaluation set* (an env whose unwrapped env has ``len()``: the number of items in its
split, as the ``eval:*`` task envs do) plays each item once, in order: episode ``i`` is reset with
``options={"idx": i}`` (and seed ``seed_start + i``); ``--episodes`` then caps how many items.
``balanced``: on GuessTheNumber with a fixed range, the first seeds from ``seed_start`` whose targets are
every number equally often instead (``--balanced``; ``gem-core train``'s held-out set is these from 1000000).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gem_core.tasks import TaskSpec, episode_seeds

PATTERN_CHARS = "*?["
DEFAULT_EPISODES = 100  # per seeded env, when --episodes is not given

# An episode's identity in a results file: (env_id, seed, item). Two runs with the same plan have
# the same keys; --resume skips the keys already written.
EpisodeKey = tuple[str, "int | None", "int | None"]


class PlanError(ValueError):
    """An evaluation that cannot be planned (no env matches a pattern, an env without an oracle...)."""


@dataclass(frozen=True)
class EvalJob:
    """One episode to play: the task row, its position among its env's episodes, and for evaluation
    sets the item it plays (``None`` for seeded envs)."""

    spec: TaskSpec
    episode: int
    item: int | None = None

    @property
    def key(self) -> EpisodeKey:
        return (self.spec.env_id, self.spec.seed, self.item)

    @property
    def options(self) -> dict[str, Any] | None:
        """The reset options: ``{"idx": item}`` for an evaluation set's item."""
        return None if self.item is None else {"idx": self.item}

    @property
    def episode_id(self) -> str:
        """Stable across runs and resumes (a local model's sampling is seeded by it)."""
        return f"{self.spec.env_id}/{self.episode}"


def expand_env_ids(patterns: Sequence[str], registered: Iterable[str] | None = None) -> list[str]:
    """Env ids from ids and glob patterns (``game:*``, ``eval:*``, ``game:Wordle-*``), in the order
    given, each once. An id is resolved through the registry (aliases to their targets; an unknown id
    raises :class:`~gem_core.errors.UnknownEnvError` with a suggestion); a pattern that matches no
    registered id raises :class:`PlanError`."""
    import gem_core

    ids = list(gem_core.list_envs() if registered is None else registered)
    out: dict[str, None] = {}
    for pattern in patterns:
        if any(ch in pattern for ch in PATTERN_CHARS):
            matches = [env_id for env_id in ids if fnmatch.fnmatchcase(env_id, pattern)]
            if not matches:
                categories = sorted({env_id.split(":", 1)[0] for env_id in ids})
                raise PlanError(f"no registered env id matches {pattern!r} (categories: {', '.join(categories) or 'none'}; see `gem-core list`)")
            out.update(dict.fromkeys(matches))
        else:
            out[gem_core.spec(pattern).id] = None
    return list(out)


def plan(
    env_ids: Sequence[str],
    episodes: int | None,
    *,
    seed_start: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    tools: Sequence[str] = (),
    need: str | None = None,
    balanced: bool = False,
) -> list[EvalJob]:
    """The jobs for ``env_ids``: ``episodes`` per env (default :data:`DEFAULT_EPISODES`; evaluation
    sets: every item, or the first ``episodes``). One env of each id is made here, so a bad kwarg, an
    unknown tool or (``need``) a missing method such as ``oracle_action`` fails before anything runs.
    ``balanced``: a GuessTheNumber env with a fixed range plays
    :func:`~gem_core.tasks.episode_seeds` from ``seed_start`` (every target equally often); other envs
    play consecutive seeds as without it."""
    jobs: list[EvalJob] = []
    for env_id in env_ids:
        probe = TaskSpec(env_id, env_kwargs=dict(env_kwargs or {}), tools=tuple(tools))
        env = probe.make_env()
        try:
            if need is not None and not callable(getattr(env, need, None)):
                raise PlanError(f"{env_id} has no {need}(); pick another policy or leave that env out")
            items = dataset_size(env)
            if items is None:
                count = DEFAULT_EPISODES if episodes is None else episodes
            else:
                count = items if episodes is None else min(items, episodes)
            seeds = episode_seeds(env, count, seed_start, balanced=balanced and items is None)
        finally:
            env.close()
        for i, seed in enumerate(seeds):
            spec = TaskSpec(env_id, seed=seed, env_kwargs=probe.env_kwargs, tools=probe.tools)
            jobs.append(EvalJob(spec, i, None if items is None else i))
    return jobs


def dataset_size(env: Any) -> int | None:
    """The number of items of an evaluation set (``len()`` of the unwrapped env), else ``None``."""
    inner = getattr(env, "unwrapped", env)
    if not hasattr(type(inner), "__len__"):
        return None
    try:
        size = len(inner)
    except TypeError:
        return None
    return size if size > 0 else None
