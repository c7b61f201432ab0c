"""Tools of the retail_orders env: an online shop's customer-service desk.

Reads look customers, orders, products and returns up by their ids or natural keys; writes place,
change and cancel orders, request and withdraw returns, and add addresses. Every write checks
its preconditions and raises `ToolError` with a message the agent can act on. The shop's date is
fixed (`TODAY`), never read from the clock, so the same calls always produce the same state.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any, Literal

from envforge.server import Db, ToolError, tool

TODAY = "2024-06-15"
RETURN_WINDOW_DAYS = 30
MAX_ADDRESSES = 4
MAX_ORDER_UNITS = 10

OrderStatus = Literal["pending", "processing", "shipped", "delivered", "cancelled"]
Category = Literal["apparel", "footwear", "electronics", "outdoors", "kitchen", "home"]
CancelReason = Literal["no_longer_needed", "ordered_by_mistake", "found_better_price", "delivery_too_slow"]
ReturnReason = Literal["defective", "wrong_item", "wrong_size", "not_as_described", "changed_mind"]

Row = dict[str, Any]


# --- helpers ---------------------------------------------------------------------------------


async def _next_id(db: Db, table: str, column: str, prefix: str) -> str:
    """The next id after the largest one in use, so new ids never depend on the clock or chance.

    `table` and `column` are constants from this module, never agent input.
    """
    sql = f"SELECT MAX(CAST(SUBSTR({column}, ?) AS INTEGER)) FROM {table}"
    rows = await db.fetch_all(sql, (len(prefix) + 1,))
    current = next(iter(rows[0].values())) if rows else None
    return f"{prefix}{(current or 0) + 1}"


async def _customer(db: Db, customer_id: str) -> Row:
    return await db.require_one(
        "SELECT * FROM customers WHERE customer_id = ?", (customer_id,), f"customer {customer_id} not found"
    )


async def _owned_order(db: Db, customer_id: str, order_id: str) -> Row:
    """The order, after checking that it exists and belongs to the customer."""
    await _customer(db, customer_id)
    order = await db.require_one(
        "SELECT * FROM orders WHERE order_id = ?", (order_id,), f"order {order_id} not found"
    )
    if order["customer_id"] != customer_id:
        raise ToolError(f"order {order_id} does not belong to customer {customer_id}")
    return order


async def _owned_payment_method(db: Db, customer_id: str, payment_method_id: str) -> Row:
    pm = await db.require_one(
        "SELECT * FROM payment_methods WHERE payment_method_id = ?",
        (payment_method_id,),
        f"payment method {payment_method_id} not found",
    )
    if pm["customer_id"] != customer_id:
        raise ToolError(f"payment method {payment_method_id} does not belong to customer {customer_id}")
    return pm


async def _owned_address(db: Db, customer_id: str, address_id: str) -> Row:
    address = await db.require_one(
        "SELECT * FROM addresses WHERE address_id = ?", (address_id,), f"address {address_id} not found"
    )
    if address["customer_id"] != customer_id:
        raise ToolError(f"address {address_id} does not belong to customer {customer_id}")
    return address


def _check_can_pay(pm: Row, amount: float) -> None:
    """A card must not be expired (as of TODAY); a gift card must hold at least `amount`."""
    if pm["kind"] == "card":
        if pm["expires"] < TODAY[:7]:
            raise ToolError(f"card {pm['payment_method_id']} expired in {pm['expires']}")
    elif pm["balance"] < amount:
        raise ToolError(
            f"gift card {pm['payment_method_id']} has a balance of {pm['balance']:.2f}, "
            f"less than the {amount:.2f} to be charged"
        )


async def _add_payment(
    db: Db, order_id: str, pm: Row, kind: str, amount: float, return_id: str | None = None
) -> None:
    """Record a charge or refund and move a gift card's balance with it."""
    amount = round(amount, 2)
    payment_id = await _next_id(db, "payments", "payment_id", "PAY-")
    await db.execute(
        "INSERT INTO payments (payment_id, order_id, payment_method_id, kind, amount, return_id)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (payment_id, order_id, pm["payment_method_id"], kind, amount, return_id),
    )
    if pm["kind"] == "gift_card":
        delta = -amount if kind == "charge" else amount
        await db.execute(
            "UPDATE payment_methods SET balance = ROUND(balance + ?, 2) WHERE payment_method_id = ?",
            (delta, pm["payment_method_id"]),
        )


