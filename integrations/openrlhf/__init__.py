"""gem-core for OpenRLHF 0.11.x (``pip install -e '.[openrlhf]'``; OpenRLHF itself is installed as its
docs say, or ``--no-deps`` plus its light deps on CPU).

* ``rollout.py``: the agent file for ``--train.agent_func_path`` (``gem-core openrlhf agent-path`` prints
  its path): OpenRLHF's ``MultiTurnAgentExecutor`` playing each GEM episode with gem_core's runner.
* ``advantage``: the ``rebn`` advantage estimator, a patch of ``RemoteExperienceMaker`` (``plugin_spec.PLUGIN``,
  the ``gem_core.plugins`` entry point) armed in every Ray worker by the launcher
  ``gem-core openrlhf train ...`` / ``python -m gem_integrations.openrlhf.train_ppo_ray ...``.
* ``dataset``: ``gem-core make-dataset openrlhf --env ID --out prompts.jsonl``.
* ``engine.OpenRLHFEnginePolicy``: OpenRLHF's vLLM engine as a gem_core policy (the agent plays on the core runner).

Nothing here imports OpenRLHF until it is used.
"""

from __future__ import annotations

from pathlib import Path


def agent_path() -> str:
    """Absolute path of the agent file, for ``--train.agent_func_path``."""
    return str(Path(__file__).resolve().with_name("rollout.py"))


__all__ = ["agent_path"]
