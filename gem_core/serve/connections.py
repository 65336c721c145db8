"""uvicorn's h11 protocol with the bounds a served env needs below the ASGI app: a deadline for each request's
headers (a silent or trickling connection is closed), a cap on open connections (the next one is closed at once,
so the process never reaches its file-descriptor limit), and a lingering close after an answer given before the
request's body was read (so that the client reads the answer instead of a reset).

Separate from :mod:`gem_core.serve.guard` because it works on another level: sockets and uvicorn's protocol
object, before there is a request for the ASGI guard to check; the two share only the event log.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gem_core.serve.events import EventLog


class _LingeringClose:
    """A connection's transport as uvicorn's h11 code sees it: the same transport, but ``close()`` asks the protocol
    to linger first (see ``GuardedH11Protocol.linger``), and the transport counts as closing while it lingers."""

    def __init__(self, transport: asyncio.Transport, protocol: Any):
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        if not self._protocol.linger():
            self._transport.close()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()


def guarded_http_protocol(*, header_timeout: float, max_connections: int, events: EventLog, linger_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, plus: a connection must send a whole request's headers within ``header_timeout``
    seconds of opening (or of its last response), else it is closed; past ``max_connections`` open
    connections (WebSockets included) a new one is closed at once; a connection closed while its client is still
    sending a request body that was answered unread (a 413) lingers, reading and dropping that body, for at most
    ``linger_timeout`` seconds, so that the answer reaches the client."""

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _linger_timer: asyncio.TimerHandle | None = None
        lingering = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._raw = transport
            if len(self.connections) > max_connections:
                events.note("connection refused", f"{len(self.connections) - 1} connections are open, the cap is {max_connections} (--max-connections)")
                transport.abort()
                return
            self.transport = _LingeringClose(transport, self)  # type: ignore[assignment]  # what each request's cycle closes
            self._arm()

        def linger(self) -> bool:
            """Whether the close lingers instead (True), when the client is still sending a body that the answer did
            not wait for. Closed at once with that body unread, the socket makes the kernel answer the client's next
            bytes with a reset, which can reach the client before the answer and lose it (a client that sends its
            whole body, then reads, saw 'connection reset' instead of its 413). Lingering: the answer is followed by
            the end of the stream (FIN), the rest of the body is read and dropped unparsed, and the socket is closed
            when the client closes its side, or dropped at the deadline."""
            raw = self._raw
            if raw.is_closing() or raw.get_protocol() is not self:  # closed, or a WebSocket now
                return False
            if self.lingering:
                return True
            if self.conn.their_state is not h11.SEND_BODY:  # the request was read whole: a plain close loses nothing
                return False
            self.lingering = True
            self._disarm()
            self._unset_keepalive_if_required()
            raw.write_eof()  # after the answer (the transport sends what it holds first)
            self.flow.resume_reading()  # paused while the unread body filled uvicorn's buffer
            self._linger_timer = self.loop.call_later(linger_timeout, raw.abort)
            return True

        def data_received(self, data: bytes) -> None:
            if self.lingering:
                return  # the rest of an answered body: dropped, never parsed nor kept
            super().data_received(data)

        def shutdown(self) -> None:
            if self.lingering:  # the server is stopping: no more waiting for the client's body
                self._raw.abort()
                return
            super().shutdown()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_overdue)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_overdue(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.transport.get_protocol() is not self:  # closed, or now a WebSocket
                return
            waiting = self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)
            if waiting:  # no request, or a request's headers still incomplete: silent or trickling
                events.note(
                    "slow client", f"closed {self.client[0] if self.client else 'a connection'}: no complete request headers within {header_timeout:g} s"
                )
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers have the same deadline (uvicorn's keep-alive timer stops at a byte)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._linger_timer is not None:
                self._linger_timer.cancel()
                self._linger_timer = None
            self.lingering = False
            super().connection_lost(exc)

    return GuardedH11Protocol
