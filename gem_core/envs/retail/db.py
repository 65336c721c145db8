"""The retail store's database, generated from a seed, and the tools that read and change it.

The database is plain data (dicts, lists, strings, numbers), so a copy is ``copy.deepcopy`` and two
states compare with ``==``: the task's success check is "the final database equals the expected one".

* ``products``: product id -> ``{"name", "product_id", "variants": {item id: {"item_id", "options", "price", "available"}}}``
* ``users``: user id -> ``{"user_id", "name": {"first_name", "last_name"}, "address", "email",
  "payment_methods": {id: {"id", "source", ("balance")}}, "orders": [order ids]}``
* ``orders``: order id -> ``{"order_id", "user_id", "address", "items": [{"name", "product_id", "item_id",
  "price", "options"}], "status", "payment_history": [{"transaction_type", "amount", "payment_method_id"}]}``

A tool is ``function(db, **arguments) -> text``; a call the store's rules refuse (cancelling a delivered
order, an unknown id, a wrong argument) raises :class:`ToolError`, whose message the assistant is shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

FIRST_NAMES = ("Emma", "Liam", "Olivia", "Noah", "Ava", "Mei", "Yusuf", "Sofia", "Ivan", "Amara", "Lucas", "Priya", "Omar", "Chloe", "Mateo", "Hana")
LAST_NAMES = ("Smith", "Garcia", "Chen", "Kowalski", "Okafor", "Silva", "Nguyen", "Müller", "Haddad", "Rossi", "Tanaka", "Johnson", "Patel", "Dubois")
CITIES = (
    ("Austin", "TX", "787"),
    ("Denver", "CO", "802"),
    ("Seattle", "WA", "981"),
    ("Boston", "MA", "021"),
    ("Phoenix", "AZ", "850"),
    ("Columbus", "OH", "432"),
)
STREETS = ("Oak Street", "Maple Avenue", "Pine Road", "Cedar Lane", "Elm Drive", "Lake View", "Hill Court", "River Way")

#: product name -> option name -> values; each product gets the variants of every combination.
CATALOG: dict[str, dict[str, tuple[str, ...]]] = {
    "T-Shirt": {"color": ("red", "blue", "black"), "size": ("S", "M", "L")},
    "Water Bottle": {"capacity": ("500ml", "1000ml"), "material": ("steel", "plastic")},
    "Headphones": {"type": ("over-ear", "in-ear"), "color": ("black", "white")},
    "Backpack": {"color": ("green", "grey"), "size": ("small", "large")},
    "Desk Lamp": {"color": ("white", "black"), "brightness": ("low", "high")},
}
BASE_PRICES = {"T-Shirt": 20.0, "Water Bottle": 15.0, "Headphones": 80.0, "Backpack": 55.0, "Desk Lamp": 35.0}

ORDER_STATUSES = ("pending", "processed", "delivered", "cancelled")
CANCEL_REASONS = ("no longer needed", "ordered by mistake")


class ToolError(Exception):
    """A call the store refuses; its message is shown to the assistant."""


def _digits(rng: np.random.Generator, n: int) -> str:
    return "".join(str(int(d)) for d in rng.integers(0, 10, size=n))


def pick(rng: np.random.Generator, options: tuple | list) -> Any:
    return options[int(rng.integers(len(options)))]


def random_address(rng: np.random.Generator) -> dict[str, str]:
    city, state, prefix = pick(rng, CITIES)
    return {
        "address1": f"{int(rng.integers(10, 999))} {pick(rng, STREETS)}",
        "address2": f"Suite {int(rng.integers(100, 999))}" if rng.random() < 0.3 else "",
        "city": city,
        "state": state,
        "country": "USA",
        "zip": prefix + _digits(rng, 2),
    }


def generate_db(rng: np.random.Generator, num_users: int) -> dict[str, Any]:
    """A small store: the catalog's products with generated ids and prices, ``num_users`` users (distinct
    first name, last name and zip), each with 1-3 orders of 1-3 items."""
    products: dict[str, Any] = {}
    for name, options in CATALOG.items():
        product_id = _digits(rng, 10)
        variants = {}
        combos: list[dict[str, str]] = [{}]
        for option, values in options.items():
            combos = [{**combo, option: value} for combo in combos for value in values]
        for combo in combos:
            item_id = _digits(rng, 10)
            price = round(BASE_PRICES[name] * (0.8 + 0.4 * float(rng.random())), 2)
            variants[item_id] = {"item_id": item_id, "options": combo, "price": price, "available": bool(rng.random() < 0.8)}
        products[product_id] = {"name": name, "product_id": product_id, "variants": variants}
    users: dict[str, Any] = {}
    orders: dict[str, Any] = {}
    seen: set[tuple[str, str, str]] = set()
    while len(users) < num_users:
        first, last, address = pick(rng, FIRST_NAMES), pick(rng, LAST_NAMES), random_address(rng)
        if (first, last, address["zip"]) in seen:
            continue
        seen.add((first, last, address["zip"]))
        user_id = f"{first.lower()}_{last.lower()}_{_digits(rng, 4)}"
        methods = {}
        card = f"credit_card_{_digits(rng, 7)}"
        methods[card] = {"id": card, "source": "credit_card"}
        if rng.random() < 0.5:
            gift = f"gift_card_{_digits(rng, 7)}"
            methods[gift] = {"id": gift, "source": "gift_card", "balance": float(rng.integers(0, 200))}
        if rng.random() < 0.4:
            paypal = f"paypal_{_digits(rng, 7)}"
            methods[paypal] = {"id": paypal, "source": "paypal"}
        email = f"{first.lower()}.{last.lower()}{_digits(rng, 2)}@example.com"
        user = {
            "user_id": user_id,
            "name": {"first_name": first, "last_name": last},
            "address": address,
            "email": email,
            "payment_methods": methods,
            "orders": [],
        }
        for _ in range(int(rng.integers(1, 4))):
            order_id = "#W" + _digits(rng, 7)
            items = []
            for _ in range(int(rng.integers(1, 4))):
                product = products[pick(rng, sorted(products))]
                variant = product["variants"][pick(rng, sorted(product["variants"]))]
                items.append(
                    {
                        "name": product["name"],
                        "product_id": product["product_id"],
                        "item_id": variant["item_id"],
                        "price": variant["price"],
                        "options": dict(variant["options"]),
                    }
                )
            method = pick(rng, sorted(methods))
            total = round(sum(item["price"] for item in items), 2)
            orders[order_id] = {
                "order_id": order_id,
                "user_id": user_id,
                "address": dict(address),
                "items": items,
                "status": pick(rng, ORDER_STATUSES),
                "payment_history": [{"transaction_type": "payment", "amount": total, "payment_method_id": method}],
            }
            user["orders"].append(order_id)
        users[user_id] = user
    return {"products": products, "users": users, "orders": orders}


# ------------------------------------------------------------------------------------------------
# The tools.
# ------------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ": "))


def _order(db: dict[str, Any], order_id: Any) -> dict[str, Any]:
    order = db["orders"].get(order_id) if isinstance(order_id, str) else None
    if order is None and isinstance(order_id, str) and not order_id.startswith("#"):
        order = db["orders"].get("#" + order_id)  # "W1234567" for "#W1234567": a common slip
    if order is None:
        raise ToolError(f"order not found: {str(order_id)[:40]!r}")
    return order


def _user_method(db: dict[str, Any], order: dict[str, Any], payment_method_id: Any) -> dict[str, Any]:
    methods = db["users"][order["user_id"]]["payment_methods"]
    if not isinstance(payment_method_id, str) or payment_method_id not in methods:
        raise ToolError(f"payment method not found for this user: {str(payment_method_id)[:40]!r}")
    return methods[payment_method_id]


def _item_ids(order: dict[str, Any], item_ids: Any) -> list[str]:
    if not isinstance(item_ids, list) or not item_ids or not all(isinstance(i, str) for i in item_ids):
        raise ToolError("item_ids must be a non-empty list of item id strings")
    available = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > available.count(item_id):
            raise ToolError(f"item {item_id[:20]!r} is not in order {order['order_id']} (or not that many times)")
    return list(item_ids)


def _refund(db: dict[str, Any], order: dict[str, Any], amount: float, method_id: str) -> None:
    order["payment_history"].append({"transaction_type": "refund", "amount": round(amount, 2), "payment_method_id": method_id})
    method = db["users"][order["user_id"]]["payment_methods"][method_id]
    if method["source"] == "gift_card":
        method["balance"] = round(method["balance"] + amount, 2)


def find_user_id_by_name_zip(db: dict[str, Any], first_name: str, last_name: str, zip: str) -> str:
    for user_id, user in db["users"].items():
        name = user["name"]
        if (
            str(first_name).strip().lower() == name["first_name"].lower()
            and str(last_name).strip().lower() == name["last_name"].lower()
            and str(zip).strip() == user["address"]["zip"]
        ):
            return user_id
    raise ToolError("user not found")


def get_user_details(db: dict[str, Any], user_id: str) -> str:
    user = db["users"].get(user_id) if isinstance(user_id, str) else None
    if user is None:
        raise ToolError(f"user not found: {str(user_id)[:40]!r}")
    return _text(user)


def get_order_details(db: dict[str, Any], order_id: str) -> str:
    return _text(_order(db, order_id))


def get_product_details(db: dict[str, Any], product_id: str) -> str:
    product = db["products"].get(product_id) if isinstance(product_id, str) else None
    if product is None:
        raise ToolError(f"product not found: {str(product_id)[:40]!r}")
    return _text(product)


def cancel_pending_order(db: dict[str, Any], order_id: str, reason: str) -> str:
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError(f"only a pending order can be cancelled; order {order['order_id']} is {order['status']}")
    if reason not in CANCEL_REASONS:
        raise ToolError(f"reason must be one of {list(CANCEL_REASONS)}")
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    for payment in [p for p in order["payment_history"] if p["transaction_type"] == "payment"]:
        _refund(db, order, payment["amount"], payment["payment_method_id"])
    return _text(order)


def modify_pending_order_address(db: dict[str, Any], order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str) -> str:
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError(f"only a pending order's address can be changed; order {order['order_id']} is {order['status']}")
    fields = {"address1": address1, "address2": address2, "city": city, "state": state, "country": country, "zip": zip}
    for name, value in fields.items():
        if not isinstance(value, str) or len(value) > 100:
            raise ToolError(f"{name} must be a string of at most 100 characters")
    order["address"] = fields
    return _text(order)


def return_delivered_order_items(db: dict[str, Any], order_id: str, item_ids: list[str], payment_method_id: str) -> str:
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError(f"only a delivered order's items can be returned; order {order['order_id']} is {order['status']}")
    items = _item_ids(order, item_ids)
    method = _user_method(db, order, payment_method_id)
    original = order["payment_history"][0]["payment_method_id"]
    if payment_method_id != original and method["source"] != "gift_card":
        raise ToolError("a refund goes to the original payment method or to a gift card of the user")
    order["status"] = "return requested"
    order["return_items"] = sorted(items)
    order["return_payment_method_id"] = payment_method_id
    return _text(order)


def exchange_delivered_order_items(db: dict[str, Any], order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str) -> str:
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError(f"only a delivered order's items can be exchanged; order {order['order_id']} is {order['status']}")
    items = _item_ids(order, item_ids)
    if not isinstance(new_item_ids, list) or len(new_item_ids) != len(items) or not all(isinstance(i, str) for i in new_item_ids):
        raise ToolError("new_item_ids must be a list of item id strings, one for each of item_ids")
    method = _user_method(db, order, payment_method_id)
    difference = 0.0
    for old_id, new_id in zip(items, new_item_ids):
        old = next(item for item in order["items"] if item["item_id"] == old_id)
        variant = db["products"][old["product_id"]]["variants"].get(new_id)
        if variant is None:
            raise ToolError(f"item {new_id[:20]!r} is not a variant of the {old['name']} (product {old['product_id']})")
        if new_id == old_id:
            raise ToolError(f"item {new_id} is the item being exchanged; pick a different variant")
        if not variant["available"]:
            raise ToolError(f"item {new_id} is not available")
        difference += variant["price"] - old["price"]
    difference = round(difference, 2)
    if method["source"] == "gift_card" and method["balance"] < difference:
        raise ToolError("the gift card's balance does not cover the price difference")
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(items)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = difference
    return _text(order)


#: name -> (function, its arguments, what it does). ``transfer_to_human`` is handled by the env (it ends the episode).
TOOLS: dict[str, tuple[Callable[..., str] | None, tuple[str, ...], str]] = {
    "find_user_id_by_name_zip": (find_user_id_by_name_zip, ("first_name", "last_name", "zip"), "the user id of a customer (authenticate first)"),
    "get_user_details": (get_user_details, ("user_id",), "a user's profile, payment methods and order ids"),
    "get_order_details": (get_order_details, ("order_id",), "an order's items, status, address and payments"),
    "get_product_details": (get_product_details, ("product_id",), "a product's variants (item ids, options, price, availability)"),
    "cancel_pending_order": (cancel_pending_order, ("order_id", "reason"), f"cancel a pending order; reason: one of {list(CANCEL_REASONS)}"),
    "modify_pending_order_address": (
        modify_pending_order_address,
        ("order_id", "address1", "address2", "city", "state", "country", "zip"),
        "change a pending order's shipping address",
    ),
    "return_delivered_order_items": (
        return_delivered_order_items,
        ("order_id", "item_ids", "payment_method_id"),
        "return items of a delivered order; refund to the original payment method or a gift card",
    ),
    "exchange_delivered_order_items": (
        exchange_delivered_order_items,
        ("order_id", "item_ids", "new_item_ids", "payment_method_id"),
        "exchange items of a delivered order for other variants of the same products",
    ),
    "transfer_to_human": (None, ("summary",), "hand the conversation to a human agent (ends the conversation)"),
}


def run_tool(db: dict[str, Any], name: str, arguments: dict[str, Any]) -> str:
    """Call tool ``name`` with ``arguments`` on ``db`` (changing it for the write tools); :class:`ToolError`
    for an unknown tool, missing or unexpected arguments, or a call the store's rules refuse."""
    entry = TOOLS.get(name)
    if entry is None or entry[0] is None:
        raise ToolError(f"there is no tool {name[:40]!r}; available: {', '.join(TOOLS)}")
    function, expected, _ = entry
    missing = [a for a in expected if a not in arguments]
    unexpected = [a for a in arguments if a not in expected]
    if missing or unexpected:
        raise ToolError(
            f"{name} takes arguments {list(expected)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unexpected {[u[:30] for u in unexpected]}" if unexpected else "")
        )
    return function(db, **arguments)
