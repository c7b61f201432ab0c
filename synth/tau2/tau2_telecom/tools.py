"""τ²-bench's telecom tools, ported onto SQLite with τ²-identical behaviour: dual control.

Four kinds of tool, by side: the agent's 13 (`TelecomTools`, on the carrier's tables), the user's
30 (`TelecomUserTools`, on their own phone: `device`, `surroundings`), the toolkit methods τ²'s
task initializations call (side "setup": `set_data_usage`, `break_vpn`, ...), and the assertions
τ²'s reward reads (side "check": `assert_service_status`, ...). Names, descriptions, parameter
schemas, result texts, error messages and quirks are τ²'s (see the τ² reference README, telecom
part), including the ones that look like bugs.

Why this shape: τ²'s code mutates two small in-memory pydantic DBs. Each call here reads both
DBs (a few dozen rows) into the very dicts τ²'s models dump to, runs τ²'s logic on them expression
by expression (so a wrongly typed argument fails with the Python error τ² shows), then runs τ²'s
`sync_tools()` coupling, as τ²'s `get_response` does after every call that succeeds, and writes
back only the rows that changed, all in the call's one transaction. So a user tool can change the
carrier's tables only through that coupling (a paid request marks its bill paid), which is why
the user's write tools declare `bills` and `surroundings`, and every agent write tool
`surroundings` and `bills`, beside their own tables.

What differs from τ² on purpose, only for calls τ² itself mishandles: a call that fails half-way is
rolled back whole (τ² keeps what its in-memory DB had changed before the exception), and τ²'s VPN
default, one object shared by the whole class (which `break_vpn` degrades for every later task of
the process), is per episode (`phone_defaults`): a fresh τ² process per evaluation.
"""

from __future__ import annotations

import datetime
import json
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from copy import deepcopy
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envforge.server import Db, ToolError, tool

#: The pydantic minor version τ²'s reference outputs were produced with (its error texts link to
#: https://errors.pydantic.dev/<version>/...).
TAU2_PYDANTIC = "2.12"
_ERRORS_URL = re.compile(r"https://errors\.pydantic\.dev/[0-9]+\.[0-9]+/")

#: τ²'s fixed clock (`get_today()`; `get_now()` is 2025-02-25 12:08:00, which no tool reads).
TODAY = datetime.date(2025, 2, 25)

# ---------------------------------------------------------------------------------------------
# The tables: one column per field of τ²'s models, in model order (envforge.synth.tau2.telecom
# derives the same lists from the models; a test holds them equal).

AGENT_COLUMNS: dict[str, tuple[str, ...]] = {
    "plans": ("plan_id", "name", "data_limit_gb", "price_per_month", "data_refueling_price_per_gb"),
    "customers": (
        "customer_id",
        "full_name",
        "date_of_birth",
        "email",
        "phone_number",
        "address",
        "account_status",
        "payment_methods",
        "line_ids",
        "bill_ids",
        "created_at",
        "last_extension_date",
        "goodwill_credit_used_this_year",
    ),
    "lines": (
        "line_id",
        "phone_number",
        "status",
        "plan_id",
        "device_id",
        "data_used_gb",
        "data_refueling_gb",
        "roaming_enabled",
        "contract_end_date",
        "last_plan_change_date",
        "last_sim_replacement_date",
        "suspension_start_date",
    ),
    "bills": (
        "bill_id",
        "customer_id",
        "period_start",
        "period_end",
        "issue_date",
        "total_due",
        "due_date",
        "line_items",
        "status",
    ),
    "devices": (
        "device_id",
        "device_type",
        "model",
        "imei",
        "is_esim_capable",
        "activated",
        "activation_date",
        "last_esim_transfer_date",
    ),
}
USER_COLUMNS: dict[str, tuple[str, ...]] = {
    "device": (
        "sim_card_status",
        "sim_card_missing",
        "airplane_mode",
        "network_signal_strength",
        "network_technology_connected",
        "network_connection_status",
        "battery_level",
        "data_enabled",
        "roaming_enabled",
        "network_mode_preference",
        "active_apn_settings",
        "wifi_enabled",
        "wifi_connected",
        "wifi_ssid",
        "wifi_signal_strength",
        "wifi_calling_enabled",
        "wifi_calling_mms_over_wifi",
        "data_saver_mode",
        "vpn_enabled_setting",
        "vpn_connected",
        "vpn_details",
        "app_statuses",
    ),
    "surroundings": (
        "name",
        "phone_number",
        "is_abroad",
        "roaming_allowed",
        "signal_strength",
        "mobile_data_usage_exceeded",
        "line_active",
        "payment_request",
    ),
}
JSON_COLUMNS = frozenset(
    {
        "address",
        "payment_methods",
        "line_ids",
        "bill_ids",
        "line_items",
        "active_apn_settings",
        "vpn_details",
        "app_statuses",
        "signal_strength",
        "payment_request",
    }
)
BOOL_COLUMNS = frozenset(
    {
        "roaming_enabled",
        "is_esim_capable",
        "activated",
        "sim_card_missing",
        "airplane_mode",
        "data_enabled",
        "wifi_enabled",
        "wifi_connected",
        "wifi_calling_enabled",
        "wifi_calling_mms_over_wifi",
        "data_saver_mode",
        "vpn_enabled_setting",
        "vpn_connected",
        "is_abroad",
        "roaming_allowed",
        "mobile_data_usage_exceeded",
        "line_active",
    }
)

# What each kind of tool may write: its own tables, and what `sync_tools` may touch after it.
SYNC_WRITES = ("surroundings", "bills")
USER_WRITES = ["device", *SYNC_WRITES]


def _decode(column: str, value: Any) -> Any:
    if column in JSON_COLUMNS and value is not None:
        return json.loads(value)
    if column in BOOL_COLUMNS and type(value) is int:
        return bool(value)
    return value


def _encode(column: str, value: Any) -> Any:
    return json.dumps(value) if column in JSON_COLUMNS else value


@dataclass
class World:
    """Both of τ²'s DBs as their dumps: the carrier's tables (lists of records, in order), the
    phone and its surroundings, and the performance of the VPN `connect_vpn` connects to."""

    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    surroundings: dict[str, Any] = field(default_factory=dict)
    vpn_default: str = "excellent"


async def _load(db: Db) -> World:
    world = World()
    for table, columns in AGENT_COLUMNS.items():
        rows = await db.execute_fetchall(f"SELECT {', '.join(columns)} FROM {table} ORDER BY position")
        world.tables[table] = [{c: _decode(c, v) for c, v in zip(columns, row, strict=True)} for row in rows]
    for table, columns in USER_COLUMNS.items():
        (row,) = await db.execute_fetchall(f"SELECT {', '.join(columns)} FROM {table} WHERE id = 1")
        setattr(world, table, {c: _decode(c, v) for c, v in zip(columns, row, strict=True)})
    world.vpn_default = await db.fetch_value("SELECT vpn_server_performance FROM phone_defaults WHERE id = 1")
    return world


async def _save(db: Db, before: World, after: World) -> None:
    """Write the rows `after` changed (updated in place, or new and appended), nothing else."""
    for table, columns in AGENT_COLUMNS.items():
        key = columns[0]
        old = {r[key]: r for r in before.tables[table]}
        for position, record in enumerate(after.tables[table]):
            previous = old.get(record[key])
            if previous == record:
                continue
            values = [_encode(c, record[c]) for c in columns]
            if previous is None:
                await db.execute(
                    f"INSERT INTO {table} (position, {', '.join(columns)}) VALUES (?{', ?' * len(columns)})",
                    (position, *values),
                )
            else:
                sets = ", ".join(f"{c} = ?" for c in columns[1:])
                await db.execute(f"UPDATE {table} SET {sets} WHERE {key} = ?", (*values[1:], values[0]))
    for table, columns in USER_COLUMNS.items():
        record = getattr(after, table)
        if record != getattr(before, table):
            sets = ", ".join(f"{c} = ?" for c in columns)
            await db.execute(
                f"UPDATE {table} SET {sets} WHERE id = 1", [_encode(c, record[c]) for c in columns]
            )
    if after.vpn_default != before.vpn_default:
        await db.execute(
            "UPDATE phone_defaults SET vpn_server_performance = ? WHERE id = 1", (after.vpn_default,)
        )


def _pydantic_text(exc: ValidationError) -> str:
    return _ERRORS_URL.sub(f"https://errors.pydantic.dev/{TAU2_PYDANTIC}/", str(exc))


@contextmanager
def _as_tau2_errors() -> Iterator[None]:
    """Any exception τ²'s own code would raise on these values, as the `Error: {e}` τ² shows."""
    try:
        yield
    except ToolError:
        raise
    except ValidationError as exc:
        raise ToolError(_pydantic_text(exc)) from None
    except (
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        IndexError,
        ArithmeticError,
        AssertionError,
    ) as exc:
        raise ToolError(str(exc)) from None


