"""Trajectories -> a token-level batch that says, per token, which turn and which episode it belongs to.

Trainers zero loss-mask tokens for their own reasons (verl's token-level rollout rejection, OpenRLHF's
overlong filtering), so turns cannot be re-derived from the mask afterwards: one rejected token would
split a turn in two and change every advantage of the batch. The runner knows each turn; this module
keeps that knowledge next to the tokens, and the estimators take it (``rebn_token_level(...,
turn_ids=...)``). Inferring turns from runs of the mask stays only as the fallback for batches that
carry no turn ids.

Two views (DESIGN.md contract 5):

* :func:`sequence_batch`: one row per episode (the verl/OpenRLHF agent-loop view): every turn's
  response then the tokens the env added, ``loss_mask`` 1 on model tokens.
* :func:`turn_batch`: one row per turn (GEM's default): the turn's response only; ``episode_ids``
  ties the rows of an episode together and ``turn_ids`` holds each row's turn index.

``turn_ids`` is the turn index (0, 1, ...) on every token of a turn (its response and the env tokens
that follow it) and -1 on padding; each turn's reward sits on its last model token.

Episodes the infrastructure failed (``Trajectory.infra_error``: an engine abort, a dead sandbox or env
worker; DESIGN.md contract 8) keep their rows, so a trainer's batch keeps its shape, but carry nothing:
``loss_mask`` 0, ``turn_ids`` -1, rewards 0 (the estimators leave them out of their statistics), and
``infra_failed`` marks them; :func:`infra_metrics` counts them. A trainer's own group estimators (GRPO,
RLOO, group_norm...) must not see them either, or their 0 enters the group's baseline: a trainer that groups
rows by uid or normalises over the whole batch is handed :func:`healthy_rows` alone (verl); one that groups by
position (``reshape(-1, n)``: OpenRLHF, RL2) takes each group's healthy rows from :func:`healthy_groups`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gem_core.rollout.trajectory import Trajectory

NO_TURN = -1


@dataclass
class TokenBatch:
    """Right-padded (rows, length) arrays and one entry per row of the lists.

    ``response_ids`` (int64, ``pad_id`` on padding), ``loss_mask`` (int8), ``turn_ids`` (int64, -1 on
    padding), ``token_rewards`` (float64), ``logprobs`` (float64, 0 on env tokens and padding; None when
    a policy reported none). ``prompt_ids``: each row's prompt (per-turn rows: the context at the turn's
    start). ``episode_ids``/``group_ids``/``env_ids``: per row. ``lengths``: real tokens per row.
    """

    prompt_ids: list[list[int]]
    response_ids: np.ndarray
    loss_mask: np.ndarray
    turn_ids: np.ndarray
    token_rewards: np.ndarray
    logprobs: np.ndarray | None
    episode_ids: list[str]
    group_ids: list[str | None]
    env_ids: list[str | None]
    lengths: list[int]
    per_turn: bool
    infra_failed: list[bool] | None = None

    def __len__(self) -> int:
        return len(self.episode_ids)

    def turn_slots(self) -> list[tuple[int, int]]:
        """``(row, turn id)`` of every turn in the batch, row by row and turn by turn: the order of
        :meth:`episode_rewards`' turns and of the values :meth:`per_token` takes. Infra-failed rows have none."""
        slots = []
        for row in range(len(self)):
            ids = self.turn_ids[row]
            slots.extend((row, int(turn)) for turn in np.unique(ids[ids != NO_TURN]))
        return slots

    def episode_rewards(self) -> tuple[list[list[float]], list[str | None]]:
        """Each episode's per-turn rewards (the ragged input of every estimator in :mod:`gem_core.algo`),
        in the batch's order, and each episode's group id. A sequence row is an episode; per-turn rows of one
        episode are consecutive (the order :func:`turn_batch` writes them in)."""
        episode_of_row, episode = [], -1
        for row in range(len(self)):
            if not self.per_turn or row == 0 or self.episode_ids[row] != self.episode_ids[row - 1]:
                episode += 1
            episode_of_row.append(episode)
        rewards: dict[int, list[float]] = {}
        groups: dict[int, str | None] = {}
        for row, turn in self.turn_slots():
            key = episode_of_row[row]
            rewards.setdefault(key, []).append(float(self.token_rewards[row][self.turn_ids[row] == turn].sum()))
            groups.setdefault(key, self.group_ids[row])
        return list(rewards.values()), list(groups.values())

    def per_token(self, turn_values: Sequence[float]) -> np.ndarray:
        """(rows, length) float64: each model token holds its turn's value (``turn_values`` in the order of
        :meth:`turn_slots`, e.g. an estimator's advantages of :meth:`episode_rewards`); 0 on the env's
        tokens, on padding and on infra-failed rows."""
        slots = self.turn_slots()
        values = np.asarray(turn_values, dtype=np.float64).reshape(-1)
        if values.shape[0] != len(slots):
            raise ValueError(f"{values.shape[0]} turn values for a batch of {len(slots)} turns")
        out = np.zeros(self.token_rewards.shape, dtype=np.float64)
        for (row, turn), value in zip(slots, values):
            out[row][self.turn_ids[row] == turn] = value
        return out * (self.loss_mask != 0)

    def advantages(self, *, gamma: float = 1.0, eps: float = 1e-6, ddof: int = 0, group_by: Sequence[Any] | None = None) -> np.ndarray:
        """ReBN on this batch with its explicit turns (see :func:`gem_core.algo.rebn_token_level`)."""
        from gem_core.algo import rebn_token_level

        if self.per_turn:
            # one row per turn: an infra-failed episode's rows are left out of the statistics, 0 advantage
            keep = healthy_rows(self.infra_failed or [False] * len(self))
            out = np.zeros(self.token_rewards.shape, dtype=np.float64)
            if keep.size:
                groups = None if group_by is None else [group_by[i] for i in keep]
                out[keep] = rebn_token_level(
                    self.token_rewards[keep],
                    self.loss_mask[keep],
                    groups,
                    gamma=gamma,
                    eps=eps,
                    ddof=ddof,
                    episode_ids=[self.episode_ids[i] for i in keep],
                )
            return out
        return rebn_token_level(self.token_rewards, self.loss_mask, group_by, gamma=gamma, eps=eps, ddof=ddof, turn_ids=self.turn_ids)


