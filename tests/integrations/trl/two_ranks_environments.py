"""One process of the TRL two-process ``environment_factory`` test (test_multiprocess.py): rows without a
``seed`` column, through TRL's own environment pool.

Run as ``python two_ranks_environments.py OUT_DIR`` with torchrun's variables set (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT): TRL's ``GRPOTrainer.__init__`` builds the accelerator, which joins
the gloo process group. Two steps of TRL's own ``train()`` (its ``_generate_and_score_completions`` hands
the pooled instances out and resets each once per batch); each reset is recorded (the step, the
instance, the seed and the game's secret number) in ``resets-RANK.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

#: A game with a wide range: two episodes with different seeds almost never share a secret number.
ENV_ID = "game:GuessTheNumber-v0"
ENV_KWARGS = {"min_number": 1, "max_number": 1_000_000}
STEPS = 2
PER_DEVICE_BATCH = 4  # rollouts per rank and step: 2 prompts x 2 generations
NUM_GENERATIONS = 2
SEED_START = 100


def build(out_dir: str) -> tuple[Any, list[dict[str, Any]]]:
    """TRL's trainer over a tiny model, its environment_factory the gem-core game (rows: a prompt, no seed),
    and the list each reset appends to."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    from gem_core.testing import build_test_tokenizer, build_tiny_model
    from gem_integrations.trl.environment_factory import INSTRUCTION, environment_factory

    tokenizer = build_test_tokenizer(qwen3_chat_template)
    model = build_tiny_model(len(tokenizer), seed=0, hidden_size=32)
    model.config.pad_token_id = tokenizer.pad_token_id
    resets: list[dict[str, Any]] = []
    Game = environment_factory(ENV_ID, env_kwargs=ENV_KWARGS, seed_start=SEED_START)

    class RecordedGame(Game):  # type: ignore[misc, valid-type]
        created = 0

        def __init__(self) -> None:
            super().__init__()
            self._instance = type(self).created
            type(self).created += 1
            env_reset = self._env.reset

            def recorded_reset(*args: Any, seed: int | None = None, **kwargs: Any) -> Any:
                self._reset_seed = seed  # the seed the gem-core env was reset with
                return env_reset(*args, seed=seed, **kwargs)

            self._env.reset = recorded_reset

        def reset(self, seed: int | None = None, **row: Any) -> str:
            message = super().reset(seed, **row)
            target = int(self._env.unwrapped.target)  # the episode: the game's secret number
            resets.append({"instance": self._instance, "seed": self._reset_seed, "seed_attribute": getattr(self, "seed", None), "target": target})
            return message

    args = GRPOConfig(
        output_dir=str(Path(out_dir) / "trainer"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=0,
        per_device_train_batch_size=PER_DEVICE_BATCH,
        num_generations=NUM_GENERATIONS,
        max_completion_length=8,
        max_steps=STEPS,
        max_tool_calling_iterations=1,
    )
    rows = [{"prompt": [{"role": "user", "content": INSTRUCTION}]} for _ in range(16)]  # no seed column
    trainer = GRPOTrainer(model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer, environment_factory=RecordedGame)
    return trainer, resets


def main(out_dir: str) -> None:
    import torch.distributed as dist

    from gem_integrations.trl.environment_factory import close_environments

    rank = int(os.environ["RANK"])
    trainer, resets = build(out_dir)
    if trainer.accelerator.num_processes != int(os.environ["WORLD_SIZE"]):
        raise SystemExit(f"the accelerator has {trainer.accelerator.num_processes} processes, expected {os.environ['WORLD_SIZE']}")
    probed = len(resets)  # TRL's probe instance is built, not reset, in __init__
    trainer.train()
    result = {"rank": rank, "probed": probed, "global_step": trainer.state.global_step, "resets": resets}
    close_environments(trainer)
    dist.barrier()  # both ranks are done with every collective
    Path(out_dir, f"resets-{rank}.json.tmp").write_text(json.dumps(result))
    os.replace(Path(out_dir, f"resets-{rank}.json.tmp"), Path(out_dir, f"resets-{rank}.json"))
    # Out without the interpreter's teardown (the process group's, torch's): what is checked is written, and on
    # the loaded 2-core machine that teardown once took over a minute after the results were in.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main(sys.argv[1])
