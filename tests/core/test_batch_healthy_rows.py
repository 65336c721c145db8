"""gem_core.batch.healthy_rows: the rows a trainer's own estimator is handed once the infra-failed rows are out
(verl's patch, OpenRLHF's batch-mean baseline, RL2's global_norm, the per-turn batch's ReBN all take it)."""

import numpy as np
import pytest

from gem_core.batch import healthy_rows


def test_without_groups_every_row_not_failed_in_batch_order():
    keep = healthy_rows([False, True, False, False, True])
    assert keep.tolist() == [0, 2, 3] and keep.dtype == np.int64
    assert healthy_rows(np.array([1, 1, 1])).tolist() == []
    assert healthy_rows([]).tolist() == []


def test_with_groups_the_lone_survivor_of_a_group_that_lost_rows_is_out_too():
    failed = [0, 1, 0, 0, 1, 1, 0, 0, 0]
    uids = ["a", "a", "b", "b", "c", "c", "d", "e", "e"]
    # a lost a row and keeps one (out); b lost none; c lost both; d had one row to begin with (kept)
    assert healthy_rows(failed, uids).tolist() == [2, 3, 6, 7, 8]
    assert healthy_rows(failed).tolist() == [0, 2, 3, 6, 7, 8]


def test_groups_need_not_be_contiguous_and_keep_batch_order():
    failed = [0, 0, 1, 0, 0]
    uids = [7, 8, 7, 8, 7]
    assert healthy_rows(failed, uids).tolist() == [0, 1, 3, 4]
    assert healthy_rows([0, 1, 1], [7, 7, 7]).tolist() == []


def test_one_group_id_per_row():
    with pytest.raises(ValueError, match="2 group ids for 3 rows"):
        healthy_rows([0, 1, 0], ["a", "a"])
