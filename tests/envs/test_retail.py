"""The retail customer-service domain (multiagent:Retail-v0): a generated store, the assistant's tools,
the scripted customer, and success judged by the database's final state."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gem_core
from gem_core.core import MAX_OBSERVATION_CHARS, model_message
from gem_core.envs.retail.db import ToolError, generate_db, run_tool
from gem_core.envs.retail.env import STOP, RetailAssistantEnv, RetailEnv, ScriptedUser, tool_call
from gem_core.envs.retail.tasks import TASK_KINDS
from gem_core.multiagent import AgentView
from gem_core.errors import InvalidArgumentError, ResetNeeded

ID = "multiagent:Retail-v0"


def play(env, actions):
    """Step ``actions`` until the episode ends; (rewards, last info, last observation)."""
    rewards, info, obs = [], {}, ""
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            break
    return rewards, info, obs


def solve(env, seed):
    env.reset(seed=seed)
    return play(env, iter(env.oracle_action, None))


@pytest.mark.parametrize("kind", TASK_KINDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_scripted_assistant_solves_every_kind_of_task(kind, seed):
    env = gem_core.make(ID, task_kind=kind)
    rewards, info, _ = solve(env, seed)
    assert info["success"] and info["task_kind"] == kind and info["user_stopped"]
    assert rewards[-1] == 1.0 and sum(rewards) == 1.0
    assert env.multi_env.db == env.multi_env.expected and env.multi_env.db != _start_db(env, seed)


def test_every_seeds_task_can_be_done():
    """Every generated task's correct calls succeed on its database (seed 1371 drew an exchange for a dearer variant
    paid by a gift card holding less than the difference: reset raised the store's refusal)."""
    env = RetailEnv()
    for seed in range(3000):
        env.reset(seed=seed)  # expected_db runs the task's calls: a refused one raises
    env = gem_core.make(ID, task_kind="exchange")
    rewards, info, _ = solve(env, 1371)
    assert info["success"] and rewards[-1] == 1.0


def _start_db(env, seed):
    fresh = RetailEnv(task_kind=env.multi_env.task_kind)
    fresh.reset(seed=seed)
    return fresh.db


def test_tasks_are_generated_from_the_seed():
    a, b = RetailEnv(), RetailEnv()
    a.reset(seed=5)
    b.reset(seed=5)
    assert a.db == b.db and a.task == b.task and a.expected == b.expected
    kinds = set()
    for seed in range(12):
        a.reset(seed=seed)
        kinds.add(a.task.kind)
        assert a.db != a.expected  # every task changes the database
    assert kinds == set(TASK_KINDS)
    b.reset(seed=6)
    assert a.db != b.db


@pytest.mark.parametrize(
    "kind, wrong",
    [
        ("cancel", lambda task: tool_call("cancel_pending_order", order_id=task.order_id, reason=_other_reason(task))),
        ("modify_address", lambda task: tool_call("modify_pending_order_address", **{**task.actions[2]["arguments"], "zip": "00000"})),
        ("return", lambda task: tool_call("cancel_pending_order", order_id=task.order_id, reason="no longer needed")),
        (
            "exchange",
            lambda task: tool_call(
                "return_delivered_order_items",
                order_id=task.order_id,
                item_ids=task.actions[2]["arguments"]["item_ids"],
                payment_method_id=task.actions[2]["arguments"]["payment_method_id"],
            ),
        ),
    ],
)
def test_a_wrong_action_gets_zero(kind, wrong):
    env = gem_core.make(ID, task_kind=kind)
    env.reset(seed=3)
    plan = env.multi_env.oracle_plan()
    plan[3] = wrong(env.multi_env.task)
    rewards, info, _ = play(env, plan)
    assert info["user_stopped"] and not info["success"] and rewards[-1] == 0.0 and sum(rewards) == 0.0


def _other_reason(task):
    return "ordered by mistake" if task.actions[2]["arguments"]["reason"] == "no longer needed" else "no longer needed"


def test_saying_done_without_acting_and_transferring_get_zero():
    env = gem_core.make(ID)
    env.reset(seed=0)
    rewards, info, _ = play(env, ["Your request has been handled. Anything else?"])
    assert info["user_stopped"] and rewards == [0.0]
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(tool_call("transfer_to_human", summary="help"))
    assert terminated and not truncated and reward == 0.0 and info["transferred"] and "human" in obs


