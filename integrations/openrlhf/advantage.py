"""``rebn`` for OpenRLHF 0.11.x without a fork: a patch of ``RemoteExperienceMaker.compute_advantages_and_returns``.

OpenRLHF has no advantage registry; its experience maker (inside the PPO trainer's Ray actor)
dispatches on ``--algo.advantage.estimator``. :func:`make_compute_advantages` wraps that method: for
``rebn`` it computes the advantages with :func:`gem_core.algo.rebn_token_level`, for every other
estimator it calls the original unchanged (after removing the GEM turn fields from ``info``).
:data:`gem_integrations.openrlhf.plugin_spec.PLUGIN` installs it (a :class:`gem_core.plugins.Patch`); the
``gem-core openrlhf train`` launcher arms it in every Ray worker through the plugin's setup hook.

What ``rebn`` computes, per batch (every experience the trainer collected in the step):

* **turns are explicit**: the GEM agent file reports each turn's ``[start, end)`` in the sequence
  (``info["gem_turn_spans"]``, from the runner's turns) and its reward (``info["gem_turn_rewards"]``).
  Turn ``t`` covers its response and the env tokens after it; its reward ``r_t`` sits on its last model
  token, clipped to ``--reward.clip_range``; OpenRLHF's length penalties, applied to the sample's total
  reward, are added to the last turn. A token whose ``action_mask`` is 0 inside a turn keeps its turn.
  *Fallback*: a batch without spans (an agent file other than gem-core's) has its turns inferred as the
  runs of 1s in ``action_mask``, which is only right while nothing zeroes a token inside a turn;
* with a KL penalty (``--algo.kl.init_coef > 0`` and not ``--algo.kl.use_loss``), ``-kl_coef * kl`` is
  added on every action token, so it counts in its turn's reward, as OpenRLHF's ``compute_reward`` does;
* ``G_t = r_t + gamma * G_{t+1}`` over turns (``--algo.advantage.gamma``), then
  ``A_t = (G_t - mean(G)) / (std(G) + eps)`` over every turn of the batch, on every action token of turn
  ``t`` (``--algo.advantage.rebn_eps``, default 1e-6; ``--algo.advantage.rebn_ddof``, default 0,
  population std). ``returns`` holds each token's ``G_t``. No further whitening;
* **infra failures**: an episode the infrastructure failed comes from the agent with no action range and
  no turns (``info["gem_infra_failed"]`` 1.0), so its row has turn id -1 everywhere and enters neither the
  loss nor ReBN's mean and std (0 advantage). For every estimator, the patch adds
  ``info["gem/infra_failed_episodes"]``: the number of such episodes in the step's batch, the same value
  on every sample, so OpenRLHF's per-sample averaging of ``info`` logs the count itself.

OpenRLHF's own estimators and infra failures: its group baselines (``rloo``, ``reinforce_baseline``,
``dr_grpo``, ``group_norm``: ``rewards.reshape(-1, n_samples_per_prompt)``; ``flash_reinforce``: the batch
mean) ignore the action mask, so a failed row's reward 0 would enter its group's baseline (three solved
episodes and a dead sandbox: RLOO +0.333 each instead of 0). With failures in the batch, OpenRLHF's step
runs as it is (length penalties, clipping, KL, returns, GAE, whitening) except for the baseline: the
scalar reward it hands ``compute_reward`` for each sample is replaced (:func:`make_compute_reward`, a
second patch, idle otherwise) by the same estimator's over the healthy rows alone
(:func:`healthy_shaped_rewards`: each group's healthy rows, :func:`gem_core.batch.healthy_groups`, as a
group of their own size). A group left with one healthy row gets 0 (OpenRLHF's formulas give NaN or 0
for a group of one: nothing to compare it with). The failed rows get advantages and returns 0, and
``group_reward_std`` is their group's over its healthy rows. ``gae`` and ``reinforce`` have no group
baseline (their whitening counts action tokens only); their failed rows are zeroed too.

Importing this module imports neither torch nor OpenRLHF.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

TURN_REWARDS_KEY = "gem_turn_rewards"
TURN_SPANS_KEY = "gem_turn_spans"
TURN_KEYS = (TURN_REWARDS_KEY, TURN_SPANS_KEY)
INFRA_FAILED_KEY = "gem_infra_failed"  # per sample, from the agent file
INFRA_COUNT_KEY = "gem/infra_failed_episodes"  # per batch, added here
ESTIMATOR = "rebn"
DEFAULT_EPS = 1e-6
DEFAULT_DDOF = 0
#: OpenRLHF's estimators whose baseline is over a prompt's group (``reshape(-1, n_samples_per_prompt)``).
GROUP_ESTIMATORS = ("rloo", "reinforce_baseline", "dr_grpo", "group_norm")
#: OpenRLHF's estimator whose baseline is the whole batch's mean reward.
BATCH_MEAN_ESTIMATORS = ("flash_reinforce",)
_SHAPED_REWARD: ContextVar[Callable[[Any, Any], Any] | None] = ContextVar("gem_openrlhf_shaped_reward", default=None)


def make_compute_advantages(original: Any) -> Any:
    """The patched ``compute_advantages_and_returns`` around OpenRLHF's ``original``."""

    @functools.wraps(original)
    def compute_advantages_and_returns(self: Any, experiences: list) -> list:
        count_infra_failures(experiences)
        estimator = self.strategy.args.algo.advantage.estimator
        if estimator == ESTIMATOR:
            return rebn_advantages_and_returns(self, experiences)
        for experience in experiences:  # not metrics: keep them out of OpenRLHF's logging
            for key in TURN_KEYS:
                experience.info.pop(key, None)
        failed = infra_failed_rows(experiences)
        if failed is None or not any(bool(f.any()) for f in failed):
            return original(self, experiences)
        with healthy_baselines(experiences, failed, estimator, int(self.strategy.args.rollout.n_samples_per_prompt)):
            out = original(self, experiences)
        for experience, dead in zip(out, failed):
            experience.advantages[dead] = 0
            experience.returns[dead] = 0
        return out

    return compute_advantages_and_returns


