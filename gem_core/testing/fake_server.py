"""A local OpenAI-compatible chat server for tests: answers ``/v1/chat/completions`` with a function of
the messages, and fails on purpose where a test says so (HTTP errors, garbage, a hang). It listens on
127.0.0.1 only, on a free port, in a background thread."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from gem_core.utils.http_server import BusyHTTPServer

Reply = Callable[[list[dict[str, str]]], str]
# fault(request_id, attempt) -> None (answer normally), an HTTP status to answer with (e.g. 500, 429),
# "garbage" (a 200 whose body is not JSON) or "hang" (never answer). ``attempt``: 1 for the first time
# this request id arrives, 2 for its first retry, ...
Fault = Callable[[str | None, int], "int | str | None"]
FAULTS = ("garbage", "hang")


class FakeChatServer:
    """``with FakeChatServer(reply) as server: OpenAIPolicy(server.base_url, "fake")``.

    ``reply(messages) -> text``. A reply longer than the request's ``max_tokens`` characters is cut
    there with ``finish_reason="length"`` (characters stand in for tokens). A conversation whose text
    exceeds ``context_chars`` gets HTTP 400 with vLLM's "maximum context length" wording.
    ``requests`` keeps every request body and its ``X-Request-Id`` header, in arrival order, with the
    fault it got (``None`` when answered). ``fault`` (see :data:`Fault`) scripts failures; a hanging
    request is released when the server closes (or after ``hang_seconds``).
    """

    def __init__(self, reply: Reply, *, context_chars: int | None = None, fault: Fault | None = None, hang_seconds: float = 60.0):
        self.reply = reply
        self.context_chars = context_chars
        self.fault = fault
        self.hang_seconds = hang_seconds
        self.requests: list[dict[str, Any]] = []
        self._attempts: dict[str | None, int] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                request_id = self.headers.get("X-Request-Id")
                with owner._lock:
                    attempt = owner._attempts[request_id] = owner._attempts.get(request_id, 0) + 1
                fault = owner.fault(request_id, attempt) if owner.fault is not None else None
                with owner._lock:
                    owner.requests.append({"body": body, "request_id": request_id, "fault": fault})
                if fault is not None:
                    self._fail(fault)
                    return
                messages = body.get("messages", [])
                size = sum(len(m.get("content") or "") for m in messages)
                if owner.context_chars is not None and size > owner.context_chars:
                    message = f"This model's maximum context length is {owner.context_chars} tokens. However, you requested {size} tokens."
                    self._send(400, {"error": {"message": message, "type": "BadRequestError", "code": 400}})
                    return
                text = owner.reply(messages)
                finish = "stop"
                limit = body.get("max_tokens")
                if limit is not None and len(text) > limit:
                    text, finish = text[:limit], "length"
                self._send(
                    200,
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "model": body.get("model", "fake"),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
                        "usage": {"prompt_tokens": size, "completion_tokens": len(text), "total_tokens": size + len(text)},
                    },
                )

            def _fail(self, fault: int | str) -> None:
                if fault == "hang":
                    owner._closing.wait(owner.hang_seconds)
                    self.close_connection = True
                elif fault == "garbage":
                    self._send(200, b"<html>502 Bad Gateway</html>", content_type="text/html")
                elif isinstance(fault, int) and not isinstance(fault, bool):
                    headers = {"Retry-After": "0"} if fault == 429 else {}
                    self._send(fault, {"error": {"message": f"scripted failure {fault}", "code": fault}}, headers=headers)
                else:
                    raise ValueError(f"unknown fault {fault!r}: an HTTP status or one of {FAULTS}")

            def _send(
                self, status: int, payload: dict[str, Any] | bytes, *, content_type: str = "application/json", headers: dict[str, str] | None = None
            ) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = BusyHTTPServer(("127.0.0.1", 0), Handler)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeChatServer:
        """Serve in a background thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-chat-server", daemon=True)  # close() waits one poll
            self._thread.start()
        return self

    def close(self) -> None:
        """Release hanging requests, stop serving and free the port."""
        self._closing.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