async def _charged_method_ids(db: Db, order_id: str) -> list[str]:
    rows = await db.fetch_all(
        "SELECT DISTINCT payment_method_id FROM payments WHERE order_id = ? AND kind = 'charge'"
        " ORDER BY payment_method_id",
        (order_id,),
    )
    return [r["payment_method_id"] for r in rows]


async def _order_items(db: Db, order_id: str) -> list[Row]:
    return await db.fetch_all(
        "SELECT i.order_item_id, i.variant_id, v.product_id, p.name, v.options, i.quantity, i.unit_price,"
        " i.status FROM order_items i JOIN variants v ON v.variant_id = i.variant_id"
        " JOIN products p ON p.product_id = v.product_id WHERE i.order_id = ? ORDER BY i.order_item_id",
        (order_id,),
    )


async def _order_detail(db: Db, order_id: str) -> Row:
    order = await db.require_one(
        "SELECT * FROM orders WHERE order_id = ?", (order_id,), f"order {order_id} not found"
    )
    order["items"] = await _order_items(db, order_id)
    order["payments"] = await db.fetch_all(
        "SELECT payment_id, payment_method_id, kind, amount, return_id FROM payments WHERE order_id = ?"
        " ORDER BY payment_id",
        (order_id,),
    )
    returns = await db.fetch_all(
        "SELECT return_id FROM returns WHERE order_id = ? ORDER BY return_id", (order_id,)
    )
    order["return_ids"] = [r["return_id"] for r in returns]
    return order


async def _return_detail(db: Db, return_id: str) -> Row:
    ret = await db.require_one(
        "SELECT * FROM returns WHERE return_id = ?", (return_id,), f"return {return_id} not found"
    )
    items = await db.fetch_all(
        "SELECT order_item_id FROM return_items WHERE return_id = ? ORDER BY order_item_id", (return_id,)
    )
    ret["order_item_ids"] = [r["order_item_id"] for r in items]
    return ret


def _customer_summary(c: Row) -> Row:
    keys = ("customer_id", "first_name", "last_name", "email", "status")
    return {k: c[k] for k in keys}


# --- read tools ------------------------------------------------------------------------------


@tool
async def find_customer_by_email(db: Db, email: str) -> Row:
    """Find a customer by email address (case-insensitive). Use it to verify a customer's identity.

    Args:
        email: The customer's email address, such as 'olivia.smith@example.com'.
    """
    c = await db.require_one(
        "SELECT * FROM customers WHERE email = ? COLLATE NOCASE",
        (email.strip(),),
        f"no customer has the email {email.strip()!r}",
    )
    return _customer_summary(c)


@tool
async def find_customer_by_name_zip(db: Db, first_name: str, last_name: str, zip: str) -> Row:
    """Find a customer by first name, last name and the zip code of any of their addresses.

    Args:
        first_name: The customer's first name.
        last_name: The customer's last name.
        zip: A 5-digit zip code of one of the customer's addresses.
    """
    rows = await db.fetch_all(
        "SELECT DISTINCT c.* FROM customers c JOIN addresses a ON a.customer_id = c.customer_id"
        " WHERE c.first_name = ? COLLATE NOCASE AND c.last_name = ? COLLATE NOCASE AND a.zip = ?"
        " ORDER BY c.customer_id",
        (first_name.strip(), last_name.strip(), zip.strip()),
    )
    if not rows:
        raise ToolError(f"no customer named {first_name} {last_name} has an address in zip {zip}")
    if len(rows) > 1:
        raise ToolError("several customers match; verify the customer by email instead")
    return _customer_summary(rows[0])


@tool
async def get_customer(db: Db, customer_id: str) -> Row:
    """Get a customer's profile with their addresses and payment methods (gift cards show their balance).

    Args:
        customer_id: The customer id, such as 'C-1001'.
    """
    c = await _customer(db, customer_id)
    c["addresses"] = await db.fetch_all(
        "SELECT address_id, line1, line2, city, state, zip, is_default FROM addresses"
        " WHERE customer_id = ? ORDER BY address_id",
        (customer_id,),
    )
    c["payment_methods"] = await db.fetch_all(
        "SELECT payment_method_id, kind, brand, last4, expires, balance FROM payment_methods"
        " WHERE customer_id = ? ORDER BY payment_method_id",
        (customer_id,),
    )
    return c


