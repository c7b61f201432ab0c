"""τ²-bench's airline DB (`db.json`) as the `tau2_airline` env's seed rows, and back.

The two directions live together because they must stay exact inverses: `airline_state_to_tau2_db`
is how a run's final state is scored against τ² (its DB hash), so anything `airline_db_to_seed`
flattens must come back with the same values, the same key order and the same list order, and
with what τ²'s `FlightDB.model_dump()` adds to db.json (`"status": null` on every reservation).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

#: τ²'s DB hash of the unmodified airline `db.json` (`FlightDB.model_dump()`, hashed).
AIRLINE_INITIAL_DB_HASH = "124e39a664b56402bcd09cb8a6a9cece6acb8462337c969799d5658e3250f263"

ADDRESS_FIELDS = ("address1", "address2", "city", "country", "state", "zip")
CABINS = ("basic_economy", "economy", "business")
_SOURCES = ("credit_card", "gift_card", "certificate")
#: The non-status fields of τ²'s FlightDateStatus models, per status, in model order.
DATE_FIELDS: dict[str, tuple[str, ...]] = {
    "available": ("available_seats", "prices"),
    "landed": ("actual_departure_time_est", "actual_arrival_time_est"),
    "cancelled": (),
    "on time": ("estimated_departure_time_est", "estimated_arrival_time_est"),
    "flying": ("actual_departure_time_est", "estimated_arrival_time_est"),
    "delayed": ("estimated_departure_time_est", "estimated_arrival_time_est"),
}
_TIME_COLUMNS = (
    "actual_departure_time_est",
    "actual_arrival_time_est",
    "estimated_departure_time_est",
    "estimated_arrival_time_est",
)

#: Tables in foreign-key order, as seed.json lists them.
AIRLINE_SEED_TABLES = (
    "flights",
    "flight_dates",
    "users",
    "payment_methods",
    "user_reservations",
    "reservations",
    "reservation_flights",
    "reservation_passengers",
    "reservation_payments",
)


def _same_key(kind: str, key: str, inner: Any) -> None:
    if key != inner:
        raise ValueError(f"{kind} keyed {key!r} carries the id {inner!r}; they must be equal")


def _cabins(kind: str, value: Any) -> list[int]:
    if not isinstance(value, dict) or list(value) != list(CABINS):
        raise ValueError(f"{kind} must map {', '.join(CABINS)} in that order, got {value!r}")
    return [int(value[c]) for c in CABINS]


def airline_db_to_seed(db: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """τ²'s airline `db.json` as seed rows for `tau2_airline/schema.sql`.

    Values are coerced the way τ²'s pydantic models coerce them on load (payment-method amounts
    to float), so that the seed's state converts back to exactly `FlightDB.model_dump()`.
    """
    seed: dict[str, list[dict[str, Any]]] = {t: [] for t in AIRLINE_SEED_TABLES}
    for f_pos, (number, flight) in enumerate(db["flights"].items()):
        _same_key("flight", number, flight["flight_number"])
        seed["flights"].append(
            {
                "flight_number": number,
                "position": f_pos,
                "origin": flight["origin"],
                "destination": flight["destination"],
                "scheduled_departure_time_est": flight["scheduled_departure_time_est"],
                "scheduled_arrival_time_est": flight["scheduled_arrival_time_est"],
            }
        )
        for d_pos, (date, data) in enumerate(flight["dates"].items()):
            status = data["status"]
            if status not in DATE_FIELDS:
                raise ValueError(f"flight {number} on {date}: unknown status {status!r}")
            row: dict[str, Any] = {"flight_number": number, "date": date, "position": d_pos, "status": status}
            seats = (
                _cabins(f"flight {number} on {date}: available_seats", data["available_seats"])
                if (status == "available")
                else [None] * 3
            )
            prices = (
                _cabins(f"flight {number} on {date}: prices", data["prices"])
                if (status == "available")
                else [None] * 3
            )
            for cabin, s, p in zip(CABINS, seats, prices, strict=True):
                row[f"seats_{cabin}"] = s
                row[f"price_{cabin}"] = p
            for column in _TIME_COLUMNS:
                row[column] = data[column] if column in DATE_FIELDS[status] else None
            seed["flight_dates"].append(row)
    for u_pos, (user_id, user) in enumerate(db["users"].items()):
        _same_key("user", user_id, user["user_id"])
        seed["users"].append(
            {
                "user_id": user_id,
                "position": u_pos,
                "first_name": user["name"]["first_name"],
                "last_name": user["name"]["last_name"],
                **{f: user["address"][f] for f in ADDRESS_FIELDS},
                "email": user["email"],
                "dob": user["dob"],
                "saved_passengers": json.dumps(
                    [
                        {"first_name": p["first_name"], "last_name": p["last_name"], "dob": p["dob"]}
                        for p in user["saved_passengers"]
                    ]
                ),
                "membership": user["membership"],
            }
        )
        for m_pos, (method_id, method) in enumerate(user["payment_methods"].items()):
            _same_key("payment method", method_id, method["id"])
            source = method["source"]
            if source not in _SOURCES:
                raise ValueError(f"payment method {method_id!r} has unknown source {source!r}")
            card = source == "credit_card"
            seed["payment_methods"].append(
                {
                    "user_id": user_id,
                    "payment_method_id": method_id,
                    "position": m_pos,
                    "source": source,
                    "brand": method["brand"] if card else None,
                    "last_four": method["last_four"] if card else None,
                    "amount": None if card else float(method["amount"]),
                }
            )
        for r_pos, reservation_id in enumerate(user["reservations"]):
            seed["user_reservations"].append(
                {"user_id": user_id, "position": r_pos, "reservation_id": reservation_id}
            )
    for position, (rid, r) in enumerate(db["reservations"].items()):
        _same_key("reservation", rid, r["reservation_id"])
        seed["reservations"].append(
            {
                "reservation_id": rid,
                "position": position,
                "user_id": r["user_id"],
                "origin": r["origin"],
                "destination": r["destination"],
                "flight_type": r["flight_type"],
                "cabin": r["cabin"],
                "created_at": r["created_at"],
                "total_baggages": int(r["total_baggages"]),
                "nonfree_baggages": int(r["nonfree_baggages"]),
                "insurance": r["insurance"],
                "status": r.get("status"),
            }
        )
        for i, s in enumerate(r["flights"]):
            seed["reservation_flights"].append(
                {
                    "reservation_id": rid,
                    "position": i,
                    "flight_number": s["flight_number"],
                    "origin": s["origin"],
                    "destination": s["destination"],
                    "date": s["date"],
                    "price": int(s["price"]),
                }
            )
        for i, p in enumerate(r["passengers"]):
            seed["reservation_passengers"].append(
                {
                    "reservation_id": rid,
                    "position": i,
                    "first_name": p["first_name"],
                    "last_name": p["last_name"],
                    "dob": p["dob"],
                }
            )
        for i, p in enumerate(r["payment_history"]):
            seed["reservation_payments"].append(
                {
                    "reservation_id": rid,
                    "position": i,
                    "payment_id": p["payment_id"],
                    "amount": int(p["amount"]),
                }
            )
    return seed


def _grouped(rows: list[dict[str, Any]], key: str) -> dict[Any, list[dict[str, Any]]]:
    """Rows grouped by `key`, each group in `position` order."""
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r["position"]):
        groups[row[key]].append(row)
    return groups


def _flight_date(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"status": row["status"]}
    for name in DATE_FIELDS[row["status"]]:
        if name == "available_seats":
            out[name] = {c: row[f"seats_{c}"] for c in CABINS}
        elif name == "prices":
            out[name] = {c: row[f"price_{c}"] for c in CABINS}
        else:
            out[name] = row[name]
    return out


def _payment_method(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"source": row["source"], "id": row["payment_method_id"]}
    if row["source"] == "credit_card":
        out["brand"] = row["brand"]
        out["last_four"] = row["last_four"]
    else:
        out["amount"] = row["amount"]
    return out


def airline_state_to_tau2_db(state: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The env's canonical state export as τ²'s `FlightDB.model_dump()`: the object τ² hashes."""
    dates = _grouped(state["flight_dates"], "flight_number")
    flights = {
        f["flight_number"]: {
            "flight_number": f["flight_number"],
            "origin": f["origin"],
            "destination": f["destination"],
            "scheduled_departure_time_est": f["scheduled_departure_time_est"],
            "scheduled_arrival_time_est": f["scheduled_arrival_time_est"],
            "dates": {d["date"]: _flight_date(d) for d in dates.get(f["flight_number"], [])},
        }
        for f in sorted(state["flights"], key=lambda r: r["position"])
    }
    methods = _grouped(state["payment_methods"], "user_id")
    listed = _grouped(state["user_reservations"], "user_id")
    users = {
        u["user_id"]: {
            "user_id": u["user_id"],
            "name": {"first_name": u["first_name"], "last_name": u["last_name"]},
            "address": {f: u[f] for f in ADDRESS_FIELDS},
            "email": u["email"],
            "dob": u["dob"],
            "payment_methods": {
                m["payment_method_id"]: _payment_method(m) for m in methods.get(u["user_id"], [])
            },
            "saved_passengers": json.loads(u["saved_passengers"]),
            "membership": u["membership"],
            "reservations": [r["reservation_id"] for r in listed.get(u["user_id"], [])],
        }
        for u in sorted(state["users"], key=lambda r: r["position"])
    }
    segments = _grouped(state["reservation_flights"], "reservation_id")
    passengers = _grouped(state["reservation_passengers"], "reservation_id")
    payments = _grouped(state["reservation_payments"], "reservation_id")
    reservations = {}
    for r in sorted(state["reservations"], key=lambda row: row["position"]):
        rid = r["reservation_id"]
        reservations[rid] = {
            "reservation_id": rid,
            "user_id": r["user_id"],
            "origin": r["origin"],
            "destination": r["destination"],
            "flight_type": r["flight_type"],
            "cabin": r["cabin"],
            "flights": [
                {k: s[k] for k in ("flight_number", "origin", "destination", "date", "price")}
                for s in segments.get(rid, [])
            ],
            "passengers": [
                {k: p[k] for k in ("first_name", "last_name", "dob")} for p in passengers.get(rid, [])
            ],
            "payment_history": [
                {"payment_id": p["payment_id"], "amount": p["amount"]} for p in payments.get(rid, [])
            ],
            "created_at": r["created_at"],
            "total_baggages": r["total_baggages"],
            "nonfree_baggages": r["nonfree_baggages"],
            "insurance": r["insurance"],
            "status": r["status"],
        }
    return {"flights": flights, "users": users, "reservations": reservations}
