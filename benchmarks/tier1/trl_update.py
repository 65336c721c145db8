"""TRL 1.16 in the Tier 1 check: the recorded batch and weights through TRL's own ``GRPOTrainer`` update.

What runs is TRL's: ``trainer.train()`` of :class:`gem_integrations.trl.GemGRPOTrainer` built from the plugin's
mapping of the experiment (``gem_integrations.trl.experiment.grpo_config`` and ``trainer_arguments``), for one
update (``max_steps`` = the update's optimizer steps): TRL's ``_generate_and_score_completions`` (the plugin's
ReBN advantages, TRL's old and reference log-probs), its shuffle and split into ``steps_per_generation``
mini-batches, ``compute_loss``, the HF Trainer's backward, gradient clipping, AdamW (``create_optimizer``) and
scheduler. Only the generation is replaced: the rollout function replays the recorded episodes
(:func:`gem_integrations.trl.rollout.trl_fields`, what ``GemRollout`` returns for them). The actor is loaded
from ``actor/`` and its ``config._name_or_path`` points at ``ref/``: TRL builds its reference model from that
path (``create_model_from_path(get_config_model_id(model.config))``), as in a run whose actor has moved from
the checkpoint it started from. Observed, not changed: the advantages ``_generate_and_score_completions``
returns and the rows of each ``_compute_loss`` call (TRL shuffles them: the reference takes the same rows).

TRL's declared semantics (:func:`semantics`), each a documented difference from gem-core train's:

* old log-probs: TRL's non-vLLM path ignores the rollout's; the old policy is the actor at the update's start
  (recomputed when an update makes several steps; ``per_token_logps.detach()`` when it makes one: ratio 1);
* ``loss_type="dapo"`` (token-mean): each mini-batch's token sum is divided by the update's model tokens over
  ``steps_per_generation``, not by the mini-batch's own tokens;
* ``loss_type="grpo"`` (seq-mean-token-mean): the mean over every row of the mini-batch, an infra-failed row
  (no loss token) counted in the divisor;
* the advantages are float32 (the plugin computes ReBN in float64 and casts to TRL's advantage dtype);
* AdamW through the HF Trainer: no weight decay on biases and norm weights; warm-up ``lr * k / W``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from gem_core.experiment import Experiment
from tier1.reference import Semantics, Update, experiment_semantics

TRAINER = "trl"


def semantics(experiment: Experiment) -> Semantics:
    """The update TRL declares for ``experiment``: the experiment's values (not the plugin's mapping of them,
    which is what is checked) under TRL's rules (see the module docstring)."""
    return experiment_semantics(
        TRAINER,
        experiment,
        advantage_dtype="float32",
        token_mean_over="batch/steps",
        seq_rows="all",
        old_logprobs="start",
        no_decay_bias_and_norm=True,
        warmup="hf",
    )


class Replay:
    """TRL's ``rollout_func``: the recorded episodes, as ``GemRollout`` would return them."""

    def __init__(self, trajectories: list[Any]):
        self.trajectories = trajectories

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        from gem_integrations.trl.rollout import _pad_id, trl_fields

        if len(prompts) != len(self.trajectories):
            raise ValueError(f"TRL asked for {len(prompts)} episodes; {len(self.trajectories)} were recorded")
        return trl_fields(self.trajectories, _pad_id(trainer))