@tool
async def list_customer_orders(db: Db, customer_id: str, status: OrderStatus | None = None) -> list[Row]:
    """List a customer's orders, oldest first, optionally only those with one status.

    Args:
        customer_id: The customer id.
        status: Only orders in this status; leave out for all orders.
    """
    await _customer(db, customer_id)
    return await db.fetch_all(
        "SELECT o.order_id, o.status, o.placed_on, o.total,"
        " (SELECT COUNT(*) FROM order_items i WHERE i.order_id = o.order_id) AS item_count"
        " FROM orders o WHERE o.customer_id = ? AND (? IS NULL OR o.status = ?) ORDER BY o.order_id",
        (customer_id, status, status),
    )


@tool
async def get_order(db: Db, order_id: str) -> Row:
    """Get an order with its items, payments (charges and refunds) and the ids of its returns.

    Args:
        order_id: The order id, such as 'O-5001'.
    """
    return await _order_detail(db, order_id)


@tool
async def search_products(
    db: Db, query: str = "", category: Category | None = None, in_stock_only: bool = False
) -> list[Row]:
    """Search the catalogue by words in the product name, optionally within a category.

    Args:
        query: Words that must appear in the product name (case-insensitive); empty matches all.
        category: Only products in this category.
        in_stock_only: Only products with at least one variant in stock.
    """
    rows = await db.fetch_all(
        "SELECT p.product_id, p.name, p.category, p.status, MIN(v.price) AS min_price,"
        " MAX(v.price) AS max_price, SUM(v.stock) AS units_in_stock"
        " FROM products p JOIN variants v ON v.product_id = p.product_id"
        " WHERE (? IS NULL OR p.category = ?) GROUP BY p.product_id ORDER BY p.product_id",
        (category, category),
    )
    words = query.lower().split()
    return [
        r
        for r in rows
        if all(w in r["name"].lower() for w in words) and (not in_stock_only or r["units_in_stock"] > 0)
    ]


@tool
async def get_product(db: Db, product_id: str) -> Row:
    """Get a product with all its variants (options, price, units in stock).

    Args:
        product_id: The product id, such as 'P-101'.
    """
    product = await db.require_one(
        "SELECT * FROM products WHERE product_id = ?", (product_id,), f"product {product_id} not found"
    )
    product["variants"] = await db.fetch_all(
        "SELECT variant_id, options, price, stock FROM variants WHERE product_id = ? ORDER BY variant_id",
        (product_id,),
    )
    return product


@tool
async def get_return(db: Db, return_id: str) -> Row:
    """Get a return: its order, status, reason, refund amount, refund payment method and items.

    Args:
        return_id: The return id, such as 'R-7001'.
    """
    return await _return_detail(db, return_id)


# --- write tools -----------------------------------------------------------------------------


@tool(writes=["orders", "order_items", "variants", "payments", "payment_methods"])
async def place_order(
    db: Db, customer_id: str, address_id: str, payment_method_id: str, variant_ids: list[str]
) -> Row:
    """Place a new order, charged in full to one payment method; it starts as 'pending'.

    Args:
        customer_id: The customer placing the order.
        address_id: One of the customer's addresses to ship to.
        payment_method_id: One of the customer's payment methods: a card that has not expired, or a gift
            card whose balance covers the total.
        variant_ids: The variants to buy, one entry per unit (repeat an id to buy several).
    """
    customer = await _customer(db, customer_id)
    if customer["status"] != "active":
        raise ToolError(f"customer {customer_id} is {customer['status']} and cannot place orders")
    if not variant_ids:
        raise ToolError("variant_ids is empty: name at least one variant to order")
    if len(variant_ids) > MAX_ORDER_UNITS:
        raise ToolError(f"an order may hold at most {MAX_ORDER_UNITS} units, got {len(variant_ids)}")
    await _owned_address(db, customer_id, address_id)
    pm = await _owned_payment_method(db, customer_id, payment_method_id)
    quantities = Counter(variant_ids)
    total = 0.0
    lines: list[tuple[Row, int]] = []
    for variant_id, qty in quantities.items():
        v = await db.require_one(
            "SELECT v.*, p.name, p.status FROM variants v JOIN products p ON p.product_id = v.product_id"
            " WHERE v.variant_id = ?",
            (variant_id,),
            f"variant {variant_id} not found",
        )
        if v["status"] != "active":
            raise ToolError(f"product {v['product_id']} ({v['name']}) is discontinued and cannot be ordered")
        if v["stock"] < qty:
            raise ToolError(f"variant {variant_id} has {v['stock']} in stock, {qty} requested")
        total += v["price"] * qty
        lines.append((v, qty))
    total = round(total, 2)
    _check_can_pay(pm, total)
    order_id = await _next_id(db, "orders", "order_id", "O-")
    await db.execute(
        "INSERT INTO orders (order_id, customer_id, address_id, status, placed_on, delivered_on,"
        " tracking_number, total, cancel_reason) VALUES (?, ?, ?, 'pending', ?, NULL, NULL, ?, NULL)",
        (order_id, customer_id, address_id, TODAY, total),
    )
    for v, qty in lines:
        item_id = await _next_id(db, "order_items", "order_item_id", "OI-")
        await db.execute(
            "INSERT INTO order_items (order_item_id, order_id, variant_id, quantity, unit_price, status)"
            " VALUES (?, ?, ?, ?, ?, 'ordered')",
            (item_id, order_id, v["variant_id"], qty, v["price"]),
        )
        await db.execute("UPDATE variants SET stock = stock - ? WHERE variant_id = ?", (qty, v["variant_id"]))
    await _add_payment(db, order_id, pm, "charge", total)
    return await _order_detail(db, order_id)


