"""How strongly ReBN's advantage favours halving the range over stepping by one in GuessTheNumber-v0-easy, per gamma.

Exact enumeration, no model: the targets 1-10, 4 turns, the env's rewards (1 for a win, a timed-out episode
1 - |last guess - target| / 9). The reference policy is where the default run's candidates plateau: first guess 5,
then one step toward the target. For each gamma: the batch's spread of per-turn returns under that policy (ReBN
divides every advantage by it), and the return gained by replacing one move (turn 2 or 3) with the halving move,
in return and in units of that spread. docs/training.md ("Gamma, worked out before running it") quotes the table.

    python benchmarks/halving_signal.py
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

LOW, HIGH, TURNS = 1, 10, 4
Policy = Callable[[int, int, list[int], int], int]


def play(target: int, policy: Policy) -> list[float]:
    """The per-turn rewards of one episode."""
    low, high, guessed, rewards = LOW, HIGH, [], []
    for turn in range(TURNS):
        guess = policy(low, high, guessed, turn)
        guessed.append(guess)
        if guess == target:
            return [*rewards, 1.0]
        low, high = (low, guess - 1) if guess > target else (guess + 1, high)
        rewards.append(0.0)
    rewards[-1] = 1 - abs(guessed[-1] - target) / (HIGH - LOW)
    return rewards


def stepping(low: int, high: int, guessed: list[int], turn: int) -> int:
    return 5 if turn == 0 else (high if guessed[-1] > high else low)


def halving(low: int, high: int, guessed: list[int], turn: int) -> int:
    return (low + high) // 2


def halving_at(k: int) -> Policy:
    return lambda low, high, guessed, turn: halving(low, high, guessed, turn) if turn == k else stepping(low, high, guessed, turn)


def returns(rewards: list[float], gamma: float) -> list[float]:
    out, total = [], 0.0
    for reward in reversed(rewards):
        total = reward + gamma * total
        out.append(total)
    return out[::-1]


def main() -> None:
    targets = range(LOW, HIGH + 1)
    print("| gamma | return spread | halving at turn 2: gain (spreads) | at turn 3 | first-turn return: stepping / halving |")
    print("|---|---|---|---|---|")
    for gamma in (1.0, 0.9, 0.7, 0.5):
        spread = statistics.pstdev([g for t in targets for g in returns(play(t, stepping), gamma)])
        cells = []
        for k in (1, 2):
            gains = [returns(play(t, halving_at(k)), gamma)[k] - returns(play(t, stepping), gamma)[k] for t in targets if len(play(t, stepping)) > k]
            gain = statistics.mean(gains)
            cells.append(f"{gain:+.3f} ({gain / spread:+.2f})")
        first = [statistics.mean(returns(play(t, p), gamma)[0] for t in targets) for p in (stepping, halving)]
        print(f"| {gamma} | {spread:.3f} | {cells[0]} | {cells[1]} | {first[0]:.3f} / {first[1]:.3f} |")


if __name__ == "__main__":
    main()
