"""ReBN in TRL: a ``GRPOTrainer`` whose advantages are gem_core's per-turn ReBN, as (B, T) tensors.

TRL 1.16 has no advantage hook: ``_generate_and_score_completions`` (private) computes one advantage per
completion from the rewards, and ``_compute_loss`` takes ``(B,)`` or, "to support subclasses", ``(B, T)``
advantages. :class:`GemGRPOTrainer` lets TRL's method run unchanged (generation through the rollout
function, reward functions, old/reference logprobs, importance sampling, logging) and then replaces
only ``output["advantages"]``: each token of turn ``t`` gets ``A_t = (G_t - mean(G)) / (std(G) + eps)``,
``G_t = r_t + gamma * G_{t+1}`` over the episode's turns, mean and std over every turn of the batch on
every process (:func:`gem_core.algo.rebn_token_level` with the rollout's explicit turn ids, statistics
all-reduced through ``torch.distributed``, the process group TRL's accelerator set up). Environment
tokens get 0 and carry no loss anyway (``env_mask``); so do the rows of episodes the infrastructure failed
(the rollout gives them no turn and no loss mask: out of the statistics too), which TRL's metrics count
as ``gem/infra_failed_episodes``. With ``estimator="trl"`` nothing is replaced: the
subclass is plain ``GRPOTrainer`` (TRL's group advantages of the episode return).

Defaults: ``gamma=0.9``, ``eps=1e-6``, ``ddof=0`` (population std), ``group_by=None`` (the whole batch):
the settings of ``gem-core train`` and the GEM paper. ``group_by="prompt"`` normalises within each of
TRL's prompt groups (the ``num_generations`` completions of a row), ``"env"`` per env id.
Normalisation happens once per generation batch, before TRL splits it into ``steps_per_generation``
micro-batches. The override is private API: the plugin checks the TRL version at construction
(``trl>=1.16,<2``) and the tests pin what the override relies on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from trl import GRPOTrainer

from gem_core.algo import DEFAULT_GAMMA, rebn_token_level
from gem_integrations.trl.plugin_spec import PLUGIN
from gem_integrations.trl.rollout import GROUP_ID, INFRA, TURN_IDS, TURN_REWARDS, GemRollout, episode_return

ESTIMATORS = ("rebn", "trl")
GROUPINGS = (None, "prompt", "env")


def token_rewards(turn_ids: np.ndarray, model_mask: np.ndarray, turn_rewards: list[list[float]]) -> np.ndarray:
    """(B, T) rewards: each turn's reward on its last model token (the sequence view's convention)."""
    out = np.zeros(turn_ids.shape, dtype=np.float64)
    for row, rewards in enumerate(turn_rewards):
        for turn, reward in enumerate(rewards):
            positions = np.flatnonzero((turn_ids[row] == turn) & model_mask[row])
            if positions.size == 0:
                raise ValueError(f"row {row}: turn {turn} has a reward but no model token in the completion")
            out[row, positions[-1]] = reward
    return out


def rebn_advantages(
    turn_ids: Any,
    model_mask: Any,
    turn_rewards: list[list[float]],
    group_keys: list[Any] | None = None,
    *,
    gamma: float = DEFAULT_GAMMA,
    eps: float = 1e-6,
    ddof: int = 0,
    distributed: bool = False,
) -> np.ndarray:
    """Per-token ReBN (B, T) for TRL rows: ``turn_ids`` (-1 on none), ``model_mask`` (1 on model tokens),
    one reward list per row; ``group_keys`` one per row or None; ``distributed``: statistics over every
    process (each passes its own rows)."""
    turn_ids = np.asarray(turn_ids, dtype=np.int64)
    mask = np.asarray(model_mask).astype(bool) & (turn_ids >= 0)
    rewards = token_rewards(turn_ids, mask, turn_rewards)
    return rebn_token_level(rewards, mask, group_keys, gamma=gamma, eps=eps, ddof=ddof, turn_ids=np.where(mask, turn_ids, -1), distributed=distributed)


class GemGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with gem-core's rollout and ReBN advantages (see the module docstring).

    Every ``GRPOTrainer`` argument is accepted as is; ``rollout_func`` defaults to
    :class:`~gem_integrations.trl.rollout.GemRollout` and ``reward_funcs`` to
    :func:`~gem_integrations.trl.rollout.episode_return`. ``estimator``: ``"rebn"`` or ``"trl"``.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        *args: Any,
        rollout_func: Any = None,
        estimator: str = "rebn",
        gamma: float = DEFAULT_GAMMA,
        eps: float = 1e-6,
        ddof: int = 0,
        group_by: str | None = None,
        **kwargs: Any,
    ):
        PLUGIN.check_version()
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        if group_by not in GROUPINGS:
            raise ValueError(f"group_by must be one of {GROUPINGS}, got {group_by!r}")
        rebn_token_level(np.ones((1, 1)), np.ones((1, 1)), gamma=gamma, eps=eps, ddof=ddof)  # the options' own checks
        self.gem_estimator, self.gem_gamma, self.gem_eps, self.gem_ddof, self.gem_group_by = estimator, gamma, eps, ddof, group_by
        super().__init__(
            model,
            episode_return if reward_funcs is None else reward_funcs,
            *args,
            rollout_func=GemRollout() if rollout_func is None else rollout_func,
            **kwargs,
        )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)  # TRL merges the rollout's fields into inputs
        self._log_episodes(inputs)
        if self.gem_estimator != "rebn":
            return output
        missing = [key for key in (TURN_IDS, TURN_REWARDS, GROUP_ID) if key not in inputs[0]]
        if missing:
            raise ValueError(f"rebn needs the gem rollout's fields {missing}: pass rollout_func=GemRollout() (or leave it unset)")
        completion_ids = output["completion_ids"]
        batch, width = completion_ids.shape
        turn_ids = np.full((batch, width), -1, dtype=np.int64)
        for row, x in enumerate(inputs):
            ids = x[TURN_IDS]
            turn_ids[row, : len(ids)] = ids
        model_mask = np.ones((batch, width), dtype=bool)
        if "tool_mask" in output:  # env_mask, padded with 1 by TRL; turn ids are -1 on padding
            model_mask = output["tool_mask"].cpu().numpy().astype(bool)
        keys = None
        if self.gem_group_by == "prompt":
            keys = [str(x[GROUP_ID]) for x in inputs]
        elif self.gem_group_by == "env":
            keys = [str(x.get("gem_env_id")) for x in inputs]
        advantages = rebn_advantages(
            turn_ids,
            model_mask,
            [list(x[TURN_REWARDS]) for x in inputs],
            keys,
            gamma=self.gem_gamma,
            eps=self.gem_eps,
            ddof=self.gem_ddof,
            distributed=self.accelerator.num_processes > 1,
        )
        output["advantages"] = self._gem_tensor(advantages, output["advantages"])
        return output

    @staticmethod
    def _gem_tensor(values: np.ndarray, like: Any) -> Any:
        import torch

        return torch.as_tensor(values, dtype=like.dtype if like.is_floating_point() else torch.float32, device=like.device)

    def _log_episodes(self, inputs: list[dict[str, Any]]) -> None:
        """Episode metrics next to TRL's, over every process: success rate, turns and return (episodes the
        infrastructure failed left out), and ``gem/infra_failed_episodes`` (how many it failed, kept out of
        the loss and the advantage statistics) with ``gem/infra_failed_fraction``."""
        import torch

        if "gem_success" not in inputs[0]:
            return
        mode = "train" if self.model.training else "eval"
        rows = []
        for x in inputs:
            failed = bool(x.get(INFRA))
            ok = 0.0 if failed else 1.0
            rows.append([ok * float(x["gem_success"]), ok * float(x["gem_num_turns"]), ok * float(x["gem_return"]), ok, 1.0 - ok])
        local = torch.tensor(rows, dtype=torch.float64).sum(dim=0)
        total = self.accelerator.gather(local.to(self.accelerator.device)).view(-1, 5).sum(dim=0).tolist()
        count = max(total[3], 1.0)
        self._metrics[mode]["gem/success_rate"].append(total[0] / count)
        self._metrics[mode]["gem/turns_per_episode"].append(total[1] / count)
        self._metrics[mode]["gem/episode_return"].append(total[2] / count)
        self._metrics[mode]["gem/infra_failed_episodes"].append(total[4])
        self._metrics[mode]["gem/infra_failed_fraction"].append(total[4] / max(total[3] + total[4], 1.0))
