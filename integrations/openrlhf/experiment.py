"""An experiment (:mod:`gem_core.experiment`) as OpenRLHF 0.11's own arguments: ``gem-core openrlhf train``
(``openrlhf.cli.train_ppo_ray`` with ``rebn``) and the ``make-dataset openrlhf`` commands.

Imports nothing from OpenRLHF: it writes text. OpenRLHF's defaults that would change the run are pinned:
the KL (``--algo.kl.init_coef`` 0.01 in the reward by default), Adam's betas (0.9, 0.95), the scheduler
(cosine with a 3% warm-up down to 10%), the reward clip (-10, 10), the evaluation temperature (0.6) and
samples (4), the seed (42), the precision (``--ds.param_dtype``, bf16 by default: DeepSpeed's bf16 weights
with float32 master weights and optimizer state, the vLLM engine in bfloat16; OpenRLHF has no float32, which is
refused). The prompt rows are played in order (``--data.shuffle false``, the launcher's option:
:mod:`gem_integrations.openrlhf.data_order`), as every trainer plays an experiment's rows.
``tests/integrations/openrlhf/test_experiment.py`` parses these arguments with
OpenRLHF's own parser (the launcher's) and checks what OpenRLHF will use.
"""

from __future__ import annotations

from gem_core.experiment import Experiment, require, require_portable, train_rows
from gem_core.experiment_scripts import dataset_command, launch_script, require_precision, warmup_optimizer_steps

TRAINER = "openrlhf"
#: The experiment's estimators as ``--algo.advantage.estimator`` (rebn: the launcher's).
ESTIMATOR = {"rebn": "rebn", "grpo": "group_norm", "drgrpo": "dr_grpo", "rloo": "rloo"}
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean")
#: A reward clip no GEM reward reaches (OpenRLHF clips rewards to (-10, 10) by default).
NO_REWARD_CLIP = ("-1000000000.0", "1000000000.0")  # argparse reads "-1e9" as an option
#: training.precision as the shell variable the arguments name (float32: the reason OpenRLHF cannot).
PRECISION = {
    "bf16": {"PARAM_DTYPE": "bf16"},
    "float32": "OpenRLHF 0.11's --ds.param_dtype is bf16 or fp16 and its vLLM engine bfloat16",
}


def check(experiment: Experiment) -> None:
    """Refuse, naming the key, what OpenRLHF cannot run."""
    require_portable(TRAINER, experiment)
    e = experiment
    require_precision(TRAINER, e, PRECISION)
    require(
        TRAINER,
        e,
        "algorithm.estimator",
        e.estimator in ESTIMATOR,
        "OpenRLHF's reinforce discounts over tokens, not turns (rebn, grpo, drgrpo and rloo map)",
    )
    require(
        TRAINER,
        e,
        "algorithm.loss_aggregation",
        e.loss_aggregation in LOSS_AGGREGATIONS,
        "OpenRLHF's --actor.loss_agg_mode has token-mean and seq-mean-token-mean",
    )
    require(TRAINER, e, "rollout.logprob_temperature", e.logprob_temperature == e.temperature, "OpenRLHF recomputes logprobs at --rollout.temperature")
    if e.view == "turn" and e.loss_aggregation != "token-mean":
        require(TRAINER, e, "algorithm.view", False, "OpenRLHF's agent trains one row per episode (sequence); per-turn rows differ under seq-mean losses")


def warmup_ratio(experiment: Experiment) -> float:
    """``--actor.lr_warmup_ratio`` that gives the experiment's warm-up: OpenRLHF warms up for
    ``ceil(max_steps * ratio)`` optimizer steps, ``max_steps`` = updates x optimizer steps per update."""
    steps = warmup_optimizer_steps(experiment)
    total = experiment.updates * experiment.optimizer_steps_per_update
    return 0.0 if steps == 0 else (steps - 0.5) / total


def arguments(experiment: Experiment) -> list[str]:
    """The arguments of ``gem-core openrlhf train`` (``$MODEL``/``$DATA`` stand for the paths, ``$PARAM_DTYPE``
    for the precision: :data:`PRECISION`)."""
    check(experiment)
    e = experiment
    args = [
        "--actor.model_name_or_path", "$MODEL",
        "--train.agent_func_path", "$(gem-core openrlhf agent-path)",
        "--data.prompt_dataset", "$DATA/train.jsonl", "--data.input_key", "prompt", "--data.label_key", "label",
        # OpenRLHF cuts both files to max_samples: the training file holds exactly its rows, the held-out one needs all of its
        "--data.max_samples", str(max(train_rows(e), e.eval_episodes)),
        "--data.shuffle", "false",  # the launcher's: the rows are the run's start states in order (update_start_seeds)
        "--data.max_len", str(e.max_context_tokens or 32768),
        "--eval.dataset", "$DATA/eval.jsonl",
        "--eval.steps", str(e.eval_every if e.eval_every else -1),
        "--eval.temperature", repr(e.temperature),
        "--eval.n_samples_per_prompt", "1",
        "--algo.advantage.estimator", ESTIMATOR[e.estimator],
        "--algo.advantage.gamma", repr(e.gamma),
        "--rollout.batch_size", str(e.groups_per_update),
        "--rollout.n_samples_per_prompt", str(e.group_size),
        "--rollout.temperature", repr(e.temperature),
        "--rollout.top_p", "1.0",
        "--train.batch_size", str(e.mini_batch_episodes),
        "--train.max_epochs", str(e.ppo_epochs),
        "--train.num_episodes", "1",
        "--train.seed", str(e.seed),
        "--actor.optim", "adam",
        "--actor.adam.lr", repr(e.lr),
        "--actor.adam.betas", repr(e.betas[0]), repr(e.betas[1]),
        "--actor.adam.eps", repr(e.eps),
        "--actor.adam.weight_decay", repr(e.weight_decay),
        "--actor.lr_scheduler", "constant_with_warmup",
        "--actor.lr_warmup_ratio", repr(warmup_ratio(e)),
        "--actor.max_norm", repr(e.max_grad_norm),
        "--actor.policy_loss_type", "ppo",
        "--actor.eps_clip_low_high", repr(e.clip_low), repr(e.clip_high),
        "--actor.loss_agg_mode", e.loss_aggregation,
        "--actor.entropy_coef", repr(e.entropy_coef),
        "--algo.kl.init_coef", repr(e.kl_coef),
        "--algo.kl.estimator", e.kl_estimator,
        "--reward.clip_range", *NO_REWARD_CLIP,
        "--ds.param_dtype", "$PARAM_DTYPE",
    ]  # fmt: skip
    if e.estimator == "rebn":
        args += ["--algo.advantage.rebn_ddof", "0", "--algo.advantage.rebn_eps", "1e-06"]
    if e.kl_coef > 0:
        args.append("--algo.kl.use_loss")  # the KL in the loss, as the experiment's
    if e.gradient_checkpointing:
        args.append("--actor.gradient_checkpointing_enable")
    return args


def render(experiment: Experiment, source: str = "experiment.toml") -> str:
    """The script: the two prompt files (training rows in order, held-out rows), then the launcher."""
    train = dataset_command(TRAINER, experiment, "$DATA/train.jsonl")
    held_out = dataset_command(TRAINER, experiment, "$DATA/eval.jsonl", held_out=True)
    command = ["gem-core", "openrlhf", "train", *arguments(experiment)]
    note = "# OpenRLHF plays the rows in order (--data.shuffle false: the plugin's launcher); its Ray, vLLM and GPU options are yours to add:"
    return launch_script(TRAINER, experiment, source, [train, held_out], PRECISION, command, note)
