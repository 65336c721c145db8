"""A local Ray cluster: the worker setup hook puts the rebn patch inside an actor, which then computes
the golden advantages with OpenRLHF's RemoteExperienceMaker."""

from __future__ import annotations

import os
import shutil
import tempfile
from types import SimpleNamespace as NS

import numpy as np
import pytest
from conftest import samples_generator

from gem_core.testing.golden import GOLDEN_DDOF, GOLDEN_EPS, GOLDEN_GAMMA, GOLDEN_MAX_CONTEXT_TOKENS

ray = pytest.importorskip("ray")
HERE = os.path.dirname(os.path.abspath(__file__))


class AdvantageActor:
    """Runs in a Ray worker; reports whether the patch is there and uses it."""

    def patch_active(self) -> bool:
        from gem_integrations.openrlhf.rebn import is_active

        return is_active()

    def rebn(self, batches, gamma, eps, ddof):
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
        from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

        args = NS(
            algo=NS(advantage=NS(estimator="rebn", gamma=gamma, lambd=1.0, no_std_norm=False, rebn_eps=eps, rebn_ddof=ddof)),
            rollout=NS(n_samples_per_prompt=1),
            reward=NS(clip_range=(-10.0, 10.0)),
        )
        maker = object.__new__(RemoteExperienceMaker)
        maker.strategy, maker.args, maker.advantage_estimator, maker.kl_ctl = NS(args=args), args, "rebn", FixedKLController(0.0)
        return [b.advantages for b in maker.compute_advantages_and_returns(batches)]


@pytest.fixture(scope="module")
def cluster():
    from gem_integrations.openrlhf.train_ppo_ray import runtime_env

    env = runtime_env({"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])})
    env["worker_process_setup_hook"] = "openrlhf_import_stubs.install_then_patch"  # stubs first, then gem's hook
    # Ray refuses a temp dir inside the virtualenv, which is where nox points TMPDIR: use the system one.
    temp_dir = tempfile.mkdtemp(prefix="ray-gem-", dir="/tmp" if os.path.isdir("/tmp") else None)
    ray.init(num_cpus=1, include_dashboard=False, runtime_env=env, log_to_driver=False, _temp_dir=temp_dir)
    yield
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_patch_is_active_in_an_actor_and_gives_golden_advantages(cluster, golden, responses):
    import torch
    from openrlhf.trainer.ppo_utils.experience import Experience

    from gem_integrations.openrlhf.train_ppo_ray import check_patch_active

    actor = ray.remote(num_cpus=1)(AdvantageActor).remote()
    assert ray.get(actor.patch_active.remote(), timeout=180) is True  # a worker that dies at start fails here
    check_patch_active()  # the launcher's own check passes in this cluster

    generator = samples_generator()
    samples = [generator._process_response_into_experience(r, max_len=GOLDEN_MAX_CONTEXT_TOKENS) for r in responses]
    for i, sample in enumerate(samples):
        sample.index = [i]
        sample.kl = torch.zeros_like(sample.action_mask, dtype=torch.float32)
    batch = Experience.concat_experiences(samples, 0)
    batch.kl = torch.zeros(batch.action_mask.shape)
    (advantages,) = ray.get(actor.rebn.remote([batch], GOLDEN_GAMMA, GOLDEN_EPS, GOLDEN_DDOF), timeout=120)
    for row, sequence, expected in zip(advantages, golden.sequences, golden.token_advantages):
        start = len(sequence.prompt_ids) - 1
        np.testing.assert_allclose(row[start : start + len(sequence.response_ids)].double().numpy(), expected, atol=1e-5)