def make_compute_reward(original: Any) -> Any:
    """OpenRLHF's ``compute_reward(r, kl_coef, kl, action_mask=..., ...)`` as ``experience_maker`` calls it,
    with ``r`` (a micro-batch's baseline-shaped rewards) replaced while :func:`healthy_baselines` is active;
    OpenRLHF's own otherwise."""

    @functools.wraps(original)
    def compute_reward(r: Any, *args: Any, **kwargs: Any) -> Any:
        replace = _SHAPED_REWARD.get()
        if replace is not None:
            r = replace(r, kwargs["action_mask"] if "action_mask" in kwargs else args[2])
        return original(r, *args, **kwargs)

    return compute_reward


def infra_failed_rows(experiences: list) -> list | None:
    """Per micro-batch, a bool tensor of its infra-failed samples (``info["gem_infra_failed"]``), or None
    when no sample carries the flag (an agent file other than gem-core's)."""
    import torch

    flags = [e.info.get(INFRA_FAILED_KEY) for e in experiences]
    if all(f is None for f in flags):
        return None
    return [torch.zeros(len(e.sequences), dtype=torch.bool) if f is None else torch.as_tensor(f).reshape(-1).bool().cpu() for e, f in zip(experiences, flags)]


def healthy_shaped_rewards(rewards: Any, failed: Any, estimator: str, n_samples: int) -> Any:
    """OpenRLHF's baseline for ``estimator`` over the healthy rows alone: ``rewards`` and ``failed`` in
    OpenRLHF's prompt order (rows ``[g * n, (g + 1) * n)`` are prompt ``g``'s samples); each group's healthy
    rows are shaped as a group of their own size with OpenRLHF's formula (``flash_reinforce``: minus the
    mean of every healthy row). Failed rows, and a group's only healthy row, get 0. None for an estimator
    with no baseline of rewards (``gae``, ``reinforce``)."""
    import torch

    from gem_core.batch import healthy_groups, healthy_rows

    shaped = torch.zeros_like(rewards)
    if estimator in BATCH_MEAN_ESTIMATORS:
        keep = torch.as_tensor(healthy_rows(failed.tolist()))
        if keep.numel():
            shaped[keep] = rewards[keep] - rewards[keep].mean()
        return shaped
    if estimator not in GROUP_ESTIMATORS:
        return None
    for k, rows in healthy_groups(failed.tolist(), n_samples).items():
        if k == 1:
            continue
        index = torch.as_tensor(rows)
        group = rewards[index]  # (groups, k): OpenRLHF's reshape(-1, k)
        if estimator == "rloo":
            group = group - (group.sum(-1, keepdim=True) - group) / (k - 1)
        elif estimator == "group_norm":
            group = (group - group.mean(-1, keepdim=True)) / (group.std(-1, keepdim=True) + 1e-9)
        else:  # reinforce_baseline, dr_grpo
            group = group - group.mean(-1, keepdim=True)
        shaped[index] = group
    return shaped