async def _run(db: Db, action: Callable[[World], Any]) -> Any:
    """τ²'s `get_response` for one call: the action, then `sync_tools()`, then what changed saved."""
    world = await _load(db)
    before = deepcopy(world)
    with _as_tau2_errors():
        result = action(world)
        _sync(world)
    await _save(db, before, world)
    return result


# ---------------------------------------------------------------------------------------------
# τ²'s result serialisation (`Environment.to_json_str`).


class _Model(dict[str, Any]):
    """A record returned where τ² returns a pydantic model: dumped whole, numbers kept."""


def _process(value: Any) -> Any:
    """τ²'s `_process`: a model is dumped as is; every int, float and bool elsewhere becomes `str`."""
    if isinstance(value, _Model):
        return dict(value)
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return [_process(v) for v in value]
    if isinstance(value, dict):
        return {k: _process(v) for k, v in value.items()}
    if isinstance(value, datetime.date):
        return value.isoformat()
    raise ValueError(f"Unsupported type: {type(value)}")


def _to_json_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(_process(value), default=str)


# ---------------------------------------------------------------------------------------------
# The carrier's toolkit (τ²'s TelecomTools), on the dumps of its records.


def _get_customer_by_id(w: World, customer_id: Any) -> dict[str, Any]:
    for customer in w.tables["customers"]:
        if customer["customer_id"] == customer_id:
            return customer
    raise ValueError(f"Customer with ID {customer_id} not found")


def _get_line_by_id(w: World, line_id: Any) -> dict[str, Any]:
    for line in w.tables["lines"]:
        if line["line_id"] == line_id:
            return line
    raise ValueError(f"Line with ID {line_id} not found")


def _get_line_by_phone(w: World, phone_number: Any) -> dict[str, Any]:
    for line in w.tables["lines"]:
        if line["phone_number"] == phone_number:
            return line
    raise ValueError(f"Line with phone number {phone_number} not found")


def _get_plan_by_id(w: World, plan_id: Any) -> dict[str, Any]:
    for plan in w.tables["plans"]:
        if plan["plan_id"] == plan_id:
            return plan
    raise ValueError(f"Plan with ID {plan_id} not found")


def _get_device_by_id(w: World, device_id: Any) -> dict[str, Any]:
    for device in w.tables["devices"]:
        if device["device_id"] == device_id:
            return device
    raise ValueError(f"Device with ID {device_id} not found")


def _get_bill_by_id(w: World, bill_id: Any) -> dict[str, Any]:
    for bill in w.tables["bills"]:
        if bill["bill_id"] == bill_id:
            return bill
    raise ValueError(f"Bill with ID {bill_id} not found")


def _get_target_line(w: World, customer_id: Any, line_id: Any) -> dict[str, Any]:
    customer = _get_customer_by_id(w, customer_id)
    if line_id not in customer["line_ids"]:
        raise ValueError(f"Line {line_id} not found for customer {customer_id}")
    return _get_line_by_id(w, line_id)


def _get_customer_by_phone(w: World, phone_number: Any) -> dict[str, Any]:
    for customer in w.tables["customers"]:
        if customer["phone_number"] == phone_number:
            return customer
        for line_id in customer["line_ids"]:
            line = _get_line_by_id(w, line_id)
            if line and line["phone_number"] == phone_number:
                return customer
    raise ValueError(f"Customer with phone number {phone_number} not found")


def _bills_awaiting_payment(w: World, customer: dict[str, Any]) -> list[dict[str, Any]]:
    bills = []
    for bill_id in customer["bill_ids"]:
        bill = _get_bill_by_id(w, bill_id)
        if bill and bill["status"] == "Awaiting Payment":
            bills.append(bill)
    return bills


def _line_item(description: Any, amount: Any, item_type: str) -> dict[str, Any]:
    """τ²'s `LineItem(...)`, dumped: the amount coerced to float as its model does."""
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        raise TypeError(f"unsupported line item amount {amount!r}")
    return {"description": description, "amount": float(amount), "date": str(TODAY), "item_type": item_type}


def _apply_one_time_charge(w: World, customer_id: Any, amount: float, description: str) -> None:
    """A charge on the customer's first Draft bill, or on a new draft bill with a random id (τ²'s
    `uuid4`: the only randomness of the domain; every gold refuels C1001, which has draft B1003)."""
    customer = _get_customer_by_id(w, customer_id)
    draft_bill = None
    for bill_id in customer["bill_ids"]:
        bill = _get_bill_by_id(w, bill_id)
        if bill and bill["status"] == "Draft":
            draft_bill = bill
            break
    if not draft_bill:
        next_month = TODAY.replace(day=1) + datetime.timedelta(days=32)
        next_month = next_month.replace(day=1)
        period_end = next_month.replace(
            month=next_month.month + 1 if next_month.month < 12 else 1,
            year=next_month.year if next_month.month < 12 else next_month.year + 1,
        ) - datetime.timedelta(days=1)
        new_bill_id = f"B{uuid.uuid4().hex[:8]}"
        draft_bill = {
            "bill_id": new_bill_id,
            "customer_id": customer_id,
            "period_start": str(next_month),
            "period_end": str(period_end),
            "issue_date": str(next_month),
            "total_due": 0.0,
            "due_date": str(next_month + datetime.timedelta(days=14)),
            "line_items": [],
            "status": "Draft",
        }
        w.tables["bills"].append(draft_bill)
        customer["bill_ids"].append(new_bill_id)
    draft_bill["line_items"].append(_line_item(description, amount, "Credit" if amount < 0 else "Charge"))
    draft_bill["total_due"] += amount


def _sync(w: World) -> None:
    """τ²'s `TelecomEnvironment.sync_tools()`: the user's surroundings follow their line, and a
    paid payment request pays its bill. Nothing until the user's phone number is set."""
    s = w.surroundings
    if s["phone_number"] is None:
        return
    phone_number = s["phone_number"]
    line = _get_line_by_phone(w, phone_number)
    s["line_active"] = line["status"] == "Active"
    s["roaming_allowed"] = bool(line["roaming_enabled"])
    plan = _get_plan_by_id(w, line["plan_id"])
    s["mobile_data_usage_exceeded"] = (
        line["data_used_gb"] >= plan["data_limit_gb"] + line["data_refueling_gb"]
    )
    request = s["payment_request"]
    if request is not None and request["paid"]:
        _get_bill_by_id(w, request["bill_id"])["status"] = "Paid"
        s["payment_request"] = None
    if s["payment_request"] is None:
        customer = _get_customer_by_phone(w, phone_number)
        bills = _bills_awaiting_payment(w, customer)
        if len(bills) != 0:
            bill = bills[0]
            s["payment_request"] = {
                "bill_id": bill["bill_id"],
                "amount_due": float(bill["total_due"]),
                "paid": False,
            }


# ---------------------------------------------------------------------------------------------
# The agent's tools, in τ²'s order.

CustomerOfLine = Annotated[str, Field(description="ID of the customer who owns the line.")]


@tool(description="Finds a customer by their primary contact or line phone number.")
async def get_customer_by_phone(
    db: Db, phone_number: Annotated[str, Field(description="The phone number to search for.")]
) -> str:
    """The first customer whose own number, or one of whose lines' numbers, is this one."""
    return await _run(db, lambda w: _to_json_str(_Model(_get_customer_by_phone(w, phone_number))))


@tool(description="Retrieves a customer directly by their unique ID.")
async def get_customer_by_id(
    db: Db, customer_id: Annotated[str, Field(description="The unique identifier of the customer.")]
) -> str:
    """The customer as τ² dumps it."""
    return await _run(db, lambda w: _to_json_str(_Model(_get_customer_by_id(w, customer_id))))


@tool(
    description="Searches for customers by name and DOB. May return multiple matches if names are similar,"
    "\n\nDOB helps disambiguate."
)
async def get_customer_by_name(
    db: Db,
    full_name: Annotated[str, Field(description="The full name of the customer.")],
    dob: Annotated[str, Field(description="Date of birth for verification, in the format YYYY-MM-DD.")],
) -> str:
    """Case-insensitive name, exact date of birth; a list, empty when nothing matches."""

    def find(w: World) -> str:
        found = [
            _Model(c)
            for c in w.tables["customers"]
            if c["full_name"].lower() == full_name.lower() and c["date_of_birth"] == dob
        ]
        return _to_json_str(found)

    return await _run(db, find)