def sequence_batch(trajectories: Sequence[Trajectory], *, pad_id: int = 0, length: int | None = None) -> TokenBatch:
    """One row per episode (see the module docstring). ``length``: pad every row to it (default: the
    longest row); a row longer than ``length`` is an error, never cut silently."""
    rows = []
    for trajectory in trajectories:
        view = trajectory.as_sequence()
        rows.append((view.prompt_ids, view.response_ids, view.loss_mask, view.turn_ids, view.token_rewards(), view.logprobs))
    return _pack(rows, trajectories, [t.episode_id for t in trajectories], pad_id, length, per_turn=False)


def turn_batch(trajectories: Sequence[Trajectory], *, pad_id: int = 0, length: int | None = None) -> TokenBatch:
    """One row per turn (see the module docstring)."""
    rows, owners, episode_ids = [], [], []
    for trajectory in trajectories:
        for sample in trajectory.per_turn_samples():
            n = len(sample.response_ids)
            rewards = [0.0] * n
            if n:
                rewards[-1] = sample.reward
            rows.append((sample.prompt_ids, sample.response_ids, [1] * n, [sample.turn_index] * n, rewards, sample.logprobs))
            owners.append(trajectory)
            episode_ids.append(trajectory.episode_id)
    return _pack(rows, owners, episode_ids, pad_id, length, per_turn=True)


