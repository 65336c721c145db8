"""One process of the TRL two-process test (test_multiprocess.py), and what the test's one-process reference shares.

Run as ``python two_ranks.py OUT_DIR`` with torchrun's variables set (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT): TRL's own ``GRPOTrainer.__init__`` builds the accelerator, which joins the
gloo process group (CPU). The tiny model's every forward is a collective here (an all-reduce in a forward
pre-hook), as under FSDP or ZeRO-3, where a forward all-gathers parameters: a process making more
forwards than the others waits forever. The process writes ``ready-RANK`` once built, then plays its own
rows through ``GemRollout`` (TRL's generation path: the model's ``generate``), then runs one step of
TRL's ``train()`` on both processes, and writes ``rank-RANK.json``: the rollout's fields, how many
``generate`` calls and forwards it made, and what the train step's loss saw.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # trl_test_envs, when run as a script

import trl_test_envs  # noqa: E402  (registers test:TRLTurns-v0)

from gem_core.tasks import TaskSpec  # noqa: E402

#: Each rank's episodes, as turns per episode: rank 0 is done after 2 rounds, rank 1 plays 4; with
#: max_batch_size 2 the first round is 2 generate calls on both. Each process makes 5 calls in all.
TURNS_BY_RANK = ((1, 2, 1), (4, 1, 3))
MAX_BATCH_SIZE = 2
EXPECTED_GENERATE_CALLS = 5
MAX_TURN_TOKENS = 4


def rows_for(rank: int) -> list[dict[str, Any]]:
    """The dataset rows (conversational prompts carrying their task spec) one rank plays."""
    from gem_integrations.trl.dataset import prompt_of

    return [
        {"prompt": prompt_of(TaskSpec(trl_test_envs.TURNS_ID, seed=10 * rank + i, env_kwargs={"turns": turns}))} for i, turns in enumerate(TURNS_BY_RANK[rank])
    ]


class CollectiveCounter:
    """Counts the model's forwards and ``generate`` calls; with a process group, each forward first
    all-reduces a tensor, a collective as FSDP's or ZeRO-3's parameter all-gather is."""

    def __init__(self, model: Any):
        import torch
        import torch.distributed as dist

        self.forwards = 0
        self.generates = 0
        collective = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

        def pre_hook(module: Any, args: Any, kwargs: Any) -> None:
            self.forwards += 1
            if collective:
                dist.all_reduce(torch.ones(1))

        model.register_forward_pre_hook(pre_hook, with_kwargs=True)
        generate = model.generate

        def counted_generate(*args: Any, **kwargs: Any) -> Any:
            self.generates += 1
            return generate(*args, **kwargs)

        model.generate = counted_generate


def build(out_dir: str, tokenizer: Any = None) -> tuple[Any, Any]:
    """TRL's trainer over a tiny model (its generation greedy, so runs compare exactly) and the counter.
    The counter is installed after the trainer is built (the accelerator has joined the process group)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from gem_core.testing import build_test_tokenizer, build_tiny_model
    from gem_integrations.trl import GemGRPOTrainer, GemRollout

    tokenizer = tokenizer if tokenizer is not None else build_test_tokenizer("qwen3")
    model = build_tiny_model(len(tokenizer), seed=0, hidden_size=32)
    model.config.pad_token_id = tokenizer.pad_token_id
    args = GRPOConfig(
        output_dir=str(Path(out_dir) / "trainer"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=0,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=256,
        max_steps=1,
    )
    rows = rows_for(0) + rows_for(1)
    trainer = GemGRPOTrainer(
        model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        rollout_func=GemRollout(max_turn_tokens=MAX_TURN_TOKENS, max_batch_size=MAX_BATCH_SIZE),
    )
    trainer.temperature = 0.0  # greedy rollouts (what the rollout reads; the loss is not run here)
    trainer.model.train()
    return trainer, CollectiveCounter(trainer.model)


def play(trainer: Any, rank: int) -> dict[str, Any]:
    """One rollout of ``rank``'s rows through the trainer's ``rollout_func``; the fields that do not
    name the process (episode and group ids do)."""
    out = trainer.rollout_func([row["prompt"] for row in rows_for(rank)], trainer)
    return {k: v for k, v in out.items() if k not in ("gem_episode_id", "gem_group_id")}


def train_step(trainer: Any, counter: CollectiveCounter) -> dict[str, Any]:
    """One step of TRL's own ``train()`` on every process (DDP over gloo, the rollout inside it), sampling
    at TRL's temperature. Returns this process's ``generate`` calls in the step and how far the advantages
    its loss saw are from the core's ReBN over both processes' episodes (statistics over every process)."""
    import numpy as np
    import torch.distributed as dist
    from conftest import capture_loss_inputs, row_of

    from gem_core.batch import sequence_batch

    trainer.temperature = trainer.args.temperature
    seen = capture_loss_inputs(trainer)
    calls = counter.generates
    trainer.train()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, trainer.rollout_func.last_trajectories)
    everyone = [t for part in gathered for t in part]
    reference = sequence_batch(everyone)
    expected = reference.advantages(gamma=0.9, eps=1e-6, ddof=0)
    inputs, worst = seen[0], 0.0
    for row in range(inputs["advantages"].shape[0]):
        i = row_of(inputs, row, reference)
        n = reference.lengths[i]
        worst = max(worst, float(np.abs(inputs["advantages"][row, :n].numpy() - expected[i, :n]).max()))
    return {
        "generate_calls": counter.generates - calls,
        "global_step": trainer.state.global_step,
        "rows": int(inputs["advantages"].shape[0]),
        "episodes": len(everyone),
        "turns": [t.num_turns for t in trainer.rollout_func.last_trajectories],
        "advantages_max_abs_diff": worst,
        "nonzero_advantages": bool(inputs["advantages"].abs().sum() > 0),
    }


def main(out_dir: str) -> None:
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    trainer, counter = build(out_dir)
    if trainer.accelerator.num_processes != int(os.environ["WORLD_SIZE"]):
        raise SystemExit(f"the accelerator has {trainer.accelerator.num_processes} processes, expected {os.environ['WORLD_SIZE']}")
    Path(out_dir, f"ready-{rank}").write_text("ready")
    fields = play(trainer, rank)
    dist.barrier()  # the trainer's next collective (TRL gathers after the rollout): ranks out of step pair it wrongly
    result = {"rank": rank, "generate_calls": counter.generates, "forwards": counter.forwards, "fields": fields}
    result["train"] = train_step(trainer, counter)
    dist.barrier()  # both ranks are done with every collective
    Path(out_dir, f"rank-{rank}.json.tmp").write_text(json.dumps(result))
    os.replace(Path(out_dir, f"rank-{rank}.json.tmp"), Path(out_dir, f"rank-{rank}.json"))
    # Out without the interpreter's teardown: gloo's process group, torn down after the peer had already gone,
    # once aborted a rank (SIGABRT) after its results were written. What is checked is written and flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
