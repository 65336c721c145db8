"""The serve log under a flood: :class:`EventLog` (one line per kind of event the guard sees, at most one per
interval, with a count of the rest) and :class:`RepeatFilter` (the same bound on uvicorn's and asyncio's own lines).

Separate from :mod:`gem_core.serve.guard` because both the guard's checks and the connection layer beneath them
(:mod:`gem_core.serve.connections`) report through it, and the server installs the filter; it knows nothing of
HTTP or WebSockets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from contextvars import ContextVar

LOGGER = logging.getLogger("gem_core.serve")
#: uvicorn's line after a WebSocket the guard refused with an HTTP answer (its websockets-sansio protocol counts only an
#: accept or a close as completing the handshake): a second, misleading line for one refusal, dropped by RepeatFilter.
_UNFINISHED_HANDSHAKE = "ASGI callable returned without completing handshake."
#: True in the task of a WebSocket the guard refused with an HTTP answer (uvicorn logs from that task, right after).
REFUSED_OVER_HTTP: ContextVar[bool] = ContextVar("gem_core_serve_refused_over_http", default=False)


class EventLog:
    """Counts events by kind and logs one line per kind at most every ``interval`` seconds (with how many
    were not logged since), so that a flood of bad clients cannot flood the log."""

    def __init__(self, logger: logging.Logger = LOGGER, interval: float = 10.0):
        self.logger = logger
        self.interval = interval
        self.counts: Counter[str] = Counter()
        self._last: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()
        self._lock = threading.Lock()

    def note(self, kind: str, detail: str) -> None:
        """One more ``kind`` event; logged now unless a line of that kind was logged in the last interval."""
        with self._lock:
            self.counts[kind] += 1
            now = time.monotonic()
            if now - self._last.get(kind, -self.interval) < self.interval:
                self._unlogged[kind] += 1
                return
            self._last[kind] = now
            unlogged, self._unlogged[kind] = self._unlogged[kind], 0
        more = f" (and {unlogged} more since the last such line)" if unlogged else ""
        self.logger.warning("gem-core serve: %s: %s%s", kind, detail, more)


class RepeatFilter(logging.Filter):
    """A logging filter that lets one record per (logger, message template) through every ``interval`` seconds:
    uvicorn's and asyncio's own warnings (an accept loop out of file descriptors) become one line, not a flood.
    uvicorn's complaint about a WebSocket the guard answered over HTTP (a 403) is dropped: the guard logged it."""

    def __init__(self, interval: float = 10.0):
        super().__init__()
        self.interval = interval
        self._last: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _UNFINISHED_HANDSHAKE and REFUSED_OVER_HTTP.get():
            return False
        key = (record.name, str(record.msg))
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -self.interval) < self.interval:
                return False
            self._last[key] = now
        return True
