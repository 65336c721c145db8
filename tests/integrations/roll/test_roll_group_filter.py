"""gem_integrations.roll.group_filter.InfraErrorGroupFilter under ROLL's group_filter_cls contract, as read from ROLL's
source (rollout_scheduler.GroupQueue.put: ``filter(group_id, episode_id, group)`` once the group is complete, True
drops it and ROLL opens a new group; the kept rollouts' ``meta_info["metrics"]`` are gathered and reduced by name,
``@sum`` summed). A rollout stands in for ROLL's DataProto here (the filter reads ``meta_info`` only);
test_roll_src.py runs it inside ROLL's own GroupQueue with rollouts from ROLL's env manager."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gem_core.errors import GemError
from gem_integrations.roll.group_filter import METRIC, InfraErrorGroupFilter, infra_failed


def rollout(tag="GemSudoku", failed=0.0, **extra):
    """What ROLL's StepEnvManager.formulate_rollouts leaves in meta_info: env/<tag>/<metric>, env/response_length."""
    return SimpleNamespace(meta_info={"metrics": {f"env/{tag}/success": 0.0, f"env/{tag}/infra_error": failed, "env/response_length": 12.0, **extra}})


def test_a_group_with_an_infra_failed_episode_is_dropped_and_counted_on_the_next_kept_group():
    groups = InfraErrorGroupFilter(config=None, env_manager_config=None, mode="train")
    assert groups.filter(0, 0, [rollout(), rollout(failed=1.0)]) is True
    assert groups.filter(1, 0, [rollout(failed=1.0), rollout(failed=1.0)]) is True
    kept = [rollout(), rollout()]
    assert groups.filter(2, 0, kept) is False
    assert kept[0].meta_info["metrics"][METRIC] == 3.0 and METRIC not in kept[1].meta_info["metrics"]
    again = [rollout()]
    assert groups.filter(3, 0, again) is False and again[0].meta_info["metrics"][METRIC] == 0.0  # counted once
    assert (groups.failed_episodes, groups.dropped_groups) == (3, 2)
    assert METRIC.endswith("@sum")  # ROLL's reduce_metrics sums it over the batch's rollouts


def test_only_the_bridge_s_env_metric_marks_a_failure():
    assert not infra_failed(rollout(failed=0.0))
    assert not infra_failed(SimpleNamespace(meta_info={"metrics": {"env/T/infra_error_rate": 1.0, "infra_error": 1.0}}))
    assert not infra_failed(SimpleNamespace(meta_info={})) and not infra_failed(SimpleNamespace())
    assert infra_failed(rollout(tag="Other", failed=1.0))
    assert InfraErrorGroupFilter().filter(0, 0, [None, rollout()]) is False  # ROLL's end-of-run None rollouts


def test_a_dead_infrastructure_is_one_error_line_not_an_endless_replay():
    groups = InfraErrorGroupFilter()
    groups.max_consecutive = 3
    assert groups.filter(0, 0, [rollout(failed=1.0)]) and groups.filter(0, 1, [rollout(failed=1.0)])
    with pytest.raises(GemError) as caught:
        groups.filter(0, 2, [rollout(failed=1.0)])
    assert "last 3 groups" in str(caught.value) and "\n" not in str(caught.value)
    fresh = InfraErrorGroupFilter()
    fresh.max_consecutive = 2
    for episode in range(10):  # a kept group in between resets the run
        assert fresh.filter(0, episode, [rollout(failed=float(episode % 2 == 0))]) is (episode % 2 == 0)


def test_a_pipeline_without_the_filter_is_refused_in_one_line():
    """Without InfraErrorGroupFilter a failed episode's reward 0 enters ROLL's batch mean and std: the
    plugin's pipeline refuses such a config at start-up; the filter's path or a subclass passes."""
    from types import SimpleNamespace as NS

    from gem_core.errors import GemError
    from gem_integrations.roll.group_filter import check_group_filter

    class Combined(InfraErrorGroupFilter):
        pass

    check_group_filter(NS(train_env_manager=NS(group_filter_cls="gem_integrations.roll.group_filter.InfraErrorGroupFilter")))
    check_group_filter(NS(train_env_manager=NS(group_filter_cls=Combined)))
    for path in (None, "roll.pipeline.agentic.env_manager.GroupFilter", "no.such.Filter", "json.JSONDecoder", ""):
        with pytest.raises(GemError, match="InfraErrorGroupFilter") as raised:
            check_group_filter(NS(train_env_manager=NS(group_filter_cls=path)))
        assert "\n" not in str(raised.value)
