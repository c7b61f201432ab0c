"""τ²-bench's retail tools (`RetailTools`), ported onto SQLite with τ²-identical behaviour.

Why so literal: results, errors and DB hashes must be comparable with the published benchmark,
so every tool keeps τ²'s name, description, parameter schema, result text, error message and
quirks, including the ones that look like bugs (see the τ² reference README). Each tool reads the
records it needs into the exact dict shapes τ²'s pydantic models dump to, runs τ²'s own logic on
them step by step, and writes back only what τ² would have changed.

Arguments arrive unvalidated (`argument_errors = "python"`), as in τ², which hands the LLM's JSON
straight to a Python method: a non-string id is simply "not found", and a wrongly typed value
fails with the Python error τ² would show.

Descriptions are τ²'s `docstring_parser` output, which differs from plain docstring text (an
inserted blank line, kept line breaks), so they are given verbatim through `@tool(description=)`
and `Field(description=)`; the docstrings here are for readers of this file.
"""

import json
import unicodedata
from typing import Annotated, Any

from pydantic import BaseModel, Field

from envforge.server import Db, ToolError, tool

ADDRESS_FIELDS = ("address1", "address2", "city", "country", "state", "zip")
_ORDER_COLUMNS = ", ".join(
    (
        "order_id",
        "user_id",
        *ADDRESS_FIELDS,
        "status",
        "cancel_reason",
        "exchange_items",
        "exchange_new_items",
        "exchange_payment_method_id",
        "exchange_price_difference",
        "return_items",
        "return_payment_method_id",
    )
)

# ---------------------------------------------------------------------------------------------
# Parameter types: τ²'s parameter descriptions, verbatim.

OrderId = Annotated[
    str,
    Field(
        description="The order id, such as '#W0000000'. "
        "Be careful there is a '#' symbol at the beginning of the order id."
    ),
]
UserId = Annotated[str, Field(description="The user id, such as 'sara_doe_496'.")]
Address1 = Annotated[str, Field(description="The first line of the address, such as '123 Main St'.")]
Address2 = Annotated[str, Field(description="The second line of the address, such as 'Apt 1' or ''.")]
City = Annotated[str, Field(description="The city, such as 'San Francisco'.")]
State = Annotated[str, Field(description="The state, such as 'CA'.")]
Country = Annotated[str, Field(description="The country, such as 'USA'.")]
Zip = Annotated[str, Field(description="The zip code, such as '12345'.")]
_PAYMENT_METHOD_START = (
    "The payment method id to pay or receive refund for the item price difference, "
    "such as 'gift_card_0000000' or 'credit_card_0000000'."
)
PaymentMethodId = Annotated[
    str, Field(description=_PAYMENT_METHOD_START + " These can be looked up from the user or order details.")
]


class UserAddress(BaseModel):
    """τ²'s address model: building one validates the address arguments exactly as τ² does."""

    address1: str
    address2: str
    city: str
    country: str
    state: str
    zip: str


# ---------------------------------------------------------------------------------------------
# Reading records in τ²'s dump shapes.


def _key(value: Any) -> str | None:
    """`value` as a key for one of τ²'s dict lookups (`value in self.db.orders`).

    Only a str can equal a τ² key, so anything else is "not found" (None matches no row); an
    unhashable value is refused with the message of the TypeError that τ²'s dict lookup raises
    (τ² shows it to the agent as its error; here it is a refusal, not a crash of the env).
    """
    try:
        hash(value)
    except TypeError as exc:
        raise ToolError(str(exc)) from None
    return value if isinstance(value, str) else None


def fold_for_match(text: str) -> str:
    """τ²'s `fold_for_match`: case- and diacritic-folded, for the user lookups.

    ASCII text (every email and name in the seed) has nothing to decompose or drop, so it takes
    the short way: a user lookup folds every user's fields, one character at a time otherwise."""
    if text.isascii():
        return text.strip().casefold()
    decomposed = unicodedata.normalize("NFD", text.strip())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()


