"""RL2's ranks as torchrun starts them, for the whole-step tests (../test_whole_step.py on the stand-in,
real/test_rl2_real_step.py on the real engine): ``world`` processes of a rank script with torchrun's environment,
the SGLang-shaped endpoint's URL, and each rank's records read back."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: Path, world: int, args: list[str], cwd: Path, out: Path, sglang_url: str, timeout: float) -> list[dict]:
    """Run ``world`` rank processes of ``script`` (gloo, one host); every rank must exit 0 within ``timeout``
    seconds, else the ranks' log tails are the failure. Returns what each rank saved in ``out/rank{r}.pt``."""
    out.mkdir()
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {
            **os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "GEM_RL2_TEST_OUT": str(out), "GEM_RL2_TEST_SGLANG": sglang_url,
            "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
        }  # fmt: skip
        env.pop("GEM_RL2_TOKENIZER", None)  # the launcher sets it from actor.model_name; the ranks read the model's
        log = open(out / f"rank{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, str(script), *args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    try:
        codes = [p.wait(timeout=timeout) for p, _ in procs]
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    logs = "\n".join((out / f"rank{r}.log").read_text()[-4000:] for r in range(world))
    assert codes == [0] * world, f"rank exit codes {codes}:\n{logs}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
