"""A tau-bench-style customer-service episode: an assistant with store tools, a customer with a request.

:class:`RetailEnv` is the two-agent env (``"assistant"``, ``"user"``). The user speaks first. The
assistant's action is either a tool call, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
(the same syntax as gem_core's MCP tool; the result comes back to the assistant alone, inside
``<tool_response>``, and it acts again), or plain text: a message to the user. The user's action is a
message to the assistant; one containing ``###STOP###`` ends the episode. So does the assistant's
``transfer_to_human`` call, and the turn limit (all steps of both agents).

Reward, when the episode ends, to both agents: 1.0 if the database equals the expected one (the task's
correct calls applied to the starting database), else 0.0. The assistant also gets
``format_penalty`` (default -0.1) for a malformed or unknown tool call and for an empty or non-text
action; a call the store's rules refuse (cancelling a delivered order) is a tool error with no penalty
(the final check judges the outcome).

:class:`ScriptedUser` is the deterministic customer: it reveals what the assistant asks for, confirms,
and stops when told the request is done. :class:`RetailAssistantEnv` is the assistant's side as a plain
env with that customer: the registered ``multiagent:Retail-v0``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from gem_core.errors import InvalidArgumentError, ResetNeeded
from gem_core.multiagent import AgentView, MultiAgentEnv, MultiStepResult, Simulator
from gem_core.params import Param, check_args
from gem_core.parsing import echo, find_tagged
from gem_core.envs.retail.db import CANCEL_REASONS, TOOLS, ToolError, generate_db, pick, run_tool
from gem_core.envs.retail.tasks import TASK_KINDS, RetailTask, expected_db, generate_task

ASSISTANT, USER = "assistant", "user"
STOP = "###STOP###"
#: Longest message passed between the agents, and longest tool result: every observation stays bounded.
MAX_MESSAGE_CHARS = 2000
MAX_TOOL_CHARS = 4000
_CALL = ("<tool_call>", "</tool_call>")  # found by gem_core.parsing.find_tagged, in linear time


def tool_call(name: str, **arguments: Any) -> str:
    """The action text of one tool call."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


def _tool_list() -> str:
    return "\n".join(f"- {name}({', '.join(args)}): {what}" for name, (_, args, what) in TOOLS.items())


ASSISTANT_PROMPT = (
    "You are the customer-service agent of an online store. A customer will write to you; help them with "
    "their request using the store's tools.\n"
    "Rules: first authenticate the customer with find_user_id_by_name_zip (first name, last name, zip code). "
    "Only pending orders can be cancelled or have their address changed; only delivered orders can have "
    "items returned or exchanged (for another available variant of the same product). Refunds go to the "
    "original payment method or a gift card. Tell the customer when their request is done.\n"
    'To call a tool, write exactly one <tool_call>{"name": TOOL, "arguments": {...}}</tool_call> with JSON '
    "inside; the result comes back inside <tool_response>...</tool_response>, seen only by you. Anything "
    "else you write is sent to the customer.\n"
    f"Tools:\n{_tool_list()}"
)


