"""The other way: an env on an OpenEnv server as a gem-core id, ``openenv:<url>``. The server is the
openenv package's own (create_app under uvicorn) serving an env written against OpenEnv's interface
alone; the runner, ``gem-core eval``, ``make-dataset`` and ReBN play it. A gem-core env served by
``gem-core serve`` round-trips exactly."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from typing import Any, Optional

import numpy as np
import pytest
import uvicorn
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from serve_helpers import guesses, play_local

import gem_core
from gem_core import cli
from gem_core.algo import rebn
from gem_core.errors import INFRA_ERROR, ResetNeeded
from gem_core.rollout import OpenAIPolicy, RunConfig, run_episodes
from gem_core.serve import serve
from gem_core.serve.environment import json_safe
from gem_core.serve.remote import OpenEnvServerError
from gem_core.tasks import TaskSpec
from gem_core.testing import FakeChatServer

GUESS = "game:GuessTheNumber-v0"


# -- an env written for OpenEnv, knowing nothing of gem-core ----------------------------------------


class SayAction(Action):
    word: str


class PromptObservation(Observation):
    prompt: str = ""
    tries_left: int = 0


class SayTheNumber(Environment):
    """Say the hidden number (0..9, fixed by the seed) in three tries: reward 1 for it, else 0."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self.target, self.tries = 0, 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> PromptObservation:
        self.target, self.tries = (seed or 0) * 7 % 10, 3
        self._state = State(episode_id=episode_id, step_count=0)
        return PromptObservation(prompt="Say a number from 0 to 9 as \\boxed{n}.", tries_left=3)

    def step(self, action: SayAction, timeout_s: Optional[float] = None, **kwargs: Any) -> PromptObservation:
        self._state.step_count += 1
        self.tries -= 1
        match = re.search(r"\\boxed\{(\d+)\}", action.word)
        if match and int(match.group(1)) == self.target:
            return PromptObservation(prompt="Right.", tries_left=self.tries, reward=1.0, done=True)
        hint = "higher" if match and int(match.group(1)) < self.target else "lower"
        return PromptObservation(prompt=f"No; it is {hint}.", tries_left=self.tries, reward=0.0, done=self.tries == 0)

    @property
    def state(self) -> State:
        return self._state


def say_policy(messages: list[dict[str, str]]) -> str:
    """Guess 0, then move by the hints (a text policy, for the fake OpenAI-compatible server)."""
    text = " ".join(m["content"] for m in messages if m["role"] == "user")
    low, high = 0, 9
    for said, hint in zip(
        re.findall(r"\\boxed\{(\d+)\}", " ".join(m["content"] for m in messages if m["role"] == "assistant")), re.findall(r"it is (higher|lower)", text)
    ):
        low, high = (int(said) + 1, high) if hint == "higher" else (low, int(said) - 1)
    return f"\\boxed{{{(low + high) // 2}}}"


@pytest.fixture(scope="module")
def openenv_url():
    """SayTheNumber on openenv's own server (create_app) under uvicorn, on a free port."""
    app = create_app(SayTheNumber, SayAction, PromptObservation, env_name="say", max_concurrent_envs=16)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()


def test_an_openenv_env_is_a_gem_core_env(openenv_url):
    env_id = f"openenv:{openenv_url}"
    assert gem_core.spec(env_id).kwargs == {"url": openenv_url}
    env = gem_core.make(env_id)
    try:
        with pytest.raises(ResetNeeded, match="step before reset"):
            env.step("\\boxed{1}")
        obs, info = env.reset(seed=3)  # target 1
        assert obs == "Say a number from 0 to 9 as \\boxed{n}." and info["openenv"] == {"tries_left": 3}
        assert env.step("\\boxed{5}") == ("No; it is lower.", 0.0, False, False, {"openenv": {"tries_left": 2}, "openenv_metadata": {}})
        obs, reward, terminated, truncated, _ = env.step("so \\boxed{1}")
        assert (obs, reward, terminated, truncated) == ("Right.", 1.0, True, False)
        with pytest.raises(ResetNeeded):
            env.step("\\boxed{1}")
        assert env.reset(seed=3)[0].startswith("Say a number")  # a new episode in the same session
    finally:
        env.close()


def test_a_served_gem_core_env_round_trips_exactly():
    """gem-core serve, then the served id back as openenv:<url>: the same episode as in-process."""
    with serve(GUESS) as server:
        env = gem_core.make(f"openenv:{server.url()}")
        try:
            for seed in (0, 4):
                obs, info = env.reset(seed=seed)
                records = [{"observation": obs, "info": info, "reward": 0.0, "terminated": False, "truncated": False}]
                for action in guesses(seed):
                    obs, reward, terminated, truncated, info = env.step(action)
                    records.append({"observation": obs, "info": info, "reward": reward, "terminated": terminated, "truncated": truncated})
                    if terminated or truncated:
                        break
                assert records == play_local(GUESS, seed, guesses(seed))
                assert gem_core.model_message(records[1]["observation"], records[1]["info"]).endswith(records[1]["info"]["suffix"])
        finally:
            env.close()


def test_runner_and_rebn_on_an_openenv_id(openenv_url):
    """The core runner plays openenv:<url> episodes (a text policy over a fake OpenAI-compatible server);
    ReBN turns their per-turn rewards into advantages."""
    env_id = f"openenv:{openenv_url}"
    with FakeChatServer(say_policy) as chat:
        policy = OpenAIPolicy(chat.base_url, "fake")
        trajectories = asyncio.run(run_episodes([env_id] * 6, policy, config=RunConfig(max_turns=3), seeds=list(range(6))))
    rewards = [t.rewards for t in trajectories]
    assert all(t.infra_error is None for t in trajectories)
    assert [r[-1] for r in rewards] == [1.0] * 6  # the search finds every target within three tries
    assert sorted(len(r) for r in rewards) != [1] * 6  # and takes more than one turn on some
    flat = np.concatenate([np.asarray(r, dtype=float) for r in rewards])
    episode_ids = np.concatenate([[i] * len(r) for i, r in enumerate(rewards)])
    advantages = rebn(flat, episode_ids, gamma=0.9)
    returns = np.concatenate([[0.9 ** (len(r) - 1 - k) for k in range(len(r))] for r in rewards])
    np.testing.assert_allclose(advantages, (returns - returns.mean()) / (returns.std() + 1e-6), rtol=1e-9)