@tool(
    description="Retrieves the details for a given ID.\n\nThe ID must be a valid ID for a Customer, Line, "
    "Device, Bill, or Plan."
)
async def get_details_by_id(
    db: Db, id: Annotated[str, Field(description="The ID of the object to retrieve.")]
) -> str:
    """Dispatches on the id's first letter, as τ² does."""

    def details(w: World) -> str:
        if id.startswith("L"):
            record = _get_line_by_id(w, id)
        elif id.startswith("D"):
            record = _get_device_by_id(w, id)
        elif id.startswith("B"):
            record = _get_bill_by_id(w, id)
        elif id.startswith("C"):
            record = _get_customer_by_id(w, id)
        elif id.startswith("P"):
            record = _get_plan_by_id(w, id)
        else:
            raise ValueError(f"Unknown ID format or type: {id}")
        return _to_json_str(_Model(record))

    return await _run(db, details)


@tool(
    writes=["lines", *SYNC_WRITES],
    description="Suspends a specific line (max 6 months).\n\nChecks: Line status must be Active.\n"
    "Logic: Sets line status to Suspended, records suspension_start_date.",
)
async def suspend_line(
    db: Db,
    customer_id: CustomerOfLine,
    line_id: Annotated[str, Field(description="ID of the line to suspend.")],
    reason: Annotated[str, Field(description="Reason for suspension.")],
) -> str:
    """An Active line becomes Suspended from today; the reason is only logged."""

    def suspend(w: World) -> str:
        line = _get_target_line(w, customer_id, line_id)
        if line["status"] != "Active":
            raise ValueError("Line must be active to suspend")
        line["status"] = "Suspended"
        line["suspension_start_date"] = str(TODAY)
        return _to_json_str(
            {"message": "Line suspended successfully. $5/month holding fee will apply.", "line": _Model(line)}
        )

    return await _run(db, suspend)


@tool(
    writes=["lines", *SYNC_WRITES],
    description="Resumes a suspended line.\n\nChecks: Line status must be Suspended or Pending Activation.\n"
    "Logic: Sets line status to Active, clears suspension_start_date.",
)
async def resume_line(
    db: Db,
    customer_id: CustomerOfLine,
    line_id: Annotated[str, Field(description="ID of the line to resume.")],
) -> str:
    """A Suspended or Pending Activation line becomes Active."""

    def resume(w: World) -> str:
        line = _get_target_line(w, customer_id, line_id)
        if line["status"] not in ["Suspended", "Pending Activation"]:
            raise ValueError("Line must be suspended to resume")
        line["status"] = "Active"
        line["suspension_start_date"] = None
        return _to_json_str({"message": "Line resumed successfully", "line": _Model(line)})

    return await _run(db, resume)


@tool(description="Retrieves a list of the customer's bills, most recent first.")
async def get_bills_for_customer(
    db: Db,
    customer_id: Annotated[str, Field(description="ID of the customer.")],
    limit: Annotated[int, Field(description="Maximum number of bills to return.")] = 12,
) -> str:
    """The customer's bills by issue date, newest first (ties in bill_ids order), at most `limit`."""

    def bills(w: World) -> str:
        customer = _get_customer_by_id(w, customer_id)
        found = [_get_bill_by_id(w, b) for b in customer["bill_ids"]]
        ordered = sorted(
            found, key=lambda bill: datetime.date.fromisoformat(bill["issue_date"]), reverse=True
        )
        return _to_json_str([_Model(b) for b in ordered[:limit]])

    return await _run(db, bills)


@tool(
    writes=[*SYNC_WRITES],
    description="Sends a payment request to the customer for a specific bill.\n\nChecks:\n"
    "    - Customer exists\n    - Bill exists and belongs to the customer\n"
    "    - No other bills are already awaiting payment for this customer\n"
    "Logic: Sets bill status to AWAITING_PAYMENT and notifies customer.\nWarning: This method "
    "does not check if the bill is already PAID.\nAlways check the bill status before calling this method.",
)
async def send_payment_request(
    db: Db,
    customer_id: Annotated[str, Field(description="ID of the customer who owns the bill.")],
    bill_id: Annotated[str, Field(description="ID of the bill to send payment request for.")],
) -> str:
    """The bill awaits payment (even a paid one); the next sync puts the request on the user's phone."""

    def send(w: World) -> str:
        customer = _get_customer_by_id(w, customer_id)
        if len(_bills_awaiting_payment(w, customer)) != 0:
            raise ValueError("A bill is already awaiting payment for this customer")
        if bill_id not in customer["bill_ids"]:
            raise ValueError(f"Bill {bill_id} not found for customer {customer_id}")
        bill = _get_bill_by_id(w, bill_id)
        bill["status"] = "Awaiting Payment"
        return f"Payment request sent to the customer for bill {bill['bill_id']}"

    return await _run(db, send)


@tool(
    description="Retrieves current billing cycle data usage for a line, including data\n\nrefueling amount, "
    "data limit, and cycle end date."
)
async def get_data_usage(
    db: Db,
    customer_id: CustomerOfLine,
    line_id: Annotated[str, Field(description="ID of the line to check usage for.")],
) -> str:
    """Usage, limit and refuel as a plain dict (so every number is shown as a string, as in τ²)."""

    def usage(w: World) -> str:
        line = _get_target_line(w, customer_id, line_id)
        plan = _get_plan_by_id(w, line["plan_id"])
        cycle_end = datetime.date(
            TODAY.year, TODAY.month + 1 if TODAY.month < 12 else 1, 1
        ) - datetime.timedelta(days=1)
        return _to_json_str(
            {
                "line_id": line_id,
                "data_used_gb": line["data_used_gb"],
                "data_limit_gb": plan["data_limit_gb"],
                "data_refueling_gb": line["data_refueling_gb"],
                "cycle_end_date": cycle_end,
            }
        )

    return await _run(db, usage)


def _set_roaming(w: World, customer_id: Any, line_id: Any, on: bool) -> str:
    line = _get_target_line(w, customer_id, line_id)
    if bool(line["roaming_enabled"]) == on:
        return f"Roaming was already {'enabled' if on else 'disabled'}"
    line["roaming_enabled"] = on
    return f"Roaming {'enabled' if on else 'disabled'} successfully"


@tool(writes=["lines", *SYNC_WRITES], description="Enables international roaming on a line.")
async def enable_roaming(
    db: Db,
    customer_id: CustomerOfLine,
    line_id: Annotated[str, Field(description="ID of the line to enable roaming for.")],
) -> str:
    """Roaming on; sync then lets the user's phone roam."""
    return await _run(db, lambda w: _set_roaming(w, customer_id, line_id, True))


@tool(writes=["lines", *SYNC_WRITES], description="Disables international roaming on a line.")
async def disable_roaming(
    db: Db,
    customer_id: CustomerOfLine,
    line_id: Annotated[str, Field(description="ID of the line to disable roaming for.")],
) -> str:
    """Roaming off."""
    return await _run(db, lambda w: _set_roaming(w, customer_id, line_id, False))


@tool(
    description="Transfer the user to a human agent, with a summary of the user's issue.\n\n"
    "Only transfer if\n -  the user explicitly asks for a human agent\n"
    " -  given the policy and the available tools, you cannot solve the user's issue."
)
async def transfer_to_human_agents(
    db: Db, summary: Annotated[str, Field(description="A summary of the user's issue.")]
) -> str:
    """τ²'s fixed answer."""
    return await _run(db, lambda w: "Transfer successful")


@tool(
    writes=["lines", "customers", *SYNC_WRITES],
    description="Refuels data for a specific line, adding to the customer's bill.\n\n"
    "Checks: Line status must be Active, Customer owns the line.\n"
    "Logic: Adds data to the line and charges customer based on the plan's refueling rate.",
)
async def refuel_data(
    db: Db,
    customer_id: CustomerOfLine,
    line_id: Annotated[str, Field(description="ID of the line to refuel data for.")],
    gb_amount: Annotated[float, Field(description="Amount of data to add in gigabytes.")],
) -> str:
    """More data on the line, charged to the first draft bill (no line-status check: τ²'s is
    commented out)."""

    def refuel(w: World) -> str:
        line = _get_target_line(w, customer_id, line_id)
        if gb_amount <= 0:
            raise ValueError("Refuel amount must be positive")
        plan = _get_plan_by_id(w, line["plan_id"])
        price = plan["data_refueling_price_per_gb"]
        charge = gb_amount * price
        line["data_refueling_gb"] += gb_amount
        _apply_one_time_charge(w, customer_id, charge, f"Data refueling: {gb_amount} GB at ${price}/GB")
        return _to_json_str(
            {
                "message": f"Successfully added {gb_amount} GB of data for line {line_id} for ${charge:.2f}",
                "new_data_refueling_gb": line["data_refueling_gb"],
                "charge": charge,
            }
        )

    return await _run(db, refuel)


# ---------------------------------------------------------------------------------------------
# The user's phone (τ²'s TelecomUserTools), on the dumps of `device` and `surroundings`.