class RetailEnv(MultiAgentEnv):
    """The retail domain's two-agent episode (see the module docstring).

    ``max_turns``: steps of both agents together. ``task_kind``: one of :data:`TASK_KINDS`, or ``None`` to
    draw one per episode. ``num_users``: customers in the generated database. ``format_penalty``: the
    assistant's reward for a malformed tool call or a non-text action.
    """

    agents = (ASSISTANT, USER)
    params: ClassVar[dict[str, Param]] = {
        "max_turns": Param(int, low=2, high=200),
        "task_kind": Param(str, choices=TASK_KINDS, none="drawn per episode"),
        "num_users": Param(int, low=1, high=50),
        "format_penalty": Param(float, low=-10, high=0),
    }

    def __init__(self, max_turns: int = 30, task_kind: str | None = None, num_users: int = 6, format_penalty: float = -0.1):
        check_args(type(self), {"max_turns": max_turns, "task_kind": task_kind, "num_users": num_users, "format_penalty": format_penalty}, type(self).__name__)
        self.max_turns = int(max_turns)
        self.task_kind = task_kind
        self.num_users = int(num_users)
        self.format_penalty = float(format_penalty)
        self.db: dict[str, Any] = {}
        self.expected: dict[str, Any] = {}
        self.task: RetailTask | None = None
        self.turn = 0
        self._current: str | None = None
        self._assistant_steps = 0

    # -- the API ---------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        kind = self.task_kind or pick(rng, TASK_KINDS)
        self.db = generate_db(rng, self.num_users)
        self.task = generate_task(rng, self.db, kind)
        self.expected = expected_db(self.db, self.task)
        self.turn = 0
        self._assistant_steps = 0
        self._current = USER
        observations = {ASSISTANT: ASSISTANT_PROMPT, USER: self.task.instruction()}
        return observations, {"task_kind": kind, "user_task": self.task.user_view(), "tool_turn": False}

    @property
    def current_agent(self) -> str | None:
        return self._current

    def step(self, action: str) -> MultiStepResult:
        if self._current is None:
            raise ResetNeeded("RetailEnv.step() called on a finished episode (or before reset()); call reset() first")
        agent = self._current
        self.turn += 1
        if agent == ASSISTANT:
            self._assistant_steps += 1
            observations, penalty, ended, info = self._assistant(action)
            rewards = {ASSISTANT: penalty, USER: 0.0}
        else:
            observations, ended, info = self._user(action)
            rewards = {ASSISTANT: 0.0, USER: 0.0}
        truncated = not ended and self.turn >= self.max_turns
        if ended or truncated:
            success = self.db == self.expected
            self._current = None
            for name in rewards:
                rewards[name] += float(success)
            info.update(success=success, task_kind=self.task.kind if self.task else None)
            if truncated:
                info["truncation_reason"] = "max_turns"
        return observations, rewards, ended, truncated, info

    def _assistant(self, action: Any) -> tuple[dict[str, str], float, bool, dict[str, Any]]:
        """(observations, penalty, ended, info) of the assistant's action."""
        info: dict[str, Any] = {"agent": ASSISTANT, "format_error": False, "invalid_action": False, "tool_turn": False}
        if not isinstance(action, str) or not action.strip():
            info["format_error"] = True
            what = "an empty message" if isinstance(action, str) else f"a {type(action).__name__}, not text"
            return {ASSISTANT: f"Your action was {what}. Write a message to the customer, or a <tool_call>."}, self.format_penalty, False, info
        opened = action.find("<tool_call>")
        if opened < 0:  # a message to the customer
            self._current = USER
            return {USER: _bounded(action.strip())}, 0.0, False, info
        info["tool_turn"] = True
        match = find_tagged(action, *_CALL, start=opened)
        if match is None:
            info["format_error"] = True
            return {ASSISTANT: _response("error: the <tool_call> is not closed with </tool_call>")}, self.format_penalty, False, info
        try:
            request = json.loads(match.body)
        except (json.JSONDecodeError, RecursionError) as exc:
            info["format_error"] = True
            detail = f"{exc.msg} at position {exc.pos}" if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            return {ASSISTANT: _response(f"error: the tool call is not valid JSON ({detail}): {echo(match.body)}")}, self.format_penalty, False, info
        arguments = request.get("arguments", {}) if isinstance(request, dict) else None
        if not isinstance(request, dict) or not isinstance(request.get("name"), str) or not isinstance(arguments, dict):
            info["format_error"] = True
            return {ASSISTANT: _response('error: a tool call is a JSON object {"name": TOOL, "arguments": {...}}')}, self.format_penalty, False, info
        name = request["name"]
        info["tool"] = name
        if name not in TOOLS:
            info["invalid_action"] = True
            return {ASSISTANT: _response(f"error: there is no tool {echo(name)}; available: {', '.join(TOOLS)}")}, self.format_penalty, False, info
        if name == "transfer_to_human":
            info["transferred"] = True
            return (
                {ASSISTANT: _response("The conversation was transferred to a human agent."), USER: "You are being transferred to a human agent."},
                0.0,
                True,
                info,
            )
        try:
            result = run_tool(self.db, name, arguments)
            info["tool_ok"] = True
        except ToolError as exc:
            result, info["tool_ok"] = f"error: {exc}", False
            info["invalid_action"] = True
        except (TypeError, ValueError, AttributeError, KeyError) as exc:  # arguments of a type the tool cannot use
            result, info["tool_ok"] = f"error: bad arguments for {name}: {type(exc).__name__}", False
            info["invalid_action"] = True
        return {ASSISTANT: _response(result)}, 0.0, False, info

    def _user(self, action: Any) -> tuple[dict[str, str], bool, dict[str, Any]]:
        text = action if isinstance(action, str) else ""
        info: dict[str, Any] = {"agent": USER, "tool_turn": False}
        if STOP in text:
            info["user_stopped"] = True
            message = text.replace(STOP, "").strip()
            return ({ASSISTANT: _bounded(message)} if message else {}), True, info
        self._current = ASSISTANT
        return {ASSISTANT: _bounded(text.strip()) or "(the customer sent an empty message)"}, False, info

    # -- helpers for tests, eval baselines and the env checker ----------------------------------------
    def sample_random_action(self) -> str:
        rng = self.np_random
        if self._current == USER:
            return pick(rng, ("Hello, I need help with my order.", "Yes, please go ahead.", "I am not sure.", f"Thanks! {STOP}"))
        users = sorted(self.db["users"]) or [""]
        user = self.db["users"].get(pick(rng, users), {})
        order_ids = sorted(self.db["orders"]) or ["#W0000000"]
        order_id = pick(rng, order_ids)
        choice = int(rng.integers(9))
        if choice == 0:
            return pick(rng, ("Could you tell me your name and zip code?", "What is your order id?", "Your request is complete. Anything else?"))
        if choice == 1 and user:
            return tool_call("find_user_id_by_name_zip", first_name=user["name"]["first_name"], last_name=user["name"]["last_name"], zip=user["address"]["zip"])
        if choice == 2:
            return tool_call("get_user_details", user_id=pick(rng, users))
        if choice == 3:
            return tool_call("get_product_details", product_id=pick(rng, sorted(self.db["products"]) or [""]))
        if choice == 4:
            return tool_call("cancel_pending_order", order_id=order_id, reason=pick(rng, CANCEL_REASONS))
        if choice == 5:
            items = [item["item_id"] for item in self.db["orders"].get(order_id, {}).get("items", [])][:1]
            methods = sorted(self.db["users"].get(self.db["orders"].get(order_id, {}).get("user_id"), {}).get("payment_methods", {})) or [""]
            return tool_call("return_delivered_order_items", order_id=order_id, item_ids=items, payment_method_id=pick(rng, methods))
        if choice == 6:
            return '<tool_call>{"name": "get_order_details", "arguments": ' + pick(rng, ("{", "[1]}", "{}}")) + "</tool_call>"  # malformed
        if choice == 7 and int(rng.integers(4)) == 0:
            return tool_call("transfer_to_human", summary="The customer needs help.")
        return tool_call("get_order_details", order_id=order_id)

    def oracle_plan(self) -> list[str]:
        """The assistant's actions that solve the task with :class:`ScriptedUser`: ask, authenticate, look
        the order up, make the change, say it is done."""
        assert self.task is not None, "reset() first"
        done = {
            "cancel": "has been cancelled",
            "modify_address": "has been updated with the new address",
            "return": "return has been requested",
            "exchange": "exchange has been requested",
        }[self.task.kind]
        return [
            "Hello! To help you, please tell me your first and last name, your zip code and your order id.",
            *(tool_call(a["name"], **a["arguments"]) for a in self.task.actions),
            f"Your order {self.task.order_id} {done}. Is there anything else I can help you with?",
        ]

    def oracle_action(self) -> str:
        """The next action of :meth:`oracle_plan` (by the number of assistant actions so far)."""
        plan = self.oracle_plan()
        return plan[min(self._assistant_steps, len(plan) - 1)]

    def default_simulators(self) -> dict[str, Simulator]:
        return {USER: ScriptedUser()}


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + f" [... cut at {MAX_MESSAGE_CHARS} of {len(text)} characters]"