@tool(writes=["orders", "variants", "payments", "payment_methods"])
async def cancel_order(db: Db, customer_id: str, order_id: str, reason: CancelReason) -> Row:
    """Cancel a pending or processing order: restock its items and refund what was paid.

    The refund goes back to the payment methods the order was charged with (gift cards are credited).

    Args:
        customer_id: The customer who owns the order.
        order_id: The order to cancel.
        reason: Why the customer cancels.
    """
    order = await _owned_order(db, customer_id, order_id)
    if order["status"] not in ("pending", "processing"):
        raise ToolError(
            f"order {order_id} is {order['status']}; only pending or processing orders can be cancelled"
        )
    for item in await _order_items(db, order_id):
        await db.execute(
            "UPDATE variants SET stock = stock + ? WHERE variant_id = ?",
            (item["quantity"], item["variant_id"]),
        )
    nets = await db.fetch_all(
        "SELECT m.*, SUM(CASE WHEN p.kind = 'charge' THEN p.amount ELSE -p.amount END) AS net"
        " FROM payments p JOIN payment_methods m ON m.payment_method_id = p.payment_method_id"
        " WHERE p.order_id = ? GROUP BY m.payment_method_id ORDER BY MIN(p.payment_id)",
        (order_id,),
    )
    remaining = round(order["total"], 2)
    for pm in nets:
        amount = round(min(pm["net"], remaining), 2)
        if amount > 0:
            await _add_payment(db, order_id, pm, "refund", amount)
            remaining = round(remaining - amount, 2)
    await db.execute(
        "UPDATE orders SET status = 'cancelled', cancel_reason = ? WHERE order_id = ?", (reason, order_id)
    )
    return await _order_detail(db, order_id)


@tool(writes=["orders"])
async def update_order_address(db: Db, customer_id: str, order_id: str, address_id: str) -> Row:
    """Change where a pending order ships to, choosing another of the customer's addresses.

    Args:
        customer_id: The customer who owns the order.
        order_id: The pending order.
        address_id: One of the customer's addresses (see get_customer).
    """
    order = await _owned_order(db, customer_id, order_id)
    if order["status"] != "pending":
        raise ToolError(f"order {order_id} is {order['status']}; only pending orders can be changed")
    await _owned_address(db, customer_id, address_id)
    if order["address_id"] == address_id:
        raise ToolError(f"order {order_id} already ships to address {address_id}")
    await db.execute("UPDATE orders SET address_id = ? WHERE order_id = ?", (address_id, order_id))
    return await _order_detail(db, order_id)


