"""JSON over HTTP with retries: the transport of :class:`~gem_core.rollout.OpenAIPolicy`.

A served model fails in passing more often than for good: a 429 when a hosted API rate-limits, a 502/503
while a vLLM server restarts, a connection reset, a request that hangs, a proxy that answers with an HTML
page. :func:`post_json` retries those with exponential backoff (and the server's ``Retry-After`` when it
sends one) and raises :class:`ModelRequestError` with one readable line when it gives up. Other answers
(a 400, a 401, a 404) are not retried: asking again would get the same answer. Standard library only.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gem_core.errors import ModelRequestError

DETAIL_CHARS = 300  # how much of an error answer a message quotes


@dataclass(frozen=True)
class Retry:
    """When and how long to wait before asking again.

    ``retries``: attempts after the first (0 = none). Before retry ``k`` (0-based) the wait is
    ``min(max_backoff, backoff * 2**k)``, scaled by a random factor in [0.5, 1] so that many clients that
    failed together do not come back together; a numeric ``Retry-After`` from the server replaces it
    (still capped at ``max_backoff``).
    """

    retries: int = 5
    backoff: float = 0.5
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {self.retries!r}")
        if not self.backoff >= 0 or not self.max_backoff >= 0:
            raise ValueError(f"backoff and max_backoff must be >= 0, got {self.backoff!r}, {self.max_backoff!r}")

    def delay(self, retry: int, retry_after: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        if retry_after is not None:
            return min(self.max_backoff, max(0.0, retry_after))
        jitter = 0.5 + 0.5 * (rng or _rng).random()
        return min(self.max_backoff, self.backoff * 2.0**retry) * jitter


_rng = random.Random()


class _Transient(Exception):
    """One failed attempt that a retry may fix; ``reason`` is how the final error describes it."""

    def __init__(self, reason: str, status: int | None = None, retry_after: float | None = None, detail: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after
        self.detail = detail


def post_json(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    *,
    timeout: float,
    retry: Retry | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """POST ``body`` as JSON and return the JSON object that comes back.

    ``timeout`` (seconds) bounds each attempt's connect and each wait for data. 429, 5xx, timeouts,
    dropped connections and answers that are not a JSON object are retried per ``retry`` (default
    :class:`Retry`); when the retries run out, or on any other HTTP error, :class:`ModelRequestError`.
    """
    retry = Retry() if retry is None else retry
    request_headers = {"Content-Type": "application/json", **(headers or {})}
    data = json.dumps(body).encode()
    attempts = retry.retries + 1
    for attempt in range(attempts):
        try:
            return _attempt(url, data, request_headers, timeout)
        except _Transient as failure:
            if attempt + 1 == attempts:
                tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
                raise ModelRequestError(f"{failure.reason} ({tries})", status=failure.status, detail=failure.detail) from None
            sleep(retry.delay(attempt, failure.retry_after))
    raise AssertionError("unreachable")


def _attempt(url: str, data: bytes, headers: dict[str, str], timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        detail = _read_detail(exc)
        message = f"{url} answered HTTP {exc.code}: {detail[:DETAIL_CHARS]}"
        if exc.code == 429 or exc.code >= 500:
            raise _Transient(message, exc.code, _retry_after(exc.headers), detail) from None
        raise ModelRequestError(message, status=exc.code, detail=detail) from None
    except (TimeoutError, socket.timeout):
        raise _Transient(f"{url} did not answer within {timeout:g} s") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (TimeoutError, socket.timeout)):
            raise _Transient(f"{url} did not answer within {timeout:g} s") from None
        raise _Transient(f"cannot reach {url}: {exc.reason}") from None
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        raise _Transient(f"connection to {url} failed: {exc.__class__.__name__}: {exc}") from None
    try:
        answer = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        text = raw[:DETAIL_CHARS].decode(errors="replace")
        raise _Transient(f"{url} answered with something that is not JSON: {text!r}") from None
    if not isinstance(answer, dict):
        raise _Transient(f"{url} answered with JSON that is not an object: {str(answer)[:DETAIL_CHARS]!r}")
    return answer


def _read_detail(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read().decode(errors="replace")
    except Exception:  # the body of an error answer is best effort
        return ""


def _retry_after(headers: Any) -> float | None:
    """A ``Retry-After`` given in seconds (the HTTP-date form is ignored: the backoff applies)."""
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
