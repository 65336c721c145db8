"""Ray actors for the end-to-end test (imported by reference in the workers: keep imports light).

* :class:`CPURolloutActor`: OpenRLHF's ``RolloutRayActor`` with vLLM swapped for gem_core's
  vLLM-faithful engine. It loads the agent file with OpenRLHF's real ``_load_agent_executor`` (as
  ``RolloutRayActor.__init__`` does) and answers ``generate_responses`` with OpenRLHF's real method
  (called on this actor), whose executor calls back into ``generate`` here.
* :class:`TrainerActor`: where OpenRLHF computes advantages: a ``RemoteExperienceMaker`` (no model
  groups) whose ``split_rollout_samples`` and (patched) ``compute_advantages_and_returns`` run for real.
"""

from __future__ import annotations

import sys

HEAVY = ("deepspeed", "vllm", "flash_attn", "torch", "openrlhf.trainer.ppo_utils.experience_maker")


def _modules_report() -> dict:
    import openrlhf_import_stubs

    from gem_integrations.openrlhf.plugin_spec import TARGET_MODULE, armed

    return {
        "hook_loaded": sorted(m for m in HEAVY if m in openrlhf_import_stubs.HOOK_MODULES),
        "loaded_now": sorted(m for m in HEAVY if m in sys.modules),
        "armed": armed(),
        "target_loaded": TARGET_MODULE in sys.modules,
    }


def _rollout_actor_class():
    """OpenRLHF's own RolloutRayActor class (under Ray's @ray.remote wrapper)."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    return next(c for c in RolloutRayActor.__ray_metadata__.modified_class.__mro__ if "generate_responses" in c.__dict__ and c.__name__ == "RolloutRayActor")


class CPURolloutActor:
    """``aborted``: request ids (``req-N``, the engine's N-th request) the engine aborts, as vLLM does
    when a request is aborted (an infrastructure failure)."""

    def __init__(self, agent_func_path: str, aborted=()):
        self.at_start = _modules_report()
        from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

        from gem_core.testing import build_test_tokenizer
        from gem_core.testing.golden import golden_respond
        from gem_core.testing.vllm_engine import ScriptedModel, VLLMFaithfulEngine

        self.executor = _load_agent_executor(agent_func_path)
        self.engine = VLLMFaithfulEngine(ScriptedModel(build_test_tokenizer("qwen3"), golden_respond), max_model_len=4096)
        self.engine.aborted = set(aborted)
        self.unfinished = 0
        self.envs = {"made": 0, "closed": 0}
        self._count_envs()

    def _count_envs(self) -> None:
        """Count the envs the agent file makes (``TaskSpec.make_env``) and closes, in this process."""
        from gem_core.tasks import TaskSpec

        make, counts = TaskSpec.make_env, self.envs

        def make_env(spec):
            env = make(spec)
            close = env.close

            def counted_close():
                counts["closed"] += 1
                close()

            counts["made"] += 1
            env.close = counted_close
            return env

        TaskSpec.make_env = make_env

    def env_counts(self) -> dict:
        return dict(self.envs)

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        self.unfinished += 1
        try:
            return await self.engine.generate(prompt_token_ids, sampling_params, multi_modal_data=multi_modal_data)
        finally:
            self.unfinished -= 1

    def get_num_unfinished_requests(self) -> int:
        """What OpenRLHF's samples generator asks each engine before dispatching (load balancing)."""
        return self.unfinished

    async def generate_responses(self, **kwargs):
        return await _rollout_actor_class().generate_responses(self, **kwargs)

    def modules(self) -> dict:
        return {"at_start": self.at_start, "now": _modules_report()}


class TrainerActor:
    def modules(self) -> dict:
        return _modules_report()

    def advantages(self, samples: list, gamma: float, eps: float, ddof: int, micro_batch_size: int) -> dict:
        from types import SimpleNamespace as NS

        import torch
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # the hook patches it here
        from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

        from gem_integrations.openrlhf.plugin_spec import PLUGIN

        args = NS(
            algo=NS(advantage=NS(estimator="rebn", gamma=gamma, lambd=1.0, no_std_norm=False, rebn_eps=eps, rebn_ddof=ddof)),
            rollout=NS(n_samples_per_prompt=1, micro_batch_size=micro_batch_size),
            reward=NS(clip_range=(-10.0, 10.0)),
            train=NS(dynamic_batch_enable=False),
        )
        maker = object.__new__(RemoteExperienceMaker)
        maker.strategy, maker.args, maker.advantage_estimator = NS(args=args), args, "rebn"
        maker.kl_ctl, maker.tokenizer = FixedKLController(0.0), NS(pad_token_id=0)
        batches = maker.split_rollout_samples(samples)  # OpenRLHF's own micro-batching (padding included)
        for batch in batches:  # what make_experience adds (no models here): kl, values
            batch.kl = torch.zeros(batch.action_mask.shape)
        batches = maker.compute_advantages_and_returns(batches)
        return {
            "patched": PLUGIN.is_installed,
            "advantages": [row for b in batches for row in b.advantages.double().tolist()],
            "returns": [row for b in batches for row in b.returns.double().tolist()],
            "action_mask": [row for b in batches for row in b.action_mask.int().tolist()],
            "info_keys": sorted({k for b in batches for k in b.info}),
        }
