"""The search tool: ``<search>query</search>`` answered by a BM25 index or a retrieval server.

Two backends give the same answers:

* :class:`BM25Index` -- an index held in this process, built with ``bm25s`` (``gem-core[search]``)
  from a JSONL corpus of ``{"id", "title", "text"}`` records that the user points at;
* :class:`RetrievalClient` -- an HTTP client of a retrieval server speaking the Search-R1 API
  (``POST /retrieve`` with ``{"queries": [...], "topk": k, "return_scores": true}``, answered with
  ``{"result": [[{"document": {"id", "contents", ...}, "score"}, ...], ...]}``), the API GEM's
  search tool uses. ``gem-core serve-search --corpus FILE`` serves a :class:`BM25Index` over that
  API (:func:`make_search_server`), so many env workers share one index instead of each building
  its own.

A search that fails (server down, bad answer, timeout) is a tool error the model sees, never an
exception in the env.

A process holds one index per corpus file and one client per server URL
(:func:`shared_index`, :func:`shared_client`): a ``SearchTool`` per env, as the dataset-row code
makes them, builds the index once, not once per env.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol

from gem_core.errors import GemError
from gem_core.parsing import find_tagged
from gem_core.tools.base import Tool, ToolCall, ToolResult, tool_call
from gem_core.utils.http_server import BusyHTTPServer

logger = logging.getLogger(__name__)


class SearchError(GemError, RuntimeError):
    """A search could not be answered (server unreachable, bad reply, bad corpus)."""


@dataclass(frozen=True)
class Passage:
    """One retrieved document and its score."""

    id: str
    title: str
    text: str
    score: float

    def contents(self) -> str:
        """The Search-R1 ``contents`` field: the title on the first line, then the text."""
        return f"{self.title}\n{self.text}"


class Retriever(Protocol):
    """What the search tool needs from a backend."""

    def batch_search(self, queries: Sequence[str], k: int) -> list[list[Passage]]: ...


# -- the embedded index ----------------------------------------------------------------------------


def read_corpus(path: str | Path) -> list[dict[str, str]]:
    """Read a JSONL corpus of ``{"id", "title", "text"}`` records (``contents`` is accepted for text)."""
    path = Path(path)
    if not path.is_file():
        raise SearchError(f"corpus file {str(path)!r} does not exist")
    docs = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SearchError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
            if not isinstance(record, dict) or ("text" not in record and "contents" not in record):
                raise SearchError(f"{path}:{number}: a record needs 'text' (and ideally 'id' and 'title')")
            docs.append(
                {
                    "id": str(record.get("id", number - 1)),
                    "title": str(record.get("title", "")),
                    "text": str(record.get("text", record.get("contents", ""))),
                }
            )
    if not docs:
        raise SearchError(f"corpus file {str(path)!r} has no records")
    return docs


class BM25Index:
    """BM25 over title and text of each document (``bm25s``, English stopwords, lower-cased)."""

    def __init__(self, docs: Iterable[dict[str, str]], *, k1: float = 1.5, b: float = 0.75, stopwords: str | None = "en"):
        try:
            import bm25s
        except ImportError:
            raise SearchError("the embedded search index needs bm25s: pip install -e '.[search]'") from None
        self._bm25s = bm25s
        self.docs = [dict(doc) for doc in docs]
        if not self.docs:
            raise SearchError("BM25Index needs at least one document")
        self.stopwords = stopwords
        self._retriever = bm25s.BM25(k1=k1, b=b)
        texts = [f"{doc.get('title', '')}\n{doc['text']}" for doc in self.docs]
        tokens = bm25s.tokenize(texts, stopwords=stopwords, show_progress=False)
        self._retriever.index(tokens, show_progress=False)
        self._lock = threading.Lock()  # retrieval is not documented as thread-safe

    @classmethod
    def from_jsonl(cls, path: str | Path, **kwargs: Any) -> BM25Index:
        """Build the index from a JSONL corpus file."""
        return cls(read_corpus(path), **kwargs)

    def __len__(self) -> int:
        return len(self.docs)

    def batch_search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """The best ``k`` documents for each query, best first; documents scoring 0 are left out."""
        k = max(1, min(int(k), len(self.docs)))
        tokens = self._bm25s.tokenize(list(queries), stopwords=self.stopwords, show_progress=False, return_ids=False)
        answers: list[list[Passage]] = [[] for _ in queries]
        # A query with no indexable word (only stopwords, punctuation) matches nothing.
        asked = [i for i, words in enumerate(tokens) if words]
        if not asked:
            return answers
        with self._lock:
            ids, scores = self._retriever.retrieve([tokens[i] for i in asked], k=k, show_progress=False, n_threads=1)
        for row, i in enumerate(asked):
            for doc_index, score in zip(ids[row], scores[row]):
                if score > 0:
                    doc = self.docs[int(doc_index)]
                    answers[i].append(Passage(doc["id"], doc.get("title", ""), doc["text"], float(score)))
        return answers

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """The best ``k`` documents for one query."""
        return self.batch_search([query], k)[0]


# -- one backend per corpus or URL per process --------------------------------------------------------

_shared_backends: dict[tuple[Any, ...], Any] = {}
_shared_locks: dict[tuple[Any, ...], threading.Lock] = {}
_registry_lock = threading.Lock()


def _shared(key: tuple[Any, ...], make: Any) -> Any:
    """The backend stored under ``key``, made by ``make()`` once (other callers wait for it)."""
    with _registry_lock:
        backend = _shared_backends.get(key)
        if backend is not None:
            return backend
        lock = _shared_locks.setdefault(key, threading.Lock())
    with lock:  # one build per key; other corpora are not held up
        backend = _shared_backends.get(key)
        if backend is None:
            backend = make()
            with _registry_lock:
                _shared_backends[key] = backend
        return backend


def shared_index(path: str | Path) -> BM25Index:
    """This process's BM25 index of the corpus at ``path`` (rebuilt only if the file changes)."""
    real = Path(path).resolve()
    try:
        stat = real.stat()
    except OSError:
        raise SearchError(f"corpus file {str(path)!r} does not exist") from None
    return _shared(("index", str(real), stat.st_mtime_ns, stat.st_size), lambda: BM25Index.from_jsonl(real))


