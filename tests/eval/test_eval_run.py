"""gem-core eval against a real local OpenAI-compatible HTTP server (gem_core.testing.FakeChatServer) and
the env baselines: known success rates, per-episode failure handling, evaluation sets, tools."""

from __future__ import annotations

import json
import time

import pytest
from eval_support import EASY, HARD, binary_search, episode_of, linear_scan, read_lines, targets, turn_of

from gem_core.cli import main
from gem_core.core import Env
from gem_core.eval.summary import wilson_interval
from gem_core.testing import FakeChatServer


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["eval", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- success rates equal the known values ---------------------------------------------------------------


def test_scripted_players_score_exactly_what_their_strategy_predicts(tmp_path, capsys):
    """Binary search wins every episode; a linear scan from the low end wins exactly the episodes whose
    target is among the first max_turns numbers (read off the envs, seed by seed)."""
    n = 30
    for name, reply in (("search", binary_search), ("scan", linear_scan)):
        with FakeChatServer(reply) as server:
            out = tmp_path / f"{name}.jsonl"
            code, stdout, _ = run(
                capsys, EASY, HARD, "--base-url", server.base_url, "--model", name, "--episodes", str(n), "--concurrency", "8", "--out", str(out)
            )
        assert code == 0
        lines = read_lines(out)
        assert [(line["env_id"], line["seed"]) for line in lines] == [(env, s) for env in (EASY, HARD) for s in range(n)]
        wins = {(line["env_id"], line["seed"]): line["success"] for line in lines}
        if name == "search":
            assert all(wins.values())
        else:
            for env_id, max_turns in ((EASY, 4), (HARD, 7)):
                expected = {seed: target <= max_turns for seed, target in targets(env_id, range(n)).items()}
                assert {s: wins[(env_id, s)] for s in range(n)} == expected
                assert 0 < sum(expected.values()) < n  # the check can fail both ways
        rate = {env: sum(wins[(env, s)] for s in range(n)) / n for env in (EASY, HARD)}
        for env_id in (EASY, HARD):  # the summary table prints the same rate
            assert f"{rate[env_id]:.3f}" in next(row for row in stdout.splitlines() if row.startswith(env_id))
        for line in lines:
            assert line["model"] == name and line["error"] is None and line["tool_calls"] == 0
            assert line["turns"] >= 1 and line["tokens_in"] > 0 and line["tokens_out"] > 0  # the server's usage
            assert line["terminated"] == line["success"] and (line["truncation_reason"] == "max_turns") == (not line["success"])


def test_oracle_wins_every_episode(capsys):
    code, stdout, _ = run(capsys, EASY, "--policy", "oracle")
    assert code == 0
    row = next(r for r in stdout.splitlines() if r.startswith(EASY)).split()
    assert row[1:4] == ["100", "1.000", "[0.963,"]  # the default 100 episodes, all won


def test_random_policy_matches_the_games_odds(tmp_path, capsys):
    """Easy: a uniform guess in 1..10 each of 4 turns, the target uniform too: each turn hits with
    probability 1/10 whatever came before (a repeated guess is never the target), so an episode is won
    with probability 1 - (9/10)^4 = 0.3439. 1000 fixed seeds: within 4 standard errors."""
    n, p = 1000, 1 - 0.9**4
    out = tmp_path / "random.jsonl"
    code, _, _ = run(capsys, EASY, "--policy", "random", "--episodes", str(n), "--out", str(out))
    assert code == 0
    wins = sum(line["success"] for line in read_lines(out))
    assert abs(wins / n - p) < 4 * (p * (1 - p) / n) ** 0.5, wins
    low, high = wilson_interval(wins, n)
    assert low < p < high


def test_two_runs_with_the_same_arguments_see_the_same_episodes(tmp_path, capsys):
    for name in ("a", "b"):
        assert run(capsys, EASY, "--policy", "random", "--episodes", "20", "--seed-start", "7", "--out", str(tmp_path / f"{name}.jsonl"))[0] == 0
    a, b = read_lines(tmp_path / "a.jsonl"), read_lines(tmp_path / "b.jsonl")
    assert [line["seed"] for line in a] == list(range(7, 27))
    assert [(x["success"], x["return"], x["turns"]) for x in a] == [(y["success"], y["return"], y["turns"]) for y in b]


# -- a server that fails ---------------------------------------------------------------------------------


def test_failures_are_retried_or_recorded_per_episode_and_the_run_goes_on(tmp_path, capsys):
    scripted = {  # episode -> fault on (turn, attempt)
        0: lambda turn, attempt: 500 if attempt == 1 else None,  # one 500, then fine
        1: lambda turn, attempt: 429 if attempt <= 2 else None,  # rate-limited twice
        2: lambda turn, attempt: "garbage" if attempt == 1 else None,  # a proxy's HTML page once
        3: lambda turn, attempt: "hang" if attempt == 1 else None,  # one request hangs
        4: lambda turn, attempt: 500,  # always 500
        5: lambda turn, attempt: "hang",  # always hangs
        6: lambda turn, attempt: "garbage",  # always garbage
        7: lambda turn, attempt: 503 if turn == 2 else None,  # fails at its third turn
        8: lambda turn, attempt: 401,  # not retried
    }

    def fault(request_id, attempt):
        script = scripted.get(episode_of(request_id))
        return script(turn_of(request_id), attempt) if script else None

    out = tmp_path / "faults.jsonl"
    started = time.monotonic()
    with FakeChatServer(binary_search, fault=fault) as server:
        code, stdout, _ = run(
            capsys,
            HARD,
            "--base-url",
            server.base_url,
            "--model",
            "m",
            "--episodes",
            "12",
            "--concurrency",
            "12",
            "--retries",
            "2",
            "--request-timeout",
            "3",
            "--out",
            str(out),
        )
        requests = list(server.requests)
    elapsed = time.monotonic() - started
    assert code == 0  # some episodes failed, the run did not
    # a hang costs its timeout, not the run: 3 attempts x 3 s + backoff, not forever (the timeout is
    # generous so that a loaded machine's healthy answers are not taken for hangs)
    assert elapsed < 120, elapsed
    lines = {line["episode"]: line for line in read_lines(out)}
    assert sorted(lines) == list(range(12))
    for ep in (0, 1, 2, 3, 9, 10, 11):
        assert lines[ep]["success"] and lines[ep]["error"] is None, (lines[ep]["error"], lines[ep]["turns"], lines[ep]["truncation_reason"])
    for ep, words in ((4, "HTTP 500"), (5, "did not answer within 3 s"), (6, "not JSON"), (7, "HTTP 503"), (8, "HTTP 401")):
        line = lines[ep]
        assert not line["success"] and words in line["error"] and "ModelRequestError" in line["error"], line
        assert line["truncation_reason"] == "abort" and line["finish_reason"] == "abort"
    assert lines[4]["turns"] == 0 and "(3 attempts)" in lines[4]["error"]
    assert lines[7]["turns"] == 2  # the turns it played are kept
    attempts = {}
    for request in requests:
        key = (episode_of(request["request_id"]), turn_of(request["request_id"]))
        attempts[key] = attempts.get(key, 0) + 1
    assert attempts[(4, 0)] == attempts[(5, 0)] == attempts[(6, 0)] == attempts[(7, 2)] == 3  # --retries 2
    assert attempts[(8, 0)] == 1 and attempts[(1, 0)] == 3 and attempts[(0, 0)] == 2
    assert "5 episode(s) ended with an error" in stdout


def test_a_run_whose_every_episode_fails_exits_1(tmp_path, capsys):
    with FakeChatServer(binary_search, fault=lambda request_id, attempt: 404) as server:
        code, stdout, _ = run(capsys, EASY, "--base-url", server.base_url, "--model", "m", "--episodes", "3")
    assert code == 1 and "3 episode(s) ended with an error" in stdout


def test_resume_plays_the_episodes_that_ended_with_an_error_again(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    with FakeChatServer(binary_search, fault=lambda request_id, attempt: 500 if episode_of(request_id) == 1 else None) as server:
        run(capsys, EASY, "--base-url", server.base_url, "--model", "m", "--episodes", "3", "--retries", "0", "--out", str(out))
    assert [line["error"] is not None for line in read_lines(out)] == [False, True, False]
    with FakeChatServer(binary_search) as server:
        code, stdout, _ = run(capsys, EASY, "--base-url", server.base_url, "--model", "m", "--episodes", "3", "--out", str(out), "--resume")
        assert [r["request_id"].split("/turn")[0] for r in server.requests if r["request_id"].endswith("turn-0")] == [f"{EASY}/1"]
    assert code == 0 and [line["success"] for line in read_lines(out)] == [True, True, True]
    assert "(1 played now)" in stdout


# -- evaluation sets, tools, transcripts -----------------------------------------------------------------


class ToyQuiz(Env):
    """A three-item evaluation set: reset(options={"idx": i}) asks question i; len() is its size."""

    QUESTIONS = [("2+2", "4"), ("3*3", "9"), ("10-7", "3")]

    def __len__(self):
        return len(self.QUESTIONS)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        question, self.answer = self.QUESTIONS[(options or {})["idx"]]
        return f"What is {question}? Answer in \\boxed{{}}.", {}

    def step(self, action):
        success = f"\\boxed{{{self.answer}}}" in action
        return ("Correct." if success else "Wrong."), float(success), True, False, {"success": success}


@pytest.fixture
def toy_eval_set():
    from gem_core import registry

    registry.register("eval:ToyQuiz-v0", ToyQuiz, description="three arithmetic questions")
    yield "eval:ToyQuiz-v0"
    registry.registry.pop("eval:ToyQuiz-v0", None)


def test_an_evaluation_set_plays_each_item_once_in_order(toy_eval_set, tmp_path, capsys):
    answers = {"2+2": "4", "3*3": "9", "10-7": "2"}  # the last one wrong on purpose

    def reply(messages):
        question = messages[-1]["content"].split("What is ")[1].split("?")[0]
        return f"\\boxed{{{answers[question]}}}"

    out = tmp_path / "set.jsonl"
    with FakeChatServer(reply) as server:
        code, stdout, _ = run(
            capsys, "eval:Toy*", "--base-url", server.base_url, "--model", "m", "--out", str(out), "--save-transcripts"
        )  # eval:* has the real sets too
    assert code == 0
    lines = read_lines(out)
    assert [(line["env_id"], line["item"], line["success"]) for line in lines] == [(toy_eval_set, 0, True), (toy_eval_set, 1, True), (toy_eval_set, 2, False)]
    assert lines[2]["transcript"]["first_message"].startswith("What is 10-7?")
    assert lines[2]["transcript"]["turns"] == [{"response": "\\boxed{2}", "action": "\\boxed{2}", "observation": "Wrong.", "reward": 0.0}]
    assert "0.667" in stdout


def test_tools_come_from_the_task_rows_as_in_training(tmp_path, capsys, monkeypatch):
    pytest.importorskip("bm25s")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "title": "Binary search", "text": "Halve the interval each time."}) + "\n")
    monkeypatch.setenv("GEM_SEARCH_CORPUS", str(corpus))

    def reply(messages):  # search once, then play
        searched = any(m["role"] == "tool" or "<information>" in m["content"] for m in messages[1:])
        return binary_search(messages) if searched else "<search>how to guess a number</search>"

    out = tmp_path / "tools.jsonl"
    with FakeChatServer(reply) as server:
        code, stdout, _ = run(capsys, EASY, "--tools", "search", "--base-url", server.base_url, "--model", "m", "--episodes", "4", "--out", str(out))
    assert code == 0
    lines = read_lines(out)
    assert [line["tool_calls"] for line in lines] == [1] * 4 and all(line["success"] for line in lines)
    assert "1.00" in next(row for row in stdout.splitlines() if row.startswith(EASY)).split()[-2]


