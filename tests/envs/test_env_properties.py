"""Property-based tests over every registered env id (hypothesis).

For each id: kwargs drawn within and outside the ranges the env class declares (``params``, see
gem_core.params), then random and hostile actions. The contract: ``make`` raises nothing but
:class:`~gem_core.errors.InvalidArgumentError` (exactly when a value is outside its declared range, or
a rule between arguments is broken); reset and step raise nothing; every message to the model stays
within :data:`gem_core.core.MAX_OBSERVATION_CHARS`; text that is not a ``\\boxed{}`` move (``\\fbox``,
non-strings) is a format error. Each id runs a handful of examples, so the whole file takes seconds.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gem_core
from gem_core.core import MAX_OBSERVATION_CHARS, model_message
from gem_core.errors import InvalidArgumentError, UnknownKwargError
from gem_core.multimodal import MAX_IMAGE_SIDE, MAX_IMAGES, MultimodalObservation, observation_text
from gem_core.params import Param
from gem_core.parsing import ECHO_CHARS
from gem_core.registry import accepted_kwargs
from gem_core.testing.task_data import generic_test_ids

# The project's own ids: other test modules register throwaway envs (test:*) in the same process.
ENV_IDS = [env_id for env_id in gem_core.list_envs() if not env_id.startswith("test:")]
# The hypothesis tests run a sample of the 105 rg:* ids (one class; tests/envs/test_reasoning_gym.py plays each).
PLAYED_IDS = generic_test_ids(ENV_IDS)
# 12 examples per id keep the file at a few seconds in CI; GEM_PROPERTY_EXAMPLES=500 digs deeper by hand.
EXAMPLES = int(os.environ.get("GEM_PROPERTY_EXAMPLES", "12"))
PROPERTY_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


def _int_range(param: Param) -> tuple[int, int]:
    low = int(param.low) if param.low is not None else int(param.above or 0) + 1
    high = int(param.high) if param.high is not None else low + 1000
    return low, high


def valid_values(param: Param) -> st.SearchStrategy[Any]:
    """Values ``param`` allows."""
    if param.choices is not None:
        one: st.SearchStrategy[Any] = st.sampled_from(param.choices)
    elif param.kind is bool:
        one = st.booleans()
    elif param.kind is int:
        one = st.integers(*_int_range(param))
    elif param.kind is float:
        low, high = _int_range(param)
        one = st.floats(min_value=float(low), max_value=float(high))
    else:
        one = st.text(max_size=10)
    if param.pair:
        item = one | st.none() if param.none else one
        one = st.tuples(item, item)
    return one | st.none() if param.none else one


def invalid_values(param: Param) -> st.SearchStrategy[Any]:
    """Values ``param`` refuses: the wrong type, or outside its range."""
    wrong_type: list[Any] = ([] if param.kind is str else ["5"]) + [[1], b"x"] + ([] if param.kind is float else [2.5]) + ([] if param.kind is bool else [True])
    if not param.none:
        wrong_type.append(None)
    options: list[st.SearchStrategy[Any]] = [st.sampled_from(wrong_type)]
    if param.kind is int and param.choices is None:
        low, high = _int_range(param)
        options.append(st.integers(max_value=low - 1))
        if param.high is not None:
            options.append(st.integers(min_value=high + 1))
    if param.choices is not None and param.kind is int:
        options.append(st.integers(-5, 100).filter(lambda v: v not in param.choices))
    one = st.one_of(options)
    if param.pair:
        low = _int_range(param)[0]
        return one | st.tuples(st.just(low), one) | st.just((low, low, low))
    return one


def free_text(param: Param) -> bool:
    """Names of files, fields and datasets (a task env's ``data_files``, ``question_key``...): any text is
    of the right type, and whether it names something is checked when it is used (tests/envs/test_datasets.py)."""
    return param.kind is str and param.choices is None


@st.composite
def kwargs_for(draw: Any, params: dict[str, Param]) -> tuple[dict[str, Any], list[str]]:
    """Kwargs for an env class and the names whose value is outside what they allow."""
    kwargs: dict[str, Any] = {}
    bad: list[str] = []
    for name, param in params.items():
        if free_text(param):
            continue
        choice = draw(st.sampled_from(["omit", "valid", "valid", "invalid"]))
        if choice == "valid":
            kwargs[name] = draw(valid_values(param))
        elif choice == "invalid":
            kwargs[name] = draw(invalid_values(param))
            bad.append(name)
    return kwargs, bad


def actions(env: gem_core.Env) -> st.SearchStrategy[Any]:
    """Random moves and hostile text: huge answers, deep braces, other boxes, non-strings."""
    return st.one_of(
        st.builds(env.sample_random_action),
        st.text(max_size=60),
        st.text(max_size=60).map(lambda t: "\\boxed{" + t + "}"),
        st.integers(0, 300_000).map(lambda n: "\\boxed{" + "9" * n + "}"),
        st.integers(0, 300_000).map(lambda n: "\\boxed" + "{" * n),
        st.integers(0, 1000).map(lambda n: "\\boxed{" + "{}" * n + "}"),
        st.sampled_from([None, 5, b"\\boxed{1}", ["\\boxed{1}"], "\\boxed{}", "\\boxed{ }", "\\boxed", "\\boxed{\n}", "\\boxed{\x00}"]),
    )


def _check_message(env_id: str, observation: Any, info: dict[str, Any], *, question: bool = False) -> None:
    """``question``: a reset message of an env whose prompt is a dataset's question (math, code, QA, rg):
    its length is the data's, not the env's, so only the type is checked."""
    assert isinstance(observation, (str, MultimodalObservation)), env_id
    if isinstance(observation, MultimodalObservation):  # vision envs: bounded images, the text as any other
        assert len(observation.images) <= MAX_IMAGES and all(max(image.size) <= MAX_IMAGE_SIDE for image in observation.images), env_id
    if question:
        return
    message = observation_text(model_message(observation, info))
    assert len(message) <= MAX_OBSERVATION_CHARS, f"{env_id}: {len(message)} characters: {message[:200]!r}"


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_every_constructor_argument_is_declared(env_id: str) -> None:
    factory = gem_core.spec(env_id).load()
    assert set(factory.params) == accepted_kwargs(factory), f"{env_id}: declare every argument in params"
    for name, param in factory.params.items():
        assert param.allowed(), name


@pytest.mark.parametrize("env_id", PLAYED_IDS)
@PROPERTY_SETTINGS
@given(data=st.data())
def test_kwargs_and_actions_never_raise_but_the_validation_error(env_id: str, data: Any) -> None:
    factory = gem_core.spec(env_id).load()
    kwargs, bad = data.draw(kwargs_for(factory.params), label="kwargs")
    try:
        env = gem_core.make(env_id, **kwargs)
    except InvalidArgumentError as err:
        message = str(err)
        assert "\n" not in message and message.startswith(f"{env_id}: ")
        # The argument named is one given, or (a rule between arguments) one of the defaults it clashes with.
        assert err.name in factory.params and f"{err.name}=" in message and "expected" in message
        assert err.name in kwargs or not bad
        assert len(message) < 400  # the value is echoed bounded
        if not bad:  # every value allowed on its own: a rule between arguments refused them
            assert not isinstance(err, TypeError), message
        return
    assert not bad, f"{env_id} accepted {[(name, kwargs[name]) for name in bad]}"
    from_data = getattr(env.unwrapped, "prompt_from_data", False)
    with env:
        observation, info = env.reset(seed=data.draw(st.integers(0, 2**32), label="seed"))
        _check_message(env_id, observation, info, question=from_data)
        for action in data.draw(st.lists(actions(env), min_size=1, max_size=5), label="actions"):
            observation, _reward, terminated, truncated, info = env.step(action)
            _check_message(env_id, observation, info)
            boxed = getattr(env.unwrapped, "answer_format", "boxed") == "boxed"  # QA envs read <answer> tags
            if boxed and (not isinstance(action, str) or "\\boxed" not in action):
                assert info["format_error"], (env_id, action)
            if terminated or truncated:
                observation, info = env.reset()
                _check_message(env_id, observation, info, question=from_data)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_a_misspelled_kwarg_is_refused_with_a_suggestion(env_id: str) -> None:
    factory = gem_core.spec(env_id).load()
    name = sorted(factory.params)[0]
    with pytest.raises(UnknownKwargError, match=f"Did you mean: {name}"):
        gem_core.make(env_id, **{name[:-1] + name[-1].upper(): 1})


@pytest.mark.parametrize("env_id", [i for i in ENV_IDS if i.endswith("-v0-easy")])
def test_a_10_mb_answer_is_read_fast_and_echoed_bounded(env_id: str) -> None:
    env = gem_core.make(env_id)
    for content in ("1" * 10_000_000, "1 " * 5_000_000, "a" * 10_000_000):
        env.reset(seed=0)
        start = time.process_time()  # CPU seconds: the read's own cost, not the machine's load
        observation, _reward, _terminated, _truncated, info = env.step("\\boxed{" + content + "}")
        elapsed = time.process_time() - start
        # A linear read takes ~0.1 CPU s; a quadratic one (or a backtracking regex) over 10 MB takes
        # hours: the bound separates the two, not machines.
        assert elapsed < 15.0, f"{env_id}: {elapsed:.2f} CPU s"
        assert info["invalid_action"] and not info["format_error"]
        assert f"({len(content)} chars)" in observation and content[:ECHO_CHARS] + "…" in observation
        assert len(model_message(observation, info)) <= MAX_OBSERVATION_CHARS


@pytest.mark.parametrize("env_id", [i for i in ENV_IDS if i.endswith("-v0-easy")])
def test_fbox_is_not_a_move(env_id: str) -> None:
    env = gem_core.make(env_id)
    env.reset(seed=0)
    move = env.sample_random_action().replace("\\boxed", "\\fbox")
    _obs, reward, _terminated, _truncated, info = env.step(move)
    assert info["format_error"] and reward == env.unwrapped.format_error_reward