class NetworkModePreference(StrEnum):
    FOUR_G_5G_PREFERRED = "4g_5g_preferred"
    FOUR_G_ONLY = "4g_only"
    THREE_G_ONLY = "3g_only"
    TWO_G_ONLY = "2g_only"


class APNNames(StrEnum):
    INTERNET = "internet"
    BROKEN = "broken"


class APNSettings(BaseModel):
    """Represents the configuration for a single Access Point Name (APN)."""

    model_config = ConfigDict(extra="forbid")

    apn_name: APNNames = Field(APNNames.INTERNET, description="The name identifier for the APN connection.")
    reset_at_reboot: bool = Field(
        False, description="Whether the APN settings will be reset at the next reboot."
    )
    mms_apn: str | None = Field(
        "mms", description="Specific APN name used for MMS traffic, if different from general data."
    )
    mmsc_url: str | None = Field(
        "http://mms.carrier.com/mms/wapenc",
        description="The URL of the Multimedia Messaging Service Center (MMSC). Crucial for MMS.",
    )
    mms_proxy: str | None = Field(
        None, description="The proxy server address required for MMS traffic on some networks."
    )
    mms_port: int | None = Field(
        None, description="The proxy server port required for MMS traffic on some networks."
    )


def _enum(value: Any, enum: str, values: tuple[str, ...]) -> str:
    """τ²'s `SomeEnum(value)`: the value, or the ValueError Python raises."""
    if isinstance(value, str) and value in values:
        return value
    raise ValueError(f"{value!r} is not a valid {enum}")


NETWORK_MODES = tuple(m.value for m in NetworkModePreference)
NETWORK_STATUSES = ("connected", "searching", "no_service", "emergency_only")
SIGNAL_BARS = {
    "none": "📵 No Signal",
    "poor": "📶¹ Poor",
    "fair": "📶² Fair",
    "good": "📶³ Good",
    "excellent": "📶⁴ Excellent",
}
SPEED_RANGES = {
    "2G": (0.1, 0.4),
    "3G": (1.0, 5.0),
    "4G": (10.0, 100.0),
    "5G": (50.0, 500.0),
    "none": (0.0, 0.0),
}
SIGNAL_FACTORS = {"poor": 0.2, "fair": 0.5, "good": 0.8, "excellent": 1.0, "none": 0.0}
SPEED_ADVICE = {
    "Very Poor": "Connection is very slow. Basic web browsing might be difficult.",
    "Poor": "Connection is slow. Web browsing may be sluggish, streaming difficult.",
    "Fair": "Connection is okay for web browsing and some standard definition streaming.",
    "Good": "Connection is good for most activities, including HD streaming.",
    "Excellent": "Connection is very fast.",
}


def _status_bar(w: World) -> str:
    d = w.device
    indicators = []
    if d["airplane_mode"]:
        indicators.append("✈️ Airplane Mode")
    else:
        indicators.append(SIGNAL_BARS.get(d["network_signal_strength"], "📵 No Signal"))
        if d["network_technology_connected"] != "none":
            indicators.append(d["network_technology_connected"])
        if d["data_enabled"] and d["network_technology_connected"] != "none":
            indicators.append("📱 Data Enabled")
            if d["data_saver_mode"]:
                indicators.append("🔽 Data Saver")
        else:
            indicators.append("📵 Data Disabled")
    if d["wifi_enabled"] and d["wifi_connected"]:
        indicators.append(f"📡 Connected to {d['wifi_ssid']}" if d["wifi_ssid"] else "📡 Enabled")
    if d["vpn_connected"]:
        indicators.append("🔒 VPN Connected")
    indicators.append(f"🔋 {d['battery_level']}%")
    return " | ".join(indicators)


def _with_bar(w: World, text: str) -> str:
    return f"{text}\nStatus Bar: {_status_bar(w)}"


def _sim_status(w: World) -> str:
    if w.device["sim_card_missing"]:
        return "missing"
    return str(w.device["sim_card_status"])


def _no_service(d: dict[str, Any]) -> None:
    d["network_connection_status"] = "no_service"
    d["network_technology_connected"] = "none"
    d["network_signal_strength"] = "none"


def _simulate_network_search(w: World) -> None:
    d, signal = w.device, w.surroundings["signal_strength"]
    if _sim_status(w) == "active":
        d["network_connection_status"] = "connected"
        pref = d["network_mode_preference"]
        if pref == "4g_5g_preferred":
            five_g = signal.get("5G", "none")
            if five_g == "none":
                d["network_technology_connected"] = "4G"
                d["network_signal_strength"] = signal.get("4G", "none")
            else:
                d["network_technology_connected"] = "5G"
                d["network_signal_strength"] = five_g
        elif pref in ("3g_only", "2g_only"):
            tech = "3G" if pref == "3g_only" else "2G"
            d["network_technology_connected"] = tech
            d["network_signal_strength"] = signal.get(tech, "none")
        else:  # "4g_only", and τ²'s fallback for anything else
            d["network_technology_connected"] = "4G"
            d["network_signal_strength"] = signal.get("4G", "none")
    else:
        _no_service(d)
    if d["airplane_mode"]:
        _no_service(d)
    if d["active_apn_settings"]["apn_name"] == "broken":
        _no_service(d)
    if not w.surroundings["line_active"]:
        _no_service(d)


def _mobile_data_working(w: World) -> bool:
    d, s = w.device, w.surroundings
    if d["airplane_mode"] or d["network_signal_strength"] == "none":
        return False
    if d["network_connection_status"] == "no_service":
        return False
    if s["is_abroad"]:
        if not d["roaming_enabled"] or not s["roaming_allowed"]:
            return False
    if not d["data_enabled"]:
        return False
    return not s["mobile_data_usage_exceeded"]


def _speed_test(w: World) -> tuple[float | None, str | None]:
    if not _mobile_data_working(w):
        return None, "No Connection"
    d = w.device
    vpn = d["vpn_details"]
    factor = 0.1 if d["vpn_connected"] and vpn and vpn["server_performance"] == "poor" else 1.0
    if d["data_saver_mode"]:
        factor *= 0.2
    low, high = SPEED_RANGES.get(d["network_technology_connected"], (0.0, 0.0))
    signal = SIGNAL_FACTORS.get(d["network_signal_strength"], 0.0)
    speed = round((low + high) / 2.0 * signal * factor, 2)
    if speed < 1:
        desc = "Very Poor"
    elif speed < 5:
        desc = "Poor"
    elif speed < 25:
        desc = "Fair"
    elif speed < 100:
        desc = "Good"
    else:
        desc = "Excellent"
    return speed, desc


def _can_send_mms(w: World) -> bool:
    d = w.device
    if not _mobile_data_working(w):
        return False
    if d["network_technology_connected"] == "2G":
        return False
    if d["wifi_calling_enabled"] and d["wifi_calling_mms_over_wifi"]:
        return False
    if d["active_apn_settings"]["mmsc_url"] is None:
        return False
    app = d["app_statuses"].get("messaging")
    if app is None:
        return False
    return bool(app["permissions"]["storage"] and app["permissions"]["sms"])


def _toggle_airplane_mode(w: World) -> bool:
    d = w.device
    was_on = d["airplane_mode"]
    d["airplane_mode"] = not was_on
    if was_on:
        d["network_connection_status"] = "searching"
        if d["wifi_enabled"]:
            d["wifi_connected"] = False
            d["wifi_ssid"] = None
            d["wifi_signal_strength"] = "none"
    else:
        d["wifi_connected"] = False
        d["wifi_ssid"] = None
        d["wifi_signal_strength"] = "none"
        if d["vpn_connected"]:
            _disconnect_vpn(w)
    _simulate_network_search(w)
    return bool(d["airplane_mode"])


def _toggle(w: World, setting: str, search: bool) -> bool:
    new_state = not w.device[setting]
    w.device[setting] = new_state
    if search:
        _simulate_network_search(w)
    return new_state


def _connect_vpn(w: World) -> bool | None:
    d = w.device
    if d["vpn_connected"]:
        return None
    d["vpn_connected"] = True
    d["vpn_details"] = {
        "server_address": "192.168.1.1",
        "protocol": "OpenVPN",
        "server_performance": w.vpn_default,
    }
    return True


def _disconnect_vpn(w: World) -> bool:
    d = w.device
    if not d["vpn_connected"]:
        return False
    d["vpn_connected"] = False
    d["vpn_details"] = None
    return True


def _vpn_repr(details: dict[str, Any]) -> str:
    """Python's repr of τ²'s `VpnDetails.model_dump()`, whose performance is still an enum member."""
    parts = []
    for key, value in details.items():
        if key == "server_performance":
            parts.append(f"{key!r}: <PerformanceLevel.{str(value).upper()}: {value!r}>")
        else:
            parts.append(f"{key!r}: {value!r}")
    return "{" + ", ".join(parts) + "}"