async def _get_order(db: Db, order_id: Any) -> dict[str, Any]:
    """τ²'s `Order.model_dump()` for `order_id`: all 14 fields, lists in stored order."""
    rows = await db.execute_fetchall(
        f"SELECT {_ORDER_COLUMNS} FROM orders WHERE order_id = ?", (_key(order_id),)
    )
    if not rows:
        raise ToolError("Order not found")
    row = rows[0]
    oid = row[0]
    items = await db.execute_fetchall(
        "SELECT name, product_id, item_id, price, options FROM order_items "
        "WHERE order_id = ? ORDER BY position",
        (oid,),
    )
    fulfillments = await db.execute_fetchall(
        "SELECT tracking_id, item_ids FROM order_fulfillments WHERE order_id = ? ORDER BY position", (oid,)
    )
    payments = await db.execute_fetchall(
        "SELECT transaction_type, amount, payment_method_id FROM order_payments "
        "WHERE order_id = ? ORDER BY position",
        (oid,),
    )
    (cancel_reason, ex_items, ex_new, ex_method, ex_diff, ret_items, ret_method) = row[9:]
    return {
        "order_id": oid,
        "user_id": row[1],
        "address": dict(zip(ADDRESS_FIELDS, row[2:8], strict=True)),
        "items": [
            {"name": n, "product_id": p, "item_id": i, "price": price, "options": json.loads(opts)}
            for n, p, i, price, opts in items
        ],
        "status": row[8],
        "fulfillments": [{"tracking_id": json.loads(t), "item_ids": json.loads(i)} for t, i in fulfillments],
        "payment_history": [
            {"transaction_type": t, "amount": a, "payment_method_id": m} for t, a, m in payments
        ],
        "cancel_reason": cancel_reason,
        "exchange_items": None if ex_items is None else json.loads(ex_items),
        "exchange_new_items": None if ex_new is None else json.loads(ex_new),
        "exchange_payment_method_id": ex_method,
        "exchange_price_difference": ex_diff,
        "return_items": None if ret_items is None else json.loads(ret_items),
        "return_payment_method_id": ret_method,
    }


def _payment_method(row: tuple[Any, ...]) -> dict[str, Any]:
    """(payment_method_id, source, brand, last_four, balance) as τ²'s payment-method model dump."""
    method_id, source, brand, last_four, balance = row
    out: dict[str, Any] = {"source": source, "id": method_id}
    if source == "credit_card":
        out.update(brand=brand, last_four=last_four)
    elif source == "gift_card":
        out["balance"] = balance
    return out


async def _require_user(db: Db, user_id: Any) -> str:
    rows = await db.execute_fetchall("SELECT user_id FROM users WHERE user_id = ?", (_key(user_id),))
    if not rows:
        raise ToolError("User not found")
    return rows[0][0]


async def _get_user(db: Db, user_id: Any) -> dict[str, Any]:
    """τ²'s `User.model_dump()`: payment methods and orders in db.json's order."""
    uid = await _require_user(db, user_id)
    (first, last, email), *_ = await db.execute_fetchall(
        "SELECT first_name, last_name, email FROM users WHERE user_id = ?", (uid,)
    )
    address = (
        await db.execute_fetchall(
            f"SELECT {', '.join(ADDRESS_FIELDS)} FROM user_addresses WHERE user_id = ?", (uid,)
        )
    )[0]
    methods = await db.execute_fetchall(
        "SELECT payment_method_id, source, brand, last_four, balance FROM payment_methods "
        "WHERE user_id = ? ORDER BY position",
        (uid,),
    )
    orders = await db.execute_fetchall(
        "SELECT order_id FROM orders WHERE user_id = ? AND user_position IS NOT NULL ORDER BY user_position",
        (uid,),
    )
    return {
        "user_id": uid,
        "name": {"first_name": first, "last_name": last},
        "address": dict(zip(ADDRESS_FIELDS, address, strict=True)),
        "email": email,
        "payment_methods": {m[0]: _payment_method(m) for m in methods},
        "orders": [o[0] for o in orders],
    }


