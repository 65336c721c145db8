"""gem-core for RL2 (``pip install -e '.[rl2]'``; PyPI's ``rl-square`` pins torch 2.8, sglang and flash-attn:
on CPU it is installed ``--no-deps`` with its light deps).

* ``env.py``: the file for RL2's ``rollout.env_path`` (``gem-core rl2 env-path`` prints its path). It exports
  both of RL2's env contracts, built on gem_core's runner and task-spec rows (:mod:`.rollout`): HEAD's
  ``async generate(config, tokenizer, router_url, sample)`` and 0.0.2's ``async reset(extra_info)`` /
  ``async step(state, action, extra_info)``; whichever RL2 is installed calls the one it knows.
* ``advantage``: ReBN over turns in place of RL2's episode-level REINFORCE, installed by the launcher
  ``gem-core rl2 train ...`` / ``python -m gem_integrations.rl2.train ...`` as a patch of
  ``RL2.trainer.ppo.compute_advantages`` (``plugin_spec.PLUGIN``).
* ``dataset``: ``gem-core make-dataset rl2 --env ID --out train.jsonl``.

Nothing here imports RL2 until it is used.
"""

from __future__ import annotations

from pathlib import Path


def env_path() -> str:
    """Absolute path of the env module, for ``rollout.env_path``."""
    return str(Path(__file__).resolve().with_name("env.py"))


__all__ = ["env_path"]
