"""An experiment (:mod:`gem_core.experiment`) as ROLL's own agentic-pipeline configuration: a YAML file that
ROLL's ``examples/start_agentic_pipeline.py`` composes (Hydra) and builds into its ``AgenticConfig`` (dacite).

What ROLL runs, as read from its source (alibaba/ROLL 8eb27cc), and how the experiment says it:

* Rows: ROLL's step env managers (``StepConcatEnvManager``, ROLL's GEM view) make each turn its own sample:
  ``algorithm.view = "turn"``.
* Optimizer steps: ``ActorWorker.train_step`` shuffles an update's samples (each PPO epoch, seeded by ``seed``) and
  takes a step per ``per_device_train_batch_size x gradient_accumulation_steps x dp`` of them, after
  ``adjust_batch`` has dropped the remainder at random (``batch_adjust_mode: delete``; an update with fewer samples
  is filled with random copies, ROLL's fallback): the step count follows the turn count. The experiment says it
  with ``training.mini_batches = 0`` and ``training.turns_per_step = N``; any other ``mini_batches`` is refused.
  Written for one GPU (dp 1): ``per_device_train_batch_size x gradient_accumulation_steps = N``; on D data-parallel
  GPUs divide ``gradient_accumulation_steps`` by D. The loss is aggregated over the whole step (ROLL's ``agg_loss``
  with the step's global token and sample counts), whatever the micro-batch.
* The estimator: ``reinforce`` (``A_t = G_t``, the per-turn discounted return on every token of the turn) is ROLL's
  ``step_reinforce`` (``step_reward_gamma`` = gamma) with ``reward_normalization.method: identity``, ``gamma: 1.0``
  (no discount inside a turn), no whitening and no clip. ``rebn`` is refused: ROLL's batch ``mean_std`` divides by
  ``torch.std`` (the sample std, ddof 1; ``agentic_reward_norm``), the experiment's ReBN by the population std
  (ddof 0) (``examples/roll/gem_core_rebn.yaml`` runs ROLL's own, ddof 1). ``grpo``/``drgrpo``/``rloo`` are refused
  too: ROLL's group normalisation of ``step_reinforce`` pools every turn of a group, not its episodes' returns.
* The loss: ``ActorWorker.loss_func`` (agentic): the clipped ratio (``use_pg_clip_range`` with ``pg_clip_low``,
  ``pg_clip_high``; ``dual_clip_loss`` off; ``ratio_type: token``), ``loss_agg_mode``, the KL to the reference (the
  starting weights) in the loss, k3 (ROLL's ``compute_approx_kl`` clamps it to [-10, 10]), ``kl_loss_coef``; no KL in
  the reward (``init_kl_coef: 0.0``, ``add_token_level_kl: false``; ROLL's default 0.2 would load a reference
  model); the entropy bonus ``entropy_loss_coef``. Old log-probs are recomputed (``step_reinforce`` forces it)
  from the raw logits: ``rollout.logprob_temperature`` must be 1.0. No train-infer correction.
* The optimizer: FSDP2's ``torch.optim.AdamW`` (``fsdp2_train``) with ``learning_rate``, ``adam_beta1/2``,
  ``weight_decay`` and torch's eps (1e-8: no option), the ``constant`` scheduler without warm-up (a warm-up is
  refused: ROLL counts it in optimizer steps, whose number per update varies), ``max_grad_norm`` (0 refused:
  ROLL clips at it). Precision: ``bf16`` is FSDP2's mixed precision (weights and optimizer state float32, loaded in
  float32, the forward and backward in bfloat16, gradients reduced in float32) with vLLM in bfloat16; ``float32``
  everything in float32. ``auto`` is refused: the YAML is decided where it is written.
* The rollout: ``rollout_batch_size`` episodes an update, ``train_env_manager`` with ``num_env_groups`` start states
  x ``group_size``; vLLM samples at ``temperature`` (``top_p`` 1, ``top_k`` -1), ``max_new_tokens`` =
  ``max_turn_tokens``; ``custom_envs.GemCore`` plays the gem-core env id (``env_type: gem-core``, its kwargs,
  tools and turn limit) with ``max_steps`` the turn limit; ``sequence_length`` = ``max_context_tokens`` (ROLL
  pads every sample to it and ends an episode whose next prompt would not fit). The pipeline is the plugin's
  (``gem_integrations.roll.pipeline.AgenticPipeline``: ROLL's, with a ``delete`` that runs) with the infra-error
  group filter and the ``gem_core_policy`` LLM proxy, as in ``examples/roll/gem_core_rebn.yaml``.

Known differences, not refusals: ROLL's per-turn prompt is its ``StepConcatEnvManager``'s (one user message: the
earlier observations, then the current one and its suffix), not gem-core's chat context with the model's earlier
replies; ROLL seeds each episode itself (``seed`` + a group seed drawn from Python's ``random`` + the episode id),
not from dataset rows; ROLL's validation (its own seeds) is off (``eval_steps: 0``): its checkpoints, saved in
Hugging Face format every ``eval_every`` updates, are evaluated on the held-out seeds with ``gem-core eval``.
``tests/integrations/roll/test_experiment.py`` builds the written file into ROLL's own ``AgenticConfig``
(``nox -s roll_src``) and checks the values ROLL will use. Imports nothing from ROLL.
"""