def _response(text: str) -> str:
    if len(text) > MAX_TOOL_CHARS:
        text = text[:MAX_TOOL_CHARS] + f" [... cut at {MAX_TOOL_CHARS} characters]"
    return f"<tool_response>\n{text}\n</tool_response>"


# ------------------------------------------------------------------------------------------------
# The scripted customer.
# ------------------------------------------------------------------------------------------------

# topic -> words in the assistant's message that ask about it
_ASKS = {
    "name": ("name",),
    "zip": ("zip", "postal", "post code"),
    "order": ("order id", "order number", "which order", "order #"),
    "reason": ("reason", "why"),
    "address": ("address",),
    "items": ("item", "which product", "what would you like to return", "what would you like to exchange"),
    "new item": ("new", "variant", "option", "instead", "prefer", "which one"),
    "payment": ("payment", "refund", "card", "pay"),
}
_DONE = ("has been", "is complete", "is done", "successfully", "anything else")
_CONFIRM = ("confirm", "proceed", "shall i", "should i", "would you like me", "go ahead", "(yes/no)", "is that correct", "is this correct")


class ScriptedUser(Simulator):
    """The deterministic customer of a retail task (read from the reset info's ``user_task``).

    First message: the request in a sentence. Then, to each assistant message: the facts it asks about
    (by keywords: name, zip, order id, reason, address, items, payment...), "yes" to a confirmation
    question, and ``###STOP###`` once told the request is done. A message that asks nothing it knows gets
    the whole request restated with every fact. After ``max_messages`` messages it gives up (``###STOP###``).
    """

    def __init__(self, max_messages: int = 10):
        self.max_messages = max_messages
        self.task: dict[str, Any] = {}
        self.sent = 0

    def reset(self, observation: str, info: Mapping[str, Any]) -> None:
        task = info.get("user_task")
        if not isinstance(task, dict):
            raise InvalidArgumentError("ScriptedUser needs the retail env's reset info (its 'user_task')")
        self.task = copy.deepcopy(task)
        self.sent = 0

    def act(self, observation: str) -> str:
        self.sent += 1
        facts: dict[str, str] = self.task["facts"]
        if self.sent == 1:
            return f"Hi! I would like to {self.task['request']}"
        if self.sent > self.max_messages:
            return f"Sorry, I have to go now. {STOP}"
        text = observation.lower()
        if any(word in text for word in _DONE):
            return f"Great, thank you! That is all. {STOP}"
        answers = [fact for topic, fact in facts.items() if any(word in text for word in _ASKS.get(topic, ()))]
        if any(word in text for word in _CONFIRM):
            answers.append("Yes, please go ahead.")
        if not answers:
            answers = [f"To be clear: I would like to {self.task['request']}", *facts.values()]
        return " ".join(answers)


class RetailAssistantEnv(AgentView):
    """The assistant's side of :class:`RetailEnv` as a plain env, with :class:`ScriptedUser` as the
    customer (``multiagent:Retail-v0``). Arguments as :class:`RetailEnv`; ``oracle_action`` plays the
    task's solution (``gem-core eval --policy oracle``)."""

    params: ClassVar[dict[str, Param]] = RetailEnv.params

    def __init__(self, max_turns: int = 30, task_kind: str | None = None, num_users: int = 6, format_penalty: float = -0.1):
        super().__init__(RetailEnv(max_turns=max_turns, task_kind=task_kind, num_users=num_users, format_penalty=format_penalty), ASSISTANT)