async def _get_payment_method(db: Db, user_id: Any, payment_method_id: Any) -> dict[str, Any]:
    """One of the user's payment methods (τ²'s `_get_payment_method`: the user must exist first)."""
    uid = await _require_user(db, user_id)
    rows = await db.execute_fetchall(
        "SELECT payment_method_id, source, brand, last_four, balance FROM payment_methods "
        "WHERE user_id = ? AND payment_method_id = ?",
        (uid, _key(payment_method_id)),
    )
    if not rows:
        raise ToolError("Payment method not found")
    return _payment_method(rows[0])


def _variant(row: tuple[Any, ...]) -> dict[str, Any]:
    item_id, options, available, price = row
    return {"item_id": item_id, "options": json.loads(options), "available": bool(available), "price": price}


async def _get_product(db: Db, product_id: Any) -> dict[str, Any]:
    """τ²'s `Product.model_dump()`: variants in db.json's order."""
    rows = await db.execute_fetchall(
        "SELECT product_id, name FROM products WHERE product_id = ?", (_key(product_id),)
    )
    if not rows:
        raise ToolError("Product not found")
    pid, name = rows[0]
    variants = await db.execute_fetchall(
        "SELECT item_id, options, available, price FROM variants WHERE product_id = ? ORDER BY position",
        (pid,),
    )
    return {"name": name, "product_id": pid, "variants": {v[0]: _variant(v) for v in variants}}


async def _get_variant(db: Db, product_id: Any, variant_id: Any) -> dict[str, Any]:
    """A variant of a given product (τ²'s `_get_variant`: the product must exist first)."""
    rows = await db.execute_fetchall(
        "SELECT product_id FROM products WHERE product_id = ?", (_key(product_id),)
    )
    if not rows:
        raise ToolError("Product not found")
    variants = await db.execute_fetchall(
        "SELECT item_id, options, available, price FROM variants WHERE product_id = ? AND item_id = ?",
        (rows[0][0], _key(variant_id)),
    )
    if not variants:
        raise ToolError("Variant not found")
    return _variant(variants[0])


# ---------------------------------------------------------------------------------------------
# Writing τ²'s changes back.


async def _set_balance(db: Db, payment_method_id: str, balance: float) -> None:
    # Written through at once: τ² mutates the one shared object, so a card met twice in one
    # call (a cancel refunding two payments to it) must see its own earlier change.
    await db.execute(
        "UPDATE payment_methods SET balance = ? WHERE payment_method_id = ?", (balance, payment_method_id)
    )


async def _append_payment(
    db: Db, order_id: str, transaction_type: str, amount: float, method_id: str
) -> None:
    await db.execute(
        "INSERT INTO order_payments (order_id, position, transaction_type, amount, payment_method_id) "
        "VALUES (?, (SELECT COALESCE(MAX(position), -1) + 1 FROM order_payments WHERE order_id = ?), "
        "?, ?, ?)",
        (order_id, order_id, transaction_type, amount, method_id),
    )


async def _set_order(db: Db, order_id: str, **columns: Any) -> None:
    assignments = ", ".join(f"{name} = ?" for name in columns)  # names are this module's literals
    await db.execute(f"UPDATE orders SET {assignments} WHERE order_id = ?", (*columns.values(), order_id))


# ---------------------------------------------------------------------------------------------
# The tools, in τ²'s order.


@tool(description="Calculate the result of a mathematical expression.")
async def calculate(
    db: Db,
    expression: Annotated[
        str,
        Field(
            description="The mathematical expression to calculate, such as '2 + 2'. The expression can "
            "contain numbers, operators (+, -, *, /), parentheses, and spaces."
        ),
    ],
) -> str:
    """Evaluate arithmetic exactly as τ² does (its `eval` with no builtins, rounded to 2 places)."""
    if not all(char in "0123456789+-*/(). " for char in expression):
        raise ToolError("Invalid characters in expression")
    try:
        return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))
    except Exception as exc:  # the agent reads τ²'s f"Error: {e}" for any failure of its expression
        raise ToolError(str(exc)) from exc


