"""gem-core envs served by OpenEnv's own server (create_app under uvicorn) and played by OpenEnv's own
GenericEnvClient, sync and async, through a real socket."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from openenv.core.generic_client import GenericEnvClient
from serve_helpers import guesses, play_local, record

from gem_core.errors import InvalidArgumentError, UnknownEnvError, UnknownKwargError
from gem_core.serve import serve
from gem_core.serve.server import ServeError

GUESS = "game:GuessTheNumber-v0"
SUDOKU = "game:Sudoku-v0-easy"


def play_sync(url: str, seed: int, actions: list[str]) -> list[dict]:
    with GenericEnvClient(base_url=url).sync() as client:
        records = [record(client.reset(seed=seed))]
        for action in actions:
            result = client.step({"action": action})
            records.append(record(result))
            if result.done:
                break
    return records


async def play_async(url: str, seed: int, actions: list[str]) -> list[dict]:
    async with GenericEnvClient(base_url=url) as client:
        records = [record(await client.reset(seed=seed))]
        for action in actions:
            result = await client.step({"action": action})
            records.append(record(result))
            if result.done:
                break
            await asyncio.sleep(0)  # let the other clients' steps interleave with this one's
    return records


def test_sync_client_plays_the_in_process_episodes():
    with serve(GUESS) as server:
        for seed in range(4):
            actions = guesses(seed)
            assert play_sync(server.url(), seed, actions) == play_local(GUESS, seed, actions)
        # the model's next message comes over the wire too, built by gem_core.model_message
        with GenericEnvClient(base_url=server.url()).sync() as client:
            first = client.reset(seed=1).observation
            after = client.step({"action": "\\boxed{10}"}).observation
        assert first["message"].startswith(first["observation"])
        assert after["message"] == after["observation"] + "\n\n" + after["info"]["suffix"]
    assert server.envs_closed == server.envs_built and server.open_envs == 0


def test_async_client_two_ids_side_by_side():
    """Two ids on one server, each under /<id>; the async client's episodes equal in-process play."""
    sudoku_moves = ["\\boxed{1 1 5}", "\\boxed{9 9 9}", "bad", "\\boxed{2 3 4}"]

    async def main(server) -> None:
        guess = await play_async(server.url(GUESS), 5, guesses(5))
        sudoku = await play_async(server.url(SUDOKU), 7, sudoku_moves)
        assert guess == play_local(GUESS, 5, guesses(5))
        assert sudoku == play_local(SUDOKU, 7, sudoku_moves)

    with serve([GUESS, SUDOKU]) as server:
        assert server.url(SUDOKU).endswith("/" + SUDOKU)
        asyncio.run(main(server))
        index = json.loads(urllib.request.urlopen(server.url(GUESS).rsplit("/", 1)[0] + "/").read())
        assert index == {"envs": {GUESS: "/" + GUESS, SUDOKU: "/" + SUDOKU}}


def test_64_concurrent_clients_lose_and_cross_no_step():
    """64 sessions stepping at once, each its own seed: every one sees exactly its in-process episode
    (a lost step or one applied to another session's env would change it), and every env is closed."""
    n = 64

    async def main(url: str) -> list[list[dict]]:
        return await asyncio.gather(*(play_async(url, seed, guesses(seed, 12)) for seed in range(n)))

    with serve(GUESS, max_sessions=n) as server:
        got = asyncio.run(main(server.url()))
        assert server.envs_built >= n
    for seed in range(n):
        assert got[seed] == play_local(GUESS, seed, guesses(seed, 12)), seed
    assert len({json.dumps(g) for g in got}) > n // 2  # the seeds do give different episodes
    assert server.envs_closed == server.envs_built and server.open_envs == 0


def test_python_tool_env_over_the_socket():
    """A tool env (the sandboxed Python tool around a game) served: a tool turn runs the code."""
    from gem_core.tools.python import PythonSandbox, SandboxUnavailable

    try:
        PythonSandbox(workers=1).close()
    except SandboxUnavailable as exc:
        pytest.skip(f"no sandbox here: {exc}")
    actions = ["<python>print(6 * 7)</python>", "\\boxed{10}"]
    local = play_local(GUESS, 3, actions, tools="python")
    with serve(GUESS, tools="python", max_sessions=2) as server:
        remote = play_sync(server.url(), 3, actions)
    for rec in local + remote:
        rec["info"].get("tool_info", {}).pop("duration", None)  # wall-clock time differs run to run
    assert remote == local
    assert "42" in remote[1]["observation"] and remote[1]["info"]["tool_turn"] is True
    assert remote[2]["info"]["tool_turn"] is False


def test_session_bound_answers_capacity_reached_and_frees_the_slot():
    with serve(GUESS, max_sessions=2) as server:
        url = server.url()
        first, second = GenericEnvClient(base_url=url).sync(), GenericEnvClient(base_url=url).sync()
        first.reset(seed=0), second.reset(seed=1)
        third = GenericEnvClient(base_url=url).sync()
        with pytest.raises(RuntimeError, match=r"Server at capacity: 2/2 sessions active.*CAPACITY_REACHED"):
            third.reset(seed=2)
        third.close()
        first.close()
        deadline = time.monotonic() + 30
        while server.open_envs > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        with GenericEnvClient(base_url=url).sync() as fourth:  # the closed session's slot is free again
            assert fourth.reset(seed=2).observation["terminated"] is False
        second.close()