from __future__ import annotations

import json
from typing import Any

from gem_core.experiment import Experiment, require, require_portable
from gem_core.experiment_scripts import eval_command, header, shell_command
from gem_core.models import EMBEDDED_MODELS

TRAINER = "roll"
#: The ``custom_envs`` tag of the experiment's env.
TAG = "GemCore"
#: ROLL's ``max_steps`` (its turn cap) when the experiment sets no turn limit (the env's own ends the episode).
TURN_CAP = 100
#: The most turn samples in one forward pass (memory, not the run: raise it on a large GPU); the micro-batch is
#: the largest divisor of ``turns_per_step`` up to it, so ROLL's batch divisor stays ``turns_per_step``.
MICRO_BATCH = 4
#: What each GPU role is given (one GPU, every role colocated; ROLL offloads between them).
DEVICES = "list(range(0,1))"
#: The per-turn prompt: ROLL's StepConcatEnvManager fills {history} (earlier observations) and
#: {current_observation} (the observation and gem-core's suffix).
AGENT_TEMPLATE = "{history}\n{current_observation}\n"
#: training.precision as ROLL's settings: FSDP2's strategy_config (no param_dtype for bf16: ROLL would then load
#: the weights in bfloat16; without it they load in float32 and FSDP2 computes in its default bfloat16), the dtype
#: of vLLM and the reference, and the attention.
PRECISION: dict[str, dict[str, Any]] = {
    "bf16": {"strategy_config": {"reduce_dtype": "fp32"}, "dtype": "bf16", "attention": "fa2"},
    "float32": {"strategy_config": {"param_dtype": "fp32", "reduce_dtype": "fp32"}, "dtype": "fp32", "attention": "sdpa"},
}
#: The experiment's estimator as ROLL's reward normalisation of step_reinforce's per-turn returns.
NORMALIZATION = {"reinforce": "identity"}


def check(experiment: Experiment) -> None:
    """Refuse, naming the key, what ROLL cannot run (see the module doc)."""
    require_portable(TRAINER, experiment, turn_steps=True)
    e = experiment
    require(
        TRAINER,
        e,
        "rollout.stop_after_box",
        not e.stop_after_box,
        "ROLL generates with its own env manager and gem-llm's envs, not gem-core's rows: it cannot stop each response at its move",
    )
    require(
        TRAINER,
        e,
        "training.mini_batches",
        e.mini_batches == 0,
        "ROLL's optimizer steps count turn samples (per_device_train_batch_size x gradient_accumulation_steps), so an "
        'update\'s step count follows its turn count: set mini_batches = 0, training.turns_per_step and view = "turn"',
    )
    require(
        TRAINER,
        e,
        "algorithm.estimator",
        e.estimator in NORMALIZATION,
        "ROLL's rebn (step_reinforce + batch mean_std) divides by torch.std, the sample std (ddof 1), the experiment's "
        "by the population std (ddof 0); its group normalisation pools a group's turns: reinforce only "
        "(examples/roll/gem_core_rebn.yaml runs ROLL's own ReBN)",
    )
    require(TRAINER, e, "training.precision", e.precision != "auto", "ROLL's YAML is decided where it is written: set bf16 or float32")
    require(TRAINER, e, "rollout.logprob_temperature", e.logprob_temperature == 1.0, "ROLL recomputes log-probs from the raw logits (temperature 1)")
    require(TRAINER, e, "algorithm.kl_estimator", e.kl_estimator == "k3" or e.kl_coef == 0, "ROLL's KL in the loss is k3")
    require(TRAINER, e, "optimizer.eps", e.eps == 1e-8, "ROLL's FSDP2 AdamW has no eps option (torch's 1e-8)")
    require(
        TRAINER,
        e,
        "optimizer.warmup_updates",
        e.warmup_updates == 0,
        "ROLL's warm-up counts optimizer steps, whose number per update follows the turn count",
    )
    require(TRAINER, e, "optimizer.max_grad_norm", e.max_grad_norm > 0, "ROLL always clips the gradient at max_grad_norm (0 would zero it)")
    require(
        TRAINER,
        e,
        "env.max_context_tokens",
        e.max_context_tokens > 0,
        "ROLL pads every sample to sequence_length: give the episode's context a limit",
    )