@tool(
    writes=["orders", "order_payments", "payment_methods"],
    description="Cancel a pending order. If the order is already processed or delivered,\n\n"
    "it cannot be cancelled. The agent needs to explain the cancellation detail\n"
    "and ask for explicit user confirmation (yes/no) to proceed. If the user confirms,\n"
    "the order status will be changed to 'cancelled' and the payment will be refunded.\n"
    "The refund will be added to the user's gift card balance immediately if the payment\n"
    "was made using a gift card, otherwise the refund would take 5-7 business days to process.\n"
    "The function returns the order details after the cancellation.",
)
async def cancel_pending_order(
    db: Db,
    order_id: OrderId,
    reason: Annotated[
        str,
        Field(
            description="The reason for cancellation, which should be either 'no longer needed' or "
            "'ordered by mistake'."
        ),
    ],
) -> dict[str, Any]:
    """Cancel an order whose status is exactly "pending"; refund every payment, gift cards at once."""
    order = await _get_order(db, order_id)
    if order["status"] != "pending":
        raise ToolError("Non-pending order cannot be cancelled")
    if reason not in {"no longer needed", "ordered by mistake"}:
        raise ToolError("Invalid reason")
    refunds = []
    for payment in order["payment_history"]:
        refunds.append(("refund", payment["amount"], payment["payment_method_id"]))
        method = await _get_payment_method(db, order["user_id"], payment["payment_method_id"])
        if method["source"] == "gift_card":
            await _set_balance(db, method["id"], round(method["balance"] + payment["amount"], 2))
    await _set_order(db, order["order_id"], status="cancelled", cancel_reason=reason)
    for refund in refunds:
        await _append_payment(db, order["order_id"], *refund)
    return await _get_order(db, order["order_id"])


@tool(
    writes=["orders"],
    description="Exchange items in a delivered order to new items of the same product type.\n\n"
    "For a delivered order, return or exchange can be only done once by the agent.\n"
    "The agent needs to explain the exchange detail and ask for explicit user confirmation "
    "(yes/no) to proceed.",
)
async def exchange_delivered_order_items(
    db: Db,
    order_id: OrderId,
    item_ids: Annotated[
        list[str],
        Field(
            description="The item ids to be exchanged, each such as '1008292230'. "
            "There could be duplicate items in the list."
        ),
    ],
    new_item_ids: Annotated[
        list[str],
        Field(
            description="The item ids to be exchanged for, each such as '1008292230'.\n"
            "There could be duplicate items in the list. Each new item id should match the item id\n"
            "in the same position and be of the same product."
        ),
    ],
    payment_method_id: Annotated[
        str,
        Field(
            description="The payment method id to pay or receive refund for the item price difference,\n"
            "such as 'gift_card_0000000' or 'credit_card_0000000'. These can be looked up\n"
            "from the user or order details."
        ),
    ],
) -> dict[str, Any]:
    """Record an exchange request: sorted id lists and the rounded difference; no money moves yet."""
    order = await _get_order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError("Non-delivered order cannot be exchanged")
    all_item_ids = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > all_item_ids.count(item_id):
            raise ToolError(f"Number of {item_id} not found.")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("The number of items to be exchanged should match.")
    diff_price: float = 0
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
        item = next((item for item in order["items"] if item["item_id"] == item_id), None)
        if item is None:
            raise ToolError(f"Item {item_id} not found")
        variant = await _get_variant(db, item["product_id"], new_item_id)
        if not variant["available"]:
            raise ToolError(f"New item {new_item_id} not found or available")
        diff_price += variant["price"] - item["price"]
    # τ² keeps round()'s own result: the int 0 for empty lists, possibly -0.0 (the column is untyped).
    diff_price = round(diff_price, 2)
    method = await _get_payment_method(db, order["user_id"], payment_method_id)
    if method["source"] == "gift_card" and method["balance"] < diff_price:
        raise ToolError("Insufficient gift card balance to pay for the price difference")
    await _set_order(
        db,
        order["order_id"],
        status="exchange requested",
        exchange_items=json.dumps(sorted(item_ids)),
        exchange_new_items=json.dumps(sorted(new_item_ids)),
        exchange_payment_method_id=payment_method_id,
        exchange_price_difference=diff_price,
    )
    return await _get_order(db, order["order_id"])