def _allowed_permissions(permissions: dict[str, Any]) -> list[str]:
    return [name.replace("_", " ").lower() for name, allowed in permissions.items() if allowed]


async def _user(db: Db, action: Callable[[World], str]) -> str:
    return str(await _run(db, action))


@tool(
    side="user",
    description="Shows what icons are currently visible in your phone's status bar (the area at the top of "
    "the screen). Displays network signal strength, mobile data status (enabled, disabled, data saver), "
    "Wi-Fi status, and battery level.",
)
async def check_status_bar(db: Db) -> str:
    """The status bar's icons."""
    return await _user(db, lambda w: f"Status Bar: {_status_bar(w)}")


@tool(
    side="user",
    description="Checks your phone's connection status to cellular networks and Wi-Fi. Shows airplane mode "
    "status, signal strength, network type, whether mobile data is enabled, and whether data roaming is "
    "enabled.",
)
async def check_network_status(db: Db) -> str:
    """One line per network setting."""

    def status(w: World) -> str:
        d = w.device
        lines = [
            f"Airplane Mode: {'ON' if d['airplane_mode'] else 'OFF'}",
            f"SIM Card Status: {_sim_status(w)}",
            f"Cellular Connection: {d['network_connection_status']}",
            f"Cellular Signal: {d['network_signal_strength']}",
            f"Cellular Network Type: {d['network_technology_connected']}",
            f"Mobile Data Enabled: {'Yes' if d['data_enabled'] else 'No'}",
            f"Data Roaming Enabled: {'Yes' if d['roaming_enabled'] else 'No'}",
            f"Wi-Fi Radio: {'ON' if d['wifi_enabled'] else 'OFF'}",
            f"Wi-Fi Connected: {'Yes' if d['wifi_connected'] else 'No'}",
        ]
        if d["wifi_connected"]:
            lines.append(f"Connected Wi-Fi Network: {d['wifi_ssid']}")
        return "\n".join(lines)

    return await _user(db, status)


@tool(side="user", description="Shows the current network mode preference.")
async def check_network_mode_preference(db: Db) -> str:
    """The preferred network mode."""
    return await _user(db, lambda w: f"Network Mode Preference: {w.device['network_mode_preference']}")


@tool(
    writes=USER_WRITES,
    side="user",
    description="Changes the type of cellular network your phone prefers to connect to (e.g., 5G, LTE/4G, "
    "3G). Higher-speed networks (LTE/5G) provide faster data but may use more battery.",
)
async def set_network_mode_preference(db: Db, mode: NetworkModePreference | str) -> str:
    """A valid mode is set and the phone searches the network again; any other text is refused in
    the result (not as an error)."""

    def set_mode(w: World) -> str:
        valid: Any
        try:
            valid = _enum(mode, "NetworkModePreference", NETWORK_MODES) if isinstance(mode, str) else mode
            w.device["network_mode_preference"] = valid
            _simulate_network_search(w)
        except ValueError:
            valid = None
        if valid is None:
            return _with_bar(
                w,
                f"Failed to set network mode: '{mode}' is not a valid option. Please use one of: "
                f"{', '.join(NETWORK_MODES)}",
            )
        if not isinstance(valid, str):  # τ²: `valid_mode.value` of what it stored unchecked
            raise AttributeError(f"'{type(valid).__name__}' object has no attribute 'value'")
        return _with_bar(w, f"Preferred Network Mode set to: {valid}")

    return await _user(db, set_mode)


@tool(
    side="user",
    description="Measures your current internet connection speed (download speed). Provides information "
    "about connection quality and what activities it can support.",
)
async def run_speed_test(db: Db) -> str:
    """The speed mobile data would give, from the network, the VPN and data saver."""

    def test(w: World) -> str:
        speed, desc = _speed_test(w)
        if speed is None:
            return f"Speed test failed: {desc or 'Could not determine speed'}."
        return f"Speed Test Result: {speed:.2f} Mbps ({desc}). {SPEED_ADVICE.get(desc or '', '')}"

    return await _user(db, test)


@tool(
    writes=USER_WRITES,
    side="user",
    description="Toggles Airplane Mode ON or OFF. When ON, it disconnects all wireless communications "
    "including cellular, Wi-Fi, and Bluetooth.\n\nReturns the new state of airplane_mode.",
)
async def toggle_airplane_mode(db: Db) -> str:
    """On drops Wi-Fi and the VPN; either way the phone searches the network again."""

    def toggle(w: World) -> str:
        on = _toggle_airplane_mode(w)
        return _with_bar(w, f"Airplane Mode is now {'ON' if on else 'OFF'}.")

    return await _user(db, toggle)


SIM_TEXT = {
    "active": "Your SIM card is active and working.",
    "missing": "No SIM card detected in the phone.",
    "locked_pin": "The SIM card is locked with a PIN code.",
    "locked_puk": "The SIM card is locked with a PUK code.",
}


@tool(
    side="user",
    description="Checks if your SIM card is working correctly and displays its current status. Shows if the "
    "SIM is active, missing, or locked with a PIN or PUK code.",
)
async def check_sim_status(db: Db) -> str:
    """The SIM's status in words."""

    def sim(w: World) -> str:
        status = _sim_status(w)
        return SIM_TEXT.get(status, f"Unknown SIM status: {status}")

    return await _user(db, sim)


@tool(
    writes=USER_WRITES,
    side="user",
    description="Simulates removing and reinserting your SIM card. This can help resolve recognition issues.",
)
async def reseat_sim_card(db: Db) -> str:
    """The SIM is back in and the phone searches the network again."""

    def reseat(w: World) -> str:
        w.device["sim_card_missing"] = False
        _simulate_network_search(w)
        return _with_bar(w, "SIM card re-seated successfully.")

    return await _user(db, reseat)


@tool(
    writes=USER_WRITES,
    side="user",
    description="Toggles your phone's mobile data connection ON or OFF. Controls whether your phone can use "
    "cellular data for internet access when Wi-Fi is unavailable.\n\nReturns the new data connection status.",
)
async def toggle_data(db: Db) -> str:
    """Mobile data on or off."""

    def toggle(w: World) -> str:
        on = _toggle(w, "data_enabled", search=True)
        return _with_bar(w, f"Mobile Data is now {'ON' if on else 'OFF'}.")

    return await _user(db, toggle)


@tool(
    writes=USER_WRITES,
    side="user",
    description="Toggles Data Roaming ON or OFF. When ON, your phone can use data networks in areas outside "
    "your carrier's coverage.\n\nReturns the new data roaming status.",
)
async def toggle_roaming(db: Db) -> str:
    """The phone's roaming setting on or off (the line must allow it too)."""

    def toggle(w: World) -> str:
        on = _toggle(w, "roaming_enabled", search=True)
        return _with_bar(w, f"Data Roaming is now {'ON' if on else 'OFF'}.")

    return await _user(db, toggle)


@tool(
    side="user",
    description="Checks if your phone has any data-limiting features active. Shows if Data Saver mode is on.",
)
async def check_data_restriction_status(db: Db) -> str:
    """Data saver on or off."""
    return await _user(
        db,
        lambda w: (
            "Data Saver mode is ON (limits data usage)."
            if w.device["data_saver_mode"]
            else "Data Saver mode is OFF."
        ),
    )


@tool(
    writes=USER_WRITES,
    side="user",
    description="Toggles Data Saver mode ON or OFF. When ON, it reduces data usage, which may affect data "
    "speed.\n\nReturns the new data saver mode status.",
)
async def toggle_data_saver_mode(db: Db) -> str:
    """Data saver on or off (no network search)."""

    def toggle(w: World) -> str:
        on = _toggle(w, "data_saver_mode", search=False)
        return _with_bar(w, f"Data Saver Mode is now {'ON' if on else 'OFF'}.")

    return await _user(db, toggle)


@tool(
    side="user",
    description="Checks the technical APN settings your phone uses to connect to your carrier's mobile data "
    "network. Shows current APN name and MMSC URL for picture messaging.",
)
async def check_apn_settings(db: Db) -> str:
    """The APN's name and MMSC URL."""

    def apn(w: World) -> str:
        settings = w.device["active_apn_settings"]
        apn_name = settings["apn_name"] or "Not Set"
        mmsc_url = settings["mmsc_url"] or "Not Set"
        return (
            f"Current APN Name: {apn_name}\nMMSC URL (for picture messages): {mmsc_url}\n"
            "(These are technical settings, usually best left unchanged.)"
        )

    return await _user(db, apn)


