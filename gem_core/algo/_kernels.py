"""Compiled token passes for `rebn_token_level` on CPU: sum each turn's rewards, paint advantages back.

The two passes over every token are the whole cost of token-level ReBN on CPU (the turn-level maths
in between touches one value per turn). numpy needs several full-size temporaries for them (edge
mask, nonzero, reduceat, repeat); a compiled loop reads each token once and writes each once, and
releases the GIL, so rows are split over a few threads.

numba is optional (the `fast` extra, pulled in by `dev` and the trainer extras). Without it, or with
GEM_CORE_NUMBA=0 in the environment, `kernels()` returns None and tokens.py takes its numpy path,
which gives the same numbers. Compiled code is cached on disk, so only a first run pays the compile.
GEM_CORE_THREADS sets how many threads share the rows (default: the CPUs this process may use, at
most 8). Plain Python threads, not numba's parallel layer, so concurrent callers are safe.
"""

from __future__ import annotations

import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

# A thread gets at least this many tokens: below it, handing work to a thread costs more than it saves.
MIN_TOKENS_PER_THREAD = 1 << 17


class Kernels:
    """The compiled passes, each run over row blocks on a small thread pool."""

    def __init__(self, turn_table: Any, returns: Any, group_sums: Any, group_squares: Any, paint: Any, threads: int) -> None:
        self._turn_table, self._returns, self._paint = turn_table, returns, paint
        self._group_sums, self._group_squares = group_sums, group_squares
        self.threads = threads
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0

    def with_threads(self, threads: int) -> Kernels:
        """The same compiled passes on another number of threads."""
        return Kernels(self._turn_table, self._returns, self._group_sums, self._group_squares, self._paint, threads)

    def turn_table(self, rewards: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(table, counts, codes) for (B, L) rewards and a mask whose runs of nonzero are the turns.

        table[0, b] sums row b's rewards before its first turn; table[k, b] (k >= 1) its k-th turn's,
        from the turn's first token up to the next turn's (or the row end), in the rewards' dtype;
        rows of the table past counts.max() are never written. counts[b] is row b's number of turns.
        codes[b, l] = 2 * k + mask bit, k the turn that token l is in or follows (0 before the
        first), so `paint` needs neither the mask nor a search. codes is this thread's scratch
        buffer, valid until its next call.
        """
        batch, length = rewards.shape
        max_turns = (length + 1) // 2
        # Turn-major, so the few turns in use touch a few pages, not every row's stride of them.
        table = np.empty((max_turns + 1, batch), rewards.dtype)
        counts = np.empty(batch, np.int64)
        codes = self._scratch((batch, length), _code_dtype(2 * max_turns + 1))
        zero = rewards.dtype.type(0)
        self._split(batch, length, lambda lo, hi: self._turn_table(rewards, mask, table, counts, codes, zero, lo, hi))
        return table, counts, codes

    def returns(self, table: np.ndarray, counts: np.ndarray, gamma: float) -> np.ndarray:
        """(B, max(counts)) float64 per-turn discounted returns from `turn_table`'s table, 0 past a row's turns."""
        out = np.empty((table.shape[1], int(counts.max(initial=0))), np.float64)
        self._returns(table, counts, float(gamma), out)
        return out

    def _scratch(self, shape: tuple[int, int], dtype: Any) -> np.ndarray:
        """A per-thread buffer reused across calls: a fresh one would page-fault on every call."""
        size = shape[0] * shape[1] * np.dtype(dtype).itemsize
        buffer = getattr(self._local, "buffer", None)
        if buffer is None or buffer.size < size:
            buffer = self._local.buffer = np.empty(max(size, 1), np.uint8)
        return buffer[:size].view(dtype).reshape(shape)

    def group_sums(self, table: np.ndarray, counts: np.ndarray, row_codes: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
        """Per group: how many turns, and the sum of their values, for a (B, T) table (row b: counts[b] turns)."""
        count, total = np.zeros(groups, np.float64), np.zeros(groups, np.float64)
        self._group_sums(table, counts, row_codes, count, total)
        return count, total

    def group_squares(self, table: np.ndarray, counts: np.ndarray, row_codes: np.ndarray, mean: np.ndarray) -> np.ndarray:
        """Per group: the sum of (value - mean of the group)^2 over its turns."""
        out = np.zeros(mean.shape[0], np.float64)
        self._group_squares(table, counts, row_codes, mean, out)
        return out

    def paint(
        self,
        values: np.ndarray,
        codes: np.ndarray,
        out: np.ndarray,
        row_shift: np.ndarray | None = None,
        row_denominator: np.ndarray | None = None,
        row_zero: np.ndarray | None = None,
    ) -> np.ndarray:
        """out[b, l] = v = values[b, k - 1] on the tokens of row b's k-th turn (k >= 1), 0 off the mask.

        With the row_* arrays (one entry per row) v is normalised on the way:
        (v - row_shift[b]) / row_denominator[b], or 0 where row_zero[b].
        """
        batch, length = out.shape
        if row_shift is None:
            row_shift, row_denominator = np.zeros(batch), np.ones(batch)
            row_zero = np.zeros(batch, np.bool_)
        self._split(batch, length, lambda lo, hi: self._paint(values, row_shift, row_denominator, row_zero, codes, out, lo, hi))
        return out

    def _split(self, batch: int, length: int, run: Any) -> None:
        parts = max(1, min(self.threads, batch * length // MIN_TOKENS_PER_THREAD, batch))
        if parts == 1:
            run(0, batch)
            return
        if self._pool_pid != os.getpid():  # first use, or a forked child: the parent's threads are not here
            self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="gem-rebn")
            self._pool_pid = os.getpid()
        bounds = [batch * i // parts for i in range(parts + 1)]
        futures = [self._pool.submit(run, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
        run(bounds[0], bounds[1])  # this thread takes the first block
        for future in futures:
            future.result()


def _code_dtype(largest: int) -> Any:
    return np.uint8 if largest < 1 << 8 else np.uint16 if largest < 1 << 16 else np.int32


_KERNELS: Any = ...  # not tried yet; None once numba was found missing or switched off


def kernels() -> Kernels | None:
    """The compiled kernels, or None when numba is absent or switched off (GEM_CORE_NUMBA=0)."""
    global _KERNELS
    if _KERNELS is ...:
        _KERNELS = None if os.environ.get("GEM_CORE_NUMBA", "1") == "0" else _compile()
    return _KERNELS


def _default_threads() -> int:
    setting = os.environ.get("GEM_CORE_THREADS", "").strip()
    if setting:
        if not setting.isdigit() or int(setting) < 1:
            raise ValueError(f"GEM_CORE_THREADS must be a whole number >= 1, got {setting!r}")
        return int(setting)
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, available))


def _compile() -> Kernels | None:
    try:
        import numba
    except ImportError:
        return None
    threads = _default_threads()  # a bad GEM_CORE_THREADS is the user's error to see, not a fallback
    try:
        return _build(numba, threads)
    except Exception as error:  # noqa: BLE001 -- e.g. no writable cache dir: numpy does the same work
        warnings.warn(f"gem_core: numba kernels unavailable ({error!r}); using numpy", RuntimeWarning, stacklevel=3)
        return None


def _build(numba: Any, threads: int) -> Kernels:
    jit = numba.njit(cache=True, nogil=True)

    # The first pass carries a turn counter and the running sum from token to token and writes
    # every slot it touches unconditionally: no branch on the data, so run edges cost nothing extra.
    # The second is a plain gather, which vectorises.
    @jit
    def turn_table(rewards, mask, table, counts, codes, zero, lo, hi):  # pragma: no cover -- compiled
        length = rewards.shape[1]
        for b in range(lo, hi):
            turns = 0
            inside = 0
            total = zero
            table[0, b] = zero
            for col in range(length):
                now = 1 if mask[b, col] != 0 else 0
                start = now & (inside ^ 1)
                turns += start
                inside = now
                codes[b, col] = 2 * turns + now
                total = rewards[b, col] if start else total + rewards[b, col]
                table[turns, b] = total
            counts[b] = turns

    @jit
    def returns(table, counts, gamma, out):  # pragma: no cover -- compiled
        for b in range(out.shape[0]):
            running = 0.0
            for k in range(out.shape[1] - 1, -1, -1):
                if k < counts[b]:
                    running = table[k + 1, b] + gamma * running  # G_t = r_t + gamma * G_{t+1}
                    out[b, k] = running
                else:
                    out[b, k] = 0.0

    # Group sums in one thread: they touch one value per turn, a few thousand rows.
    @jit
    def group_sums(table, counts, row_codes, count, total):  # pragma: no cover -- compiled
        for b in range(table.shape[0]):
            row_total = 0.0
            for k in range(counts[b]):
                row_total += table[b, k]
            count[row_codes[b]] += counts[b]
            total[row_codes[b]] += row_total

    @jit
    def group_squares(table, counts, row_codes, mean, out):  # pragma: no cover -- compiled
        for b in range(table.shape[0]):
            centre = mean[row_codes[b]]
            row_total = 0.0
            for k in range(counts[b]):
                deviation = table[b, k] - centre
                row_total += deviation * deviation
            out[row_codes[b]] += row_total

    # Each row first lays its turn values out by code (slot 2k + 1 = turn k, even slots 0), then
    # the token loop is a plain gather, which vectorises.
    @jit
    def paint(values, row_shift, row_denominator, row_zero, codes, out, lo, hi):  # pragma: no cover -- compiled
        slots = np.zeros(2 * values.shape[1] + 2, out.dtype)
        for b in range(lo, hi):
            for k in range(values.shape[1]):
                slots[2 * k + 3] = 0.0 if row_zero[b] else (values[b, k] - row_shift[b]) / row_denominator[b]
            for col in range(out.shape[1]):
                out[b, col] = slots[codes[b, col]]

    return Kernels(turn_table, returns, group_sums, group_squares, paint, threads)
