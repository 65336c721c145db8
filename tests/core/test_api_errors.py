"""What a user of the Python API meets on a bad input (issue 26): one gem_core error with a one-line
message naming the argument, the value and what is allowed, raised where the mistake is made, the
same for sync and async vector envs; a model server that cannot be reached is a gem_core error too.
"""

from __future__ import annotations

import multiprocessing
import socket
import subprocess
import sys
import textwrap
import urllib.error

import pytest

import gem_core
from gem_core.errors import GemError, InvalidArgumentError, InvalidArgumentTypeError, ModelRequestError, ResetNeeded, UnknownKwargError
from gem_core.tasks import TaskSpec

GTN = "game:GuessTheNumber-v0-easy"
GAME_IDS = [i for i in gem_core.list_envs("game") if str(gem_core.spec(i).entry_point).startswith("gem_core.")]
MAX_TURNS_ALLOWED = "expected an integer in 1..100000, or None (set per episode by the game)"


@pytest.mark.parametrize("value", ["5", 2.5, 0, -1, True, 10**6])
def test_make_refuses_a_bad_max_turns_at_once(value):
    with pytest.raises(InvalidArgumentError) as caught:
        gem_core.make(GTN, max_turns=value)
    assert str(caught.value) == f"{GTN}: max_turns={value!r} is not allowed: {MAX_TURNS_ALLOWED}"
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, GemError)
    assert isinstance(caught.value, TypeError) == (not isinstance(value, int) or isinstance(value, bool))
    assert (caught.value.name, caught.value.value) == ("max_turns", value)


def test_a_whole_float_is_not_a_turn_count_either():
    """2.0 is refused like 2.5: a prompt never says "within 2.0 turns"."""
    with pytest.raises(InvalidArgumentTypeError, match=r"max_turns=2\.0 is not allowed"):
        gem_core.make(GTN, max_turns=2.0)


@pytest.mark.parametrize(
    ("num_envs", "message"),
    [
        (2.5, "make_vec: num_envs=2.5 is not allowed: expected an integer in 1..1000000"),
        ("4", "make_vec: num_envs='4' is not allowed: expected an integer in 1..1000000"),
        (0, "make_vec: num_envs=0 is not allowed: expected an integer in 1..1000000"),
        (10**14, "make_vec: num_envs=100000000000000 is not allowed: expected an integer in 1..1000000"),
    ],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec_refuses_a_bad_num_envs(num_envs, message, mode):
    with pytest.raises(InvalidArgumentError) as caught:
        gem_core.make_vec(GTN, num_envs, vectorization_mode=mode)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("vector_kwargs", "message"),
    [
        ({"step_timeout": "5"}, "make_vec(vectorization_mode='async'): step_timeout='5' is not allowed: expected a number > 0, or None (no time limit)"),
        ({"step_timeout": -1.0}, "make_vec(vectorization_mode='async'): step_timeout=-1.0 is not allowed: expected a number > 0, or None (no time limit)"),
    ],
)
def test_async_vector_options_are_checked_before_any_worker_starts(vector_kwargs, message):
    before = set(multiprocessing.active_children())
    with pytest.raises(InvalidArgumentError) as caught:
        gem_core.make_vec(GTN, 2, vectorization_mode="async", vector_kwargs=vector_kwargs)
    assert str(caught.value) == message
    assert set(multiprocessing.active_children()) == before


def test_a_misspelled_keyword_gets_the_same_suggestion_sync_and_async():
    messages = []
    for mode in ("sync", "async"):
        with pytest.raises(UnknownKwargError) as caught:
            gem_core.make_vec(GTN, 2, vectorization_mode=mode, max_turn=3)
        messages.append(str(caught.value))
    assert messages[0] == messages[1] == (f"{GTN} does not take 'max_turn'. Did you mean: max_turns? It accepts: max_number, max_turns, min_number.")
    with pytest.raises(UnknownKwargError) as caught:
        gem_core.make(GTN, max_turn=3)
    assert str(caught.value) == messages[0]


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_step_before_any_reset_says_so(env_id):
    env = gem_core.make(env_id)
    with pytest.raises(ResetNeeded) as caught:
        env.step("\\boxed{1}")
    name = type(env.unwrapped).__name__
    assert str(caught.value) == f"{name}.step() called before reset(); call reset() first to start an episode"


@pytest.mark.parametrize("field", ["max_turns", "max_turn_tokens", "max_context_tokens"])
def test_a_dataset_row_refuses_a_negative_limit(field):
    """`--max-turns -1` is never written into a row (the CLI refuses it too: tests/core/test_cli_errors.py)."""
    with pytest.raises(ValueError, match=f"{field} must be an integer >= 1 or unset, got -1"):
        TaskSpec(GTN, seed=0, **{field: -1})


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_model_server_is_one_gem_core_error():
    from gem_core.rollout import OpenAIPolicy, run_episodes_sync
    from gem_core.rollout.http import Retry

    port = _free_port()  # nothing listens there any more
    policy = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "some-model", retry=Retry(retries=1, backoff=0.0))
    try:
        with pytest.raises(ModelRequestError) as caught:
            run_episodes_sync([GTN], policy, seeds=[0])
    finally:
        policy.close()
    error = caught.value
    assert isinstance(error, GemError) and not isinstance(error, urllib.error.URLError)
    message = str(error)
    assert message.startswith(f"cannot reach http://127.0.0.1:{port}/v1/chat/completions: ")
    assert "Connection refused" in message and message.endswith("(2 attempts)") and "\n" not in message


def test_isolation_none_warns_once():
    """One warning, through the warnings module only (it used to be logged as well: printed twice)."""
    script = textwrap.dedent(
        """
        from gem_core.tools.sandbox import PythonSandbox
        for _ in range(3):
            PythonSandbox(workers=1, isolation="none", preload=()).close()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("WITHOUT isolation") == 1, done.stderr