@tool(
    description="Find user id by first name, last name, and zip code. "
    "If the user is not found, the function\n\n"
    "will return an error message. By default, find user id by email, and only call this function\n"
    "if the user is not found by email or cannot remember email.",
)
async def find_user_id_by_name_zip(
    db: Db,
    first_name: Annotated[str, Field(description="The first name of the customer, such as 'John'.")],
    last_name: Annotated[str, Field(description="The last name of the customer, such as 'Doe'.")],
    zip: Annotated[str, Field(description="The zip code of the customer, such as '12345'.")],
) -> str:
    """The first user (db.json order) whose folded names match and whose zip matches exactly."""
    wanted_first = fold_for_match(first_name)
    wanted_last = fold_for_match(last_name)
    users = await db.execute_fetchall(
        "SELECT u.user_id, u.first_name, u.last_name, a.zip FROM users u "
        "JOIN user_addresses a ON a.user_id = u.user_id ORDER BY u.position"
    )
    for user_id, first, last, user_zip in users:
        if fold_for_match(first) == wanted_first and fold_for_match(last) == wanted_last and user_zip == zip:
            return user_id
    raise ToolError("User not found")


@tool(
    description="Find user id by email. If the user is not found, the function will return an error message.",
)
async def find_user_id_by_email(
    db: Db,
    email: Annotated[str, Field(description="The email of the user, such as 'something@example.com'.")],
) -> str:
    """The first user (db.json order) whose folded email matches."""
    wanted = fold_for_match(email)
    for user_id, user_email in await db.execute_fetchall(
        "SELECT user_id, email FROM users ORDER BY position"
    ):
        if fold_for_match(user_email) == wanted:
            return user_id
    raise ToolError("User not found")


@tool(description="Get the status and details of an order.")
async def get_order_details(db: Db, order_id: OrderId) -> dict[str, Any]:
    """The order as τ² dumps it."""
    return await _get_order(db, order_id)


@tool(description="Get the inventory details of a product.")
async def get_product_details(
    db: Db,
    product_id: Annotated[
        str,
        Field(
            description="The product id, such as '6086499569'. "
            "Be careful the product id is different from the item id."
        ),
    ],
) -> dict[str, Any]:
    """The product with all its variants."""
    return await _get_product(db, product_id)


@tool(description="Get the inventory details of an item.")
async def get_item_details(
    db: Db,
    item_id: Annotated[
        str,
        Field(
            description="The item id, such as '6086499569'. "
            "Be careful the item id is different from the product id."
        ),
    ],
) -> dict[str, Any]:
    """One variant, found among all products' variants (item ids are unique across products)."""
    rows = await db.execute_fetchall(
        "SELECT item_id, options, available, price FROM variants WHERE item_id = ?", (_key(item_id),)
    )
    if not rows:
        raise ToolError("Item not found")
    return _variant(rows[0])


@tool(description="Get the details of a user, including their orders.")
async def get_user_details(db: Db, user_id: UserId) -> dict[str, Any]:
    """The user as τ² dumps it."""
    return await _get_user(db, user_id)


@tool(
    description="List the name and product id of all product types.\n\n"
    "Each product type has a variety of different items with unique item ids and options.\n"
    "There are only 50 product types in the store.",
)
async def list_all_product_types(db: Db) -> str:
    """τ² returns this as a JSON *string* sorted by name, so the agent sees it unquoted."""
    rows = await db.execute_fetchall("SELECT name, product_id FROM products ORDER BY position")
    return json.dumps(dict(rows), sort_keys=True)


@tool(
    writes=["orders"],
    description="Modify the shipping address of a pending order. The agent needs to explain the modification "
    "detail and ask for explicit user confirmation (yes/no) to proceed.",
)
async def modify_pending_order_address(
    db: Db,
    order_id: OrderId,
    address1: Address1,
    address2: Address2,
    city: City,
    state: State,
    country: Country,
    zip: Zip,
) -> dict[str, Any]:
    """Replace the address of any order whose status contains "pending" (τ²'s loose check)."""
    order = await _get_order(db, order_id)
    if "pending" not in order["status"]:
        raise ToolError("Non-pending order cannot be modified")
    address = UserAddress(
        address1=address1, address2=address2, city=city, state=state, country=country, zip=zip
    )
    await _set_order(db, order["order_id"], **address.model_dump())
    return await _get_order(db, order["order_id"])