def micro_batch(experiment: Experiment) -> int:
    """Turn samples per forward pass: the largest divisor of ``turns_per_step`` up to :data:`MICRO_BATCH`."""
    return max(d for d in range(1, MICRO_BATCH + 1) if experiment.turns_per_step % d == 0)


def model_value(experiment: Experiment) -> str:
    """``pretrain``: ``$MODEL`` where set when ROLL composes the file (OmegaConf's ``oc.env``), else ``model.id`` (the
    embedded model's alias as its hub id)."""
    name = experiment.model.strip()
    embedded = EMBEDDED_MODELS.get(name.lower())
    default = embedded.hub_id if embedded else name
    return "${oc.env:MODEL,'" + default.replace("\\", "\\\\").replace("'", "\\'") + "'}"


def settings(experiment: Experiment) -> dict[str, Any]:
    """Every key of ROLL's ``AgenticConfig`` the experiment sets, nested as the YAML holds them."""
    check(experiment)
    e = experiment
    precision = PRECISION[e.precision]
    micro = micro_batch(e)
    turns = e.max_turns or TURN_CAP
    env_config: dict[str, Any] = {"env": e.env_ids[0], "env_kwargs": dict(e.env_kwargs), "suffix": "info"}
    if e.tools:
        env_config["tools"] = list(e.tools)
    if e.max_turns:
        env_config["max_turns"] = e.max_turns
    manager = {
        "num_env_groups": e.groups_per_update,
        "group_size": e.group_size,
        "tags": [TAG],
        "num_groups_partition": [e.groups_per_update],
        "group_filter_cls": "gem_integrations.roll.group_filter.InfraErrorGroupFilter",
        "llm_proxy": {"proxy_type": "gem_core_policy"},
    }
    kl = e.kl_coef > 0
    out: dict[str, Any] = {
        "exp_name": "gem_core_experiment",
        "seed": e.seed,
        "logging_dir": "./output/logs",
        "output_dir": "./output",
        "max_steps": e.updates,
        "save_steps": e.eval_every or e.updates,
        "logging_steps": 1,
        "eval_steps": 0,
        "resume_from_checkpoint": False,
        "async_generation_ratio": 0.0,
        "rollout_batch_size": e.episodes_per_update,
        "val_batch_size": e.episodes_per_update,
        "sequence_length": e.max_context_tokens,
        "pretrain": model_value(e),
        "pipeline_cls": "gem_integrations.roll.pipeline.AgenticPipeline",
        # the estimator
        "adv_estimator": "step_reinforce",
        "step_reward_gamma": e.gamma,
        "reward_normalization": {"grouping": "batch", "method": NORMALIZATION[e.estimator]},
        "gamma": 1.0,
        "lambd": 1.0,
        "whiten_advantages": False,
        "whiten_rewards": False,
        "batch_adjust_mode": "delete",
        # the loss
        "ppo_epochs": e.ppo_epochs,
        "use_pg_clip_range": True,
        "pg_clip": e.clip_low,
        "pg_clip_low": e.clip_low,
        "pg_clip_high": e.clip_high,
        "dual_clip_loss": False,
        "ratio_type": "token",
        "loss_agg_mode": e.loss_aggregation,
        "use_kl_loss": kl,
        "kl_loss_coef": e.kl_coef,
        "init_kl_coef": 0.0,
        "add_token_level_kl": False,
        "entropy_loss_coef": e.entropy_coef,
        "max_grad_norm": e.max_grad_norm,
        "train_infer_correction": {"is_weight": {"enabled": False}, "filters": []},
        "actor_train": {
            "model_args": {
                "dtype": "fp32",
                "attn_implementation": precision["attention"],
                "disable_gradient_checkpointing": not e.gradient_checkpointing,
            },
            "training_args": {
                "learning_rate": e.lr,
                "lr_scheduler_type": "constant",
                "warmup_steps": 0,
                "warmup_ratio": 0.0,
                "weight_decay": e.weight_decay,
                "adam_beta1": e.betas[0],
                "adam_beta2": e.betas[1],
                "per_device_train_batch_size": micro,
                "gradient_accumulation_steps": e.turns_per_step // micro,
            },
            "strategy_args": {"strategy_name": "fsdp2_train", "strategy_config": dict(precision["strategy_config"])},
            "device_mapping": DEVICES,
            "infer_batch_size": micro,
        },
        "actor_infer": {
            "model_args": {"dtype": precision["dtype"], "disable_gradient_checkpointing": True},
            "generating_args": {
                "max_new_tokens": e.max_turn_tokens,
                "temperature": e.temperature,
                "top_p": 1.0,
                "top_k": -1,
                "num_beams": 1,
                "num_return_sequences": 1,
            },
            "strategy_args": {"strategy_name": "vllm", "strategy_config": {"gpu_memory_utilization": 0.6, "load_format": "auto"}},
            "device_mapping": DEVICES,
        },
        "custom_envs": {
            TAG: {
                "env_type": "gem-core",
                "env_manager_cls": "gem_integrations.roll.env_manager.StepConcatEnvManager",
                "max_steps": turns,
                "max_tokens_per_step": e.max_turn_tokens,
                "use_thread_lock": True,
                "history_length": turns,
                "agent_system_template": None,
                "agent_template": AGENT_TEMPLATE,
                "env_config": env_config,
            }
        },
        "train_env_manager": manager,
        "val_env_manager": {**manager, "num_env_groups": e.episodes_per_update, "group_size": 1, "num_groups_partition": [e.episodes_per_update]},
    }
    if kl:
        out["reference"] = {
            "model_args": {"dtype": precision["dtype"], "attn_implementation": precision["attention"], "disable_gradient_checkpointing": True},
            "strategy_args": {"strategy_name": "hf_infer", "strategy_config": {}},
            "device_mapping": DEVICES,
            "infer_batch_size": micro,
        }
    return out


