"""The standard library's threading HTTP server, sized for many clients at once."""

from __future__ import annotations

from http.server import ThreadingHTTPServer


class BusyHTTPServer(ThreadingHTTPServer):
    """A thread per request, with a listen backlog that many concurrent clients fit in.

    ``ThreadingHTTPServer`` keeps the ``socketserver`` backlog of 5: a burst of more simultaneous
    connections than that (a rollout's envs querying search, an eval run's episodes) overflows the
    kernel's accept queue, and the clients see resets or timeouts for requests the server may still
    answer later. Production servers (uvicorn, vLLM) listen with a backlog in the thousands.
    """

    request_queue_size = 1024
    daemon_threads = True