@contextmanager
def healthy_baselines(experiences: list, failed: list, estimator: str, n_samples: int) -> Iterator[None]:
    """While OpenRLHF's ``compute_advantages_and_returns`` runs: each micro-batch's call of
    ``compute_reward`` gets :func:`healthy_shaped_rewards` of the rewards as OpenRLHF holds them then
    (its length penalties applied), and each sample's ``group_reward_std`` becomes its group's over the
    healthy rows (after OpenRLHF's step). Nothing replaced for an estimator without a baseline."""
    import torch

    from gem_core.batch import healthy_groups

    rows = [len(e.index) for e in experiences]
    positions = torch.tensor([int(i) for e in experiences for i in e.index])
    dead = torch.zeros(len(positions), dtype=torch.bool)
    dead[positions] = torch.cat(failed)
    micro_batch = {}
    cache: dict[str, Any] = {}

    def per_micro_batch(values: Any) -> list:
        return list(values[positions].split(rows))

    def replace(reward: Any, action_mask: Any) -> Any:
        if "shaped" not in cache:
            for i, experience in enumerate(experiences):
                micro_batch[id(experience.action_mask)] = i
            raw = torch.cat([e.rewards for e in experiences])
            ordered = torch.empty_like(raw)
            ordered[positions] = raw
            cache["rewards"] = ordered
            cache["shaped"] = per_micro_batch(healthy_shaped_rewards(ordered, dead, estimator, n_samples))
        i = micro_batch.get(id(action_mask))
        if i is None:
            raise RuntimeError("gem: OpenRLHF's compute_reward was called for a micro-batch not in this step; cannot leave infra-failed rows out")
        return cache["shaped"][i].to(device=reward.device, dtype=reward.dtype)

    if estimator not in GROUP_ESTIMATORS + BATCH_MEAN_ESTIMATORS:
        yield
        return
    token = _SHAPED_REWARD.set(replace)
    try:
        yield
    finally:
        _SHAPED_REWARD.reset(token)
    if "rewards" in cache and n_samples > 1 and all("group_reward_std" in e.info for e in experiences):
        std = torch.zeros_like(cache["rewards"])  # a group left with fewer than two healthy rows: 0
        for k, group_rows in healthy_groups(dead.tolist(), n_samples).items():
            if k > 1:  # the group's healthy std on every row of it, the failed ones too
                index = torch.as_tensor(group_rows)
                members = index[:, :1] // n_samples * n_samples + torch.arange(n_samples)
                std[members] = cache["rewards"][index].std(-1, keepdim=True).expand(-1, n_samples)
        for experience, values in zip(experiences, per_micro_batch(std)):
            experience.info["group_reward_std"] = values.to(experience.info["group_reward_std"].dtype)