def test_the_store_refuses_what_its_rules_forbid_without_penalty():
    env = gem_core.make(ID, task_kind="return")  # the task's order is delivered
    env.reset(seed=1)
    task, before = env.multi_env.task, copy.deepcopy(env.multi_env.db)
    obs, reward, terminated, _, info = env.step(tool_call("cancel_pending_order", order_id=task.order_id, reason="no longer needed"))
    assert "only a pending order can be cancelled" in obs and "<tool_response>" in obs
    assert reward == 0.0 and not terminated and info["invalid_action"] and info["tool_ok"] is False and info["tool_turn"]
    assert env.multi_env.db == before
    for name, arguments, message in [
        ("get_order_details", {"order_id": "#W0"}, "order not found"),
        ("find_user_id_by_name_zip", {"first_name": "No", "last_name": "Body", "zip": "1"}, "user not found"),
        ("get_order_details", {}, "missing ['order_id']"),
        ("get_order_details", {"order_id": task.order_id, "x": 1}, "unexpected ['x']"),
        ("return_delivered_order_items", {"order_id": task.order_id, "item_ids": "abc", "payment_method_id": "p"}, "item_ids must be a non-empty list"),
    ]:
        obs, reward, *_ = env.step(tool_call(name, **arguments))
        assert message in obs and reward == 0.0, obs
    assert env.multi_env.db == before


