"""The compiled token passes (numba) give what the numpy passes give, on any mask, split over any threads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gem_core.algo import _kernels, rebn_token_level

COMPILED = _kernels.kernels()
pytestmark = pytest.mark.skipif(COMPILED is None, reason="numba is not installed (the `fast` extra)")


@st.composite
def batches(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batch, length = draw(st.integers(1, 9)), draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    mask = rng.random((batch, length)) < draw(st.sampled_from([0.2, 0.5, 0.9, 1.0]))
    mask[rng.integers(0, batch)] = True  # at least one turn in the batch
    rewards = np.where(rng.random((batch, length)) < 0.3, rng.normal(size=(batch, length)), 0.0)
    first = np.where(mask.any(axis=1), mask.argmax(axis=1), length)
    rewards[np.arange(length)[None, :] < first[:, None]] = 0.0  # nothing before a row's first turn
    groups = rng.integers(0, 3, batch)
    return rewards, mask, groups


def both_paths(monkeypatch: pytest.MonkeyPatch, threads: int, *args, **kwargs):
    monkeypatch.setattr(_kernels, "MIN_TOKENS_PER_THREAD", 1)  # split even tiny batches over the threads
    split = COMPILED.with_threads(threads)
    monkeypatch.setattr(_kernels, "_KERNELS", split)
    fast = rebn_token_level(*args, **kwargs)
    monkeypatch.setattr(_kernels, "_KERNELS", None)
    slow = rebn_token_level(*args, **kwargs)
    return fast, slow


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from([1, 2, 3]), st.sampled_from([0.0, 0.9, 1.0]), st.booleans(), st.sampled_from(["float32", "float64"]))
def test_compiled_passes_match_numpy(data, threads, gamma, grouped, dtype) -> None:
    rewards, mask, groups = data
    with pytest.MonkeyPatch.context() as monkeypatch:
        (fast_adv, fast_ret), (slow_adv, slow_ret) = both_paths(
            monkeypatch,
            threads,
            rewards.astype(dtype),
            mask.astype(np.int64),
            groups if grouped else None,
            gamma=gamma,
            return_returns=True,
        )
    np.testing.assert_allclose(fast_ret, slow_ret, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fast_adv, slow_adv, rtol=1e-5, atol=1e-5)
    assert (fast_adv[mask == 0] == 0).all()


@pytest.mark.parametrize("mask_dtype", [bool, np.uint8, np.int32, np.int64, np.float32])
def test_any_mask_dtype_and_torch_tensors(monkeypatch: pytest.MonkeyPatch, mask_dtype) -> None:
    rng = np.random.default_rng(0)
    mask = rng.random((64, 300)) < 0.6  # length 300: up to 150 turns, so codes need uint16
    rewards = np.where(mask, rng.normal(size=mask.shape), 0.0).astype(np.float32)
    fast, slow = both_paths(monkeypatch, 2, rewards, mask.astype(mask_dtype), np.arange(64) % 4, gamma=0.7)
    np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-6)
    torch = pytest.importorskip("torch")
    fast_t, slow_t = both_paths(monkeypatch, 2, torch.from_numpy(rewards), torch.from_numpy(mask.astype(np.int64)), gamma=0.7)
    assert fast_t.dtype == torch.float32
    np.testing.assert_allclose(fast_t.numpy(), slow_t.numpy(), rtol=1e-5, atol=1e-6)


def test_errors_match_the_numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    mask = np.array([[0, 1, 1, 0], [1, 1, 0, 0]])
    early = np.array([[0.5, 0, 1, 0], [0, 0, 0, 0]])  # a reward before row 0's first turn
    for rewards, message in [(early, "row 0 has rewards before"), (np.where(mask, np.nan, 0.0), "must be finite")]:
        with pytest.raises(ValueError, match=message):
            both_paths(monkeypatch, 2, rewards, mask)
    with pytest.raises(ValueError, match="no response tokens"):
        both_paths(monkeypatch, 2, np.zeros((2, 4)), np.zeros((2, 4)))


def test_switched_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kernels, "_KERNELS", ...)
    monkeypatch.setenv("GEM_CORE_NUMBA", "0")
    assert _kernels.kernels() is None


def test_a_forked_child_gets_its_own_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's threads do not survive fork(): a child that reused the parent's pool would hang."""
    import multiprocessing

    monkeypatch.setattr(_kernels, "MIN_TOKENS_PER_THREAD", 1)
    split = COMPILED.with_threads(2)
    monkeypatch.setattr(_kernels, "_KERNELS", split)
    rewards, mask = np.eye(4, 6), np.eye(4, 6)
    expected = rebn_token_level(rewards, mask)  # the parent's pool now has a thread
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        got = pool.apply_async(rebn_token_level, (rewards, mask)).get(timeout=60)
    np.testing.assert_array_equal(got, expected)


def test_thread_count_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEM_CORE_THREADS", "3")
    assert _kernels._default_threads() == 3
    for bad in ("0", "two", "-1", "1.5"):
        monkeypatch.setenv("GEM_CORE_THREADS", bad)
        with pytest.raises(ValueError, match="GEM_CORE_THREADS must be a whole number"):
            _kernels._default_threads()
    monkeypatch.delenv("GEM_CORE_THREADS")
    assert 1 <= _kernels._default_threads() <= 8


def test_a_bad_thread_count_is_an_error_not_a_silent_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kernels, "_KERNELS", ...)
    monkeypatch.setenv("GEM_CORE_THREADS", "many")
    with pytest.raises(ValueError, match="GEM_CORE_THREADS"):
        rebn_token_level(np.eye(2, 3), np.eye(2, 3))