def test_gem_core_eval_on_an_openenv_id(openenv_url, tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    with FakeChatServer(say_policy) as chat:
        code = cli.main(
            ["eval", f"openenv:{openenv_url}", "--base-url", chat.base_url, "--model", "fake", "--episodes", "4", "--max-turns", "3", "--out", str(out)]
        )
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and {row["env_id"] for row in rows} == {f"openenv:{openenv_url}"}
    assert [row["return"] for row in rows] == [1.0] * 4 and all(row["terminated"] for row in rows), rows


@pytest.mark.parametrize("trainer", ["verl", "openrlhf", "trl", "rl2", "oat"])
def test_make_dataset_on_an_openenv_id(openenv_url, tmp_path, trainer):
    """A trainer's dataset rows for openenv:<url> (verl's in parquet, the others' in JSONL): the rows name
    the id, and each row's prompt (or task spec's first message) is the server's first message."""
    out = tmp_path / ("rows.parquet" if trainer == "verl" else "rows.jsonl")
    assert cli.main(["make-dataset", trainer, "--env", f"openenv:{openenv_url}", "--n", "3", "--out", str(out)]) == 0
    if trainer == "verl":
        import pyarrow.parquet as pq

        rows = pq.read_table(out).to_pylist()
        text = json.dumps(rows)
    else:
        text = out.read_text()
        rows = [json.loads(line) for line in text.splitlines()]
    assert len(rows) == 3 and f"openenv:{openenv_url}" in text
    if trainer in ("verl", "openrlhf", "trl"):  # the prompt is in the row
        assert text.count("Say a number from 0 to 9") == 3
    else:  # the row is the task spec; the trainer's rollout builds the episode from it
        specs = [TaskSpec.from_json(row.get("gem_task") or row["extra_info"]["gem_task"]) for row in rows]
        assert [(spec.env_id, spec.seed) for spec in specs] == [(f"openenv:{openenv_url}", seed) for seed in range(3)]
        assert specs[0].first_message().startswith("Say a number from 0 to 9")


def test_a_server_that_goes_away_is_an_infrastructure_failure():
    server = serve(GUESS)
    env = gem_core.make(f"openenv:{server.url()}")
    try:
        env.reset(seed=0)
        server.stop()
        obs, reward, terminated, truncated, info = env.step("\\boxed{3}")
        assert (obs, reward, terminated, truncated) == ("", 0.0, False, True)
        assert info[INFRA_ERROR].startswith(f"openenv:{server.url()}: step failed: ")
    finally:
        env.close()


def test_bad_openenv_ids_fail_in_one_line():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(OpenEnvServerError, match=rf"openenv:http://127.0.0.1:{port}: cannot read the server's /schema: .*refused"):
        gem_core.make(f"openenv:http://127.0.0.1:{port}")
    with pytest.raises(gem_core.errors.UnknownKwargError, match="does not take 'max_turns'"):
        gem_core.make(f"openenv:http://127.0.0.1:{port}", max_turns=3)
    with pytest.raises(gem_core.errors.UnknownEnvError):
        gem_core.make("openenv:")  # no url: not a prefixed id


def test_json_safe_keeps_every_info_on_the_wire():
    info = {"n": np.int64(3), "x": np.float32(0.5), "a": np.arange(3), "t": (1, 2), "nan": float("nan"), "o": object}
    safe = json_safe(info)
    assert json.loads(json.dumps(safe)) == safe
    assert safe["n"] == 3 and safe["a"] == [0, 1, 2] and safe["t"] == [1, 2] and safe["nan"] == "nan"


def test_without_the_openenv_package_an_openenv_id_is_one_line(monkeypatch):
    """What a user without the extra meets: the error names it (not a ModuleNotFoundError traceback)."""
    import sys

    from gem_core.serve import OpenEnvUnavailable

    for name in ("openenv", "openenv.core", "openenv.core.env_server", "openenv.core.generic_client"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of it raises ImportError, as when not installed
    monkeypatch.delitem(sys.modules, "gem_core.serve.remote", raising=False)
    with pytest.raises(OpenEnvUnavailable, match=r"need the openenv package .*pip install -e '\.\[openenv\]'"):
        gem_core.make("openenv:http://127.0.0.1:1")


def test_an_openenv_id_in_an_async_vector_env():
    """A worker process builds openenv:<url> envs from the spec alone (the prefix resolves there too); each
    env is its own session."""
    with serve(GUESS, max_sessions=4) as server:
        vec = gem_core.make_vec(f"openenv:{server.url()}", 2, vectorization_mode="async", vector_kwargs={"num_workers": 1})
        try:
            obs, _ = vec.reset(seed=3)
            assert list(obs) == [play_local(GUESS, 3, [])[0]["observation"], play_local(GUESS, 4, [])[0]["observation"]]
            _, rewards, terminated, truncated, infos = vec.step(["\\boxed{5}", "\\boxed{5}"])
            assert list(rewards) == [0.0, 0.0] and not any(terminated) and not any(truncated)
            assert server.open_envs == 2
        finally:
            vec.close()
        deadline = time.monotonic() + 60
        while server.open_envs and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.open_envs == 0
