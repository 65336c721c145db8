"""An experiment (:mod:`gem_core.experiment`) as oat 0.2.4's own arguments: ``gem-core oat train`` (oat's
``PPOArgs`` plus the GEM actor's ``--gem-*``) and the ``make-dataset oat`` commands.

Imports nothing from oat: it writes text. oat's defaults that would change the run are pinned: Adam's betas
(0.9, 0.95), the scheduler (cosine with a 3% warm-up), ``beta`` (0.1, the KL in the loss), the
``critic_type`` (drgrpo: a token sum over a constant), ``gradient_checkpointing``, the seed (42), the
batch sizes (128), the policy buffer (16 transitions: its deque would keep an update's last 16 turns only) and the precision (``--bf16``, oat's default: DeepSpeed's bf16 weights with float32 master weights
and optimizer state, the vLLM engine in bfloat16; float32: ``--no-bf16``, and ``--no-flash-attn``, whose kernels
compute in 16 bits only). The run's length is not mapped: oat counts it in epochs over its prompt dataset, which the
GEM actor does not read (stop the run after ``training.updates`` learner steps). oat's multi-turn learner trains each turn as its own sample and averages each sample's
token mean (``critic_type grpo``): the experiment must say ``view = "turn"`` and
``loss_aggregation = "seq-mean-token-mean"``; anything else is refused by name.
``tests/integrations/oat/test_experiment.py`` parses these arguments with the launcher's parser (oat's own
``get_default_args``) and checks what oat will use.
"""

from __future__ import annotations

from gem_core.experiment import Experiment, require, require_portable
from gem_core.experiment_scripts import dataset_command, launch_script, require_precision

TRAINER = "oat"
#: The most transitions (turns) one update holds when the experiment sets no turn limit (oat's batch sizes
#: count transitions; they must hold the whole update so that oat does not subsample it).
TURN_CAP = 100
#: training.precision as the shell variables the arguments name: oat's precision flag and its attention
#: (flash-attention 2, oat's default, computes in 16 bits only).
PRECISION = {
    "bf16": {"BF16_FLAG": "--bf16", "ATTENTION_FLAG": "--flash-attn"},
    "float32": {"BF16_FLAG": "--no-bf16", "ATTENTION_FLAG": "--no-flash-attn"},
}


def check(experiment: Experiment) -> None:
    """Refuse, naming the key, what oat cannot run."""
    require_portable(TRAINER, experiment)
    e = experiment
    require_precision(TRAINER, e, PRECISION)
    require(TRAINER, e, "algorithm.estimator", e.estimator == "rebn", "the oat plugin's learner is ReBN (oat's whitening of per-turn returns)")
    require(
        TRAINER,
        e,
        "algorithm.loss_aggregation",
        e.loss_aggregation == "seq-mean-token-mean",
        "oat's learner averages each turn sample's token mean (critic_type grpo); its drgrpo divides a token sum by a constant",
    )
    require(TRAINER, e, "algorithm.view", e.view == "turn", "oat's multi-turn learner trains each turn as its own sample")
    require(TRAINER, e, "algorithm.clip_high", e.clip_high == e.clip_low, "oat clips symmetrically (--cliprange)")
    require(TRAINER, e, "algorithm.kl_estimator", e.kl_estimator == "k3" or e.kl_coef == 0, "oat's KL in the loss (--beta) is k3")
    require(TRAINER, e, "algorithm.entropy_coef", e.entropy_coef == 0, "oat's PPO loss has no entropy bonus")
    require(TRAINER, e, "rollout.group_size", e.group_size == 1, "the oat plugin plays one episode per dataset row (a group is rows of one start state)")
    require(TRAINER, e, "rollout.logprob_temperature", e.logprob_temperature == e.temperature, "oat recomputes logprobs at --temperature")
    require(TRAINER, e, "training.mini_batches", e.mini_batches == 1, "oat's batch sizes count turns, not episodes: one optimizer step per pass here")
    require(TRAINER, e, "optimizer.eps", e.eps == 1e-8, "oat's Adam has no eps option (1e-8)")
    require(TRAINER, e, "optimizer.warmup_updates", e.warmup_updates == 0, "oat's constant schedule has no warm-up (its other schedules decay)")


def transitions_per_update(experiment: Experiment) -> int:
    """oat's rollout and train batch: every turn of one update."""
    return experiment.episodes_per_update * (experiment.max_turns or TURN_CAP)


def arguments(experiment: Experiment) -> list[str]:
    """The arguments of ``gem-core oat train`` (``$MODEL``/``$DATA`` stand for the paths, ``$BF16_FLAG`` and
    ``$ATTENTION_FLAG`` for the precision's: :data:`PRECISION`)."""
    check(experiment)
    e = experiment
    batch = str(transitions_per_update(e))
    args = [
        "--pretrain", "$MODEL",
        "--gem-dataset", "$DATA/train.jsonl",
        "--gem-episodes-per-step", str(e.episodes_per_update),
        "--gem-max-context-tokens", str(e.max_context_tokens or 32768),
        "--critic-type", "grpo",
        "--gamma", repr(e.gamma),
        "--learning-rate", repr(e.lr),
        "--lr-scheduler", "constant",
        "--lr-warmup-ratio", "0.0",
        "--adam-beta-1", repr(e.betas[0]),
        "--adam-beta-2", repr(e.betas[1]),
        "--l2", repr(e.weight_decay),
        "--max-norm", repr(e.max_grad_norm),
        "--num-ppo-epochs", str(e.ppo_epochs),
        "--cliprange", repr(e.clip_low),
        "--beta", repr(e.kl_coef),
        "--kl-penalty-coef", "0.0",
        "--temperature", repr(e.temperature),
        "--top-p", "1.0",
        "--top-k", "-1",
        "--generate-max-length", str(e.max_turn_tokens),
        "--rollout-batch-size", batch,
        "--rollout-batch-size-per-device", batch,
        "--pi-buffer-maxlen-per-device", batch,
        "--train-batch-size", batch,
        "--train-batch-size-per-device", "1",
        "--seed", str(e.seed),
        "$BF16_FLAG", "--no-fp16", "$ATTENTION_FLAG",
    ]  # fmt: skip
    if e.max_turns:
        args += ["--gem-max-turns", str(e.max_turns)]
    args.append("--gradient-checkpointing" if e.gradient_checkpointing else "--no-gradient-checkpointing")
    return args


def render(experiment: Experiment, source: str = "experiment.toml") -> str:
    """The script: the training rows (played in order), then the launcher."""
    train = dataset_command(TRAINER, experiment, "$DATA/train.jsonl")
    command = ["gem-core", "oat", "train", *arguments(experiment)]
    return launch_script(TRAINER, experiment, source, [train], PRECISION, command, "# oat's launchpad, vLLM and GPU options are yours to add:")