def infra_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``gem/infra_failed_episodes``: how many episodes the infrastructure failed (kept out of training),
    and ``gem/infra_failed_fraction`` of the batch."""
    failed = sum(t.infra_error is not None for t in trajectories)
    return {"gem/infra_failed_episodes": float(failed), "gem/infra_failed_fraction": failed / max(len(trajectories), 1)}


def healthy_rows(failed: Sequence[bool], groups: Sequence[Any] | None = None) -> np.ndarray:
    """The rows (indices, in batch order) a trainer's own estimator is handed once the infra-failed rows are
    out, so that no failed row enters a baseline; the rows left out get advantage 0. ``groups`` (each row's
    group: verl's uid), for an estimator that refuses a group of one: also without the lone survivor of each
    group that lost rows (its only healthy row, left nothing to be compared with); a group that had one row
    to begin with keeps it."""
    failed = np.asarray(failed, dtype=bool).reshape(-1)
    keep = np.flatnonzero(~failed)
    if groups is None:
        return keep
    if len(groups) != failed.size:
        raise ValueError(f"{len(groups)} group ids for {failed.size} rows")
    lost = {groups[i] for i in np.flatnonzero(failed)}
    healthy: dict[Any, int] = {}
    for i in keep:
        healthy[groups[i]] = healthy.get(groups[i], 0) + 1
    return np.asarray([i for i in keep if not (groups[i] in lost and healthy[groups[i]] == 1)], dtype=np.int64)


def healthy_groups(failed: Sequence[bool], group_size: int) -> dict[int, np.ndarray]:
    """The rows each group keeps once its infra-failed rows are out, for a trainer that groups rows by
    position (rows ``[g * n, (g + 1) * n)`` are prompt ``g``'s ``n = group_size`` samples, its estimator's
    ``rewards.reshape(-1, n)``): ``{k: (groups, k) row indices}`` for every group that keeps ``k`` rows,
    groups and rows in batch order. A group with no row left is absent. Running the trainer's own group
    formula on each ``(groups, k)`` block (as ``reshape(-1, k)``) gives each healthy row the advantage it
    would have had if the failed rows had never been played."""
    failed = np.asarray(failed, dtype=bool).reshape(-1)
    if group_size < 1 or failed.size % group_size:
        raise ValueError(f"a batch of {failed.size} rows is not whole groups of {group_size}")
    by_size: dict[int, list[np.ndarray]] = {}
    for group in range(failed.size // group_size):
        rows = np.arange(group * group_size, (group + 1) * group_size)
        kept = rows[~failed[rows]]
        if kept.size:
            by_size.setdefault(int(kept.size), []).append(kept)
    return {k: np.stack(groups) for k, groups in sorted(by_size.items())}


def _pack(rows: list[tuple], owners: Sequence[Trajectory], episode_ids: list[str], pad_id: int, length: int | None, *, per_turn: bool) -> TokenBatch:
    if not rows:
        raise ValueError("an empty batch: no trajectory has a turn")
    lengths = [len(row[1]) for row in rows]
    width = max(lengths) if length is None else int(length)
    if max(lengths) > width:
        raise ValueError(f"a row has {max(lengths)} response tokens, more than length={width}")
    count = len(rows)
    response = np.full((count, width), pad_id, dtype=np.int64)
    mask = np.zeros((count, width), dtype=np.int8)
    turn_ids = np.full((count, width), NO_TURN, dtype=np.int64)
    rewards = np.zeros((count, width), dtype=np.float64)
    have_logprobs = all(row[5] is not None for row in rows)
    logprobs = np.zeros((count, width), dtype=np.float64) if have_logprobs else None
    failed = [owner.infra_error is not None for owner in owners]
    for i, (_, ids, row_mask, row_turns, row_rewards, row_logprobs) in enumerate(rows):
        n = len(ids)
        response[i, :n] = ids
        if not failed[i]:  # an infra-failed episode's row carries no loss, no turn and no reward
            mask[i, :n] = row_mask
            turn_ids[i, :n] = row_turns
            rewards[i, :n] = row_rewards
        if logprobs is not None:
            logprobs[i, :n] = row_logprobs
    return TokenBatch(
        prompt_ids=[list(row[0]) for row in rows],
        response_ids=response,
        loss_mask=mask,
        turn_ids=turn_ids,
        token_rewards=rewards,
        logprobs=logprobs,
        episode_ids=list(episode_ids),
        group_ids=[t.group_id for t in owners],
        env_ids=[t.env_id for t in owners],
        lengths=lengths,
        per_turn=per_turn,
        infra_failed=failed,
    )
