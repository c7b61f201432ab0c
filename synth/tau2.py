"""Import τ²-bench's retail domain into the `tau2_retail` env, and convert its state back.

τ²'s retail DB is one nested JSON document (`db.json`: products, users and orders keyed by id);
the env stores it relationally (`envs/tau2_retail/schema.sql`). The two directions live together
here because they must stay exact inverses: `state_to_tau2_db` is how a run's final state is
scored against τ² (its DB hash), so anything `tau2_db_to_seed` flattens must come back with the
same values, the same key order and the same list order.

The τ² data itself is never copied into the repository: `import_tau2_env` generates `seed.json`
and `policy.md` into the env folder from a τ²-bench data folder supplied at import time.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

#: τ²'s DB hash of the unmodified retail `db.json` (`RetailDB.model_dump()`, hashed).
INITIAL_DB_HASH = "b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c"

#: The 16 agent tools of τ²'s `RetailTools`, in definition order (the order τ² lists them in).
RETAIL_TOOLS = (
    "calculate",
    "cancel_pending_order",
    "exchange_delivered_order_items",
    "find_user_id_by_name_zip",
    "find_user_id_by_email",
    "get_order_details",
    "get_product_details",
    "get_item_details",
    "get_user_details",
    "list_all_product_types",
    "modify_pending_order_address",
    "modify_pending_order_items",
    "modify_pending_order_payment",
    "modify_user_address",
    "return_delivered_order_items",
    "transfer_to_human_agents",
)

ADDRESS_FIELDS = ("address1", "address2", "city", "country", "state", "zip")
#: Order fields that db.json leaves out but τ²'s `Order` model dumps (as null when unset).
ORDER_OPTIONAL_FIELDS = (
    "cancel_reason",
    "exchange_items",
    "exchange_new_items",
    "exchange_payment_method_id",
    "exchange_price_difference",
    "return_items",
    "return_payment_method_id",
)
_JSON_LIST_FIELDS = ("exchange_items", "exchange_new_items", "return_items")
_SOURCES = ("credit_card", "gift_card", "paypal")

#: Tables in foreign-key order, as seed.json lists them.
SEED_TABLES = (
    "products",
    "variants",
    "users",
    "user_addresses",
    "payment_methods",
    "orders",
    "order_items",
    "order_fulfillments",
    "order_payments",
)


class Tau2ImportError(ValueError):
    """The τ²-bench data folder is incomplete or holds something this importer cannot represent."""


def _text(value: Any) -> str:
    """JSON text for a nested value, as τ² would serialise it (default separators, key order kept)."""
    return json.dumps(value)


def _same_key(kind: str, key: str, inner: Any) -> None:
    # The relational form keeps one id per record; τ²'s dicts could in principle disagree with it.
    if key != inner:
        raise ValueError(f"{kind} keyed {key!r} carries the id {inner!r}; they must be equal")


def tau2_db_to_seed(db: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """τ²'s retail `db.json` as seed rows for `envs/tau2_retail/schema.sql`.

    Values are coerced the way τ²'s pydantic models coerce them on load (prices and balances to
    float), so that the seed's state converts back to exactly `RetailDB.model_dump()`.
    """
    seed: dict[str, list[dict[str, Any]]] = {t: [] for t in SEED_TABLES}
    for p_pos, (product_id, product) in enumerate(db["products"].items()):
        _same_key("product", product_id, product["product_id"])
        seed["products"].append({"product_id": product_id, "name": product["name"], "position": p_pos})
        for v_pos, (item_id, variant) in enumerate(product["variants"].items()):
            _same_key("variant", item_id, variant["item_id"])
            seed["variants"].append(
                {
                    "item_id": item_id,
                    "product_id": product_id,
                    "position": v_pos,
                    "options": _text(variant["options"]),
                    "available": int(bool(variant["available"])),
                    "price": float(variant["price"]),
                }
            )
    listed: dict[str, tuple[str, int]] = {}
    for u_pos, (user_id, user) in enumerate(db["users"].items()):
        _same_key("user", user_id, user["user_id"])
        seed["users"].append(
            {
                "user_id": user_id,
                "first_name": user["name"]["first_name"],
                "last_name": user["name"]["last_name"],
                "email": user["email"],
                "position": u_pos,
            }
        )
        seed["user_addresses"].append({"user_id": user_id, **{f: user["address"][f] for f in ADDRESS_FIELDS}})
        for m_pos, (method_id, method) in enumerate(user["payment_methods"].items()):
            _same_key("payment method", method_id, method["id"])
            source = method["source"]
            if source not in _SOURCES:
                raise ValueError(f"payment method {method_id!r} has unknown source {source!r}")
            seed["payment_methods"].append(
                {
                    "payment_method_id": method_id,
                    "user_id": user_id,
                    "position": m_pos,
                    "source": source,
                    "brand": method["brand"] if source == "credit_card" else None,
                    "last_four": method["last_four"] if source == "credit_card" else None,
                    "balance": float(method["balance"]) if source == "gift_card" else None,
                }
            )
        for o_pos, order_id in enumerate(user["orders"]):
            if order_id in listed:
                raise ValueError(f"order {order_id!r} is listed twice in users' order lists")
            listed[order_id] = (user_id, o_pos)
    for position, (order_id, order) in enumerate(db["orders"].items()):
        _same_key("order", order_id, order["order_id"])
        owner, user_position = listed.pop(order_id, (order["user_id"], None))
        if owner != order["user_id"]:
            raise ValueError(f"order {order_id!r} belongs to {order['user_id']!r} but {owner!r} lists it")
        row: dict[str, Any] = {
            "order_id": order_id,
            "user_id": order["user_id"],
            "position": position,
            "user_position": user_position,
        }
        row.update({f: order["address"][f] for f in ADDRESS_FIELDS})
        row["status"] = order["status"]
        for f in ORDER_OPTIONAL_FIELDS:
            value = order.get(f)
            if f in _JSON_LIST_FIELDS and value is not None:
                value = _text(value)
            elif f == "exchange_price_difference" and value is not None:
                value = float(value)
            row[f] = value
        seed["orders"].append(row)
        for i_pos, item in enumerate(order["items"]):
            seed["order_items"].append(
                {
                    "order_id": order_id,
                    "position": i_pos,
                    "name": item["name"],
                    "product_id": item["product_id"],
                    "item_id": item["item_id"],
                    "price": float(item["price"]),
                    "options": _text(item["options"]),
                }
            )
        for f_pos, fulfillment in enumerate(order["fulfillments"]):
            seed["order_fulfillments"].append(
                {
                    "order_id": order_id,
                    "position": f_pos,
                    "tracking_id": _text(fulfillment["tracking_id"]),
                    "item_ids": _text(fulfillment["item_ids"]),
                }
            )
        for pay_pos, payment in enumerate(order["payment_history"]):
            seed["order_payments"].append(
                {
                    "order_id": order_id,
                    "position": pay_pos,
                    "transaction_type": payment["transaction_type"],
                    "amount": float(payment["amount"]),
                    "payment_method_id": payment["payment_method_id"],
                }
            )
    if listed:
        raise ValueError(f"users list orders that do not exist: {sorted(listed)[:5]}")
    return seed


def _grouped(rows: list[dict[str, Any]], key: str) -> dict[Any, list[dict[str, Any]]]:
    """Rows grouped by `key`, each group in `position` order."""
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r["position"]):
        groups[row[key]].append(row)
    return groups


def payment_method_dump(row: dict[str, Any]) -> dict[str, Any]:
    """A `payment_methods` row as τ²'s CreditCard / GiftCard / Paypal model dumps it."""
    out: dict[str, Any] = {"source": row["source"], "id": row["payment_method_id"]}
    if row["source"] == "credit_card":
        out["brand"] = row["brand"]
        out["last_four"] = row["last_four"]
    elif row["source"] == "gift_card":
        out["balance"] = row["balance"]
    return out


