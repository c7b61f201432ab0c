"""Import τ²-bench's retail (or airline) domain into a `tau2_retail` (`tau2_airline`) env folder,
and convert its state back.

Airline's own converter is `airline.py`; `DOMAINS` says how each domain is recognised and
written, and everything else here (tasks, self-checks, the folder rules) serves both.

τ²'s retail DB is one nested JSON document (`db.json`: products, users and orders keyed by id);
the env stores it relationally (`tau2_retail/schema.sql` beside this module). The two directions
live together here because they must stay exact inverses: `state_to_tau2_db` is how a run's final
state is scored against τ² (its DB hash), so anything `tau2_db_to_seed` flattens must come back with
the same values, the same key order and the same list order.

The port's code (`tau2_retail/`: `env.toml`, `schema.sql`, `tools.py`) ships in this package and
its tools define the schema; τ²'s data is never copied into the repository. `import_tau2_json_env`
writes the whole env folder from a τ²-bench checkout's retail folder as published (`db.json`,
`tasks.json`, `policy.md`, `split_tasks.json`): the port's code, then `seed.json`, `policy.md` and
`tasks.jsonl` generated from the data. A `tools.json` beside them, which a checkout does not have,
is only cross-checked against the port's tools. τ²'s tasks become envforge `Task`s whose golden
states come from replaying τ²'s gold actions in this env (not from τ²'s files), so the hashes a run
is scored against are the env's own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import re
import tempfile
import tomllib
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from envforge.server import Environment, Fleet, State, ToolSpec, load_env, state_hash

from ..checks.verify import CHECKS, verify_task
from ..graph.footprint import Footprint, set_authorizer
from ..graph.toolgraph import build_graph, load_graph
from ..task.models import (
    ActionCheck,
    AnswerRule,
    Call,
    CallNode,
    Checkpoint,
    Dag,
    DagEdge,
    Difficulty,
    Fact,
    Principal,
    RewardPart,
    RowCheck,
    Task,
    ToolGraph,
    UserScenario,
)
from ..task.rewards import OFFLINE_PARTS
from ..task.statediff import apply_diff, cents_hash, diff_states, primary_keys, to_cents
from ..walk.context import SynthContext
from .airline import AIRLINE_INITIAL_DB_HASH, airline_db_to_seed, airline_state_to_tau2_db
from .telecom import telecom_state_to_tau2_db

#: τ²'s DB hash of the unmodified retail `db.json` (`RetailDB.model_dump()`, hashed).
INITIAL_DB_HASH = "b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c"

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
    """A τ² port's canonical state export as τ²'s own DB dump (the object τ² hashes): airline's
    `FlightDB.model_dump()` for a `tau2_airline` state (it has `reservations`), telecom's agent-side
    `TelecomDB.model_dump()` for a `tau2_telecom` one (it has `surroundings`), else retail's."""
    if "reservations" in state:
        return airline_state_to_tau2_db(state)
    if "surroundings" in state:
        return telecom_state_to_tau2_db(state)
    return retail_state_to_tau2_db(state)