@tool(writes=USER_WRITES, side="user", description="Sets the APN settings for the phone.")
async def set_apn_settings(db: Db, apn_settings: APNSettings | dict) -> str:  # type: ignore[type-arg]
    """New APN settings, validated as τ²'s model validates them; the phone searches again."""

    def set_apn(w: World) -> str:
        if not isinstance(apn_settings, dict):
            raise AttributeError(f"'{type(apn_settings).__name__}' object has no attribute 'apn_name'")
        settings = APNSettings(**apn_settings)
        w.device["active_apn_settings"] = settings.model_dump(mode="json")
        _simulate_network_search(w)
        return _with_bar(w, f"APN settings set to: {settings.apn_name.value}")

    return await _user(db, set_apn)


@tool(writes=USER_WRITES, side="user", description="Resets your APN settings to the default settings.")
async def reset_apn_settings(db: Db) -> str:
    """Only marks the APN for reset: the reset happens at the next reboot."""

    def reset(w: World) -> str:
        w.device["active_apn_settings"]["reset_at_reboot"] = True
        _simulate_network_search(w)
        return _with_bar(w, "APN settings will reset at reboot.")

    return await _user(db, reset)


@tool(
    side="user",
    description="Checks your Wi-Fi connection status. Shows if Wi-Fi is turned on, which network you're "
    "connected to (if any), and the signal strength.",
)
async def check_wifi_status(db: Db) -> str:
    """Wi-Fi on or off, and the network it is connected to."""

    def wifi(w: World) -> str:
        d = w.device
        if not d["wifi_enabled"]:
            return "Wi-Fi is turned OFF."
        if d["wifi_connected"]:
            ssid, signal = d["wifi_ssid"], d["wifi_signal_strength"]
            return f"Wi-Fi is ON and connected to '{ssid}'. Signal strength: {signal}."
        return "Wi-Fi is ON but not connected to any network."

    return await _user(db, wifi)


@tool(
    writes=USER_WRITES,
    side="user",
    description="Toggles your phone's Wi-Fi radio ON or OFF. Controls whether your phone can discover and "
    "connect to wireless networks for internet access.\n\nReturns the new Wi-Fi status.",
)
async def toggle_wifi(db: Db) -> str:
    """Wi-Fi on or off; refused while airplane mode is on."""

    def toggle(w: World) -> str:
        d = w.device
        if d["airplane_mode"]:
            return _with_bar(w, "Cannot change Wi-Fi settings while Airplane Mode is ON.")
        on = not d["wifi_enabled"]
        d["wifi_enabled"] = on
        if not on:
            d["wifi_connected"] = False
            d["wifi_ssid"] = None
            d["wifi_signal_strength"] = "none"
        return _with_bar(w, f"Wi-Fi is now {'ON' if on else 'OFF'}.")

    return await _user(db, toggle)


@tool(
    side="user",
    description="Checks if Wi-Fi Calling is enabled on your device. This feature allows you to make and "
    "receive calls over a Wi-Fi network instead of using the cellular network.",
)
async def check_wifi_calling_status(db: Db) -> str:
    """Wi-Fi calling on or off."""
    return await _user(
        db,
        lambda w: f"Wi-Fi Calling is currently turned {'ON' if w.device['wifi_calling_enabled'] else 'OFF'}.",
    )


@tool(
    writes=USER_WRITES,
    side="user",
    description="Toggles Wi-Fi Calling ON or OFF. This feature allows you to make and receive calls over "
    "Wi-Fi instead of the cellular network, which can help in areas with weak cellular signal.\n\nReturns "
    "the new Wi-Fi Calling status.",
)
async def toggle_wifi_calling(db: Db) -> str:
    """Wi-Fi calling on or off (no network search)."""

    def toggle(w: World) -> str:
        on = _toggle(w, "wifi_calling_enabled", search=False)
        return _with_bar(w, f"Wi-Fi Calling is now {'ON' if on else 'OFF'}.")

    return await _user(db, toggle)


@tool(
    side="user",
    description="Checks if you're using a VPN (Virtual Private Network) connection. Shows if a VPN is "
    "active, connected, and displays any available connection details.",
)
async def check_vpn_status(db: Db) -> str:
    """The VPN, with τ²'s Python repr of its details."""

    def vpn(w: World) -> str:
        d = w.device
        if d["vpn_connected"]:
            details = d["vpn_details"] if d["vpn_details"] and d["vpn_connected"] else None
            if details:
                return f"VPN is ON and connected. Details: {_vpn_repr(details)}"
            return "VPN is ON and connected (no specific details available)."
        if d["vpn_enabled_setting"]:
            return "VPN is turned ON in settings, but currently not connected."
        return "VPN is turned OFF."

    return await _user(db, vpn)


@tool(writes=USER_WRITES, side="user", description="Connects to your VPN (Virtual Private Network).")
async def connect_vpn(db: Db) -> str:
    """Connects to the default VPN (a poor one after the initialization `break_vpn`)."""

    def connect(w: World) -> str:
        connected = _connect_vpn(w)
        if connected is None:
            return "VPN already connected."
        return _with_bar(w, "VPN connected successfully." if connected else "No VPN connection to connect.")

    return await _user(db, connect)


@tool(
    writes=USER_WRITES,
    side="user",
    description="Disconnects any active VPN (Virtual Private Network) connection. Stops routing your "
    "internet traffic through a VPN server, which might affect connection speed or access to content.",
)
async def disconnect_vpn(db: Db) -> str:
    """The VPN off."""

    def disconnect(w: World) -> str:
        done = _disconnect_vpn(w)
        return _with_bar(
            w, "VPN disconnected successfully." if done else "No active VPN connection to disconnect."
        )

    return await _user(db, disconnect)


@tool(side="user", description="Returns the name of all installed apps on the phone.")
async def check_installed_apps(db: Db) -> str:
    """The apps, in the phone's order."""
    return await _user(
        db, lambda w: f"The following apps are installed on the phone: {', '.join(w.device['app_statuses'])}"
    )


@tool(
    side="user",
    description="Checks detailed information about a specific app. Shows its permissions and background data "
    "usage settings.",
)
async def check_app_status(db: Db, app_name: str) -> str:
    """The app's granted permissions."""

    def status(w: World) -> str:
        app = w.device["app_statuses"].get(app_name)
        if not app:
            return f"App '{app_name}' not found on this phone."
        lines = [f"Status for App: {app_name}"]
        allowed = _allowed_permissions(app["permissions"])
        if not allowed:
            lines.append(" - Permissions: None granted.")
        else:
            lines.append(" - Permissions Granted:")
            lines.extend(f"   - {perm}" for perm in allowed)
        return "\n".join(lines)

    return await _user(db, status)


@tool(
    side="user",
    description="Checks what permissions a specific app currently has. Shows if the app has access to "
    "features like storage, camera, location, etc.",
)
async def check_app_permissions(db: Db, app_name: str) -> str:
    """The app's granted permissions, on one line."""

    def permissions(w: World) -> str:
        app = w.device["app_statuses"].get(app_name)
        if not app:
            return f"App '{app_name}' not found on this phone."
        allowed = _allowed_permissions(app["permissions"])
        if not allowed:
            return f"App '{app_name}' currently has no permissions granted."
        return f"App '{app_name}' has permission for: {', '.join(allowed)}."

    return await _user(db, permissions)


@tool(
    writes=USER_WRITES,
    side="user",
    description="Gives a specific permission to an app (like access to storage, camera, or location). "
    "Required for some app functions to work properly.",
)
async def grant_app_permission(
    db: Db,
    app_name: Annotated[str, Field(description="The name of the app to grant the permission to.")],
    permission: Annotated[str, Field(description="The permission to grant, should be lowercase.")],
) -> str:
    """One of the app's four tracked permissions on (lower-cased); failures are in the result text."""

    def grant(w: World) -> str:
        app = w.device["app_statuses"].get(app_name)
        name = permission.lower()
        if app:
            available = list(app["permissions"])
            if name not in available:
                ok = False
                message = (
                    f"Permission '{name}' not tracked for app '{app_name}', "
                    f"available permissions: {available}"
                )
            else:
                app["permissions"][name] = True
                ok, message = True, f"Permission '{name}' granted to app '{app_name}'."
        else:
            ok, message = False, f"App '{app_name}' not found. Cannot grant permission."
        return _with_bar(w, f"{'Success. ' if ok else 'Error. '}{message}")

    return await _user(db, grant)


@tool(side="user", description="Checks if the default messaging app can send MMS messages.")
async def can_send_mms(db: Db) -> str:
    """Whether MMS would go through."""
    return await _user(
        db,
        lambda w: (
            "Your messaging app can send MMS messages."
            if _can_send_mms(w)
            else "Your messaging app cannot send MMS messages."
        ),
    )