@tool(
    writes=["orders", "order_items", "order_payments", "payment_methods"],
    description="Modify items in a pending order to new items of the same product type. For a pending order, "
    "this function can only be called once. The agent needs to explain the exchange detail and ask for "
    "explicit user confirmation (yes/no) to proceed.",
)
async def modify_pending_order_items(
    db: Db,
    order_id: OrderId,
    item_ids: Annotated[
        list[str],
        Field(
            description="The item ids to be modified, each such as '1008292230'. "
            "There could be duplicate items in the list."
        ),
    ],
    new_item_ids: Annotated[
        list[str],
        Field(
            description="The item ids to be modified for, each such as '1008292230'. "
            "There could be duplicate items in the list. Each new item id should match the item id "
            "in the same position and be of the same product."
        ),
    ],
    payment_method_id: PaymentMethodId,
) -> dict[str, Any]:
    """Swap items of an exactly-"pending" order for other variants and settle the difference.

    τ²'s quirks are kept on purpose: every modified item takes the price and options of the LAST
    new variant validated (its loop variable leaks), and the payment entry's amount is the
    unrounded sum of differences.
    """
    order = await _get_order(db, order_id)
    if order["status"] != "pending":
        raise ToolError("Non-pending order cannot be modified")
    all_item_ids = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > all_item_ids.count(item_id):
            raise ToolError(f"{item_id} not found")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("The number of items to be exchanged should match")
    diff_price: float = 0
    variant: dict[str, Any] = {}
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
        if item_id == new_item_id:
            raise ToolError("The new item id should be different from the old item id")
        item = next((item for item in order["items"] if item["item_id"] == item_id), None)
        if item is None:
            raise ToolError(f"Item {item_id} not found")
        variant = await _get_variant(db, item["product_id"], new_item_id)
        if not variant["available"]:
            raise ToolError(f"New item {new_item_id} not found or available")
        diff_price += variant["price"] - item["price"]
    method = await _get_payment_method(db, order["user_id"], payment_method_id)
    if method["source"] == "gift_card" and method["balance"] < diff_price:
        raise ToolError("Insufficient gift card balance to pay for the new item")
    # OrderPayment validates `amount` as a float, so abs(0) of an empty modification is 0.0.
    transaction = "payment" if diff_price > 0 else "refund"
    await _append_payment(db, order["order_id"], transaction, float(abs(diff_price)), payment_method_id)
    if method["source"] == "gift_card":
        await _set_balance(db, method["id"], round(method["balance"] - diff_price, 2))
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
        # Looked up again in the list being modified, as τ² does: an id written by an earlier
        # step can be found again by a later one.
        item = next((item for item in order["items"] if item["item_id"] == item_id), None)
        if item is None:
            raise ToolError(f"Item {item_id} not found")
        item["item_id"] = new_item_id
        item["price"] = variant["price"]
        item["options"] = variant["options"]
    positions = await db.execute_fetchall(
        "SELECT position FROM order_items WHERE order_id = ? ORDER BY position", (order["order_id"],)
    )
    for (position,), item in zip(positions, order["items"], strict=True):
        await db.execute(
            "UPDATE order_items SET item_id = ?, price = ?, options = ? WHERE order_id = ? AND position = ?",
            (item["item_id"], item["price"], json.dumps(item["options"]), order["order_id"], position),
        )
    await _set_order(db, order["order_id"], status="pending (item modified)")
    return await _get_order(db, order["order_id"])