def run(work: str | Path, experiment: Experiment, fault: str | None = None, overrides: dict[str, Any] | None = None) -> Update:
    """One update of TRL on the recorded batch in ``work``; ``fault`` injects one mistake on TRL's side
    (``lr``: twice the rate; ``kl``: beta 0; ``clip``: half the clip; ``aggregation``: the other loss type;
    ``infra``: the failed episode's flag dropped, so its row counts); ``overrides``: ``GRPOConfig`` fields set
    over the plugin's mapping (tests: what a default the mapping pins would do)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from gem_core.tasks import TaskSpec
    from gem_integrations.trl import GemGRPOTrainer
    from gem_integrations.trl.dataset import rows_for
    from gem_integrations.trl.experiment import grpo_config, trainer_arguments
    from tier1.batch import INFRA_EPISODE, load, tokenizer

    work = Path(work)
    recorded = load(work)
    trajectories = recorded.trajectories
    if fault == "infra":
        trajectories[INFRA_EPISODE] = dataclasses.replace(trajectories[INFRA_EPISODE], infra_error=None)
    e = experiment
    config = {**grpo_config(e), "max_steps": e.optimizer_steps_per_update, "save_strategy": "no", "logging_steps": 1, "report_to": "none"}
    if fault == "lr":
        config["learning_rate"] *= 2
    elif fault == "kl":
        config["beta"] = 0.0
    elif fault == "clip":
        config["epsilon"] /= 2
        config["epsilon_high"] /= 2
    elif fault == "aggregation":
        config["loss_type"] = "grpo" if config["loss_type"] == "dapo" else "dapo"
    elif fault not in (None, "infra"):
        raise ValueError(f"unknown fault {fault!r}")
    config.update(overrides or {})
    arguments = trainer_arguments(e)
    arguments.pop("rollout")
    torch.manual_seed(e.seed)  # TRL's shuffle of the rows draws from the global RNG (the rows it chose are recorded)
    model = AutoModelForCausalLM.from_pretrained(work / "actor", dtype=torch.float32)
    model.config._name_or_path = str(work / "ref")  # TRL's reference model comes from here
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    tok = tokenizer()
    seeds = [t.seed for t in trajectories[:: e.group_size]]
    dataset = Dataset.from_list(list(rows_for(TaskSpec(e.env_ids[0], seed=s) for s in seeds)))
    seen: dict[str, Any] = {"advantages": None, "steps": [], "losses": []}

    class Observed(GemGRPOTrainer):
        """GemGRPOTrainer, its results read as they pass (nothing changed)."""

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            output = super()._generate_and_score_completions(inputs)
            seen["advantages"] = output["advantages"].detach().clone()
            seen["batch"] = {k: output[k].detach().clone() for k in ("completion_ids", "tool_mask", "advantages") if k in output}
            return output

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            seen["steps"].append(_rows_of(inputs, seen["batch"]))
            loss = super()._compute_loss(model, inputs)
            seen["losses"].append(float(loss.detach()))
            return loss

    args = GRPOConfig(output_dir=str(work / "trl-out"), use_cpu=True, bf16=False, fp16=False, **config)
    trainer = Observed(model, args=args, train_dataset=dataset, processing_class=tok, rollout_func=Replay(trajectories), **arguments)
    trainer.train()
    deltas = {name: (p.detach() - start[name]).double().numpy() for name, p in trainer.model.named_parameters()}
    advantages = seen["advantages"]
    dtype = str(advantages.dtype).replace("torch.", "")
    stats = [{"loss": loss} for loss in seen["losses"]]
    return Update(advantages.double().numpy().astype(np.float64), deltas, seen["steps"], dtype, stats)


def _rows_of(part: dict[str, Any], whole: dict[str, Any]) -> list[int]:
    """The row index in the update's batch ``whole`` of each row of the mini-batch ``part``, matched on the
    completion ids, the loss mask and the advantages (identical rows: the first not yet taken)."""
    import torch

    def keys(d: dict[str, Any]) -> Any:
        mask = d.get("tool_mask", torch.ones_like(d["completion_ids"]))
        advantages = d["advantages"] if d["advantages"].dim() == 2 else d["advantages"][:, None].expand_as(mask)
        return torch.cat([d["completion_ids"].double(), mask.double(), advantages.double()], dim=1)

    a, b = keys(part), keys(whole)
    used: set[int] = set()
    out = []
    for row in a:
        match = next((i for i in range(b.shape[0]) if i not in used and bool(torch.equal(b[i], row))), None)
        if match is None:
            raise ValueError("a mini-batch row that is not in the update's batch")
        used.add(match)
        out.append(match)
    return out