@tool(
    writes=USER_WRITES,
    side="user",
    description="Restarts your phone completely. This can help resolve many temporary software glitches by "
    "refreshing all running services and connections.",
)
async def reboot_device(db: Db) -> str:
    """Applies a pending APN reset, then searches the network again."""

    def reboot(w: World) -> str:
        lines = []
        if w.device["active_apn_settings"]["reset_at_reboot"]:
            lines.append("Resetting APN settings...")
            w.device["active_apn_settings"] = APNSettings().model_dump(mode="json")
        lines.append("Restarting network services...")
        w.device["network_connection_status"] = "searching"
        _simulate_network_search(w)
        return _with_bar(w, "\n".join(lines))

    return await _user(db, reboot)


@tool(side="user", description="Checks if the agent has sent you a payment request.")
async def check_payment_request(db: Db) -> str:
    """The request the agent's `send_payment_request` put on the phone (through sync), if any."""

    def check(w: World) -> str:
        request = w.surroundings["payment_request"]
        if request is None:
            return "No payment request has been made."
        return f"You have a payment request for bill {request['bill_id']} of {request['amount_due']} USD."

    return await _user(db, check)


@tool(
    writes=USER_WRITES, side="user", description="Makes a payment for the bill that the agent has sent you."
)
async def make_payment(db: Db) -> str:
    """Pays the request; sync then marks the bill Paid and clears the request."""

    def pay(w: World) -> str:
        request = w.surroundings["payment_request"]
        if request is None:
            return "You do not have a payment request."
        request["paid"] = True
        return f"Payment of {request['amount_due']} USD has been made for bill {request['bill_id']}."

    return await _user(db, pay)


# ---------------------------------------------------------------------------------------------
# Initialization methods (side "setup"): τ²'s toolkit methods that tasks' `initialization_actions`
# call, each followed by sync. `enable_roaming`, `disable_roaming` and `set_network_mode_preference`
# are tools of their side already and run as those.

ALL_WRITES = ["plans", "customers", "lines", "bills", "devices", "device", "surroundings", "phone_defaults"]


def _setup(db: Db, action: Callable[[World], Any]) -> Any:
    return _run(db, action)


@tool(writes=ALL_WRITES, side="setup", description="Sets the data usage for a line.")
async def set_data_usage(db: Db, customer_id: Any, line_id: Any, data_used_gb: Any) -> Any:
    """τ²'s `TelecomTools.set_data_usage`: the value is stored as given."""

    def set_usage(w: World) -> str:
        _get_target_line(w, customer_id, line_id)["data_used_gb"] = data_used_gb
        return f"Data usage set to {data_used_gb} GB for line {line_id}"

    return await _setup(db, set_usage)


@tool(writes=ALL_WRITES, side="setup", description="Suspends a line for an unpaid bill.")
async def suspend_line_for_overdue_bill(
    db: Db, customer_id: Any, line_id: Any, new_bill_id: Any, contract_ended: Any
) -> Any:
    """A new overdue bill for last month's plan charge (appended, as τ² does), and the line suspended."""

    def suspend(w: World) -> str:
        line = _get_line_by_id(w, line_id)
        if line["status"] != "Active":
            raise ValueError("Line must be active to suspend for unpaid bill")
        plan = _get_plan_by_id(w, line["plan_id"])
        amount = plan["price_per_month"]
        if amount <= 0:
            raise ValueError("Amount must be positive for overdue bill")
        customer = _get_customer_by_id(w, customer_id)
        for bill_id in customer["bill_ids"]:
            if _get_bill_by_id(w, bill_id)["status"] == "Overdue":
                raise ValueError("Customer already has an overdue bill")
        last_month_end = TODAY.replace(day=1) - datetime.timedelta(days=1)
        last_month_start = last_month_end.replace(day=1)
        if not isinstance(new_bill_id, str):
            raise TypeError(f"a bill id must be a string, got {new_bill_id!r}")
        item = _line_item(f"Charge for line {line['line_id']}", amount, "Charge" if amount > 0 else "Credit")
        w.tables["bills"].append(
            {
                "bill_id": new_bill_id,
                "customer_id": customer_id,
                "period_start": str(last_month_start),
                "period_end": str(last_month_end),
                "issue_date": str(last_month_start),
                "total_due": 0.0 + amount,
                "due_date": str(last_month_start + datetime.timedelta(days=14)),
                "line_items": [item],
                "status": "Overdue",
            }
        )
        customer["bill_ids"].append(new_bill_id)
        line["status"] = "Suspended"
        line["suspension_start_date"] = str(TODAY)
        if contract_ended:
            line["contract_end_date"] = str(last_month_end)
        return f"Line {line_id} suspended for unpaid bill {new_bill_id}. Contract ended: {contract_ended}"

    return await _setup(db, suspend)


@tool(writes=ALL_WRITES, side="setup", description="Sets the user's name and phone number.")
async def set_user_info(db: Db, name: Any, phone_number: Any) -> Any:
    """Who the user is: from here on sync couples their phone to that number's line."""

    def set_info(w: World) -> None:
        w.surroundings["name"] = name
        w.surroundings["phone_number"] = phone_number

    return await _setup(db, set_info)


@tool(writes=ALL_WRITES, side="setup", description="Sets the user's location to abroad or not.")
async def set_user_location(db: Db, abroad: Any) -> Any:
    """Abroad or at home."""

    def set_location(w: World) -> None:
        w.surroundings["is_abroad"] = abroad

    return await _setup(db, set_location)


def _force(setting: Callable[[World], bool], want: bool) -> Callable[[World], None]:
    """τ²'s `turn_X_on/off`: toggle, and toggle again if that gave the wrong state."""

    def force(w: World) -> None:
        if setting(w) != want:
            setting(w)

    return force


@tool(writes=ALL_WRITES, side="setup", description="Turns Airplane Mode ON.")
async def turn_airplane_mode_on(db: Db) -> Any:
    """Airplane mode on."""
    force = _force(_toggle_airplane_mode, True)
    return await _setup(db, lambda w: (force(w), "Airplane Mode is now ON.")[1])


@tool(writes=ALL_WRITES, side="setup", description="Turns Airplane Mode OFF.")
async def turn_airplane_mode_off(db: Db) -> Any:
    """Airplane mode off."""
    force = _force(_toggle_airplane_mode, False)
    return await _setup(db, lambda w: (force(w), "Airplane Mode is now OFF.")[1])


@tool(
    writes=ALL_WRITES,
    side="setup",
    description="Simulates the outcome of a cellular network search based on SIM status.",
)
async def simulate_network_search(db: Db) -> Any:
    """The network search the phone runs after most changes."""
    return await _setup(db, _simulate_network_search)


@tool(writes=ALL_WRITES, side="setup", description="Removes a specific permission from an app.")
async def remove_app_permission(db: Db, app_name: Any, permission: Any) -> Any:
    """One of the app's permissions off; τ² answers with a (success, message) pair."""

    def remove(w: World) -> list[Any]:
        app = w.device["app_statuses"].get(app_name)
        name = permission.lower()
        if not app:
            return [False, f"App '{app_name}' not found. Cannot remove permission."]
        if name not in app["permissions"]:
            return [False, f"Permission '{name}' not tracked for app '{app_name}'."]
        app["permissions"][name] = False
        return [True, f"Permission '{name}' removed from app '{app_name}'."]

    return await _setup(db, remove)


def _roaming(w: World) -> bool:
    return _toggle(w, "roaming_enabled", search=True)


def _data(w: World) -> bool:
    return _toggle(w, "data_enabled", search=True)


def _data_saver(w: World) -> bool:
    return _toggle(w, "data_saver_mode", search=False)


@tool(writes=ALL_WRITES, side="setup", description="Turns Data Roaming OFF.")
async def turn_roaming_off(db: Db) -> Any:
    """The phone's roaming off."""
    force = _force(_roaming, False)
    return await _setup(db, lambda w: (force(w), "Data Roaming is now OFF.")[1])


@tool(writes=ALL_WRITES, side="setup", description="Turns Data Roaming ON.")
async def turn_roaming_on(db: Db) -> Any:
    """The phone's roaming on."""
    force = _force(_roaming, True)
    return await _setup(db, lambda w: (force(w), "Data Roaming is now ON.")[1])


@tool(writes=ALL_WRITES, side="setup", description="Turns Data OFF.")
async def turn_data_off(db: Db) -> Any:
    """Mobile data off."""
    force = _force(_data, False)
    return await _setup(db, lambda w: (force(w), "Data connection broken.")[1])


@tool(writes=ALL_WRITES, side="setup", description="Turns Data ON.")
async def turn_data_on(db: Db) -> Any:
    """Mobile data on (τ² sets the switch without a network search)."""

    def on(w: World) -> str:
        w.device["data_enabled"] = True
        return "Data connection restored."

    return await _setup(db, on)


