"""The search tool: BM25 ranking, the /retrieve server and client agree, failures are tool errors."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("bm25s")

from gem_core.cli import main as cli_main
from gem_core.tools.search import (
    BM25Index,
    RetrievalClient,
    SearchError,
    SearchTool,
    make_search_server,
    retrieve_url,
)

DOCS = [
    {"id": "d0", "title": "Paris", "text": "Paris is the capital and largest city of France, on the Seine."},
    {"id": "d1", "title": "Berlin", "text": "Berlin is the capital of Germany and its largest city."},
    {
        "id": "d2",
        "title": "Photosynthesis",
        "text": "Plants turn light, water and carbon dioxide into glucose and oxygen.",
    },
    {"id": "d3", "title": "Mitochondria", "text": "The mitochondrion is the powerhouse of the cell; it makes ATP."},
    {"id": "d4", "title": "Seine", "text": "The Seine is a river in northern France that flows through Paris."},
    {"id": "d5", "title": "Glucose", "text": "Glucose is a simple sugar with the formula C6H12O6."},
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("search") / "corpus.jsonl"
    path.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    return path


@pytest.fixture(scope="module")
def index(corpus) -> BM25Index:
    return BM25Index.from_jsonl(corpus)


@pytest.fixture(scope="module")
def server(index):
    srv = make_search_server(index, "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _closed_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


# -- ranking ---------------------------------------------------------------------------------------


def test_bm25_ranks_the_matching_document_first(index):
    assert index.search("capital of Germany", 3)[0].id == "d1"
    assert index.search("mitochondria powerhouse ATP", 3)[0].id == "d3"
    seine = [p.id for p in index.search("river Seine", 3)]
    assert seine[0] == "d4" and "d0" in seine  # both mention the Seine; the river doc more so
    scores = [p.score for p in index.search("glucose", 6)]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)


def test_bm25_edge_cases(index):
    assert index.search("the of and", 3) == []  # stopwords only
    assert index.search("zzzz qqqq", 3) == []  # no known word
    assert len(index.search("capital", 100)) <= len(DOCS)  # k larger than the corpus
    batch = index.batch_search(["Paris", "", "oxygen"], 2)
    assert batch[0][0].id in ("d0", "d4") and batch[1] == [] and batch[2][0].id == "d2"


def test_corpus_errors_are_clear(tmp_path):
    with pytest.raises(SearchError, match="does not exist"):
        BM25Index.from_jsonl(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "text": "ok"}\nnot json\n')
    with pytest.raises(SearchError, match=r"bad.jsonl:2"):
        BM25Index.from_jsonl(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(SearchError, match="no records"):
        BM25Index.from_jsonl(empty)


# -- server and client -----------------------------------------------------------------------------


def test_server_and_embedded_index_give_the_same_results(index, server):
    client = RetrievalClient(server)
    queries = ["capital city", "sugar formula", "France river", "powerhouse of the cell", "the"]
    remote = client.batch_search(queries, 3)
    local = index.batch_search(queries, 3)
    assert [[p.id for p in hits] for hits in remote] == [[p.id for p in hits] for hits in local]
    for r_hits, l_hits in zip(remote, local):
        for r, h in zip(r_hits, l_hits):
            assert (r.title, r.text) == (h.title, h.text) and r.score == pytest.approx(h.score)
    by_url = SearchTool(url=server).execute("<search>capital of Germany</search>")
    by_index = SearchTool(index).execute("<search>capital of Germany</search>")
    assert by_url is not None and by_index is not None
    assert by_url.observation == by_index.observation and by_url.ok
    assert by_url.info["doc_ids"][0] == "d1"


def test_server_speaks_the_search_r1_and_gem_request_shapes(server):
    def post(payload: dict) -> dict:
        req = urllib.request.Request(server + "/retrieve", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    batch = post({"queries": ["Berlin", "glucose"], "topk": 2, "return_scores": True})
    assert len(batch["result"]) == 2 and batch["result"][0][0]["document"]["id"] == "d1"
    assert batch["result"][0][0]["document"]["contents"].startswith("Berlin\n") and batch["result"][0][0]["score"] > 0
    single = post({"query": "Berlin", "topk": 1, "return_scores": False})
    assert len(single["result"]) == 1 and single["result"][0]["score"] is None
    with urllib.request.urlopen(server + "/health", timeout=5) as resp:
        assert json.loads(resp.read()) == {"status": "ok", "documents": len(DOCS)}
    req = urllib.request.Request(server + "/retrieve", data=b"{not json", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 400


def test_server_down_is_a_tool_error_not_a_crash():
    port = _closed_port()
    tool = SearchTool(url=f"http://127.0.0.1:{port}", timeout=1.0)
    result = tool.execute("<search>anything</search>")
    assert result is not None and not result.ok
    assert "unreachable" in result.observation and f"127.0.0.1:{port}" in result.observation
    with pytest.raises(SearchError, match="unreachable"):
        RetrievalClient(f"http://127.0.0.1:{port}", retries=0).search("x")


def test_url_normalisation():
    assert retrieve_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/retrieve"
    assert retrieve_url("http://h:1/retrieve") == "http://h:1/retrieve"
    with pytest.raises(SearchError, match="http://host:port"):
        retrieve_url("127.0.0.1:8000")


# -- the tool --------------------------------------------------------------------------------------


def test_tool_parsing_and_observation(index):
    tool = SearchTool(index, topk=2)
    assert tool.find_call("no search") is None
    call = tool.find_call("think <search> first  query </search> then <search>second</search>")
    assert call is not None and call.payload == " first  query "
    result = tool.execute("<search>Paris France</search>")
    assert result is not None and result.ok
    assert result.observation.startswith("<information>\n[1] ") and result.observation.endswith("\n</information>")
    assert result.observation.count("\n[") == 2
    empty = tool.execute("<search>   </search>")
    assert empty is not None and not empty.ok and "empty query" in empty.observation
    nothing = tool.execute("<search>zzzz</search>")
    assert nothing is not None and nothing.ok and "no document matches" in nothing.observation
    assert "<search>" in tool.instructions()


def test_tool_needs_exactly_one_backend(index, corpus):
    with pytest.raises(ValueError, match="exactly one backend"):
        SearchTool()
    with pytest.raises(ValueError, match="exactly one backend"):
        SearchTool(index, url="http://127.0.0.1:1")
    assert SearchTool(str(corpus)).execute("<search>Berlin</search>").info["doc_ids"][0] == "d1"  # type: ignore[union-attr]


def test_one_index_per_corpus_and_one_client_per_url_per_process(corpus, server, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from gem_core.tools.search import shared_index

    with ThreadPoolExecutor(8) as pool:
        tools = list(pool.map(lambda _: SearchTool(str(corpus)), range(16)))
    assert len({id(tool.backend) for tool in tools}) == 1  # built once, though 16 envs asked at once
    assert shared_index(corpus) is tools[0].backend
    by_url = [SearchTool(url=server) for _ in range(4)]
    assert len({id(tool.backend) for tool in by_url}) == 1
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "x", "text": "another corpus"}) + "\n")
    assert SearchTool(str(other)).backend is not tools[0].backend
    with pytest.raises(SearchError, match="does not exist"):
        SearchTool(str(tmp_path / "missing.jsonl"))


# -- the command -----------------------------------------------------------------------------------


def test_serve_search_command_serves_the_corpus(corpus):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gem_core.cli", "serve-search", "--corpus", str(corpus), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith(f"serving {len(DOCS)} documents") and "/retrieve" in line
        url = line.split(" at ")[1].strip()
        hits = RetrievalClient(url).search("capital of Germany", 1)
        assert [h.id for h in hits] == ["d1"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_search_command_rejects_a_missing_corpus(tmp_path, capsys):
    assert cli_main(["serve-search", "--corpus", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
