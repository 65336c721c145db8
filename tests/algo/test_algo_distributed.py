"""Distributed ReBN: two gloo processes on loopback give exactly the single-process answer on the union."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gem_core.algo import (
    discounted_returns,
    normalization_stats,
    rebn,
    rebn_token_level,
)

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover - every CPU wheel has gloo
    pytest.skip("torch.distributed is not available", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).parent))
from _distributed_worker import shard, shared_batch  # noqa: E402  (from this folder, put on sys.path above)

WORKER = Path(__file__).parent / "_distributed_worker.py"


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, np.ndarray]]:
    out_dir = tmp_path_factory.mktemp("gloo")
    port = free_loopback_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    ranks = [subprocess.Popen([sys.executable, str(WORKER), str(rank), "2", str(port), str(out_dir)], env=env) for rank in range(2)]
    try:
        codes = [process.wait(timeout=60) for process in ranks]
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
    assert codes == [0, 0], f"worker exit codes {codes}"
    return [dict(np.load(out_dir / f"rank{rank}.npz")) for rank in range(2)]


def test_rebn_over_two_ranks_equals_rebn_on_the_union(rank_results: list) -> None:
    data = shared_batch()
    union = np.concatenate([rank_results[0]["ddof0"], rank_results[1]["ddof0"]])
    np.testing.assert_allclose(union, rebn(data["episodes"], gamma=0.9, ddof=0), atol=1e-12)


def test_grouped_rebn_with_different_groups_on_each_rank(rank_results: list) -> None:
    data = shared_batch()
    union = np.concatenate([rank_results[0]["ddof1_grouped"], rank_results[1]["ddof1_grouped"]])
    expected = rebn(data["episodes"], gamma=0.9, ddof=1, group_by=data["keys"])
    np.testing.assert_allclose(union, expected, atol=1e-12)
    union = np.concatenate([rank_results[0]["torch_grouped"], rank_results[1]["torch_grouped"]])
    np.testing.assert_allclose(union, rebn(data["episodes"], gamma=0.5, group_by=data["keys"]), atol=1e-12)


def test_token_level_rebn_over_two_ranks(rank_results: list) -> None:
    data = shared_batch()
    expected = rebn_token_level(data["rewards"].astype(np.float32), data["mask"], data["row_keys"], gamma=0.9, ddof=1)
    for rank in range(2):
        rows = shard(rank)[1]
        np.testing.assert_allclose(rank_results[rank]["token_level"], expected[rows], atol=1e-6)


def test_every_rank_sees_the_global_statistics(rank_results: list) -> None:
    data = shared_batch()
    stats = normalization_stats(discounted_returns(data["episodes"], gamma=0.9))
    for rank in range(2):
        np.testing.assert_allclose(rank_results[rank]["stats"], [stats.count[0], stats.mean[0], stats.std[0]], atol=1e-12)


def test_a_rank_with_no_episodes_still_takes_part(rank_results: list) -> None:
    data = shared_batch()
    np.testing.assert_allclose(rank_results[0]["uneven"], rebn(data["episodes"][:7], gamma=0.9), atol=1e-12)
    assert rank_results[1]["uneven"].shape == (0,)


def test_distributed_without_a_process_group_is_a_clear_error() -> None:
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        rebn([[1.0, 2.0]], distributed=True)