def count_infra_failures(experiences: list) -> None:
    """Put the batch's number of infra-failed episodes on every sample's ``info`` (see the module doc);
    nothing when no sample carries ``gem_infra_failed`` (an agent file other than gem-core's)."""
    import torch

    flags = [e.info.get(INFRA_FAILED_KEY) for e in experiences]
    if all(f is None for f in flags):
        return
    count = float(sum(float(torch.as_tensor(f).sum()) for f in flags if f is not None))
    for experience in experiences:
        experience.info[INFRA_COUNT_KEY] = torch.full((len(experience.sequences),), count)


def is_active() -> bool:
    """Whether this process's ``RemoteExperienceMaker`` carries the patch (imports it)."""
    from gem_integrations.openrlhf.plugin_spec import PLUGIN

    return PLUGIN.is_installed


def install() -> None:
    """Apply the patch now (idempotent); see :data:`gem_integrations.openrlhf.plugin_spec.PLUGIN`."""
    from gem_integrations.openrlhf.plugin_spec import PLUGIN

    PLUGIN.install()


def uninstall() -> None:
    """Put OpenRLHF's method back (tests)."""
    from gem_integrations.openrlhf.plugin_spec import PLUGIN

    PLUGIN.uninstall()


def rebn_advantages_and_returns(maker: Any, experiences: list) -> list:
    """The ``rebn`` branch: fills ``advantages``/``returns`` of every experience (see the module doc)."""
    import torch
    from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

    from gem_core.algo import rebn_token_level

    with torch.no_grad():
        args = maker.strategy.args
        advantage_args = args.algo.advantage
        gamma = float(advantage_args.gamma)
        eps = float(getattr(advantage_args, "rebn_eps", DEFAULT_EPS))
        ddof = int(getattr(advantage_args, "rebn_ddof", DEFAULT_DDOF))
        kl_coef = max(float(maker.kl_ctl.value), 0.0)
        clip = getattr(args.reward, "clip_range", None)

        tables, spans = [], []
        for i, experience in enumerate(experiences):
            experience.rewards = experience.rewards.to(torch.promote_types(experience.rewards.dtype, torch.float32))
            table = experience.info.pop(TURN_REWARDS_KEY, None)
            span = experience.info.pop(TURN_SPANS_KEY, None)
            if table is None:
                raise RuntimeError(
                    "--algo.advantage.estimator rebn needs per-turn rewards (info['gem_turn_rewards']), which the GEM "
                    "agent file writes when GEM_OPENRLHF_TURNS=1: launch with `gem-core openrlhf train` and "
                    "--train.agent_func_path $(gem-core openrlhf agent-path)"
                )
            table = torch.as_tensor(table, dtype=torch.float64).reshape(len(experience.rewards), -1)
            if table.shape[1] == 0:  # every sample of this micro-batch is infra-failed: no turns at all
                table = torch.zeros(len(experience.rewards), 1, dtype=torch.float64)
            if not torch.allclose(table.sum(-1), experience.rewards.double(), atol=1e-4, rtol=1e-5):
                raise ValueError(f"micro-batch {i}: per-turn rewards do not add up to the samples' rewards")
            tables.append(table)
            spans.append(None if span is None else torch.as_tensor(span, dtype=torch.long).reshape(len(experience.rewards), -1))

        before = [e.rewards.double().clone() for e in experiences]
        apply_length_penalties(experiences, args)  # OpenRLHF's own; changes the total reward only

        rows, masks, turn_rows = [], [], []
        for experience, table, span, total_before in zip(experiences, tables, spans, before):
            mask = experience.action_mask.bool()
            turn_ids, ends = _explicit_turns(span, mask) if span is not None else _turns_from_mask(mask)
            num_turns = ends.sum(-1)
            if int(num_turns.max()) > table.shape[1]:
                raise ValueError(f"a sample has {int(num_turns.max())} turns but only {table.shape[1]} turn rewards")
            table = table.clone()
            last = (num_turns - 1).clamp(min=0)
            table[torch.arange(len(table)), last] += experience.rewards.double() - total_before
            if clip:
                table = table.clamp(min=float(clip[0]), max=float(clip[1]))
            index = turn_ids.clamp(min=0, max=table.shape[1] - 1)
            token_rewards = torch.where(ends, table.gather(1, index), torch.zeros((), dtype=torch.float64))
            if kl_coef > 0 and experience.kl is not None:
                token_rewards = token_rewards - kl_coef * experience.kl.double() * mask
            rows.append(token_rewards)
            masks.append(mask)
            turn_rows.append(turn_ids)

        width = max(m.shape[1] for m in masks)
        pad = torch.nn.functional.pad
        rewards = torch.cat([pad(r, (0, width - r.shape[1])) for r in rows])
        mask = torch.cat([pad(m, (0, width - m.shape[1]), value=False) for m in masks])
        turn_ids = torch.cat([pad(t, (0, width - t.shape[1]), value=-1) for t in turn_rows])
        advantages, returns = rebn_token_level(rewards, mask, gamma=gamma, eps=eps, ddof=ddof, turn_ids=turn_ids, return_returns=True)

        start = 0
        for experience, token_rewards in zip(experiences, rows):
            n, w = token_rewards.shape
            dtype = experience.rewards.dtype
            experience.advantages = advantages[start : start + n, :w].to(dtype)
            experience.returns = returns[start : start + n, :w].to(dtype)
            experience.info["return"] = token_rewards.sum(-1).to(dtype)
            experience.kl = None
            start += n
        return experiences


