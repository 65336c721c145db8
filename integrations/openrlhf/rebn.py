"""``rebn`` for OpenRLHF 0.11.x without a fork: a patch of ``RemoteExperienceMaker.compute_advantages_and_returns``.

OpenRLHF has no advantage registry; its experience maker (inside the Ray trainer actor) dispatches on
``--algo.advantage.estimator``. :func:`install` wraps that method: for ``rebn`` it computes the
advantages with :func:`gem_core.algo.rebn_token_level`, for every other estimator it calls the original
unchanged. The ``gem-core openrlhf train`` launcher installs it in every Ray worker process through
Ray's ``worker_process_setup_hook`` (``"gem_integrations.openrlhf.rebn.install"``).

What ``rebn`` computes, per batch (every experience the trainer collected in the step):

* turns are the runs of 1s in each sample's ``action_mask`` (OpenRLHF's ``action_ranges``); turn ``t``'s
  reward ``r_t`` (``gem_turn_rewards`` in ``info``, written by the GEM agent file) sits on its last
  token, clipped to ``--reward.clip_range``; OpenRLHF's length penalties, applied to the sample's total
  reward, are added to the last turn;
* with a KL penalty (``--algo.kl.init_coef > 0`` and not ``--algo.kl.use_loss``), ``-kl_coef * kl`` is
  added on every action token, so it counts in its turn's reward, as OpenRLHF's ``compute_reward`` does;
* ``G_t = r_t + gamma * G_{t+1}`` over turns (``--algo.advantage.gamma``), then
  ``A_t = (G_t - mean(G)) / (std(G) + eps)`` over every turn of the batch, on every token of turn ``t``
  (``--algo.advantage.rebn_eps``, default 1e-6; ``--algo.advantage.rebn_ddof``, default 0, population
  std). ``returns`` holds each token's ``G_t``. No further whitening.
"""

from __future__ import annotations

import functools
from typing import Any

TURN_REWARDS_KEY = "gem_turn_rewards"
EPISODE_LENGTH_KEY = "gem_episode_length"
ESTIMATOR = "rebn"
DEFAULT_EPS = 1e-6
DEFAULT_DDOF = 0
_MARK = "_gem_core_rebn_patch"


def is_active() -> bool:
    """Whether this process's ``RemoteExperienceMaker`` carries the patch."""
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    return bool(getattr(RemoteExperienceMaker.compute_advantages_and_returns, _MARK, False))


def install() -> None:
    """Patch ``RemoteExperienceMaker.compute_advantages_and_returns`` (idempotent). Ray worker setup hook."""
    import torch
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    original = RemoteExperienceMaker.compute_advantages_and_returns
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    @torch.no_grad()
    def compute_advantages_and_returns(self: Any, experiences: list) -> list:
        if self.strategy.args.algo.advantage.estimator == ESTIMATOR:
            return rebn_advantages_and_returns(self, experiences)
        for experience in experiences:  # not a metric: keep it out of OpenRLHF's logging
            experience.info.pop(TURN_REWARDS_KEY, None)
        return original(self, experiences)

    setattr(compute_advantages_and_returns, _MARK, True)
    compute_advantages_and_returns.original = original  # type: ignore[attr-defined]
    RemoteExperienceMaker.compute_advantages_and_returns = compute_advantages_and_returns


def uninstall() -> None:
    """Put the original method back (tests)."""
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    current = RemoteExperienceMaker.compute_advantages_and_returns
    if getattr(current, _MARK, False):
        RemoteExperienceMaker.compute_advantages_and_returns = current.original


def rebn_advantages_and_returns(maker: Any, experiences: list) -> list:
    """The ``rebn`` branch: fills ``advantages``/``returns`` of every experience (see the module doc)."""
    import torch
    from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

    from gem_core.algo import rebn_token_level

    args = maker.strategy.args
    advantage_args = args.algo.advantage
    gamma = float(advantage_args.gamma)
    eps = float(getattr(advantage_args, "rebn_eps", DEFAULT_EPS))
    ddof = int(getattr(advantage_args, "rebn_ddof", DEFAULT_DDOF))
    kl_coef = max(float(maker.kl_ctl.value), 0.0)
    clip = getattr(args.reward, "clip_range", None)

    turn_rewards = []
    for i, experience in enumerate(experiences):
        experience.rewards = experience.rewards.to(torch.promote_types(experience.rewards.dtype, torch.float32))
        table = experience.info.pop(TURN_REWARDS_KEY, None)
        if table is None:
            raise RuntimeError(
                "--algo.advantage.estimator rebn needs per-turn rewards (info['gem_turn_rewards']), which the "
                "GEM agent file writes when GEM_OPENRLHF_TURN_REWARDS=1: launch with `gem-core openrlhf train` "
                "and --train.agent_func_path $(gem-core openrlhf agent-path)"
            )
        table = torch.as_tensor(table, dtype=torch.float64).reshape(len(experience.rewards), -1)
        total = experience.rewards.double()
        if not torch.allclose(table.sum(-1), total, atol=1e-4, rtol=1e-5):
            raise ValueError(f"micro-batch {i}: per-turn rewards do not add up to the samples' rewards")
        turn_rewards.append(table)

    before = [e.rewards.double().clone() for e in experiences]
    apply_length_penalties(experiences, args)  # OpenRLHF's own; changes the total reward only

    rows, masks, widths = [], [], []
    for experience, table, total_before in zip(experiences, turn_rewards, before):
        mask = experience.action_mask.bool()
        widths.append(mask.shape[1])
        ends = mask & ~torch.nn.functional.pad(mask[:, 1:], (0, 1), value=False)  # last token of every run
        num_turns = ends.sum(-1)
        lengths = experience.info.get(EPISODE_LENGTH_KEY)
        if lengths is not None and not torch.equal(num_turns, torch.as_tensor(lengths).reshape(-1).to(num_turns.dtype)):
            raise ValueError(
                f"action-mask runs {num_turns.tolist()} do not match the episode lengths {torch.as_tensor(lengths).tolist()}"
            )
        if int(num_turns.max()) > table.shape[1]:
            raise ValueError(f"a sample has {int(num_turns.max())} turns but only {table.shape[1]} turn rewards")
        table = table.clone()
        last = (num_turns - 1).clamp(min=0)
        penalty = experience.rewards.double() - total_before
        table[torch.arange(len(table)), last] += penalty
        if clip:
            table = table.clamp(min=float(clip[0]), max=float(clip[1]))
        index = (ends.long().cumsum(-1) - 1).clamp(min=0, max=table.shape[1] - 1)
        token_rewards = torch.where(ends, table.gather(1, index), torch.zeros((), dtype=torch.float64))
        if kl_coef > 0 and experience.kl is not None:
            token_rewards = token_rewards - kl_coef * experience.kl.double() * mask
        rows.append(token_rewards)
        masks.append(mask)

    width = max(widths)
    rewards = torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1])) for r in rows])
    mask = torch.cat([torch.nn.functional.pad(m, (0, width - m.shape[1]), value=False) for m in masks])
    advantages, returns = rebn_token_level(rewards, mask, gamma=gamma, eps=eps, ddof=ddof, return_returns=True)

    start = 0
    for experience, token_rewards, w in zip(experiences, rows, widths):
        n = token_rewards.shape[0]
        dtype = experience.rewards.dtype
        experience.advantages = advantages[start : start + n, :w].to(dtype)
        experience.returns = returns[start : start + n, :w].to(dtype)
        experience.info["return"] = token_rewards.sum(-1).to(dtype)
        experience.kl = None
        start += n
    return experiences