@tool(writes=["orders", "order_items", "variants", "payments", "payment_methods"])
async def change_order_item(
    db: Db, customer_id: str, order_id: str, order_item_id: str, variant_id: str, payment_method_id: str
) -> Row:
    """Swap an item of a pending order for another variant of the same product (e.g. another size).

    The price difference for the item's quantity is charged to the payment method, or refunded to it;
    a refund may only go to a payment method this order was charged with.

    Args:
        customer_id: The customer who owns the order.
        order_id: The pending order.
        order_item_id: The item of that order to change.
        variant_id: The new variant; it must belong to the same product and be in stock.
        payment_method_id: The customer's payment method that pays or receives the price difference.
    """
    order = await _owned_order(db, customer_id, order_id)
    if order["status"] != "pending":
        raise ToolError(f"order {order_id} is {order['status']}; only pending orders can be changed")
    item = await db.require_one(
        "SELECT i.*, v.product_id FROM order_items i JOIN variants v ON v.variant_id = i.variant_id"
        " WHERE i.order_item_id = ? AND i.order_id = ?",
        (order_item_id, order_id),
        f"order item {order_item_id} is not part of order {order_id}",
    )
    new = await db.require_one(
        "SELECT v.*, p.name, p.status FROM variants v JOIN products p ON p.product_id = v.product_id"
        " WHERE v.variant_id = ?",
        (variant_id,),
        f"variant {variant_id} not found",
    )
    if new["variant_id"] == item["variant_id"]:
        raise ToolError(f"order item {order_item_id} already is variant {variant_id}")
    if new["product_id"] != item["product_id"]:
        raise ToolError(
            f"variant {variant_id} belongs to product {new['product_id']}, not {item['product_id']}; "
            "an item can only be swapped for a variant of the same product"
        )
    if new["status"] != "active":
        raise ToolError(f"product {new['product_id']} ({new['name']}) is discontinued")
    qty = item["quantity"]
    if new["stock"] < qty:
        raise ToolError(f"variant {variant_id} has {new['stock']} in stock, {qty} needed")
    pm = await _owned_payment_method(db, customer_id, payment_method_id)
    diff = round((new["price"] - item["unit_price"]) * qty, 2)
    if diff > 0:
        _check_can_pay(pm, diff)
        await _add_payment(db, order_id, pm, "charge", diff)
    elif diff < 0:
        if payment_method_id not in await _charged_method_ids(db, order_id):
            raise ToolError(
                f"order {order_id} was not paid with {payment_method_id}; "
                "a refund can only go to a payment method the order was charged with"
            )
        await _add_payment(db, order_id, pm, "refund", -diff)
    await db.execute("UPDATE variants SET stock = stock + ? WHERE variant_id = ?", (qty, item["variant_id"]))
    await db.execute("UPDATE variants SET stock = stock - ? WHERE variant_id = ?", (qty, variant_id))
    await db.execute(
        "UPDATE order_items SET variant_id = ?, unit_price = ? WHERE order_item_id = ?",
        (variant_id, new["price"], order_item_id),
    )
    await db.execute("UPDATE orders SET total = ROUND(total + ?, 2) WHERE order_id = ?", (diff, order_id))
    return await _order_detail(db, order_id)


@tool(writes=["returns", "return_items", "order_items"])
async def request_return(
    db: Db,
    customer_id: str,
    order_id: str,
    order_item_ids: list[str],
    reason: ReturnReason,
    payment_method_id: str,
) -> Row:
    """Open a return for items of a delivered order, within 30 days of delivery.

    The refund is paid when the warehouse receives the items, to the given payment method: one the
    order was charged with, or one of the customer's gift cards.

    Args:
        customer_id: The customer who owns the order.
        order_id: The delivered order.
        order_item_ids: The items to return (each returns its whole quantity); at least one.
        reason: Why the items come back.
        payment_method_id: Where the refund goes.
    """
    order = await _owned_order(db, customer_id, order_id)
    if order["status"] != "delivered":
        raise ToolError(f"order {order_id} is {order['status']}; only delivered orders can be returned")
    closes = dt.date.fromisoformat(order["delivered_on"]) + dt.timedelta(days=RETURN_WINDOW_DAYS)
    if closes.isoformat() < TODAY:
        raise ToolError(
            f"the {RETURN_WINDOW_DAYS}-day return window of order {order_id} closed on {closes.isoformat()}"
        )
    if not order_item_ids:
        raise ToolError("order_item_ids is empty: name at least one item to return")
    if len(set(order_item_ids)) != len(order_item_ids):
        raise ToolError("order_item_ids lists an item more than once")
    items = {i["order_item_id"]: i for i in await _order_items(db, order_id)}
    amount = 0.0
    for item_id in order_item_ids:
        item = items.get(item_id)
        if item is None:
            raise ToolError(f"order item {item_id} is not part of order {order_id}")
        if item["status"] != "ordered":
            raise ToolError(f"order item {item_id} is already {item['status'].replace('_', ' ')}")
        amount += item["quantity"] * item["unit_price"]
    pm = await _owned_payment_method(db, customer_id, payment_method_id)
    if pm["kind"] != "gift_card" and payment_method_id not in await _charged_method_ids(db, order_id):
        raise ToolError(
            f"order {order_id} was not paid with {payment_method_id}; refunds go to a payment method "
            "the order was charged with or to one of the customer's gift cards"
        )
    return_id = await _next_id(db, "returns", "return_id", "R-")
    await db.execute(
        "INSERT INTO returns (return_id, order_id, payment_method_id, reason, status, requested_on,"
        " refund_amount) VALUES (?, ?, ?, ?, 'requested', ?, ?)",
        (return_id, order_id, payment_method_id, reason, TODAY, round(amount, 2)),
    )
    for item_id in order_item_ids:
        await db.execute(
            "INSERT INTO return_items (return_id, order_item_id) VALUES (?, ?)", (return_id, item_id)
        )
        await db.execute(
            "UPDATE order_items SET status = 'return_requested' WHERE order_item_id = ?", (item_id,)
        )
    return await _return_detail(db, return_id)


