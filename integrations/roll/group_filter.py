"""``group_filter_cls`` for ROLL: keeps the episodes the infrastructure failed out of ROLL's loss and
out of its advantage statistics, and counts them.

    train_env_manager:
      group_filter_cls: gem_integrations.roll.group_filter.InfraErrorGroupFilter

What ROLL offers, as read from its source (``roll/distributed/scheduler/rollout_scheduler.py``,
``GroupQueue.put``): once a group's ``group_size`` rollouts are in, it asks
``group_filter.filter(group_id, episode_id, group)``; True drops the group before ``get_batch`` sees
it (so neither the actor's loss nor ``compute_response_level_rewards``' batch mean and std ever hold
it), counts it in the step metric ``scheduler/group_filter_count`` and opens a new group in its place
(``advance_group``), so the batch keeps its size. ROLL drops its own failed rollouts this way
(``AgentNativeEnvManager``'s ``drop_flag`` with its ``GroupFilter``). It has nothing finer: no
per-sample mask ahead of its reward normalisation (``get_agentic_response_level_mask`` keeps every
sample), so the whole group goes; with ``group_size > 1`` the failed episode's siblings go with it.

A rollout failed when the env metrics ROLL's ``formulate_rollouts`` put in ``meta_info["metrics"]``
hold ``env/<tag>/infra_error`` > 0: :class:`gem_integrations.roll.rollout.GemCoreEnv` sets that step
metric (aggregated with ``max``) when gem-core's ``info["infra_error"]`` reports a failure.

Counting: besides ROLL's ``scheduler/group_filter_count`` (groups), the number of failed episodes is
added as :data:`METRIC` to the metrics of the next group let through (its first rollout's
``meta_info["metrics"]``); ROLL's scheduler gathers every rollout's metrics into the batch's and its
``reduce_metrics`` sums a key ending in ``@sum``. A group that ROLL later discards as too old
(``async_generation_ratio``) takes its count with it.

ROLL needs the filter configured: :func:`check_group_filter` refuses, in one line, a train env manager
without it (the plugin's ``pipeline_cls`` calls it at start-up), since a failed episode's reward 0 would
otherwise enter ROLL's batch mean and std.

A dead pool fails every episode and ROLL would replay groups forever: after
:attr:`InfraErrorGroupFilter.max_consecutive` groups dropped in a row the filter raises one
:class:`~gem_core.errors.GemError` line instead (raised in ROLL's queue actor, it reaches the env
manager's ``put`` call).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from gem_core.errors import GemError

METRIC = "gem/infra_failed_episodes@sum"  # ROLL's reduce_metrics sums a key ending in "@sum"
FLAG = "infra_error"  # the bridge's step metric: env/<tag>/infra_error in a rollout's metrics


def infra_failed(rollout: Any) -> bool:
    """Whether a ROLL rollout (a ``DataProto`` from an env manager) comes from an episode whose env
    reported an infrastructure failure (``env/<tag>/infra_error`` > 0 in its ``meta_info["metrics"]``)."""
    metrics = getattr(rollout, "meta_info", None) or {}
    metrics = metrics.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        return False
    return any(key.startswith("env/") and key.rsplit("/", 1)[-1] == FLAG and float(value) > 0 for key, value in metrics.items())


class InfraErrorGroupFilter:
    """ROLL's ``group_filter_cls`` interface (``__init__(config, env_manager_config, mode)``,
    ``filter(group_id, episode_id, group) -> bool``, True drops): drops every group holding an episode
    the infrastructure failed, counts those episodes into :data:`METRIC`. Subclass it to combine it
    with a filter of your own (``super().filter(...) or yours``)."""

    max_consecutive = 512  # groups dropped in a row before the filter gives up (the infrastructure is down)

    def __init__(self, config: Any = None, env_manager_config: Any = None, mode: str = "train"):
        self.mode = mode
        self.pending = 0  # failed episodes not yet reported in a rollout's metrics
        self.failed_episodes = 0  # totals, for logs and tests
        self.dropped_groups = 0
        self.consecutive = 0

    def filter(self, group_id: int, episode_id: int, group: Iterable[Any]) -> bool:
        """True (drop) when a rollout of the group comes from an infra-failed episode; otherwise the
        count of episodes dropped since the last kept group goes into its first rollout's metrics."""
        rollouts = [rollout for rollout in group if rollout is not None]
        failed = sum(infra_failed(rollout) for rollout in rollouts)
        if failed:
            self.pending += failed
            self.failed_episodes += failed
            self.dropped_groups += 1
            self.consecutive += 1
            if self.consecutive >= self.max_consecutive:
                raise GemError(
                    f"gem-core's ROLL group filter ({self.mode}): the last {self.consecutive} groups all held an episode whose env reported "
                    f"an infrastructure failure (info['infra_error']; group {group_id}, episode {episode_id}): the sandbox or env workers are down"
                )
            return True
        self.consecutive = 0
        if rollouts:  # the key on every kept group (0.0 too), so the step's metrics always show it
            metrics = rollouts[0].meta_info.setdefault("metrics", {})
            metrics[METRIC] = float(metrics.get(METRIC, 0.0)) + self.pending
            self.pending = 0
        return False


def check_group_filter(pipeline_config: Any) -> None:
    """Refuse (one :class:`~gem_core.errors.GemError` line) a ROLL pipeline config whose
    ``train_env_manager.group_filter_cls`` is not :class:`InfraErrorGroupFilter` or a subclass: without
    it an episode the infrastructure failed trains with reward 0 and enters ROLL's batch mean and std."""
    manager = getattr(pipeline_config, "train_env_manager", None)
    path = getattr(manager, "group_filter_cls", None)
    found: Any = path
    if isinstance(path, str):
        module, _, name = path.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), name) if module else None
        except (ImportError, AttributeError):
            found = None
    if not (isinstance(found, type) and issubclass(found, InfraErrorGroupFilter)):
        raise GemError(
            f"train_env_manager.group_filter_cls is {path!r}: gem-core's ROLL envs need "
            "gem_integrations.roll.group_filter.InfraErrorGroupFilter (or a subclass) there, so that an episode the "
            "infrastructure failed stays out of ROLL's batch statistics"
        )


__all__ = ["FLAG", "METRIC", "InfraErrorGroupFilter", "check_group_filter", "infra_failed"]