def retail_state_to_tau2_db(state: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
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
        raise Tau2ImportError(f"{path}: missing; expected τ²-bench's {name} in {src_dir}")
    return path


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Tau2ImportError(f"{path}: invalid JSON ({exc})") from exc


def port_tools(domain: str = "retail") -> dict[str, ToolSpec]:
    """The port's tools as the loader builds them: the schema τ²'s data is imported against.

    Loaded from a scratch copy of the port's code with an empty seed, so that tools.json and the
    gold actions of tasks.json are checked before anything is written into the env folder.
    """
    port = DOMAINS[domain]
    with tempfile.TemporaryDirectory(prefix="envforge-tau2-port-") as tmp:
        root = Path(tmp) / port.env_name
        root.mkdir()
        for name in ENV_CODE:
            (root / name).write_bytes((port.port_dir / name).read_bytes())
        (root / "seed.json").write_text("{}\n", encoding="utf-8")
        (root / "policy.md").write_text("The port's tools, loaded without τ²'s data.\n", encoding="utf-8")
        return load_env(root).tools


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _object(value: Any) -> dict[str, Any]:
    """A JSON object of tools.json, or {} where tools.json has something else there."""
    return value if isinstance(value, dict) else {}


def _schema_diff(theirs: Any, ours: Any) -> str:
    """Which keys of two parameter schemas differ, with both values (tools.json's first)."""
    if not isinstance(theirs, dict) or not isinstance(ours, dict):
        return f"schema (tools.json {_short(theirs)}, port {_short(ours)})"
    keys = [k for k in (*theirs, *(k for k in ours if k not in theirs)) if theirs.get(k) != ours.get(k)]
    return "; ".join(f"{k} (tools.json {_short(theirs.get(k))}, port {_short(ours.get(k))})" for k in keys)


def tools_json_mismatches(path: Path, tools: dict[str, ToolSpec]) -> list[str]:
    """How τ²'s `tools.json` (tool schemas as τ² shows them to the agent) differs from the port's
    `tools`, one line per difference: tools missing on either side, their order, descriptions, and
    per tool its parameters (names, each one's schema, which are required). Empty when they agree.

    The port's tools define the schema; tools.json is only a cross-check (a τ²-bench checkout
    does not have one). A file that is not τ²'s list of function schemas is an error.
    """
    data = _load_json(path)
    try:
        listed = [t["function"] for t in data if t["type"] == "function"]
        theirs = {f["name"]: f for f in listed}
    except (TypeError, KeyError) as exc:
        raise Tau2ImportError(
            f"{path}: not a list of {{'type': 'function', 'function': {{...}}}} objects"
        ) from exc
    out = [f"{path}: tool {name!r} is not one of the port's tools" for name in theirs if name not in tools]
    out += [f"{path}: lacks the port's tool {name!r}" for name in tools if name not in theirs]
    common = [name for name in theirs if name in tools]
    if common != [name for name in tools if name in theirs]:
        out.append(f"{path}: lists the tools in another order than the port ({', '.join(common)})")
    for name in common:
        where = f"{path}: tool {name!r}"
        spec, fn = tools[name], theirs[name]
        if fn.get("description") != spec.description:
            out.append(f"{where}: description differs ({_short(fn.get('description'))})")
        params = _object(fn.get("parameters"))
        ours_props: dict[str, Any] = spec.input_schema.get("properties", {})
        their_props = _object(params.get("properties"))
        for p in their_props:
            if p not in ours_props:
                out.append(f"{where}: parameter {p!r} is not a parameter of the port's tool")
            elif their_props[p] != ours_props[p]:
                out.append(
                    f"{where}: parameter {p!r} differs in {_schema_diff(their_props[p], ours_props[p])}"
                )
        out += [f"{where}: lacks the port's parameter {p!r}" for p in ours_props if p not in their_props]
        if sorted(params.get("required") or []) != sorted(spec.input_schema.get("required") or []):
            out.append(
                f"{where}: required parameters differ (tools.json {_short(params.get('required'))}, "
                f"port {_short(spec.input_schema.get('required'))})"
            )
    return out


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


# --------------------------------------------------------------------------- tasks

#: τ²'s reward-basis names and the envforge reward parts that judge the same thing.
REWARD_BASIS = {
    "DB": "state",
    "COMMUNICATE": "outputs",
    "ACTION": "actions",
    "NL_ASSERTION": "nl_assertions",
}
#: How imported tasks find `communicate_info` in the agent's messages: τ²'s own substring rule, as
#: τ² scores it (`envforge eval --answers strict` applies the exact rule instead).
TAU2_ANSWER_RULE: AnswerRule = "substring"

TASK_SOURCE = "tau2"
#: The env the import writes (the name in the port's env.toml).
ENV_NAME = "tau2_retail"
#: The port's code, shipped in this package: copied into the env folder byte for byte.
PORT_DIR = Path(__file__).resolve().parent / ENV_NAME
ENV_CODE = ("env.toml", "schema.sql", "tools.py")
#: Files generated from τ²'s data, in the order `import_tau2_env` writes them (after `ENV_CODE`).
GENERATED = ("seed.json", "policy.md", "tasks.jsonl")
#: τ²-bench's domain folder as published; `tools.json` (not in a checkout) is an optional cross-check.
CHECKOUT_FILES = ("db.json", "policy.md", "tasks.json", "split_tasks.json")


@dataclass(frozen=True)
class Tau2Domain:
    """One τ² domain the importer knows: its port's code, and how its db.json maps to seed rows."""

    name: str
    env_name: str
    port_dir: Path
    db_keys: tuple[str, ...]
    to_seed: Callable[[dict[str, Any]], dict[str, list[dict[str, Any]]]]
    initial_db_hash: str

    def recognises(self, db: Any) -> bool:
        return isinstance(db, dict) and all(isinstance(db.get(k), dict) for k in self.db_keys)


#: The domains `import tau2` recognises, by the top-level objects of their db.json.
DOMAINS = {
    "retail": Tau2Domain(
        "retail",
        ENV_NAME,
        PORT_DIR,
        ("products", "users", "orders"),
        lambda db: tau2_db_to_seed(db),
        INITIAL_DB_HASH,
    ),
    "airline": Tau2Domain(
        "airline",
        "tau2_airline",
        PORT_DIR.parent / "tau2_airline",
        ("flights", "users", "reservations"),
        airline_db_to_seed,
        AIRLINE_INITIAL_DB_HASH,
    ),
}

_T = TypeVar("_T")

# Facts a user states about themselves in τ²'s `known_info` (and order ids from the reason for the
# call): what the user can give the agent when asked. Ordered as they are listed.
_FACT_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("user_id", re.compile(r"\b[a-z]+_[a-z]+_\d{4}\b")),
    ("email", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")),
    ("zip", re.compile(r"(?<![\d#W])\d{5}(?!\d)")),
    ("order_id", re.compile(r"#W\d{7}\b")),
)
_NAME = re.compile(r"(?:\bYou are|\bYou're|\b[Yy]our? name is|\bcalled)\s+([A-Z][a-z]+)(?:\s+([A-Z][a-z]+))?")


def _run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run `coro` to completion from sync code, also when an event loop is already running (tests,
    notebooks): then in a worker thread with its own loop, since the caller's loop cannot be blocked on."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _load_tasks_json(tasks_json: Path | list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    if isinstance(tasks_json, Path | str):
        path = Path(tasks_json)
        if not path.is_file():
            raise Tau2ImportError(f"{path}: missing; expected τ²-bench's tasks.json")
        where, data = str(path), _load_json(path)
    else:
        where, data = "tasks.json", tasks_json
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise Tau2ImportError(f"{where}: expected a JSON list of τ² task objects")
    return where, data


def _load_split_json(split_json: Path | dict[str, list[str]]) -> tuple[str, dict[str, list[str]]]:
    if isinstance(split_json, Path | str):
        path = Path(split_json)
        if not path.is_file():
            raise Tau2ImportError(f"{path}: missing; expected τ²-bench's split_tasks.json")
        where, data = str(path), _load_json(path)
    else:
        where, data = "split_tasks.json", split_json
    if not isinstance(data, dict) or not all(
        isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in data.values()
    ):
        raise Tau2ImportError(f"{where}: expected an object mapping split names to lists of task ids")
    return where, data


def _facts(instructions: dict[str, Any]) -> list[Fact]:
    """Identifying values the user knows: names, user ids, emails, zip codes (from `known_info`) and
    order ids (from `known_info` and `reason_for_call`). Repeats of a kind get "(2)", "(3)", ... ."""
    known = instructions.get("known_info") or ""
    found: list[tuple[str, str]] = []
    name = _NAME.search(known)
    if name:
        found.append(("first_name", name.group(1)))
        if name.group(2):
            found.append(("last_name", name.group(2)))
    for kind, pattern in _FACT_PATTERNS:
        text = known if kind != "order_id" else f"{known}\n{instructions.get('reason_for_call') or ''}"
        found.extend((kind, m.group(0)) for m in pattern.finditer(text))
    facts: list[Fact] = []
    seen: Counter[str] = Counter()
    for kind, value in found:
        if any(f.value == value and f.name.split(" (")[0] == kind for f in facts):
            continue
        seen[kind] += 1
        facts.append(Fact(name=kind if seen[kind] == 1 else f"{kind} ({seen[kind]})", value=value))
    return facts


def _instruction_text(instructions: dict[str, Any]) -> str:
    """τ²'s structured user instructions as one text, section by section in τ²'s order."""
    sections = [("Domain", instructions.get("domain"))]
    sections += [
        ("Reason for call", instructions.get("reason_for_call")),
        ("Known info", instructions.get("known_info")),
        ("Unknown info", instructions.get("unknown_info")),
        ("Task instructions", instructions.get("task_instructions")),
    ]
    return "\n".join(
        f"{title}:\n" + "\n".join(f"\t{line}" for line in str(text).splitlines())
        for title, text in sections
        if text is not None
    )


def _scenario(where: str, task_id: str, raw: Any, required_outputs: list[str]) -> UserScenario:
    if not isinstance(raw, dict):
        raise Tau2ImportError(f"{where}: task {task_id}: user_scenario must be an object")
    instructions = raw.get("instructions")
    if isinstance(instructions, str):
        text, facts = instructions, []
    elif isinstance(instructions, dict) and isinstance(instructions.get("reason_for_call"), str):
        text, facts = _instruction_text(instructions), _facts(instructions)
    else:
        raise Tau2ImportError(f"{where}: task {task_id}: user_scenario.instructions has no reason_for_call")
    return UserScenario(
        # τ² retail tasks have no persona (null): its user simulator gets none, so none is invented.
        persona=raw.get("persona") or "",
        instruction=text,
        known_facts=facts,
        must_be_told=list(required_outputs),
        instruction_source=TASK_SOURCE,
    )


def _call_text(env: Environment, call: Call) -> str:
    spec = env.tools.get(call.name)
    desc = spec.description.strip().split("\n")[0].rstrip(".") if spec else call.name
    args = "; ".join(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in call.arguments.items())
    return f"{desc} ({args})" if args else desc


@dataclass
class _Parsed:
    """One τ² task's fields, validated, before its gold actions are replayed."""

    id: str
    calls: list[Call]
    action_checks: list[ActionCheck]
    required_outputs: list[str]
    nl_assertions: list[str]
    reward_basis: list[RewardPart]
    scenario: UserScenario
    split: list[str]


def _parse_task(where: str, raw: dict[str, Any], splits: dict[str, list[str]]) -> _Parsed:
    task_id = raw.get("id")
    if not isinstance(task_id, str | int) or isinstance(task_id, bool):
        raise Tau2ImportError(f"{where}: a task has no string id: {json.dumps(raw)[:120]}")
    task_id = str(task_id)
    if raw.get("initial_state") is not None:
        # No retail or airline task has one; a task-specific initial state would need `Task.setup`.
        raise Tau2ImportError(f"{where}: task {task_id}: initial_state is not supported by this importer")
    criteria = raw.get("evaluation_criteria")
    if not isinstance(criteria, dict):
        raise Tau2ImportError(f"{where}: task {task_id}: evaluation_criteria missing")
    calls: list[Call] = []
    checks: list[ActionCheck] = []
    for action in criteria.get("actions") or []:
        if not isinstance(action, dict) or not isinstance(action.get("name"), str):
            raise Tau2ImportError(f"{where}: task {task_id}: an action has no name")
        if action.get("requestor", "assistant") != "assistant":
            raise Tau2ImportError(
                f"{where}: task {task_id}: action {action.get('action_id')} is the user's "
                f"({action['requestor']!r}); only assistant actions can be replayed"
            )
        arguments = action.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise Tau2ImportError(f"{where}: task {task_id}: action {action.get('action_id')} arguments")
        calls.append(Call(name=action["name"], arguments=arguments))
        checks.append(
            ActionCheck(name=action["name"], arguments=arguments, compare_args=action.get("compare_args"))
        )
    basis: list[RewardPart] = []
    for part in criteria.get("reward_basis") or []:
        if part not in REWARD_BASIS:
            raise Tau2ImportError(
                f"{where}: task {task_id}: reward basis {part!r} has no envforge counterpart "
                f"(supported: {', '.join(REWARD_BASIS)})"
            )
        basis.append(REWARD_BASIS[part])  # type: ignore[arg-type]
    outputs = [str(o) for o in criteria.get("communicate_info") or []]
    return _Parsed(
        id=task_id,
        calls=calls,
        action_checks=checks,
        required_outputs=outputs,
        nl_assertions=[str(a) for a in criteria.get("nl_assertions") or []],
        reward_basis=basis,
        scenario=_scenario(where, task_id, raw.get("user_scenario"), outputs),
        split=[name for name, ids in splits.items() if task_id in ids],
    )


def _diff(pks: dict[str, tuple[str, ...]], before: State, after: State) -> Any:
    """`diff_states`, given only the rows that differ: the retail state has ~8,000 rows and a gold
    changes a handful, and `diff_states` serialises every key. Same result, as it reports only
    differences and orders them by key."""
    old: State = {}
    new: State = {}
    for table in sorted(set(before) | set(after)):
        a, b = before.get(table, []), after.get(table, [])
        if a == b:
            continue
        pk = pks[table]
        a_rows = {tuple(r.get(c) for c in pk): r for r in a}
        b_rows = {tuple(r.get(c) for c in pk): r for r in b}
        keys = [k for k in a_rows.keys() | b_rows.keys() if a_rows.get(k) != b_rows.get(k)]
        old[table] = [a_rows[k] for k in keys if k in a_rows]
        new[table] = [b_rows[k] for k in keys if k in b_rows]
    return diff_states(pks, old, new)


class _Hasher:
    """`state_hash` and `cents_hash` of states that differ from the initial one in a few tables.

    Both hash canonical JSON, which for a state is the tables' JSON joined in name order, so the
    initial state's per-table text is reused for unchanged tables. The composition is checked
    against the real functions on the initial state; if they ever disagree it is not used.
    """

    def __init__(self, initial: State) -> None:
        self.initial = initial
        self.plain = {t: self._json(rows) for t, rows in initial.items()}
        self.cents = {t: self._json(to_cents(rows)) for t, rows in initial.items()}
        self.exact = self._compose(initial, self.plain, False) == state_hash(initial) and self._compose(
            initial, self.cents, True
        ) == cents_hash(initial)

    @staticmethod
    def _json(value: Any) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    def _compose(self, state: State, cache: dict[str, str], cents: bool) -> str:
        parts = []
        for table in sorted(state):
            rows = state[table]
            if table in cache and rows == self.initial.get(table):
                text = cache[table]
            else:
                text = self._json(to_cents(rows) if cents else rows)
            parts.append(f"{self._json(table)}:{text}")
        return hashlib.sha256(("{" + ",".join(parts) + "}").encode()).hexdigest()

    def hashes(self, state: State) -> tuple[str, str]:
        if not self.exact:
            return state_hash(state), cents_hash(state)
        return self._compose(state, self.plain, False), self._compose(state, self.cents, True)


def _context(env: Environment, fleet: Fleet) -> SynthContext:
    """A synthesis context without a tool graph: replay, partial export and standalone verification
    need none, and building one would probe every tool (seconds) for nothing."""
    graph = ToolGraph(env=env.name, tools=[], edges=[], state_edges=[])
    return SynthContext(env=env, graph=graph, fleet=fleet, pks=primary_keys(env.tables))


async def _gold_task(
    env: Environment, fleet: Fleet, pks: dict[str, tuple[str, ...]], hasher: _Hasher, p: _Parsed
) -> Task:
    """Replay the gold actions in a fresh episode: the golden state, per-write checkpoints, difficulty.

    Every call runs under the SQLite authorizer (reset per call, which also expires cached
    statements so nothing is missed), so the tables a write touched are measured, not assumed.
    """
    initial = env.seed_state()
    episode = await fleet.create_episode(env.name, database=env.seed_db)
    ctx = _context(env, fleet)
    nodes: list[CallNode] = []
    edges: list[DagEdge] = []
    write_diffs: dict[str, Any] = {}
    tables: set[str] = set()
    state = dict(initial)
    try:
        for i, call in enumerate(p.calls):
            fp = Footprint()
            await set_authorizer(episode, fp)
            result = await fleet.call(episode.id, call.name, call.arguments)
            await set_authorizer(episode, None)
            tables |= set(fp.reads) | set(fp.writes)
            spec = env.tools.get(call.name)
            node = CallNode(
                id=f"n{i}",
                kind="call",
                text=_call_text(env, call),
                call=call,
                write=spec is not None and not spec.read_only,
                expect_error=result.is_error,
            )
            nodes.append(node)
            if i:
                edges.append(DagEdge(source=f"n{i - 1}", target=node.id, kind="control", label="then"))
            if node.write and not result.is_error:
                written = sorted(fp.writes)
                after = await ctx.replayer.export_tables(episode.id, written)
                write_diffs[node.id] = _diff(pks, {t: state[t] for t in written}, after)
                state.update(after)
        golden = await episode.export()
    finally:
        await fleet.close_episode(episode.id)
    golden_hash, golden_cents = hasher.hashes(golden)
    checkpoints = []
    for node in nodes:
        if node.id not in write_diffs:
            continue
        rows = []
        for table, d in write_diffs[node.id].items():
            pk = pks[table]
            keys = [{c: r[c] for c in pk} for r in d.inserted + d.deleted] + [u.key for u in d.updated]
            for key in keys:
                final = next((r for r in golden[table] if all(r.get(c) == v for c, v in key.items())), None)
                rows.append(RowCheck(table=table, key=key, row=final))
        checkpoints.append(Checkpoint(node=node.id, tool=node.call.name, rows=rows))
    return Task(
        id=p.id,
        env=env.name,
        seed=f"{TASK_SOURCE}:{p.id}",
        dag=Dag(nodes=nodes, edges=edges),
        scenario=p.scenario,
        golden_calls=p.calls,
        golden_hash=golden_hash,
        golden_cents_hash=golden_cents,
        golden_diff=_diff(pks, initial, golden),
        required_outputs=p.required_outputs,
        checkpoints=checkpoints,
        difficulty=Difficulty(
            calls=len(p.calls),
            writes=len(write_diffs),
            reasoning=0,
            depth=len(nodes),
            tables=len(tables),
        ),
        reward_basis=p.reward_basis,
        source=TASK_SOURCE,
        split=p.split,
        nl_assertions=p.nl_assertions,
        action_checks=p.action_checks,
        answer_rule=TAU2_ANSWER_RULE,
    )


async def tau2_tasks_to_envforge_async(
    tasks_json: Path | list[dict[str, Any]], split_json: Path | dict[str, list[str]], env: Environment
) -> list[Task]:
    """The async form of `tau2_tasks_to_envforge` (for callers already inside an event loop)."""
    where, raw_tasks = _load_tasks_json(tasks_json)
    split_where, splits = _load_split_json(split_json)
    parsed = [_parse_task(where, raw, splits) for raw in raw_tasks]
    ids = [p.id for p in parsed]
    dupes = sorted(i for i, n in Counter(ids).items() if n > 1)
    if dupes:
        raise Tau2ImportError(f"{where}: duplicate task ids {dupes}")
    unknown = sorted({i for members in splits.values() for i in members} - set(ids))
    if unknown:
        raise Tau2ImportError(f"{split_where}: splits name task ids that {where} lacks: {unknown[:10]}")
    pks = primary_keys(env.tables)
    fleet = Fleet([env])
    try:
        hasher = _Hasher(env.seed_state())
        return [await _gold_task(env, fleet, pks, hasher, p) for p in parsed]
    finally:
        await fleet.aclose()


def tau2_tasks_to_envforge(
    tasks_json: Path | list[dict[str, Any]], split_json: Path | dict[str, list[str]], env: Environment
) -> list[Task]:
    """τ²'s tasks (`tasks.json`, a path or its parsed list) as envforge tasks of `env`, in file order.

    Mapping: id, scenario (instructions as text; known facts parsed from them), gold actions as
    `golden_calls`, a linear DAG of call nodes and `action_checks` (with `compare_args`),
    `communicate_info` as `required_outputs` under τ²'s substring rule (`TAU2_ANSWER_RULE`),
    `nl_assertions` kept, the reward basis mapped part by
    part (`REWARD_BASIS`), and the splits of `split_tasks.json` that list the task. Golden state,
    diff, checkpoints and difficulty come from replaying the gold actions on a fresh episode;
    gold calls that return errors are kept (τ² keeps them; its evaluator treats them as no-ops).
    """
    return _run_sync(tau2_tasks_to_envforge_async(tasks_json, split_json, env))


def offline_view(task: Task) -> Task:
    """`task` with only the reward parts judged without a trajectory or an LLM (`OFFLINE_PARTS`)."""
    return task.model_copy(update={"reward_basis": [p for p in task.reward_basis if p in OFFLINE_PARTS]})


@dataclass
class VerifyReport:
    """The five self-checks over imported tasks: failures are reported, never used to drop tasks."""

    total: int
    failures: dict[str, list[str]] = field(default_factory=dict)  # task id -> failed checks

    @property
    def failed_tasks(self) -> list[str]:
        return sorted({t for ids in self.failures.values() for t in ids}, key=_id_key)

    def by_check(self) -> dict[str, list[str]]:
        """Check name -> failing task ids, for every check (empty lists included), in `CHECKS` order."""
        out: dict[str, list[str]] = {c: [] for c in CHECKS}
        for task_id, checks in self.failures.items():
            for c in checks:
                out[c].append(task_id)
        return {c: sorted(ids, key=_id_key) for c, ids in out.items()}


def _id_key(task_id: str) -> tuple[int, str]:
    return (int(task_id), "") if task_id.isdigit() else (1 << 30, task_id)


async def verify_report_async(
    env: Environment, tasks: list[Task], *, graph: ToolGraph | None = None
) -> VerifyReport:
    """Run `verify.verify_task` on each task's offline view (see `OFFLINE_PARTS`), given the golden
    state rebuilt from the task's stored diff: the checks then compare states directly instead of
    hashing ~8,000 rows per replay. The tool graph (for the tables a dropped write can touch) is
    ENV_DIR/graph.json when present, else measured by probing."""
    fleet = Fleet([env])
    report = VerifyReport(total=len(tasks))
    try:
        graph = graph or load_graph(env.root) or await build_graph(env, fleet)
        ctx = SynthContext(env=env, graph=graph, fleet=fleet, pks=primary_keys(env.tables))
        for task in tasks:
            golden = golden_end_state(env, task)
            failed = await verify_task(ctx, offline_view(task), golden_state=golden)
            if failed:
                report.failures[task.id] = failed
    finally:
        await fleet.aclose()
    return report


def verify_report(env: Environment, tasks: list[Task], *, graph: ToolGraph | None = None) -> VerifyReport:
    """Which imported tasks fail which self-checks. By design some τ² tasks do: a gold that leaves
    the DB unchanged fails `not_presatisfied` and `do_nothing` (an agent must simply not write)."""
    return _run_sync(verify_report_async(env, tasks, graph=graph))


#: Why a check fails for τ² tasks, as the summary explains it.
CHECK_REASONS = {
    "golden_replay": "replaying the gold actions does not reach the golden state",
    "do_nothing": "doing nothing already scores 1 (the gold leaves the DB unchanged)",
    "drop_write": "a successful gold write leaves no trace in the end state (a no-op, or undone later)",
    "not_presatisfied": "initial state already equals golden (the gold leaves the DB unchanged)",
    "deterministic": "replaying the gold twice gives different states",
}


@dataclass
class Tau2Import:
    """What `import_tau2_env` wrote and found."""

    env_dir: Path
    tasks: list[Task] | None  # None when only the env (code, seed, policy) was written
    tools_json: Path | None  # the tools.json cross-checked, if the data folder has one
    tool_mismatches: list[str] = field(default_factory=list)  # one line per difference from the port


def _check_target(env_dir: Path, env_name: str = ENV_NAME) -> None:
    """The env folder may be new, empty, or an earlier import (also one whose code was removed,
    leaving generated files): never a file, nor a folder holding another env."""
    if env_dir.exists() and not env_dir.is_dir():
        raise Tau2ImportError(f"{env_dir}: not a directory")
    manifest = env_dir / "env.toml"
    if not manifest.is_file():
        return
    try:
        name = tomllib.loads(manifest.read_text(encoding="utf-8")).get("name")
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        name = None
    if name != env_name:
        raise Tau2ImportError(
            f"{env_dir}: holds another env ({manifest} names {name!r}); import into a new folder "
            f"or an earlier {env_name} import"
        )


def _check_gold_tools(
    where: str, parsed: list[_Parsed], tools: dict[str, ToolSpec], domain: str = "retail"
) -> None:
    """Gold actions must name the port's tools: the sign that tasks.json is the same domain's as db.json."""
    for p in parsed:
        for call in p.calls:
            if call.name not in tools:
                raise Tau2ImportError(
                    f"{where}: task {p.id}: gold action {call.name!r} is not a tool of the "
                    f"{DOMAINS[domain].env_name} port (is this τ²-bench's {domain} folder?)"
                )


def _domain_folder(src_dir: Path, env_dir: Path) -> Path:
    """`src_dir` itself when it holds a db.json, else its subfolder for one domain: the one the
    env folder is named after (`tau2_airline` -> `airline/`), else `retail/`, else `airline/`."""
    if (src_dir / "db.json").exists():
        return src_dir
    wanted = env_dir.name.removeprefix("tau2_")
    for name in (wanted, *DOMAINS):
        if name in DOMAINS and (src_dir / name / "db.json").exists():
            return src_dir / name
    return src_dir


def detect_domain(db_path: Path, db: Any) -> Tau2Domain:
    """The domain whose db.json this is, from its top-level objects; anything else is refused."""
    for domain in DOMAINS.values():
        if domain.recognises(db):
            return domain
    keys = ", ".join(repr(k) for k in db) if isinstance(db, dict) else f"a JSON {type(db).__name__}"
    expected = "; ".join(f"{d.name}: {', '.join(repr(k) for k in d.db_keys)}" for d in DOMAINS.values())
    raise Tau2ImportError(
        f"{db_path}: not a τ² domain this importer knows (top level: {keys or 'empty'}; expected objects "
        f"{expected})"
    )


POLICY_RULES = "policy_rules.toml"
"""The port's declaration of τ²'s retail policy (`import tau2 --policy-rules` writes it)."""


def _fold(text: str) -> str:
    """τ²'s `fold_for_match` (the port's tools.py): case- and diacritic-folded."""
    decomposed = unicodedata.normalize("NFD", text.strip())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()


def tau2_principal(task: Task, state: State) -> Principal | None:
    """The user a τ² task acts for: the one its first golden user lookup finds, as the port's
    `find_user_id_by_email` / `find_user_id_by_name_zip` find them (the first in db.json order);
    where τ²'s gold lists only the writes, the one the user's own facts (email, or name and zip)
    find; else the owner of the first order a golden call names. None for a task that names no
    user (a transfer-only task)."""
    users = sorted(state.get("users", []), key=lambda r: r["position"])
    zips = {r["user_id"]: r["zip"] for r in state.get("user_addresses", [])}
    owners = {r["order_id"]: r["user_id"] for r in state.get("orders", [])}
    facts = {f.name: f.value for f in task.scenario.known_facts}
    lookups = [(c.name, c.arguments) for c in task.golden_calls]
    lookups += [("find_user_id_by_email", facts), ("find_user_id_by_name_zip", facts)]
    for name, args in lookups:
        if name == "find_user_id_by_email" and "email" in args:
            found = [u for u in users if _fold(u["email"]) == _fold(str(args["email"]))]
        elif name == "find_user_id_by_name_zip" and {"first_name", "last_name", "zip"} <= set(args):
            first, last = _fold(str(args["first_name"])), _fold(str(args["last_name"]))
            found = [
                u
                for u in users
                if _fold(u["first_name"]) == first
                and _fold(u["last_name"]) == last
                and zips.get(u["user_id"]) == args["zip"]
            ]
        else:
            continue
        if found:
            return _user_principal(found[0])
    for call in task.golden_calls:
        owner = owners.get(call.arguments.get("order_id"))
        user = next((u for u in users if u["user_id"] == owner), None)
        if user is not None:
            return _user_principal(user)
    return None


def _user_principal(user: dict[str, Any]) -> Principal:
    return Principal(
        table="users", key={"user_id": user["user_id"]}, name=f"{user['first_name']} {user['last_name']}"
    )


def with_principals(env: Environment, tasks: list[Task]) -> list[Task]:
    """`tasks` with the user each acts for as its principal (`tau2_principal`): what the identity
    rule of the port's policy_rules.toml verifies."""
    pks = primary_keys(env.tables)
    seed = env.seed_state()
    out = []
    for task in tasks:
        state = apply_diff(pks, seed, task.setup) if task.setup else seed
        dag = task.dag.model_copy(update={"principal": tau2_principal(task, state)})
        out.append(task.model_copy(update={"dag": dag}))
    return out


def import_tau2_json_env(
    src_dir: Path,
    env_dir: Path,
    *,
    tasks: bool = True,
    strict_tools: bool = False,
    policy_rules: bool = False,
) -> Tau2Import:
    """Write the `tau2_retail` or `tau2_airline` env folder `env_dir` from τ²-bench's data folder
    `src_dir` (`domains.import_tau2_env`, the public entry, hands telecom to its own importer).

    `src_dir` is the retail or airline folder of a τ²-bench checkout as published
    (`CHECKOUT_FILES`); the domain is recognised from db.json's top-level objects (`DOMAINS`). A
    folder with domain subfolders is accepted too (`_domain_folder`). `env_dir` is created if needed; a
    folder holding another env (an env.toml naming another) is refused. The import writes the
    port's code (`ENV_CODE`), `seed.json` from db.json, `policy.md` byte for byte (τ² gives it to
    the agent unchanged), and, with `tasks`, `tasks.jsonl` from tasks.json and split_tasks.json
    (without, those two files are not read).
    A `tools.json` in `src_dir` is cross-checked against the port's tools: its differences are
    returned (`tool_mismatches`), or raised with `strict_tools`. Everything is validated before
    anything is written; re-running leaves the files byte-identical.

    By default the env keeps τ²'s own reward: no policy part (a `policy_rules.toml` an earlier
    opt-in wrote is removed). `policy_rules` opts in to envforge's policy part: it writes the
    port's `policy_rules.toml` (τ²'s retail policy as checkable rules) and gives each task the
    user it acts for as its principal (`with_principals`), whom the identity rule verifies; only
    the retail port declares such rules.
    """
    src_dir, env_dir = Path(src_dir), Path(env_dir)
    src_dir = _domain_folder(src_dir, env_dir)
    db_path = _source_file(src_dir, "db.json")
    policy_path = _source_file(src_dir, "policy.md")
    db = _load_json(db_path)
    domain = detect_domain(db_path, db)
    _check_target(env_dir, domain.env_name)
    if policy_rules and not (domain.port_dir / POLICY_RULES).is_file():
        raise Tau2ImportError(f"--policy-rules: the {domain.env_name} port declares no policy rules")
    try:
        seed = domain.to_seed(db)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Tau2ImportError(f"{db_path}: cannot import ({type(exc).__name__}: {exc})") from exc
    policy = policy_path.read_bytes()
    try:
        if not policy.decode("utf-8").strip():
            raise Tau2ImportError(f"{policy_path}: empty")
    except UnicodeDecodeError as exc:
        raise Tau2ImportError(f"{policy_path}: not UTF-8 text ({exc})") from exc
    tools = port_tools(domain.name)
    tools_path = src_dir / "tools.json"
    mismatches: list[str] = []
    if tools_path.is_file():
        mismatches = tools_json_mismatches(tools_path, tools)
        if mismatches and strict_tools:
            more = f" (and {len(mismatches) - 1} more)" if len(mismatches) > 1 else ""
            raise Tau2ImportError(f"{mismatches[0]}{more}")
    if tasks:
        tasks_where, raw_tasks = _load_tasks_json(_source_file(src_dir, "tasks.json"))
        _, splits = _load_split_json(_source_file(src_dir, "split_tasks.json"))
        # Parse now, so a bad tasks.json fails before any file is written.
        parsed = [_parse_task(tasks_where, raw, splits) for raw in raw_tasks]
        _check_gold_tools(tasks_where, parsed, tools, domain.name)
    env_dir.mkdir(parents=True, exist_ok=True)
    for name in ENV_CODE:
        _write_if_changed(env_dir / name, (domain.port_dir / name).read_bytes())
    _write_if_changed(env_dir / "seed.json", seed_json_text(seed).encode("utf-8"))
    _write_if_changed(env_dir / "policy.md", policy)
    rules_file = domain.port_dir / POLICY_RULES
    rules_bytes = rules_file.read_bytes() if rules_file.is_file() else None
    if policy_rules and rules_bytes is not None:
        _write_if_changed(env_dir / POLICY_RULES, rules_bytes)
    elif (env_dir / POLICY_RULES).is_file() and (env_dir / POLICY_RULES).read_bytes() == rules_bytes:
        (env_dir / POLICY_RULES).unlink()  # an earlier opt-in's: the default is τ²'s own reward
    found = Tau2Import(
        env_dir=env_dir,
        tasks=None,
        tools_json=tools_path if tools_path.is_file() else None,
        tool_mismatches=mismatches,
    )
    if not tasks:
        return found
    env = load_env(env_dir)
    found.tasks = tau2_tasks_to_envforge(raw_tasks, splits, env)
    if policy_rules:
        found.tasks = with_principals(env, found.tasks)
    text = "".join(t.model_dump_json() + "\n" for t in found.tasks)
    _write_if_changed(env_dir / "tasks.jsonl", text.encode("utf-8"))
    return found


def golden_end_state(env: Environment, task: Task) -> State:
    """The task's golden end state rebuilt from its seed, setup and stored golden diff."""
    pks = primary_keys(env.tables)
    return apply_diff(pks, apply_diff(pks, env.seed_state(), task.setup), task.golden_diff)