def test_idle_session_times_out_with_a_clear_error():
    """A WebSocket with no message for idle_timeout is closed with its session and env; OpenEnv's client
    reconnects on its next request, to a new session, whose error says why; the slot is free."""
    with serve(GUESS, max_sessions=1, idle_timeout=0.5) as server:
        with GenericEnvClient(base_url=server.url()).sync() as client:
            client.reset(seed=0)
            deadline = time.monotonic() + 60
            while server.open_envs and time.monotonic() < deadline:
                time.sleep(0.1)
            assert server.open_envs == 0 and server.envs_closed == server.envs_built
            assert server.events.counts["idle"] == 1
            with pytest.raises(RuntimeError, match=r"step before reset .*a connection with no message for 0.5 s is closed"):
                client.step({"action": "\\boxed{3}"})
        with GenericEnvClient(base_url=server.url()).sync() as again:
            assert again.reset(seed=0).done is False


def test_stop_closes_every_session_and_frees_the_port():
    server = serve(GUESS, max_sessions=8)
    url = server.url()
    port = int(url.rsplit(":", 1)[1])
    clients = [GenericEnvClient(base_url=url).sync() for _ in range(3)]
    for seed, client in enumerate(clients):
        client.reset(seed=seed)
        client.step({"action": "\\boxed{4}"})
    assert server.open_envs == 3
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 60  # a hang guard with room for load
    assert server.open_envs == 0 and server.envs_closed == server.envs_built
    with pytest.raises((RuntimeError, ConnectionError, OSError)):
        clients[0].step({"action": "\\boxed{5}"})
    for client in clients:
        client.close()
    server.stop()  # twice is fine
    with socket.socket() as probe:  # the port is free again
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))


# -- bad requests: one clear line, the same text as gem-core's own bad input ------------------------


def test_bad_requests_over_the_socket():
    with serve(GUESS) as server:
        with GenericEnvClient(base_url=server.url()).sync() as client:
            with pytest.raises(RuntimeError, match=r"step before reset .*EXECUTION_ERROR"):
                client.step({"action": "\\boxed{1}"})
            with pytest.raises(RuntimeError, match=r"reset: seed=-1 is not allowed: expected an integer >= 0"):
                client.reset(seed=-1)
            with pytest.raises(RuntimeError, match=r"reset: seed='3' is not allowed"):
                client.reset(seed="3")
            with pytest.raises(RuntimeError, match=r"reset does not take 'difficulty'; it takes seed, episode_id, options"):
                client.reset(seed=1, difficulty="hard")
            with pytest.raises(RuntimeError, match=r"reset options must be a JSON object, got list"):
                client.reset(seed=1, options=[1])
            client.reset(seed=1)
            with pytest.raises(RuntimeError, match=r"Invalid message \(code: VALIDATION_ERROR\)"):
                client.step({"move": "\\boxed{1}"})  # OpenEnv's own check of the action schema
            result = client.step({"action": "x" * 100_000})  # a bad move is the env's to judge, not an error
            assert result.observation["info"]["invalid_action"] or result.observation["info"]["format_error"]
            for guess in range(1, 21):  # play the episode to its end (a game may end it at a bad move)
                if result.done:
                    break
                result = client.step({"action": f"\\boxed{{{guess}}}"})
            assert result.done
            with pytest.raises(RuntimeError, match=r"the episode has ended; reset to start another"):
                client.step({"action": "\\boxed{2}"})
        # OpenEnv's stateless HTTP /step has no session: gem-core answers it 400 with the same line
        request = urllib.request.Request(
            server.url() + "/step", data=json.dumps({"action": {"action": "\\boxed{1}"}}).encode(), headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request)
        assert err.value.code == 400
        assert "step before reset" in json.loads(err.value.read())["detail"]


def test_serve_checks_its_arguments_before_building_anything():
    with pytest.raises(UnknownEnvError, match=r"no env registered as 'game:GuessTheNumbr-v0'.*Did you mean"):
        serve("game:GuessTheNumbr-v0")
    with pytest.raises(UnknownKwargError, match=r"does not take 'max_turn'"):
        serve(GUESS, env_kwargs={"max_turn": 3})
    with pytest.raises(InvalidArgumentError, match=r"serve: max_sessions=0 is not allowed: expected an integer in 1..4096"):
        serve(GUESS, max_sessions=0)
    with pytest.raises(InvalidArgumentError, match=r"serve: idle_timeout=0 is not allowed"):
        serve(GUESS, idle_timeout=0)
    with pytest.raises(InvalidArgumentError, match=r"unknown env tool\(s\) \['shell'\]"):
        serve(GUESS, tools="shell")
    with pytest.raises(InvalidArgumentError, match=r"distinct env ids"):
        serve([GUESS, GUESS])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(ServeError, match=r"cannot listen on 127.0.0.1:\d+: Address already in use"):
            serve(GUESS, port=taken.getsockname()[1])