def _explicit_turns(spans: Any, mask: Any) -> tuple[Any, Any]:
    """(turn ids, last-model-token marks) on OpenRLHF's action axis from each row's turn spans.

    ``spans[b]`` is ``[s0, e0, s1, e1, ...]`` in sequence positions, zero-padded; action index ``j``
    is position ``j + 1`` (OpenRLHF's action mask is shifted by one). Turn ``t`` runs from its response
    to the next turn's (env tokens included); its reward goes on position ``e_t - 1``.
    """
    import torch

    from gem_core.algo import turn_ids_from_spans

    width = mask.shape[1]
    pairs = spans.reshape(len(spans), -1, 2) if spans.numel() else spans.reshape(len(spans), 0, 2)
    rows = []
    ends = torch.zeros_like(mask)
    for b, row in enumerate(pairs.tolist()):
        row = [(s, e) for s, e in row if e > 0]
        if any(e - 1 > width for _, e in row):
            raise ValueError(f"sample {b}: a turn span {row} reaches past the sequence ({width + 1} tokens)")
        starts = [s - 1 for s, _ in row]
        rows.append([(a, b_) for a, b_ in zip(starts, [*starts[1:], row[-1][1] - 1])] if row else [])
        for _, e in row:
            ends[b, e - 2] = True
    turn_ids = torch.full(mask.shape, -1, dtype=torch.long)
    present = [i for i, row in enumerate(rows) if row]
    if present:
        turn_ids[present] = torch.as_tensor(turn_ids_from_spans([rows[i] for i in present], width), dtype=torch.long)
    return turn_ids, ends


def _turns_from_mask(mask: Any) -> tuple[Any, Any]:
    """The fallback: turns are the runs of 1s in ``action_mask``; each run's last token takes the reward."""
    import torch

    from gem_core.algo import turn_ids_from_mask

    ends = mask & ~torch.nn.functional.pad(mask[:, 1:], (0, 1), value=False)
    return torch.as_tensor(turn_ids_from_mask(mask), dtype=torch.long), ends
