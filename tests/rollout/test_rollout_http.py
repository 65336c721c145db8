"""post_json's retries against a local server that fails on purpose (no real waiting: sleep is recorded)."""

from __future__ import annotations

import random

import pytest

from gem_core.rollout.http import ModelRequestError, Retry, post_json
from gem_core.testing import FakeChatServer

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_delays_double_up_to_the_cap_with_jitter_and_follow_retry_after():
    retry = Retry(retries=8, backoff=0.5, max_backoff=4.0)
    rng = random.Random(0)
    for k in range(8):
        full = min(4.0, 0.5 * 2**k)
        assert 0.5 * full <= retry.delay(k, rng=rng) <= full
    assert retry.delay(3, retry_after=1.25) == 1.25 and retry.delay(0, retry_after=99) == 4.0
    with pytest.raises(ValueError):
        Retry(retries=-1)


@pytest.mark.parametrize(("fault", "retried"), [(500, True), (503, True), (429, True), ("garbage", True), (400, False), (401, False), (404, False)])
def test_what_is_retried_and_what_is_not(fault, retried):
    waits: list[float] = []
    with FakeChatServer(lambda messages: "ok", fault=lambda request_id, attempt: fault) as server:
        with pytest.raises(ModelRequestError) as caught:
            post_json(server.base_url + "/chat/completions", BODY, timeout=5, retry=Retry(retries=3, backoff=0.1), sleep=waits.append)
        attempts = len(server.requests)
    assert attempts == (4 if retried else 1) and len(waits) == attempts - 1
    assert caught.value.status == (fault if isinstance(fault, int) else None)
    if fault == 429:
        assert waits == [0.0, 0.0, 0.0]  # the server's Retry-After: 0
    elif retried:
        assert all(0.05 * 2**k <= w <= 0.1 * 2**k for k, w in enumerate(waits))


def test_a_transient_failure_then_an_answer():
    with FakeChatServer(lambda messages: "fine", fault=lambda request_id, attempt: "hang" if attempt == 1 else None) as server:
        answer = post_json(server.base_url + "/chat/completions", BODY, timeout=0.3, retry=Retry(retries=1), sleep=lambda s: None)
    assert answer["choices"][0]["message"]["content"] == "fine"


def test_an_unreachable_server_is_one_readable_error():
    with FakeChatServer(lambda messages: "x") as server:
        url = server.base_url
    with pytest.raises(ModelRequestError, match=r"cannot reach .*\(2 attempts\)"):
        post_json(url + "/chat/completions", BODY, timeout=1, retry=Retry(retries=1), sleep=lambda s: None)