@tool(writes=["returns", "order_items"])
async def cancel_return(db: Db, customer_id: str, return_id: str) -> Row:
    """Withdraw a return that is still 'requested'; its items count as kept again.

    Args:
        customer_id: The customer who owns the order of the return.
        return_id: The return to withdraw.
    """
    ret = await _return_detail(db, return_id)
    await _owned_order(db, customer_id, ret["order_id"])
    if ret["status"] != "requested":
        raise ToolError(f"return {return_id} is {ret['status']}; only requested returns can be cancelled")
    await db.execute("UPDATE returns SET status = 'cancelled' WHERE return_id = ?", (return_id,))
    for item_id in ret["order_item_ids"]:
        await db.execute("UPDATE order_items SET status = 'ordered' WHERE order_item_id = ?", (item_id,))
    return await _return_detail(db, return_id)


@tool(writes=["addresses"])
async def add_address(
    db: Db,
    customer_id: str,
    line1: str,
    city: str,
    state: str,
    zip: str,
    line2: str = "",
    make_default: bool = False,
) -> Row:
    """Add a shipping address to a customer's profile (at most 4 addresses per customer).

    Args:
        customer_id: The customer.
        line1: Street address, such as '12 Maple Street'.
        city: City.
        state: Two-letter US state code, such as 'TX'.
        zip: 5-digit zip code.
        line2: Apartment, suite, etc.; empty if none.
        make_default: Make this the customer's default address.
    """
    await _customer(db, customer_id)
    line1, line2, city, state, zip = line1.strip(), line2.strip(), city.strip(), state.strip(), zip.strip()
    if not line1 or not city:
        raise ToolError("line1 and city must not be empty")
    if len(state) != 2 or not state.isalpha() or not state.isupper():
        raise ToolError(f"state must be a two-letter code such as 'TX', got {state!r}")
    if len(zip) != 5 or not zip.isdigit():
        raise ToolError(f"zip must be 5 digits, got {zip!r}")
    existing = await db.fetch_all(
        "SELECT * FROM addresses WHERE customer_id = ? ORDER BY address_id", (customer_id,)
    )
    if len(existing) >= MAX_ADDRESSES:
        raise ToolError(f"customer {customer_id} already has {MAX_ADDRESSES} addresses, the maximum")
    for a in existing:
        if a["line1"].lower() == line1.lower() and a["line2"].lower() == line2.lower() and a["zip"] == zip:
            raise ToolError(f"customer {customer_id} already has this address as {a['address_id']}")
    address_id = await _next_id(db, "addresses", "address_id", "A-")
    is_default = 1 if make_default or not existing else 0
    if is_default:
        await db.execute("UPDATE addresses SET is_default = 0 WHERE customer_id = ?", (customer_id,))
    await db.execute(
        "INSERT INTO addresses (address_id, customer_id, line1, line2, city, state, zip, is_default)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (address_id, customer_id, line1, line2, city, state, zip, is_default),
    )
    return await db.require_one(
        "SELECT * FROM addresses WHERE address_id = ?", (address_id,), "address not found"
    )