@tool(
    writes=["order_payments", "payment_methods"],
    description="Modify the payment method of a pending order. The agent needs to explain the modification "
    "detail and ask for explicit user confirmation (yes/no) to proceed.",
)
async def modify_pending_order_payment(
    db: Db, order_id: OrderId, payment_method_id: PaymentMethodId
) -> dict[str, Any]:
    """Pay an order (status containing "pending") with another method: a payment, then a refund."""
    order = await _get_order(db, order_id)
    if "pending" not in order["status"]:
        raise ToolError("Non-pending order cannot be modified")
    method = await _get_payment_method(db, order["user_id"], payment_method_id)
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        raise ToolError("There should be exactly one payment for a pending order")
    if history[0]["payment_method_id"] == payment_method_id:
        raise ToolError("The new payment method should be different from the current one")
    amount = history[0]["amount"]
    if method["source"] == "gift_card" and method["balance"] < amount:
        raise ToolError("Insufficient gift card balance to pay for the order")
    old_method_id = history[0]["payment_method_id"]
    await _append_payment(db, order["order_id"], "payment", amount, payment_method_id)
    await _append_payment(db, order["order_id"], "refund", amount, old_method_id)
    if method["source"] == "gift_card":
        await _set_balance(db, method["id"], round(method["balance"] - amount, 2))
    old_method = await _get_payment_method(db, order["user_id"], old_method_id)
    if old_method["source"] == "gift_card":
        await _set_balance(db, old_method["id"], round(old_method["balance"] + amount, 2))
    return await _get_order(db, order["order_id"])


@tool(
    writes=["user_addresses"],
    description="Modify the default address of a user. The agent needs to explain the modification detail "
    "and ask for explicit user confirmation (yes/no) to proceed.",
)
async def modify_user_address(
    db: Db,
    user_id: UserId,
    address1: Address1,
    address2: Address2,
    city: City,
    state: State,
    country: Country,
    zip: Zip,
) -> dict[str, Any]:
    """Replace the user's default address (their orders keep their own addresses)."""
    uid = await _require_user(db, user_id)
    address = UserAddress(
        address1=address1, address2=address2, city=city, state=state, country=country, zip=zip
    )
    values = address.model_dump()
    assignments = ", ".join(f"{name} = ?" for name in values)
    await db.execute(f"UPDATE user_addresses SET {assignments} WHERE user_id = ?", (*values.values(), uid))
    return await _get_user(db, uid)


@tool(
    writes=["orders"],
    description="Return some items of a delivered order.\n\n"
    "The order status will be changed to 'return requested'.\n"
    "The agent needs to explain the return detail and ask for explicit user confirmation "
    "(yes/no) to proceed.\n"
    "The user will receive follow-up email for how and where to return the item.",
)
async def return_delivered_order_items(
    db: Db,
    order_id: OrderId,
    item_ids: Annotated[
        list[str],
        Field(
            description="The item ids to be returned, each such as '1008292230'. "
            "There could be duplicate items in the list."
        ),
    ],
    payment_method_id: Annotated[
        str,
        Field(description=_PAYMENT_METHOD_START + "\nThese can be looked up from the user or order details."),
    ],
) -> dict[str, Any]:
    """Record a return request; the refund goes to a gift card or the original payment method."""
    order = await _get_order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError("Non-delivered order cannot be returned")
    method = await _get_payment_method(db, order["user_id"], payment_method_id)
    if (
        method["source"] != "gift_card"
        and payment_method_id != order["payment_history"][0]["payment_method_id"]
    ):
        raise ToolError("Payment method should be the original payment method")
    all_item_ids = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > all_item_ids.count(item_id):
            raise ToolError("Some item not found")
    await _set_order(
        db,
        order["order_id"],
        status="return requested",
        return_items=json.dumps(sorted(item_ids)),
        return_payment_method_id=payment_method_id,
    )
    return await _get_order(db, order["order_id"])


@tool(
    description="Transfer the user to a human agent, with a summary of the user's issue.\n\n"
    "Only transfer if\n"
    " -  the user explicitly asks for a human agent\n"
    " -  given the policy and the available tools, you cannot solve the user's issue.",
)
async def transfer_to_human_agents(
    db: Db, summary: Annotated[str, Field(description="A summary of the user's issue.")]
) -> str:
    """Nothing to do in the DB: τ² ends the conversation on this tool's call."""
    return "Transfer successful"
