"""What an env tells a trainer about its episodes beyond success, return and turns: the report hook.

``gem-core train`` reports every env alike: success rate, mean return, turns per episode, turns per solved
episode, malformed and illegal turns. Anything else is the env's to give. An env (its ``unwrapped``) may
implement any of the members below; a trainer uses those it finds and prints nothing else. An env that
implements none of them gets the common table alone.

What an env author implements (every member optional)::

    class MyGame(TextGame):
        # the extra numbers of a batch of episodes, in table order: each a metrics.jsonl field (<key> per
        # update, eval_<key> and eval_greedy_<key> per evaluation) and a column of the summary table
        episode_metric_columns = (MetricColumn("repeat_rate", "repeated moves"),)
        episode_metrics_title = "moves"  # what curves.png calls the panels of these numbers

        def episode_metrics(self, trajectories):  # -> {key: value or None (nothing to measure)}
            ...  # each trajectory's turns carry the env's observation, the action, the reward, info

        def scripted_baselines(self, seeds):  # -> [ScriptedBaseline, ...]: scripted players on these seeds
            ...

        # which of the baselines is the best a player that ignores the env's feedback gets (None: no such player)
        blind_ceiling = BlindCeiling("random, no repeats", "feedback-blind ceiling", "what it means", "what a run at it learned")

        def balanced_seeds(self, count, start):  # -> reset seeds whose start states are balanced
            ...  # (read by gem_core.tasks.episode_seeds: the evaluation sets, eval --balanced, make-dataset)

        def start_state(self, seed):  # -> a hashable key of what reset(seed) starts
            ...  # promise: two seeds with one key play out alike for the same moves (the env's own steps
            # depend on the key and the moves alone), so greedy play from them is one episode

:class:`EnvReport` reads these members of one env, with the defaults of an env that has none of them
(``balanced_seeds`` is read where seeds are chosen, :func:`gem_core.tasks.episode_seeds`).
:class:`~gem_core.envs.games.guess_the_number.GuessTheNumber` implements them all (hint use, random and
hint-blind players, binary search, targets balanced over the range).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a game's module stays light: the rollout machinery is imported where episodes are played
    from gem_core.rollout import Trajectory

__all__ = ["BlindCeiling", "EnvReport", "MetricColumn", "ScriptedBaseline"]


@dataclass(frozen=True)
class MetricColumn:
    """One number an env reports over a batch of episodes: ``key`` names it in ``metrics.jsonl``, ``header``
    in the summary table and curves.png."""

    key: str
    header: str


@dataclass
class ScriptedBaseline:
    """What a scripted player (no model) scores on a set of seeds: success, turns per solved episode (None:
    it solved none) and the env's own metrics (keys of its :class:`MetricColumn`\\ s; None: nothing to measure)."""

    name: str
    success_rate: float
    turns_when_solved: float | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """The baseline as one flat record (``metrics.jsonl``'s first line holds one per baseline)."""
        return {"name": self.name, "success_rate": self.success_rate, "turns_when_solved": self.turns_when_solved, **self.metrics}


@dataclass(frozen=True)
class BlindCeiling:
    """The expected success of the best player that ignores what the env tells it between turns: a policy
    above it reads the feedback; one at or below it may not. ``baseline``: the name of the
    :class:`ScriptedBaseline` that plays it; ``label``: what the run's summary calls it; ``meaning``: one
    clause saying what it is; ``at_or_below``: one clause saying what a run that ends at or below it learned."""

    baseline: str
    label: str
    meaning: str
    at_or_below: str


#: How far above the ceiling's rate a run's rate still counts as at it: the ceiling is an expectation summed in
#: floats (GuessTheNumber's 0.4 comes out 0.3999999999999359), a run's rate k of n episodes, so a run exactly at the
#: ceiling (0.400) compared with ``<=`` alone read as above it.
CEILING_TOLERANCE = 1e-9


def at_or_below(rate: float, ceiling_rate: float) -> bool:
    """Whether a success rate is at or below a blind ceiling's (within :data:`CEILING_TOLERANCE`)."""
    return rate <= ceiling_rate + CEILING_TOLERANCE


@dataclass(frozen=True)
class EnvReport:
    """The report hook of one env as a trainer reads it (:meth:`of`): the env's columns, title and ceiling,
    its metrics and its baselines; empty where the env implements nothing."""

    env: Any  # the unwrapped env
    columns: tuple[MetricColumn, ...] = ()
    title: str = "env metrics"
    ceiling: BlindCeiling | None = None

    @classmethod
    def of(cls, env: Any) -> EnvReport:
        """The hook members ``env`` (or its ``unwrapped``) implements."""
        env = getattr(env, "unwrapped", env)
        columns = tuple(getattr(env, "episode_metric_columns", ()) or ())
        if columns and not callable(getattr(env, "episode_metrics", None)):
            raise TypeError(f"{type(env).__name__} declares episode_metric_columns but no episode_metrics(trajectories)")
        title = getattr(env, "episode_metrics_title", None) or cls.title
        return cls(env, columns, title, getattr(env, "blind_ceiling", None))

    def metrics(self, trajectories: Sequence[Trajectory]) -> dict[str, float | None]:
        """The env's metrics of ``trajectories``, one per column (None where the env gave none); {} without columns."""
        if not self.columns:
            return {}
        values = self.env.episode_metrics(trajectories)
        return {column.key: values.get(column.key) for column in self.columns}

    def start_states(self, seeds: Sequence[int]) -> list[Any] | None:
        """The key of each seed's start state (the env's ``start_state``), or None where the env promises no such
        key: then every seed is its own start state. A trainer plays greedy evaluation once per key and counts
        it as often as ``seeds`` hold it (greedy play from one start state is one episode)."""
        key = getattr(self.env, "start_state", None)
        return [key(seed) for seed in seeds] if callable(key) else None

    def baselines(self, seeds: Sequence[int]) -> list[ScriptedBaseline]:
        """The env's scripted players on ``seeds`` ([] when it has none, or no seeds are given)."""
        scripted = getattr(self.env, "scripted_baselines", None)
        return list(scripted(list(seeds))) if callable(scripted) and seeds else []
