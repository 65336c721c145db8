"""make_vec's ray mode: named by its entry point below the Ray backend, loaded when used, one clear line without Ray."""

from __future__ import annotations

import importlib.util

import pytest

import gem_core
from gem_core.cli import main as gem_core_main
from gem_core.vector.make import VECTOR_MODES, vector_class_of

GTN = "game:GuessTheNumber-v0-easy"


def test_the_ray_mode_resolves_to_the_ray_backends_vector_env():
    from gem_core.ray import RayVectorEnv

    assert VECTOR_MODES["ray"] == "gem_core.ray.vector_env:RayVectorEnv"
    assert vector_class_of("ray") is RayVectorEnv
    assert set(VECTOR_MODES) == {"sync", "async", "ray"}


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed here: the ray session covers the mode")
def test_without_ray_the_ray_mode_is_one_clear_error_before_anything_is_built(capsys):
    from gem_core.ray import RayBackendError

    with pytest.raises(RayBackendError, match="needs Ray, which is not installed"):
        gem_core.make_vec(GTN, 2, vectorization_mode="ray")
    assert gem_core_main(["play", GTN, "--policy", "random", "--num-envs", "2", "--vector", "ray", "--no-progress"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs Ray" in err[0] and "Traceback" not in err[0]
