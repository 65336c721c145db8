"""One rank of the two-update RL2 run (test_rl2_two_updates.py): rank_real.py's rank (../rank_main.py's CPU
stand-ins, the real model in float32, RL2's logprob recompute recorded) with its per-update records kept for
each update instead of the last one: on rank 0, per ``Actor.update`` call, the batch RL2 updates on (with
the engine's generation-time ``llm_logps``), RL2's actor logprobs of it (``Actor.compute_logps``), the
learning rate the optimizer step uses and each parameter's sum before and after the update (a fingerprint of
the weights: a copy of them would cost the rank 0.5 GB more on a machine where memory is what runs out).
Nothing RL2 does is changed here; its weight sync (``Rollout.update``) runs as is, to the stand-in."""

from __future__ import annotations

import sys

import rank_real  # noqa: F401  (this folder is the script's: installs its stand-ins and observers into rank_main)
import rank_main  # noqa: E402  (on the path: rank_real puts the parent folder there)

_install_observers = rank_main.install_observers  # rank_real's


def install_observers(record: dict) -> None:
    _install_observers(record)
    import torch.distributed as dist

    import RL2.workers.actor as actor

    update = actor.Actor.update  # rank_real's (the recompute, then rank_main's recording of the batch)

    def sums(model) -> dict[str, float]:
        """Each parameter's float64 sum, by its name in the unwrapped model (a fingerprint: no copy of the weights)."""
        module = getattr(model, "module", model)  # the DDP stand-in
        return {name: float(p.detach().double().sum()) for name, p in module.named_parameters()}

    def recorded_update(self, tensor_dict, step):
        before = sums(self.model)
        lr = float(self.optimizer.param_groups[0]["lr"])
        out = update(self, tensor_dict, step)
        if dist.get_rank() == 0:
            keys = ("batch", "actor_logps", "actor_logps_states")
            record.setdefault("updates", []).append(
                {"step": step, "lr": lr, "sums_before": before, "sums_after": sums(self.model), **{k: record.pop(k) for k in keys}}
            )
        return out

    actor.Actor.update = recorded_update


rank_main.install_observers = install_observers

if __name__ == "__main__":
    sys.exit(rank_main.main())
