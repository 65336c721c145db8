"""oat's own PPO arguments plus the GEM actor's (``--gem-env``, ``--gem-dataset``, ...), one tyro dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from oat.algorithms.ppo import PPOArgs


@dataclass
class GemArgs(PPOArgs):
    """``PPOArgs`` and what the GEM actor plays. Episodes come from ``gem_dataset`` (rows of
    ``gem-core make-dataset oat``, played in order, cycling) or else from ``gem_env`` ids (round robin,
    seeds ``gem_seed_start``, +1, ...)."""

    gem_env: List[str] = field(default_factory=list)
    gem_dataset: str = ""
    gem_seed_start: int = 0
    gem_episodes_per_step: int = 16
    gem_max_turns: Optional[int] = None
    gem_max_context_tokens: Optional[int] = None
    gem_system_prompt: Optional[str] = None
    # ReBN: normalise over the transitions left after oat's subsampling to rollout_batch_size_per_device
    # (oat's own whitening, the default) or over every transition before it (GemLearner).
    gem_rebn_before_subsampling: bool = False
