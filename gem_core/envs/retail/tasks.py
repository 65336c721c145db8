"""Tasks of the retail domain, generated per seed: what the customer wants, what they know, and the
correct tool calls, whose result on a copy of the database is the expected final state.

Four kinds: ``cancel`` a pending order, ``modify_address`` of a pending order, ``return`` items of a
delivered order, ``exchange`` an item of a delivered order for another variant of the same product.
"""

from __future__ import annotations

import copy
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gem_core.envs.retail.db import CANCEL_REASONS, pick, random_address, run_tool

TASK_KINDS = ("cancel", "modify_address", "return", "exchange")

_REASON_WORDS = {"no longer needed": "you no longer need it", "ordered by mistake": "you ordered it by mistake"}


@dataclass
class RetailTask:
    """One customer's request. ``facts``: topic -> what the customer says about it when asked (name, zip,
    order id, ...). ``actions``: the correct calls, ``[{"name": tool, "arguments": {...}}]``."""

    kind: str
    user_id: str
    first_name: str
    last_name: str
    zip: str
    order_id: str
    goal: str
    facts: dict[str, str] = field(default_factory=dict)
    actions: list[dict[str, Any]] = field(default_factory=list)

    def instruction(self) -> str:
        """What the user agent is told: who they are, what they want, what they know, how to finish."""
        known = "\n".join(f"- {topic}: {text}" for topic, text in self.facts.items())
        return (
            "You are a customer of an online store, chatting with its support agent. Stay in character.\n"
            f"Your name is {self.first_name} {self.last_name} and your zip code is {self.zip}.\n"
            f"What you want: {self.goal}\n"
            f"What you know (tell the agent only what it asks for):\n{known}\n"
            "Confirm when the agent asks you to. When your request is done (or cannot be done), end the "
            "conversation with a message containing ###STOP###. Write only your next message to the agent."
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def user_view(self) -> dict[str, Any]:
        """What the customer knows (no solution): the reset info's ``user_task``."""
        return {k: v for k, v in self.to_dict().items() if k != "actions"} | {"request": first_person(self.goal)}


def first_person(goal: str) -> str:
    """The goal as the customer says it ("cancel your order ... because you ..." -> "my order ... because I ...")."""
    return re.sub(r"\byou\b", "I", re.sub(r"\byour\b", "my", goal))


def _describe(item: dict[str, Any]) -> str:
    options = ", ".join(f"{k} {v}" for k, v in item["options"].items())
    return f"the {item['name']} ({options})"


def generate_task(rng: np.random.Generator, db: dict[str, Any], kind: str) -> RetailTask:
    """A task of ``kind`` on ``db``: one user's order is set to the status the task needs (the database is
    changed in place, before the episode starts), so every task can be solved."""
    if kind not in TASK_KINDS:
        raise ValueError(f"task kind must be one of {TASK_KINDS}, got {kind!r}")
    user = db["users"][pick(rng, sorted(db["users"]))]
    order = db["orders"][pick(rng, user["orders"])]
    order["status"] = "pending" if kind in ("cancel", "modify_address") else "delivered"
    first, last = user["name"]["first_name"], user["name"]["last_name"]
    payment = order["payment_history"][0]["payment_method_id"]
    task = RetailTask(kind, user["user_id"], first, last, user["address"]["zip"], order["order_id"], goal="")
    task.facts = {"name": f"My name is {first} {last}.", "zip": f"My zip code is {user['address']['zip']}.", "order": f"The order id is {order['order_id']}."}
    auth = {"name": "find_user_id_by_name_zip", "arguments": {"first_name": first, "last_name": last, "zip": user["address"]["zip"]}}
    look = {"name": "get_order_details", "arguments": {"order_id": order["order_id"]}}
    if kind == "cancel":
        reason = pick(rng, CANCEL_REASONS)
        task.goal = f"cancel your order {order['order_id']} because {_REASON_WORDS[reason]}."
        task.facts["reason"] = (
            f"I want to cancel it because it was {reason}." if reason == "ordered by mistake" else "I want to cancel it because it is no longer needed."
        )
        change = {"name": "cancel_pending_order", "arguments": {"order_id": order["order_id"], "reason": reason}}
    elif kind == "modify_address":
        new = random_address(rng)
        while new == order["address"]:
            new = random_address(rng)
        where = ", ".join(v for v in (new["address1"], new["address2"], new["city"], new["state"], new["country"], new["zip"]) if v)
        task.goal = f"change the shipping address of your pending order {order['order_id']} to {where}."
        task.facts["address"] = f"The new address is {where} (address1: {new['address1']}; address2: {new['address2'] or 'none'})."
        change = {"name": "modify_pending_order_address", "arguments": {"order_id": order["order_id"], **new}}
    elif kind == "return":
        count = int(rng.integers(1, len(order["items"]) + 1))
        chosen = [order["items"][i] for i in sorted(rng.choice(len(order["items"]), size=count, replace=False).tolist())]
        names = " and ".join(_describe(item) for item in chosen)
        task.goal = f"return {names} from your delivered order {order['order_id']}, refunded to the original payment method."
        task.facts["items"] = f"I want to return {names}."
        task.facts["payment"] = f"Please refund it to the original payment method, {payment}."
        item_ids = [item["item_id"] for item in chosen]
        change = {"name": "return_delivered_order_items", "arguments": {"order_id": order["order_id"], "item_ids": item_ids, "payment_method_id": payment}}
    else:  # exchange one item for another available variant of its product
        candidates = []
        for item in order["items"]:
            variants = db["products"][item["product_id"]]["variants"]
            others = [v for v in sorted(variants) if v != item["item_id"] and variants[v]["available"]]
            if others:
                candidates.append((item, others))
        if not candidates:  # every other variant sold out: make one available
            item = order["items"][0]
            variants = db["products"][item["product_id"]]["variants"]
            other = next(v for v in sorted(variants) if v != item["item_id"])
            variants[other]["available"] = True
            candidates = [(item, [other])]
        item, others = candidates[int(rng.integers(len(candidates)))]
        new_id = pick(rng, others)
        new_variant = db["products"][item["product_id"]]["variants"][new_id]
        new_options = new_variant["options"]
        # a gift card pays a dearer variant only up to its balance: the card holds the difference, so the task can be done
        method = user["payment_methods"][payment]
        difference = round(new_variant["price"] - item["price"], 2)
        if method["source"] == "gift_card" and method["balance"] < difference:
            method["balance"] = difference
        wanted = ", ".join(f"{k} {v}" for k, v in new_options.items())
        task.goal = f"exchange {_describe(item)} from your delivered order {order['order_id']} for the same product with {wanted}; pay or be refunded any price difference with the original payment method."
        task.facts["items"] = f"I want to exchange {_describe(item)}."
        task.facts["new item"] = f"I would like the one with {wanted} instead."
        task.facts["payment"] = f"Use the original payment method, {payment}, for any price difference."
        change = {
            "name": "exchange_delivered_order_items",
            "arguments": {"order_id": order["order_id"], "item_ids": [item["item_id"]], "new_item_ids": [new_id], "payment_method_id": payment},
        }
    task.actions = [auth, look, change]
    return task


def expected_db(db: dict[str, Any], task: RetailTask) -> dict[str, Any]:
    """The database after the task's correct calls, on a copy."""
    target = copy.deepcopy(db)
    for action in task.actions:
        run_tool(target, action["name"], copy.deepcopy(action["arguments"]))
    return target