@pytest.mark.parametrize(
    "action, message, flag",
    [
        ('<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}', "not closed", "format_error"),
        ("<tool_call>{name: get_order_details}</tool_call>", "not valid JSON", "format_error"),
        ('<tool_call>["get_order_details"]</tool_call>', 'a tool call is a JSON object {"name"', "format_error"),
        ('<tool_call>{"name": "get_order_details", "arguments": [1]}</tool_call>', 'a tool call is a JSON object {"name"', "format_error"),
        ('<tool_call>{"name": "refund_everything", "arguments": {}}</tool_call>', "there is no tool 'refund_everything'", "invalid_action"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON", "format_error"),
        ("   ", "empty message", "format_error"),
        (None, "a NoneType, not text", "format_error"),
        (b"bytes", "a bytes, not text", "format_error"),
    ],
)
def test_malformed_calls_are_penalised_with_one_clear_message(action, message, flag):
    env = gem_core.make(ID)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert message in obs and info[flag] and reward == pytest.approx(-0.1)
    assert not terminated and not truncated
    assert len(model_message(obs, info)) <= MAX_OBSERVATION_CHARS
    assert env.multi_env.current_agent == "assistant"  # the assistant acts again; the customer saw nothing


def test_every_observation_stays_bounded_for_huge_inputs():
    env = gem_core.make(ID)
    env.reset(seed=0)
    huge = "x" * 1_000_000
    for action in (huge, '<tool_call>{"name": "' + huge + '", "arguments": {}}</tool_call>', tool_call("get_order_details", order_id=huge)):
        obs, _, terminated, truncated, info = env.step(action)
        assert len(model_message(obs, info)) <= MAX_OBSERVATION_CHARS
        if terminated or truncated:
            env.reset(seed=0)


def test_turn_order_and_who_sees_what():
    env = RetailEnv()
    observations, info = env.reset(seed=4)
    assert env.agents == ("assistant", "user") and env.current_agent == "user"
    assert "find_user_id_by_name_zip" in observations["assistant"] and "###STOP###" in observations["user"]
    assert env.task.order_id in observations["user"] and env.task.order_id not in observations["assistant"]
    assert "actions" not in info["user_task"]  # the customer's view holds no solution
    obs, rewards, *_ = env.step("Hi, I need help.")
    assert obs == {"assistant": "Hi, I need help."} and env.current_agent == "assistant" and rewards == {"assistant": 0.0, "user": 0.0}
    obs, rewards, *_ = env.step(tool_call("get_user_details", user_id=env.task.user_id))
    assert set(obs) == {"assistant"} and env.current_agent == "assistant"  # a tool's result goes to the assistant alone
    obs, *_ = env.step("What is your order id?")
    assert obs == {"user": "What is your order id?"} and env.current_agent == "user"
    obs, rewards, terminated, truncated, info = env.step(f"Bye {STOP}")
    assert terminated and env.current_agent is None and rewards == {"assistant": 0.0, "user": 0.0} and obs == {"assistant": "Bye"}
    with pytest.raises(ResetNeeded):
        env.step("again")


def test_the_turn_limit_truncates_and_still_judges_the_database():
    env = RetailEnv(max_turns=6, task_kind="cancel")
    env.reset(seed=2)
    plan = env.oracle_plan()
    env.step("Hi")  # user
    for action in plan[1:4]:  # the three calls, without talking to the customer
        result = env.step(action)
    env.step("Done?")  # assistant -> user
    obs, rewards, terminated, truncated, info = env.step("What do you mean?")  # the 6th step
    assert truncated and not terminated and info["truncation_reason"] == "max_turns"
    assert info["success"] and rewards == {"assistant": 1.0, "user": 1.0}
    assert result[2] is False


def test_the_scripted_user_answers_what_is_asked_confirms_and_stops():
    env = RetailEnv(task_kind="exchange")
    _, info = env.reset(seed=0)
    user = ScriptedUser(max_messages=5)
    user.reset("", info)
    task = env.task
    assert user.act("").startswith("Hi! I would like to exchange") and " my delivered order" in user.act("")  # first-person request
    user.reset("", info)
    user.act("")
    assert user.act("What is your zip code?") == f"My zip code is {task.zip}."
    answer = user.act("Which item, and which payment method? Shall I proceed?")
    assert task.facts["items"] in answer and task.facts["payment"] in answer and "Yes, please go ahead." in answer
    assert user.act("Hmm.").startswith("To be clear: I would like to exchange")  # nothing asked: the whole request
    assert STOP in user.act("Your exchange has been requested.")
    assert STOP in user.act("anything")  # the 6th message: it gives up
    with pytest.raises(InvalidArgumentError, match="user_task"):
        ScriptedUser().reset("", {})


def test_state_roundtrip_clone_and_step_after_end():
    env = gem_core.make(ID)
    env.reset(seed=8)
    plan = env.multi_env.oracle_plan()
    env.step(plan[0])
    state = env.get_state()
    twin = env.clone()
    first = play(env, plan[1:])
    assert first[0][-1] == 1.0
    with pytest.raises(ResetNeeded):
        env.step("more")
    env.set_state(state)
    assert play(env, plan[1:])[0] == first[0]
    assert play(twin, plan[1:])[0] == first[0]
    assert twin.others["user"] is not env.others["user"] and twin.multi_env is not env.multi_env


def test_params_are_declared_and_checked():
    assert isinstance(gem_core.make(ID), RetailAssistantEnv) and isinstance(gem_core.make(ID), AgentView)
    with pytest.raises(InvalidArgumentError, match="task_kind"):
        gem_core.make(ID, task_kind="refund")
    with pytest.raises(InvalidArgumentError, match="max_turns"):
        gem_core.make(ID, max_turns=1)
    env = gem_core.make(ID, num_users=1, max_turns=10)
    env.reset(seed=0)
    assert len(env.multi_env.db["users"]) == 1 and env.max_turns == 10


def test_tools_on_the_db_directly():
    import numpy as np

    db = generate_db(np.random.default_rng(0), 4)
    user = next(iter(db["users"].values()))
    assert (
        run_tool(
            db,
            "find_user_id_by_name_zip",
            {"first_name": user["name"]["first_name"].upper(), "last_name": user["name"]["last_name"], "zip": user["address"]["zip"]},
        )
        == user["user_id"]
    )
    order_id = user["orders"][0]
    assert json.loads(run_tool(db, "get_order_details", {"order_id": order_id[1:]}))["order_id"] == order_id  # "#" optional
    with pytest.raises(ToolError, match="there is no tool"):
        run_tool(db, "transfer_to_human", {"summary": ""})  # the env handles it, not the database


def test_list_and_eval_run_it(tmp_path, capsys):
    from gem_core.cli import main

    assert main(["list"]) == 0
    assert ID in capsys.readouterr().out
    out = tmp_path / "results.jsonl"
    assert main(["eval", ID, "--policy", "oracle", "--episodes", "4", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(row["success"] and row["error"] is None for row in rows)
    assert main(["eval", ID, "--policy", "random", "--episodes", "2", "--out", str(tmp_path / "random.jsonl")]) == 0


@settings(max_examples=40, deadline=None, database=None)
@given(
    seed=st.integers(0, 2**32),
    script=st.lists(
        st.one_of(st.none(), st.text(max_size=40), st.sampled_from(["sample", STOP, "<tool_call>", "<tool_call>{}</tool_call>"])), min_size=1, max_size=40
    ),
)
def test_both_agents_acting_anything_never_raise(seed, script):
    """The two-agent env itself, either agent acting random moves or junk: valid results, bounded texts,
    the end within max_turns."""
    env = RetailEnv(max_turns=12)
    observations, _ = env.reset(seed=seed)
    for step in range(1, env.max_turns + 1):
        action = script[step % len(script)]
        action = env.sample_random_action() if action == "sample" else action
        observations, rewards, terminated, truncated, info = env.step(action)
        assert set(observations) <= {"assistant", "user"} and set(rewards) == {"assistant", "user"}
        assert all(isinstance(text, str) and len(text) <= MAX_OBSERVATION_CHARS for text in observations.values())
        assert all(isinstance(r, float) for r in rewards.values()) and not (terminated and truncated)
        if terminated or truncated:
            assert env.current_agent is None and info["success"] in (True, False)
            return
    pytest.fail("the episode did not end within max_turns")
