"""One rank of the cross-framework benchmark's RL2 run (experiment_run.py): rank_real.py's rank (../rank_main.py's
CPU stand-ins, the real model in float32 as RL2's actor) with rank_main's own observers (RL2's ``wandb.log`` calls:
its timings and metrics per step) and, on rank 0, the config RL2 resolved (``Trainer.__init__``), but not
rank_real's extra log-prob recompute before each update: a forward pass RL2 itself does not run here, which a long
run would otherwise be timed with (the two-update test checks the engine against RL2's actor). Nothing RL2 does is
changed here; its weight sync (``Rollout.update``) runs as is, to the stand-in."""

from __future__ import annotations

import sys

import rank_real  # noqa: F401  (this folder is the script's: installs its stand-ins and observers into rank_main)
import rank_main  # noqa: E402  (on the path: rank_real puts the parent folder there)

_observe = rank_real._install_observers  # rank_main's own, without rank_real's recompute


def install_observers(record: dict) -> None:
    _observe(record)
    import torch.distributed as dist
    from omegaconf import OmegaConf

    import RL2.trainer.ppo as ppo

    init = ppo.PPOTrainer.__init__

    def recorded_init(self, config):
        init(self, config)
        if dist.get_rank() == 0:
            record["config"] = OmegaConf.to_container(self.config, resolve=True)

    ppo.PPOTrainer.__init__ = recorded_init


rank_main.install_observers = install_observers

if __name__ == "__main__":
    sys.exit(rank_main.main())
