"""Shared test settings: hypothesis profiles (CI runs the 'ci' profile: derandomised, more examples)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _task_data(tmp_path_factory):
    """Every task id (math:*, eval:*, ...) makes offline: small generated copies of their datasets under
    $GEM_DATA_DIR (gem_core.testing.task_data), read through the real loader."""
    from gem_core.testing.task_data import write_task_data

    root = tmp_path_factory.mktemp("gem_data")
    write_task_data(root)
    previous = os.environ.get("GEM_DATA_DIR")
    os.environ["GEM_DATA_DIR"] = str(root)
    yield root
    if previous is None:
        os.environ.pop("GEM_DATA_DIR", None)
    else:
        os.environ["GEM_DATA_DIR"] = previous