def render(experiment: Experiment, source: str = "experiment.toml") -> str:
    """The YAML file: the header (what it runs, how to start it), then :func:`settings`."""
    body = settings(experiment)
    e = experiment
    lines = header(TRAINER, e, source)
    lines[2] = (  # ROLL reads no dataset rows
        "# Training start states: ROLL's own (seed + a group seed from Python's random + the episode id); held-out: "
        f"{e.eval_episodes} seeds from {e.eval_seed_start} (gem-core eval --balanced, below)."
    )
    lines += [
        f"# Optimizer steps of {e.turns_per_step} turn samples (training.turns_per_step; one GPU: per_device_train_batch_size x",
        "# gradient_accumulation_steps; on D data-parallel GPUs divide gradient_accumulation_steps by D). ROLL seeds each",
        "# episode itself, not from dataset rows. Run it from a ROLL checkout with gem-core installed beside it",
        "# (pip install -e '.[roll]'), this file saved as examples/gem_core/NAME.yaml there ($MODEL, where set, is the model):",
        "#   python examples/start_agentic_pipeline.py --config_path gem_core --config_name NAME",
        "# Evaluate a saved checkpoint (Hugging Face format, under output_dir) on the held-out seeds:",
        *("#   " + line for line in shell_command(eval_command(e)).splitlines()),
        "# Where it runs (device_mapping, vLLM's gpu_memory_utilization, the micro-batch) is yours to change; the rest is",
        "# the experiment (gem_integrations.roll.experiment says how each key maps).",
        "hydra:",
        "  run:",
        "    dir: .",
        "  output_subdir: null",
    ]
    return "\n".join(lines + _yaml(body)) + "\n"


def _yaml(value: dict[str, Any], indent: int = 0) -> list[str]:
    """``value`` as block-style YAML lines (ROLL's loader is OmegaConf's: YAML 1.1)."""
    lines = []
    pad = " " * indent
    for key, item in value.items():
        if isinstance(item, dict) and item:
            lines.append(f"{pad}{key}:")
            lines += _yaml(item, indent + 2)
        elif isinstance(item, str) and "\n" in item:
            lines.append(f"{pad}{key}: |")
            lines += [f"{pad}  {line}" if line else "" for line in item.rstrip("\n").split("\n")]
        else:
            lines.append(f"{pad}{key}: {_scalar(item)}")
    return lines


def _scalar(value: Any) -> str:
    if value is None:
        return "~"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # YAML 1.1 reads 1e-05 as a string: the mantissa needs a point (1.0e-05)
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:
            text = text.replace("e", ".0e", 1)
        return text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_scalar(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    return json.dumps(str(value))
