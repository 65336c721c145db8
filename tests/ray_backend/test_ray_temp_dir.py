"""A local cluster starts whatever the checkout's path: Ray's sockets need a short temp folder (a Unix socket's
path holds 107 bytes), and nox points TMPDIR into .nox/<session>/tmp inside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

START_AND_STOP = textwrap.dedent(
    """
    import sys
    from gem_core.ray import cluster
    ray = cluster.connect()
    temp_dir = cluster._temp_dir
    assert ray.get(ray.remote(lambda: 41 + 1).remote()) == 42
    cluster.release()
    print(temp_dir)
    """
)


@pytest.fixture
def long_temp(tmp_path):
    """A temp folder 100 characters deep, as a checkout's .nox/<session>/tmp is from an ordinary path."""
    path = tmp_path / "checkout"
    path = str(path) + "-" + "x" * max(1, 100 - len(str(path)) - 1)
    os.makedirs(path)
    assert len(path) == 100
    return path


def _env(temp: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_TMPDIR", "RAY_ADDRESS")}
    return {**env, "TMPDIR": temp}


def test_a_cluster_started_under_a_long_temp_folder_runs_and_its_short_folder_is_removed(long_temp):
    done = subprocess.run([sys.executable, "-c", START_AND_STOP], env=_env(long_temp), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    temp_dir = done.stdout.strip().splitlines()[-1]
    assert temp_dir.startswith("/tmp/gem-ray-") and not os.path.exists(temp_dir)


def test_without_the_short_folder_the_same_start_fails(long_temp):
    """The check can fail: Ray's own choice of folder under the same TMPDIR cannot hold its sockets."""
    plain = "import ray\nray.init(num_cpus=1, include_dashboard=False)\nray.shutdown()\n"
    try:
        done = subprocess.run([sys.executable, "-c", plain], env=_env(long_temp), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return  # hung instead of starting: fails all the same
    assert done.returncode != 0 and "107" in done.stderr