def test_the_system_prompt_is_sent_first(capsys):
    with FakeChatServer(binary_search) as server:
        run(capsys, EASY, "--base-url", server.base_url, "--model", "m", "--episodes", "1", "--system-prompt", "Be brief.")
        bodies = [r["body"] for r in server.requests]
    assert bodies and all(b["messages"][0] == {"role": "system", "content": "Be brief."} for b in bodies)
    assert all(b["model"] == "m" and b["temperature"] == 0.0 and b["max_tokens"] == 1024 for b in bodies)


def test_balanced_plays_the_held_out_seeds_of_gem_core_train(tmp_path, capsys):
    """--balanced on GuessTheNumber: the seeds from --seed-start whose targets are every number equally often,
    the very seeds gem-core train evaluates on (so a checkpoint of any trainer is scored on its held-out set);
    on an env without targets to balance, the seeds without it."""
    from gem_core.train.trainer import evaluation_seeds

    out = tmp_path / "balanced.jsonl"
    code, _, err = run(capsys, EASY, "--policy", "random", "--episodes", "30", "--seed-start", "1000000", "--balanced", "--out", str(out))
    assert code == 0, err
    seeds = [line["seed"] for line in read_lines(out)]
    assert sorted(seeds) == sorted(evaluation_seeds(EASY, {}, 30))
    counts = {}
    for target in targets(EASY, seeds).values():
        counts[target] = counts.get(target, 0) + 1
    assert counts == {n: 3 for n in range(1, 11)}
    plain = tmp_path / "plain.jsonl"
    assert run(capsys, EASY, "--policy", "random", "--episodes", "30", "--seed-start", "1000000", "--out", str(plain))[0] == 0
    assert sorted(line["seed"] for line in read_lines(plain)) == list(range(1_000_000, 1_000_030)) != sorted(seeds)
    other = tmp_path / "other.jsonl"
    assert run(capsys, "game:Wordle-v0-easy", "--policy", "random", "--episodes", "5", "--seed-start", "9", "--balanced", "--out", str(other))[0] == 0
    assert sorted(line["seed"] for line in read_lines(other)) == [9, 10, 11, 12, 13]