def state_to_tau2_db(state: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The env's canonical state export as τ²'s `RetailDB.model_dump()`: the object τ² hashes.

    Every order carries all 14 `Order` fields (the optional ones as null), dict-valued fields and
    lists come back in their stored order, and nested JSON text is parsed back into values.
    """
    variants = _grouped(state["variants"], "product_id")
    products = {
        p["product_id"]: {
            "name": p["name"],
            "product_id": p["product_id"],
            "variants": {
                v["item_id"]: {
                    "item_id": v["item_id"],
                    "options": json.loads(v["options"]),
                    "available": bool(v["available"]),
                    "price": v["price"],
                }
                for v in variants.get(p["product_id"], [])
            },
        }
        for p in sorted(state["products"], key=lambda r: r["position"])
    }
    addresses = {a["user_id"]: a for a in state["user_addresses"]}
    methods = _grouped(state["payment_methods"], "user_id")
    user_orders: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for o in state["orders"]:
        if o["user_position"] is not None:
            user_orders[o["user_id"]].append((o["user_position"], o["order_id"]))
    users = {
        u["user_id"]: {
            "user_id": u["user_id"],
            "name": {"first_name": u["first_name"], "last_name": u["last_name"]},
            "address": {f: addresses[u["user_id"]][f] for f in ADDRESS_FIELDS},
            "email": u["email"],
            "payment_methods": {
                m["payment_method_id"]: payment_method_dump(m) for m in methods.get(u["user_id"], [])
            },
            "orders": [order_id for _, order_id in sorted(user_orders.get(u["user_id"], []))],
        }
        for u in sorted(state["users"], key=lambda r: r["position"])
    }
    items = _grouped(state["order_items"], "order_id")
    fulfillments = _grouped(state["order_fulfillments"], "order_id")
    payments = _grouped(state["order_payments"], "order_id")
    orders = {}
    for o in sorted(state["orders"], key=lambda r: r["position"]):
        order_id = o["order_id"]
        order: dict[str, Any] = {
            "order_id": order_id,
            "user_id": o["user_id"],
            "address": {f: o[f] for f in ADDRESS_FIELDS},
            "items": [
                {
                    "name": i["name"],
                    "product_id": i["product_id"],
                    "item_id": i["item_id"],
                    "price": i["price"],
                    "options": json.loads(i["options"]),
                }
                for i in items.get(order_id, [])
            ],
            "status": o["status"],
            "fulfillments": [
                {"tracking_id": json.loads(f["tracking_id"]), "item_ids": json.loads(f["item_ids"])}
                for f in fulfillments.get(order_id, [])
            ],
            "payment_history": [
                {
                    "transaction_type": p["transaction_type"],
                    "amount": p["amount"],
                    "payment_method_id": p["payment_method_id"],
                }
                for p in payments.get(order_id, [])
            ],
        }
        for f in ORDER_OPTIONAL_FIELDS:
            value = o[f]
            order[f] = json.loads(value) if f in _JSON_LIST_FIELDS and value is not None else value
        orders[order_id] = order
    return {"products": products, "users": users, "orders": orders}


def tau2_db_hash(db: dict[str, Any]) -> str:
    """τ²'s `get_dict_hash`: sha256 of `json.dumps(db, sort_keys=True, default=str)`."""
    return hashlib.sha256(json.dumps(db, sort_keys=True, default=str).encode()).hexdigest()


def seed_json_text(seed: dict[str, list[dict[str, Any]]]) -> str:
    """seed.json's text: one row per line, so the loader's line numbers point at a single row."""
    parts = []
    for table, rows in seed.items():
        body = ",\n".join(json.dumps(row) for row in rows)
        parts.append(f"{json.dumps(table)}: [\n{body}\n]")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _source_file(src_dir: Path, name: str) -> Path:
    path = src_dir / name
    if not path.is_file():
        raise Tau2ImportError(f"{path}: missing; expected τ²-bench's retail {name} in {src_dir}")
    return path


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Tau2ImportError(f"{path}: invalid JSON ({exc})") from exc


def _check_tools(path: Path) -> None:
    """tools.json must be τ²'s 16 retail tool schemas: a sanity check that this is the retail domain."""
    tools = _load_json(path)
    try:
        names = tuple(t["function"]["name"] for t in tools if t["type"] == "function")
    except (TypeError, KeyError) as exc:
        raise Tau2ImportError(
            f"{path}: not a list of {{'type': 'function', 'function': {{...}}}} objects"
        ) from exc
    if names != RETAIL_TOOLS:
        raise Tau2ImportError(
            f"{path}: expected τ²'s 16 retail tools {list(RETAIL_TOOLS)}, found {list(names)}"
        )


def _write_if_changed(path: Path, data: bytes) -> None:
    """Write atomically, and not at all when the bytes are already there (re-imports are no-ops)."""
    if path.is_file() and path.read_bytes() == data:
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the generated files private
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def import_tau2_env(src_dir: Path, env_dir: Path) -> None:
    """Generate `seed.json` and `policy.md` in `env_dir` from τ²-bench's retail data in `src_dir`.

    `src_dir` holds `db.json`, `policy.md` and `tools.json` (a folder with a `retail/` subfolder
    holding them is accepted too). The policy is copied byte for byte: τ² gives it to the agent
    unchanged. Re-running on the same data leaves both files byte-identical.
    """
    src_dir, env_dir = Path(src_dir), Path(env_dir)
    if not (src_dir / "db.json").exists() and (src_dir / "retail" / "db.json").exists():
        src_dir = src_dir / "retail"
    if not env_dir.is_dir():
        raise Tau2ImportError(f"{env_dir}: not a directory (expected the tau2_retail env folder)")
    db_path = _source_file(src_dir, "db.json")
    policy_path = _source_file(src_dir, "policy.md")
    tools_path = _source_file(src_dir, "tools.json")
    db = _load_json(db_path)
    if not isinstance(db, dict) or not all(
        isinstance(db.get(k), dict) for k in ("products", "users", "orders")
    ):
        raise Tau2ImportError(f"{db_path}: expected an object with 'products', 'users' and 'orders' objects")
    try:
        seed = tau2_db_to_seed(db)
    except (KeyError, TypeError, ValueError) as exc:
        raise Tau2ImportError(f"{db_path}: cannot import ({type(exc).__name__}: {exc})") from exc
    policy = policy_path.read_bytes()
    try:
        if not policy.decode("utf-8").strip():
            raise Tau2ImportError(f"{policy_path}: empty")
    except UnicodeDecodeError as exc:
        raise Tau2ImportError(f"{policy_path}: not UTF-8 text ({exc})") from exc
    _check_tools(tools_path)
    _write_if_changed(env_dir / "seed.json", seed_json_text(seed).encode("utf-8"))
    _write_if_changed(env_dir / "policy.md", policy)