def shared_client(url: str, timeout: float = 5.0) -> RetrievalClient:
    """This process's client of the retrieval server at ``url``."""
    return _shared(("client", retrieve_url(url), float(timeout)), lambda: RetrievalClient(url, timeout=timeout))


def _after_fork_in_child() -> None:
    """Locks held by another thread at the fork would never be released in the child."""
    global _registry_lock
    _registry_lock = threading.Lock()
    _shared_locks.clear()
    for backend in _shared_backends.values():
        if isinstance(backend, BM25Index):
            backend._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


# -- the HTTP client -------------------------------------------------------------------------------


def retrieve_url(url: str) -> str:
    """``url`` with ``/retrieve`` appended when it names only a server (``http://host:port``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SearchError(f"retrieval server url must look like http://host:port[/retrieve], got {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/retrieve")
    return urllib.parse.urlunsplit(parts)


class RetrievalClient:
    """A client of a Search-R1 style retrieval server (``POST /retrieve``). Stateless, thread-safe."""

    def __init__(self, url: str, *, timeout: float = 5.0, retries: int = 1):
        self.url = retrieve_url(url)
        self.timeout = timeout
        self.retries = retries

    def batch_search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Ask the server; raises :class:`SearchError` with the reason when it cannot answer."""
        body = json.dumps({"queries": list(queries), "topk": int(k), "return_scores": True}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"}, method="POST")
        last: Exception | None = None
        for _attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    payload = json.loads(response.read())
                return [_parse_hits(hits) for hits in _results(payload, len(queries))]
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:200].decode(errors="replace")
                raise SearchError(f"the retrieval server at {self.url} answered HTTP {exc.code}: {detail}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                last = exc
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise SearchError(f"the retrieval server at {self.url} sent an answer we cannot read: {exc}") from None
        reason = getattr(last, "reason", last)
        raise SearchError(f"the retrieval server at {self.url} is unreachable: {reason}")

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """The best ``k`` documents for one query."""
        return self.batch_search([query], k)[0]


def _results(payload: Any, n: int) -> list[Any]:
    result = payload["result"]
    if n == 1 and result and isinstance(result[0], dict):  # a server that answers one query flat
        result = [result]
    if not isinstance(result, list) or len(result) != n:
        raise ValueError(f"expected {n} result lists")
    return result


def _parse_hits(hits: list[dict[str, Any]]) -> list[Passage]:
    passages = []
    for hit in hits:
        doc = hit["document"]
        if "text" in doc:
            title, text = doc.get("title", ""), doc["text"]
        else:  # Search-R1 corpora: '"Title"\ntext' in one field
            title, _, text = doc.get("contents", "").partition("\n")
            title = title.strip().strip('"')
        score = hit.get("score")
        passages.append(Passage(str(doc.get("id", "")), title, text, float(score) if score is not None else 0.0))
    return passages


# -- the server ------------------------------------------------------------------------------------


def _hit(passage: Passage) -> dict[str, Any]:
    return {
        "document": {"id": passage.id, "title": passage.title, "text": passage.text, "contents": passage.contents()},
        "score": passage.score,
    }


def make_search_server(index: Retriever, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3) -> BusyHTTPServer:
    """An HTTP server answering ``POST /retrieve`` from ``index`` (``port=0`` picks a free port).

    It accepts Search-R1's ``{"queries": [...], "topk", "return_scores"}`` and GEM's single
    ``{"query": ..., "topk", "return_scores"}`` (JSON; msgpack too when ``msgspec`` is installed,
    answered in kind). ``GET /health`` reports the number of documents. Call ``serve_forever()``.
    """

    class Handler(BaseHTTPRequestHandler):
        server_version = "gem-core-search"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("search server: " + format, *args)

        def _reply(self, status: int, payload: Any, msgpack: bool = False) -> None:
            if msgpack:
                import msgspec

                body, kind = msgspec.msgpack.encode(payload), "application/msgpack"
            else:
                body, kind = json.dumps(payload).encode(), "application/json"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/health":
                self._reply(200, {"status": "ok", "documents": len(getattr(index, "docs", []))})
            else:
                self._reply(404, {"error": f"no such path {self.path!r}; POST /retrieve"})

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/retrieve":
                self._reply(404, {"error": f"no such path {self.path!r}; POST /retrieve"})
                return
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            request, msgpack = _decode_request(raw, self.headers.get("Content-Type", ""))
            if request is None:
                self._reply(400, {"error": "the body must be a JSON object with 'queries' (or 'query')"})
                return
            single = "queries" not in request
            queries = [request.get("query")] if single else request.get("queries")
            if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
                self._reply(400, {"error": "'queries' must be a list of strings ('query' a string)"}, msgpack)
                return
            topk = request.get("topk") or default_topk
            try:
                answers = index.batch_search(queries, int(topk))
            except Exception as exc:  # noqa: BLE001 - the client gets the reason, the server lives on
                self._reply(500, {"error": f"search failed: {exc}"}, msgpack)
                return
            with_scores = request.get("return_scores", True)
            results = [[{**_hit(p), "score": p.score if with_scores else None} for p in hits] for hits in answers]
            self._reply(200, {"result": results[0] if single else results}, msgpack)

    return BusyHTTPServer((host, port), Handler)


def _decode_request(raw: bytes, content_type: str) -> tuple[dict[str, Any] | None, bool]:
    if "msgpack" not in content_type:
        try:
            request = json.loads(raw)
            return (request if isinstance(request, dict) else None), False
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass
    try:  # GEM's client posts msgpack without a content type
        import msgspec

        request = msgspec.msgpack.decode(raw)
        return (request if isinstance(request, dict) else None), True
    except Exception:  # noqa: BLE001 - not msgpack either (or msgspec missing)
        return None, False


# -- the tool --------------------------------------------------------------------------------------

_SEARCH_TAGS = ("<search>", "</search>")


class SearchTool(Tool):
    """Answers the first ``<search>query</search>`` of an action with the top ``topk`` passages.

    Give exactly one backend: ``index`` (a :class:`BM25Index`, or a path to a JSONL corpus: the
    process's shared index of it) or ``url`` (a retrieval server: the process's shared client). The passages come back inside
    ``<information>...</information>``; a failed search is an ``ok=False`` result that says why.
    """

    name = "search"

    def __init__(
        self,
        index: BM25Index | Retriever | str | Path | None = None,
        *,
        url: str | None = None,
        topk: int = 3,
        timeout: float = 5.0,
        max_passage_chars: int = 2000,
    ):
        if (index is None) == (url is None):
            raise ValueError("SearchTool needs exactly one backend: index=<BM25Index or corpus path> or url=<server>")
        if isinstance(index, (str, Path)):
            index = shared_index(index)
        self.backend: Retriever = index if index is not None else shared_client(url, timeout)  # type: ignore[arg-type]
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        self.topk = topk
        self.max_passage_chars = max_passage_chars

    def instructions(self) -> str:
        return (
            "You can search a document collection. Write a query inside <search>...</search>; the best "
            f"{self.topk} passages come back inside <information>...</information>. Search as often as you "
            "need, then give your final answer."
        )

    def find_call(self, action: str) -> ToolCall | None:
        return tool_call(self.name, find_tagged(action, *_SEARCH_TAGS))

    def run(self, call: ToolCall) -> ToolResult:
        query = " ".join(call.payload.split())
        if not query:
            return ToolResult("<information>\n(empty query: write words inside <search>...</search>)\n</information>", ok=False)
        try:
            passages = self.backend.batch_search([query], self.topk)[0]
        except SearchError as exc:
            return ToolResult(f"<information>\nsearch failed: {exc}\n</information>", ok=False, info={"error": str(exc)})
        except Exception as exc:
            logger.exception("search backend failed")
            return ToolResult(f"<information>\nsearch failed: {exc!r}\n</information>", ok=False, info={"error": repr(exc)})
        if not passages:
            body = "(no document matches this query)"
        else:
            body = "\n".join(
                f"[{rank}] {p.title}: {_clip(p.text, self.max_passage_chars)}" if p.title else f"[{rank}] {_clip(p.text, self.max_passage_chars)}"
                for rank, p in enumerate(passages, start=1)
            )
        info = {"query": query, "doc_ids": [p.id for p in passages]}
        return ToolResult(f"<information>\n{body}\n</information>", ok=True, info=info)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