@tool(writes=ALL_WRITES, side="setup", description="Un-seats the SIM card by removing it.")
async def unseat_sim_card(db: Db) -> Any:
    """The SIM out: no service."""

    def unseat(w: World) -> str:
        w.device["sim_card_missing"] = True
        _simulate_network_search(w)
        return "SIM card un-seated successfully."

    return await _setup(db, unseat)


@tool(writes=ALL_WRITES, side="setup", description="Locks the SIM card by setting the PIN.")
async def lock_sim_card(db: Db, mode: Any) -> Any:
    """A SIM locked by PIN or PUK, which no tool can fix."""

    def lock(w: World) -> str:
        if mode == "pin":
            w.device["sim_card_status"] = "locked_pin"
        elif mode == "puk":
            w.device["sim_card_status"] = "locked_puk"
        _simulate_network_search(w)
        return f"SIM card locked successfully in {mode} mode."

    return await _setup(db, lock)


@tool(writes=ALL_WRITES, side="setup", description="Set the Wi-Fi Calling setting.")
async def set_wifi_calling(db: Db, enabled: Any, mms_over_wifi: Any = None) -> Any:
    """Wi-Fi calling to `enabled`, and MMS over Wi-Fi when given."""

    def set_calling(w: World) -> str:
        if w.device["wifi_calling_enabled"] != enabled:
            _toggle(w, "wifi_calling_enabled", search=False)
        msg = f"Wi-Fi Calling is now {'ON' if enabled else 'OFF'}."
        if mms_over_wifi is not None:
            w.device["wifi_calling_mms_over_wifi"] = mms_over_wifi
            msg += f"\nMMS over Wi-Fi is now {'ON' if mms_over_wifi else 'OFF'}."
        return msg

    return await _setup(db, set_calling)


@tool(writes=ALL_WRITES, side="setup", description="Breaks the APN MMS setting.")
async def break_apn_mms_setting(db: Db) -> Any:
    """No MMSC URL: no MMS until the APN is reset and the phone rebooted."""

    def break_mms(w: World) -> str:
        w.device["active_apn_settings"]["mmsc_url"] = None
        assert not _can_send_mms(w)
        return "APN MMS setting broken. Please call reset_apn_settings() to fix."

    return await _setup(db, break_mms)


@tool(writes=ALL_WRITES, side="setup", description="Breaks the APN settings.")
async def break_apn_settings(db: Db) -> Any:
    """A broken APN: no service until the APN is reset and the phone rebooted."""

    def break_apn(w: World) -> str:
        w.device["active_apn_settings"]["apn_name"] = "broken"
        _simulate_network_search(w)
        assert w.device["network_connection_status"] == "no_service"
        return "APN settings broken. Please call reset_apn_settings() to fix."

    return await _setup(db, break_apn)


@tool(writes=ALL_WRITES, side="setup", description="Turns Data Saver mode ON.")
async def turn_data_saver_mode_on(db: Db) -> Any:
    """Data saver on."""
    force = _force(_data_saver, True)
    return await _setup(db, lambda w: (force(w), "Data Saver Mode is now ON.")[1])


@tool(writes=ALL_WRITES, side="setup", description="Turns Data Saver mode OFF.")
async def turn_data_saver_mode_off(db: Db) -> Any:
    """Data saver off."""
    force = _force(_data_saver, False)
    return await _setup(db, lambda w: (force(w), "Data Saver Mode is now OFF.")[1])


@tool(
    writes=ALL_WRITES, side="setup", description="Breaks the VPN connection. Results in a slow mobile data."
)
async def break_vpn(db: Db) -> Any:
    """Connects the default VPN and degrades it, for the rest of the episode: τ²'s `connect_vpn`
    stores the toolkit's one shared default, which this then mutates."""

    def degrade(w: World) -> str:
        _connect_vpn(w)
        details = w.device["vpn_details"]
        if details is None:
            raise AttributeError("'NoneType' object has no attribute 'server_performance'")
        details["server_performance"] = "poor"
        w.vpn_default = "poor"
        return "VPN connection broken."

    return await _setup(db, degrade)


# ---------------------------------------------------------------------------------------------
# Assertions (side "check"): what τ²'s env assertions call on the end state.


async def _check(db: Db, action: Callable[[World], bool]) -> bool:
    return bool(await _run(db, action))


@tool(side="check", description="Assert that the data refueling amount is as expected.")
async def assert_data_refueling_amount(db: Db, customer_id: Any, line_id: Any, expected_amount: Any) -> bool:
    """Within 1e-6 GB."""
    return await _check(
        db,
        lambda w: (
            abs(_get_target_line(w, customer_id, line_id)["data_refueling_gb"] - expected_amount) < 1e-6
        ),
    )


@tool(side="check", description="Assert that the line status is as expected.")
async def assert_line_status(db: Db, customer_id: Any, line_id: Any, expected_status: Any) -> bool:
    """The line's status."""
    return await _check(db, lambda w: _get_target_line(w, customer_id, line_id)["status"] == expected_status)


@tool(side="check", description="Assert that the overdue bill exists.")
async def assert_overdue_bill_exists(db: Db, customer_id: Any, overdue_bill_id: Any) -> bool:
    """True, or τ²'s error saying what is missing."""

    def exists(w: World) -> bool:
        customer = _get_customer_by_id(w, customer_id)
        if overdue_bill_id not in customer["bill_ids"]:
            raise ValueError(f"Overdue bill {overdue_bill_id} not found")
        if _get_bill_by_id(w, overdue_bill_id)["status"] != "Overdue":
            raise ValueError(f"Overdue bill {overdue_bill_id} is not overdue")
        return True

    return await _check(db, exists)


@tool(side="check", description="Assert that either the overdue bill is not in the database or it is paid.")
async def assert_no_overdue_bill(db: Db, overdue_bill_id: Any) -> bool:
    """Paid, or gone."""

    def settled(w: World) -> bool:
        try:
            bill = _get_bill_by_id(w, overdue_bill_id)
        except ValueError:
            return True
        return bill["status"] == "Paid"

    return await _check(db, settled)


@tool(side="check", description="Assert that the airplane mode status is as expected.")
async def assert_airplane_mode_status(db: Db, expected_status: Any) -> bool:
    """Airplane mode."""
    return await _check(db, lambda w: w.device["airplane_mode"] == expected_status)


@tool(side="check", description="Assert that the network connection status is as expected.")
async def assert_service_status(db: Db, expected_status: Any) -> bool:
    """The network connection status (an invalid status is τ²'s enum error)."""
    return await _check(
        db,
        lambda w: (
            w.device["network_connection_status"] == _enum(expected_status, "NetworkStatus", NETWORK_STATUSES)
        ),
    )


@tool(side="check", description="Assert that the mobile data status is as expected.")
async def assert_mobile_data_status(db: Db, expected_status: Any) -> bool:
    """Whether mobile data works."""
    return await _check(db, lambda w: _mobile_data_working(w) == expected_status)


@tool(side="check", description="Assert that the roaming status is as expected.")
async def assert_mobile_roaming_status(db: Db, expected_status: Any) -> bool:
    """The phone's roaming setting."""
    return await _check(db, lambda w: w.device["roaming_enabled"] == expected_status)


@tool(side="check", description="Assert that the data saver mode status is as expected.")
async def assert_mobile_data_saver_mode_status(db: Db, expected_status: Any) -> bool:
    """Data saver."""
    return await _check(db, lambda w: w.device["data_saver_mode"] == expected_status)


@tool(side="check", description="Assert that the internet speed is as expected.")
async def assert_internet_speed(db: Db, expected_speed: Any, expected_desc: Any = None) -> bool:
    """At least `expected_speed`, and the band named `expected_desc` when given."""

    def fast(w: World) -> bool:
        speed, desc = _speed_test(w)
        speed = speed or 0.0
        if expected_desc is None:
            return bool(speed >= expected_speed)
        return bool(speed >= expected_speed and str(desc).lower() == expected_desc.lower())

    return await _check(db, fast)


@tool(side="check", description="Assert that the internet speed is not excellent.")
async def assert_internet_not_excellent(db: Db) -> bool:
    """Anything but Excellent."""
    return await _check(db, lambda w: str(_speed_test(w)[1]).lower() != "excellent")


@tool(side="check", description="Assert that the default messaging app can send MMS messages.")
async def assert_can_send_mms(db: Db, expected_status: Any) -> bool:
    """Whether MMS goes through."""
    return await _check(db, lambda w: _can_send_mms(w) == expected_status)


@tool(side="check", description="Assert that the mobile data usage exceeded status is as expected.")
async def assert_mobile_data_usage_exceeded(db: Db, expected_status: Any) -> bool:
    """The surroundings' usage flag."""
    return await _check(db, lambda w: w.surroundings["mobile_data_usage_exceeded"] == expected_status)
