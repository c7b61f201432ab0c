"""SkyForge Airlines tools: member lookup, flight search, and reservation changes with fare rules.

The clock is never read: "today" is the fixed date `TODAY`, stated in policy.md as well, so the
same calls always produce the same state. New ids are the table's highest number plus one.
Every rule the policy states that can be checked from data is enforced here with a `ToolError`,
so an agent that ignores the policy is refused rather than silently allowed.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envforge.server import Db, ToolError, tool

TODAY = "2025-06-10"
CHECK_IN_DATES = (TODAY, "2025-06-11")  # check-in opens the day before departure

Cabin = Literal["economy", "premium_economy", "business"]
ReservationStatus = Literal["confirmed", "checked_in", "flown", "cancelled"]
CABIN_RANK = {"economy": 0, "premium_economy": 1, "business": 2}

# Fees per passenger, by cabin and loyalty tier (policy.md has the same tables).
CANCEL_FEE = {
    "economy": {"basic": 100.0, "silver": 100.0, "gold": 50.0, "platinum": 0.0},
    "premium_economy": {"basic": 50.0, "silver": 50.0, "gold": 0.0, "platinum": 0.0},
    "business": {"basic": 0.0, "silver": 0.0, "gold": 0.0, "platinum": 0.0},
}
CHANGE_FEE = {
    "economy": {"basic": 75.0, "silver": 75.0, "gold": 0.0, "platinum": 0.0},
    "premium_economy": {"basic": 0.0, "silver": 0.0, "gold": 0.0, "platinum": 0.0},
    "business": {"basic": 0.0, "silver": 0.0, "gold": 0.0, "platinum": 0.0},
}
CABIN_FREE_BAGS = {"economy": 0, "premium_economy": 1, "business": 2}
TIER_EXTRA_BAGS = {"basic": 0, "silver": 1, "gold": 1, "platinum": 2}
MAX_BAGS_PER_PASSENGER = 3
BAG_FEE = 40.0
MAX_PASSENGERS = 6
COMPENSATION_CANCELLED = 100.0
COMPENSATION_DELAYED = 50.0
COMPENSATION_MIN_DELAY = 120
OPEN_FLIGHT = ("scheduled", "delayed")


class PassengerInfo(BaseModel):
    """One traveller on a new reservation."""

    model_config = ConfigDict(extra="forbid")

    first_name: str = Field(description="Given name as on the travel document.")
    last_name: str = Field(description="Family name as on the travel document.")
    date_of_birth: str = Field(description="Date of birth, 'YYYY-MM-DD'.")


# ---------------------------------------------------------------------------------------------
# Queries and shared checks


async def _member(db: Db, member_id: str) -> dict[str, Any]:
    return await db.require_one(
        "SELECT member_id, first_name, last_name, email, phone, date_of_birth, tier, travel_credit, status "
        "FROM members WHERE member_id = ?",
        (member_id,),
        f"member {member_id} not found",
    )


async def _flight(db: Db, flight_id: str) -> dict[str, Any]:
    return await db.require_one(
        "SELECT flight_id, flight_number, origin, destination, departure_date, departure_time, arrival_time, "
        "status, delay_minutes FROM flights WHERE flight_id = ?",
        (flight_id,),
        f"flight {flight_id} not found",
    )


async def _owned_reservation(db: Db, member_id: str, reservation_id: str) -> dict[str, Any]:
    """The reservation row, after checking that the member exists and owns it."""
    return (await _member_and_reservation(db, member_id, reservation_id))[1]


async def _member_and_reservation(
    db: Db, member_id: str, reservation_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(member row, reservation row), after checking that the member exists and owns it."""
    member = await _member(db, member_id)
    res = await db.require_one(
        "SELECT reservation_id, member_id, flight_id, cabin, fare_per_passenger, status, booked_on "
        "FROM reservations WHERE reservation_id = ?",
        (reservation_id,),
        f"reservation {reservation_id} not found",
    )
    if res["member_id"] != member_id:
        raise ToolError(f"reservation {reservation_id} does not belong to member {member_id}")
    return member, res


def _require_active(member: dict[str, Any]) -> None:
    if member["status"] != "active":
        raise ToolError(
            f"member {member['member_id']} is {member['status']} and cannot make purchases or changes"
        )


def _require_open(flight: dict[str, Any]) -> None:
    """A flight can be sold, changed or upgraded only while it has not left and is not cancelled."""
    if flight["status"] not in OPEN_FLIGHT or flight["departure_date"] < TODAY:
        raise ToolError(
            f"flight {flight['flight_id']} is {flight['status']}; it is closed for sales and changes"
        )


async def _passengers(db: Db, reservation_id: str) -> list[dict[str, Any]]:
    rows = await db.fetch_all(
        "SELECT passenger_id, first_name, last_name, date_of_birth, checked_bags, checked_in "
        "FROM passengers WHERE reservation_id = ? ORDER BY passenger_id",
        (reservation_id,),
    )
    for r in rows:
        r["checked_in"] = bool(r["checked_in"])
    return rows


async def _cabin(db: Db, flight_id: str, cabin: str) -> dict[str, Any]:
    return await db.require_one(
        "SELECT cabin, capacity, seats_sold, fare FROM flight_cabins WHERE flight_id = ? AND cabin = ?",
        (flight_id, cabin),
        f"flight {flight_id} has no {cabin} cabin",
    )


async def _take_seats(db: Db, flight_id: str, cabin: str, n: int) -> dict[str, Any]:
    row = await _cabin(db, flight_id, cabin)
    left = row["capacity"] - row["seats_sold"]
    if left < n:
        raise ToolError(f"flight {flight_id} has {left} {cabin} seat(s) left; {n} needed")
    await db.execute(
        "UPDATE flight_cabins SET seats_sold = seats_sold + ? WHERE flight_id = ? AND cabin = ?",
        (n, flight_id, cabin),
    )
    return row


async def _release_seats(db: Db, flight_id: str, cabin: str, n: int) -> None:
    await db.execute(
        "UPDATE flight_cabins SET seats_sold = MAX(seats_sold - ?, 0) WHERE flight_id = ? AND cabin = ?",
        (n, flight_id, cabin),
    )


async def _next_id(db: Db, table: str, column: str, prefix: str) -> str:
    """The next id in a table's sequence (`table`/`column` are constants, never agent input).

    The highest number among ids spelled `prefix` + digits, found by SQLite (GLOB, unlike LIKE,
    is case-sensitive), so an id costs one statement, not a read of the whole table. The pattern
    is part of the SQL text: a bound GLOB pattern would have SQLite re-plan the statement on
    every run.
    """
    rows = await db.execute_fetchall(
        f"SELECT MAX(CAST(substr({column}, {len(prefix) + 1}) AS INTEGER)) FROM {table} "
        f"WHERE {column} GLOB '{prefix}[0-9]*'"
    )
    return f"{prefix}{(rows[0][0] or 0) + 1}"


async def _record_payment(
    db: Db,
    reservation_id: str,
    kind: str,
    source: str,
    payment_method_id: str | None,
    amount: float,
    description: str,
) -> None:
    payment_id = await _next_id(db, "payments", "payment_id", "PAY-")
    await db.execute(
        "INSERT INTO payments (payment_id, reservation_id, kind, source, payment_method_id, amount, "
        "description) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (payment_id, reservation_id, kind, source, payment_method_id, round(amount, 2), description),
    )


async def _adjust_credit(db: Db, member_id: str, delta: float) -> None:
    await db.execute(
        "UPDATE members SET travel_credit = ROUND(travel_credit + ?, 2) WHERE member_id = ?",
        (round(delta, 2), member_id),
    )


async def _check_payment(
    db: Db,
    member: dict[str, Any],
    amount: float,
    payment_method_id: str | None,
    travel_credit_amount: float,
) -> tuple[float, float]:
    """Validate how `amount` will be paid; returns (travel credit part, card part). Writes nothing."""
    amount = round(amount, 2)
    credit = round(travel_credit_amount, 2)
    if credit < 0:
        raise ToolError("travel_credit_amount cannot be negative")
    if credit > amount:
        raise ToolError(f"travel_credit_amount {credit:.2f} exceeds the amount due {amount:.2f}")
    if credit > round(member["travel_credit"], 2):
        raise ToolError(
            f"member {member['member_id']} has {member['travel_credit']:.2f} in travel credit; "
            f"{credit:.2f} requested"
        )
    card = round(amount - credit, 2)
    if card > 0:
        if payment_method_id is None:
            raise ToolError(f"{card:.2f} is due: a payment_method_id is required")
        pm = await db.require_one(
            "SELECT payment_method_id, member_id, expiry FROM payment_methods WHERE payment_method_id = ?",
            (payment_method_id,),
            f"payment method {payment_method_id} not found",
        )
        if pm["member_id"] != member["member_id"]:
            raise ToolError(
                f"payment method {payment_method_id} does not belong to member {member['member_id']}"
            )
        if pm["expiry"] < TODAY[:7]:
            raise ToolError(f"payment method {payment_method_id} expired in {pm['expiry']}")
    return credit, card


async def _collect(
    db: Db,
    member: dict[str, Any],
    reservation_id: str,
    parts: tuple[float, float],
    payment_method_id: str | None,
    description: str,
) -> None:
    credit, card = parts
    if credit > 0:
        await _adjust_credit(db, member["member_id"], -credit)
        await _record_payment(db, reservation_id, "charge", "travel_credit", None, credit, description)
    if card > 0:
        await _record_payment(db, reservation_id, "charge", "card", payment_method_id, card, description)


async def _paid_by_source(db: Db, reservation_id: str) -> list[tuple[str | None, float]]:
    """Net amount paid per source (card ids first, travel credit as None last); compensation excluded."""
    rows = await db.execute_fetchall(
        "SELECT payment_method_id, ROUND(SUM(CASE kind WHEN 'charge' THEN amount ELSE -amount END), 2) "
        "FROM payments WHERE reservation_id = ? AND kind IN ('charge', 'refund') "
        "GROUP BY payment_method_id ORDER BY payment_method_id IS NULL, payment_method_id",
        (reservation_id,),
    )
    return [(r[0], round(r[1], 2)) for r in rows if round(r[1], 2) > 0]


def _free_bags(cabin: str, tier: str) -> int:
    return min(CABIN_FREE_BAGS[cabin] + TIER_EXTRA_BAGS[tier], MAX_BAGS_PER_PASSENGER)


async def _reservation_view(db: Db, reservation_id: str) -> dict[str, Any]:
    res = await db.require_one(
        "SELECT r.reservation_id, r.member_id, r.flight_id, f.flight_number, f.origin, f.destination, "
        "f.departure_date, f.departure_time, f.status AS flight_status, r.cabin, r.fare_per_passenger, "
        "r.status, r.booked_on, m.tier FROM reservations r JOIN flights f ON f.flight_id = r.flight_id "
        "JOIN members m ON m.member_id = r.member_id WHERE r.reservation_id = ?",
        (reservation_id,),
        f"reservation {reservation_id} not found",
    )
    tier = res.pop("tier")
    res["free_bags_per_passenger"] = _free_bags(res["cabin"], tier)
    res["passengers"] = await _passengers(db, reservation_id)
    res["payments"] = await db.fetch_all(
        "SELECT payment_id, kind, source, payment_method_id, amount, description FROM payments "
        "WHERE reservation_id = ? ORDER BY payment_id",
        (reservation_id,),
    )
    res["amount_paid"] = round(sum(a for _, a in await _paid_by_source(db, reservation_id)), 2)
    return res


async def _flight_view(db: Db, flight: dict[str, Any]) -> dict[str, Any]:
    cabins = await db.fetch_all(
        "SELECT cabin, fare, capacity - seats_sold AS seats_available FROM flight_cabins WHERE flight_id = ? "
        "ORDER BY CASE cabin WHEN 'economy' THEN 0 WHEN 'premium_economy' THEN 1 ELSE 2 END",
        (flight["flight_id"],),
    )
    return {**flight, "cabins": cabins}


async def _cancellation_quote(db: Db, member_id: str, reservation_id: str) -> dict[str, Any]:
    """What cancelling would refund, after every precondition of cancel_reservation is checked."""
    return (await _cancellation(db, member_id, reservation_id))[0]


async def _cancellation(
    db: Db, member_id: str, reservation_id: str
) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(`_cancellation_quote`, the reservation row, its passenger count): the cancellation itself
    needs the row and the count too, and need not read them again."""
    member, res = await _member_and_reservation(db, member_id, reservation_id)
    if res["status"] != "confirmed":
        raise ToolError(
            f"reservation {reservation_id} is {res['status']}; only confirmed reservations can be cancelled"
        )
    flight = await _flight(db, res["flight_id"])
    airline_cancelled = flight["status"] == "cancelled"
    if not airline_cancelled:
        _require_open(flight)
    n = len(await _passengers(db, reservation_id))
    fee_each = 0.0 if airline_cancelled else CANCEL_FEE[res["cabin"]][member["tier"]]
    paid = await _paid_by_source(db, reservation_id)
    total = round(sum(a for _, a in paid), 2)
    fee = round(min(fee_each * n, total), 2)
    remaining_fee = fee
    refunds = []
    for payment_method_id, amount in paid:  # the fee comes off the card part first
        take = min(amount, remaining_fee)
        remaining_fee = round(remaining_fee - take, 2)
        back = round(amount - take, 2)
        if back > 0:
            source = "card" if payment_method_id else "travel_credit"
            refunds.append({"source": source, "payment_method_id": payment_method_id, "amount": back})
    quote = {
        "reservation_id": reservation_id,
        "member_id": member_id,
        "flight_status": flight["status"],
        "amount_paid": total,
        "cancellation_fee": fee,
        "refund_total": round(total - fee, 2),
        "refunds": refunds,
    }
    return quote, res, n


# ---------------------------------------------------------------------------------------------
# Read tools


@tool
async def find_member(db: Db, email: str) -> dict[str, Any]:
    """Find a loyalty member by email address (case-insensitive), to identify the caller.

    Args:
        email: The member's email address, such as 'ava.thompson@example.com'.
    """
    return await db.require_one(
        "SELECT member_id, first_name, last_name, email, phone, date_of_birth, tier, travel_credit, status "
        "FROM members WHERE lower(email) = lower(?)",
        (email.strip(),),
        f"no member with email {email}",
    )


@tool
async def get_member(db: Db, member_id: str) -> dict[str, Any]:
    """Get a member's profile, loyalty tier, travel credit balance, stored cards and reservations.

    Args:
        member_id: The member id, such as 'M-1001'.
    """
    member = await _member(db, member_id)
    member["payment_methods"] = await db.fetch_all(
        "SELECT payment_method_id, brand, last4, expiry FROM payment_methods WHERE member_id = ? "
        "ORDER BY payment_method_id",
        (member_id,),
    )
    member["reservations"] = await db.fetch_all(
        "SELECT reservation_id, flight_id, status FROM reservations WHERE member_id = ? "
        "ORDER BY reservation_id",
        (member_id,),
    )
    return member


@tool
async def list_reservations(
    db: Db, member_id: str, status: ReservationStatus | None = None
) -> list[dict[str, Any]]:
    """List a member's reservations with their flights, optionally only those with one status.

    Args:
        member_id: The member id, such as 'M-1001'.
        status: Only reservations with this status; all when omitted.
    """
    await _member(db, member_id)
    return await db.fetch_all(
        "SELECT r.reservation_id, r.flight_id, f.flight_number, f.origin, f.destination, f.departure_date, "
        "r.cabin, r.status, (SELECT COUNT(*) FROM passengers p WHERE p.reservation_id = r.reservation_id) "
        "AS passenger_count FROM reservations r JOIN flights f ON f.flight_id = r.flight_id "
        "WHERE r.member_id = ? AND (? IS NULL OR r.status = ?) ORDER BY f.departure_date, r.reservation_id",
        (member_id, status, status),
    )


@tool
async def get_reservation(db: Db, reservation_id: str) -> dict[str, Any]:
    """Get a reservation: its flight, cabin, passengers with bags and check-in, payments and amount paid.

    Args:
        reservation_id: The reservation id, such as 'R-5001'.
    """
    return await _reservation_view(db, reservation_id)


@tool
async def get_flight(db: Db, flight_id: str) -> dict[str, Any]:
    """Get a flight's schedule, status, delay, and per-cabin fare and seats available.

    Args:
        flight_id: The flight id, such as 'FL-201'.
    """
    return await _flight_view(db, await _flight(db, flight_id))


@tool
async def search_flights(
    db: Db, origin: str, destination: str, departure_date: str, cabin: Cabin | None = None
) -> list[dict[str, Any]]:
    """Search flights on a route and date, with fares and seats available per cabin.

    Cancelled and departed flights are listed too, with their status, so they can be explained.

    Args:
        origin: Departure airport code, such as 'JFK'.
        destination: Arrival airport code, such as 'LAX'.
        departure_date: Departure date, 'YYYY-MM-DD'.
        cabin: Only flights that have this cabin; all flights when omitted.
    """
    for code in (origin, destination):
        await db.require_one(
            "SELECT airport_code FROM airports WHERE airport_code = ?", (code,), f"unknown airport {code}"
        )
    flights = await db.fetch_all(
        "SELECT flight_id, flight_number, origin, destination, departure_date, departure_time, arrival_time, "
        "status, delay_minutes FROM flights f WHERE origin = ? AND destination = ? AND departure_date = ? "
        "AND (? IS NULL OR EXISTS (SELECT 1 FROM flight_cabins c WHERE c.flight_id = f.flight_id "
        "AND c.cabin = ?)) ORDER BY departure_time, flight_id",
        (origin, destination, departure_date, cabin, cabin),
    )
    return [await _flight_view(db, f) for f in flights]


@tool
async def list_airports(db: Db, country: str | None = None) -> list[dict[str, Any]]:
    """List the airports the airline serves, optionally in one country.

    Args:
        country: Only airports in this country, such as 'United States'; all when omitted.
    """
    return await db.fetch_all(
        "SELECT airport_code, name, city, country FROM airports "
        "WHERE (? IS NULL OR lower(country) = lower(?)) ORDER BY airport_code",
        (country, country),
    )


@tool
async def quote_cancellation(db: Db, member_id: str, reservation_id: str) -> dict[str, Any]:
    """Show what cancelling a reservation would refund and charge, without cancelling it.

    Args:
        member_id: The member who owns the reservation.
        reservation_id: The reservation id, such as 'R-5001'.
    """
    return await _cancellation_quote(db, member_id, reservation_id)


# ---------------------------------------------------------------------------------------------
# Write tools


@tool(writes=["reservations", "passengers", "flight_cabins", "payments", "members"])
async def book_reservation(
    db: Db,
    member_id: str,
    flight_id: str,
    cabin: Cabin,
    passengers: list[PassengerInfo],
    payment_method_id: str | None = None,
    travel_credit_amount: float = 0.0,
) -> dict[str, Any]:
    """Book seats on a flight for up to 6 passengers, paying the cabin fare per passenger.

    Travel credit is applied first (up to travel_credit_amount); the rest is charged to the card.

    Args:
        member_id: The member making the booking.
        flight_id: The flight to book, such as 'FL-201'.
        cabin: The cabin for every passenger on the reservation.
        passengers: The travellers, each with first_name, last_name and date_of_birth.
        payment_method_id: The member's card for the amount not paid with travel credit.
        travel_credit_amount: How much of the member's travel credit to use (0 for none).
    """
    member = await _member(db, member_id)
    _require_active(member)
    if not 1 <= len(passengers) <= MAX_PASSENGERS:
        raise ToolError(f"a reservation holds 1 to {MAX_PASSENGERS} passengers; {len(passengers)} given")
    for p in passengers:
        if not p.first_name.strip() or not p.last_name.strip():
            raise ToolError("every passenger needs a first_name and a last_name")
        try:
            born = dt.date.fromisoformat(p.date_of_birth)
        except ValueError:
            raise ToolError(f"date_of_birth {p.date_of_birth!r} is not a 'YYYY-MM-DD' date") from None
        if born.isoformat() >= TODAY:
            raise ToolError(f"date_of_birth {p.date_of_birth} is not in the past")
    flight = await _flight(db, flight_id)
    _require_open(flight)
    seats = await _take_seats(db, flight_id, cabin, len(passengers))
    total = round(seats["fare"] * len(passengers), 2)
    parts = await _check_payment(db, member, total, payment_method_id, travel_credit_amount)
    reservation_id = await _next_id(db, "reservations", "reservation_id", "R-")
    await db.execute(
        "INSERT INTO reservations (reservation_id, member_id, flight_id, cabin, fare_per_passenger, status, "
        "booked_on) VALUES (?, ?, ?, ?, ?, 'confirmed', ?)",
        (reservation_id, member_id, flight_id, cabin, round(seats["fare"], 2), TODAY),
    )
    for p in passengers:
        passenger_id = await _next_id(db, "passengers", "passenger_id", "P-")
        await db.execute(
            "INSERT INTO passengers (passenger_id, reservation_id, first_name, last_name, date_of_birth) "
            "VALUES (?, ?, ?, ?, ?)",
            (passenger_id, reservation_id, p.first_name.strip(), p.last_name.strip(), p.date_of_birth),
        )
    await _collect(
        db, member, reservation_id, parts, payment_method_id, f"fare {flight['flight_number']} {cabin}"
    )
    return await _reservation_view(db, reservation_id)


@tool(writes=["reservations", "flight_cabins", "payments", "members"])
async def cancel_reservation(db: Db, member_id: str, reservation_id: str) -> dict[str, Any]:
    """Cancel a confirmed reservation and refund what was paid, less the cancellation fee.

    Card payments are refunded to the same card, travel credit back to the member's balance; the
    fee comes off the card part first. No fee applies when the airline cancelled the flight.

    Args:
        member_id: The member who owns the reservation.
        reservation_id: The reservation to cancel, such as 'R-5001'.
    """
    quote, res, n = await _cancellation(db, member_id, reservation_id)
    await db.execute(
        "UPDATE reservations SET status = 'cancelled' WHERE reservation_id = ?", (reservation_id,)
    )
    await _release_seats(db, res["flight_id"], res["cabin"], n)
    for refund in quote["refunds"]:
        if refund["source"] == "travel_credit":
            await _adjust_credit(db, member_id, refund["amount"])
        await _record_payment(
            db,
            reservation_id,
            "refund",
            refund["source"],
            refund["payment_method_id"],
            refund["amount"],
            "cancellation refund",
        )
    view = await _reservation_view(db, reservation_id)
    view["cancellation_fee"] = quote["cancellation_fee"]
    view["refund_total"] = quote["refund_total"]
    return view


@tool(writes=["reservations", "flight_cabins", "payments", "members"])
async def change_flight(
    db: Db,
    member_id: str,
    reservation_id: str,
    flight_id: str,
    payment_method_id: str | None = None,
    travel_credit_amount: float = 0.0,
) -> dict[str, Any]:
    """Move a confirmed reservation to another flight on the same route, in the same cabin.

    The member pays the change fee plus any fare increase; a fare decrease (less the fee) is
    returned as travel credit. Both are waived when the airline cancelled the original flight.

    Args:
        member_id: The member who owns the reservation.
        reservation_id: The reservation to change, such as 'R-5001'.
        flight_id: The new flight, such as 'FL-202'.
        payment_method_id: The member's card for any amount due not paid with travel credit.
        travel_credit_amount: How much of the member's travel credit to use (0 for none).
    """
    member, res = await _member_and_reservation(db, member_id, reservation_id)
    _require_active(member)
    if res["status"] != "confirmed":
        raise ToolError(
            f"reservation {reservation_id} is {res['status']}; only confirmed reservations can change"
        )
    old = await _flight(db, res["flight_id"])
    airline_cancelled = old["status"] == "cancelled"
    if not airline_cancelled:
        _require_open(old)
    if flight_id == res["flight_id"]:
        raise ToolError(f"reservation {reservation_id} is already on flight {flight_id}")
    new = await _flight(db, flight_id)
    if (new["origin"], new["destination"]) != (old["origin"], old["destination"]):
        raise ToolError(
            f"flight {flight_id} flies {new['origin']}-{new['destination']}, not "
            f"{old['origin']}-{old['destination']}; only same-route changes are allowed"
        )
    _require_open(new)
    n = len(await _passengers(db, reservation_id))
    seats = await _take_seats(db, flight_id, res["cabin"], n)
    if airline_cancelled:
        due, new_fare = 0.0, res["fare_per_passenger"]
    else:
        fee = CHANGE_FEE[res["cabin"]][member["tier"]] * n
        due = round(fee + (seats["fare"] - res["fare_per_passenger"]) * n, 2)
        new_fare = seats["fare"]
    parts = await _check_payment(db, member, max(due, 0.0), payment_method_id, travel_credit_amount)
    await _release_seats(db, res["flight_id"], res["cabin"], n)
    await db.execute(
        "UPDATE reservations SET flight_id = ?, fare_per_passenger = ? WHERE reservation_id = ?",
        (flight_id, round(new_fare, 2), reservation_id),
    )
    note = f"change to {new['flight_number']} on {new['departure_date']}"
    await _collect(db, member, reservation_id, parts, payment_method_id, note)
    if due < 0:
        await _adjust_credit(db, member_id, -due)
        await _record_payment(db, reservation_id, "refund", "travel_credit", None, -due, note)
    return await _reservation_view(db, reservation_id)


@tool(writes=["reservations", "flight_cabins", "payments", "members"])
async def upgrade_cabin(
    db: Db,
    member_id: str,
    reservation_id: str,
    cabin: Cabin,
    payment_method_id: str | None = None,
    travel_credit_amount: float = 0.0,
) -> dict[str, Any]:
    """Upgrade every passenger on a confirmed reservation to a higher cabin on the same flight.

    The member pays the difference between the new cabin's fare and the fare paid, per passenger.

    Args:
        member_id: The member who owns the reservation.
        reservation_id: The reservation to upgrade, such as 'R-5001'.
        cabin: The higher cabin to move to.
        payment_method_id: The member's card for the amount not paid with travel credit.
        travel_credit_amount: How much of the member's travel credit to use (0 for none).
    """
    member, res = await _member_and_reservation(db, member_id, reservation_id)
    _require_active(member)
    if res["status"] != "confirmed":
        raise ToolError(
            f"reservation {reservation_id} is {res['status']}; only confirmed reservations can upgrade"
        )
    if CABIN_RANK[cabin] <= CABIN_RANK[res["cabin"]]:
        raise ToolError(f"{cabin} is not higher than the current cabin {res['cabin']}; upgrades only go up")
    _require_open(await _flight(db, res["flight_id"]))
    n = len(await _passengers(db, reservation_id))
    seats = await _take_seats(db, res["flight_id"], cabin, n)
    per_passenger = round(max(seats["fare"] - res["fare_per_passenger"], 0.0), 2)
    parts = await _check_payment(db, member, per_passenger * n, payment_method_id, travel_credit_amount)
    await _release_seats(db, res["flight_id"], res["cabin"], n)
    await db.execute(
        "UPDATE reservations SET cabin = ?, fare_per_passenger = ? WHERE reservation_id = ?",
        (cabin, round(res["fare_per_passenger"] + per_passenger, 2), reservation_id),
    )
    await _collect(db, member, reservation_id, parts, payment_method_id, f"upgrade to {cabin}")
    return await _reservation_view(db, reservation_id)


@tool(writes=["passengers", "payments", "members"])
async def add_checked_bags(
    db: Db,
    member_id: str,
    reservation_id: str,
    passenger_id: str,
    bags: int,
    payment_method_id: str | None = None,
    travel_credit_amount: float = 0.0,
) -> dict[str, Any]:
    """Add checked bags for one passenger; bags beyond the free allowance cost 40.00 each.

    Args:
        member_id: The member who owns the reservation.
        reservation_id: The reservation, such as 'R-5001'.
        passenger_id: The passenger on that reservation, such as 'P-7001'.
        bags: How many bags to add (the passenger may have at most 3 in total).
        payment_method_id: The member's card for any fee not paid with travel credit.
        travel_credit_amount: How much of the member's travel credit to use (0 for none).
    """
    member, res = await _member_and_reservation(db, member_id, reservation_id)
    _require_active(member)
    if res["status"] not in ("confirmed", "checked_in"):
        raise ToolError(f"reservation {reservation_id} is {res['status']}; bags can no longer be added")
    _require_open(await _flight(db, res["flight_id"]))
    if bags < 1:
        raise ToolError("bags must be at least 1")
    passenger = next(
        (p for p in await _passengers(db, reservation_id) if p["passenger_id"] == passenger_id), None
    )
    if passenger is None:
        raise ToolError(f"passenger {passenger_id} is not on reservation {reservation_id}")
    total = passenger["checked_bags"] + bags
    if total > MAX_BAGS_PER_PASSENGER:
        raise ToolError(
            f"passenger {passenger_id} has {passenger['checked_bags']} bag(s); "
            f"at most {MAX_BAGS_PER_PASSENGER} are allowed per passenger"
        )
    free = _free_bags(res["cabin"], member["tier"])
    paid_bags = max(total - max(free, passenger["checked_bags"]), 0)
    fee = round(paid_bags * BAG_FEE, 2)
    parts = await _check_payment(db, member, fee, payment_method_id, travel_credit_amount)
    await db.execute("UPDATE passengers SET checked_bags = ? WHERE passenger_id = ?", (total, passenger_id))
    await _collect(
        db, member, reservation_id, parts, payment_method_id, f"{paid_bags} extra bag(s) {passenger_id}"
    )
    return await _reservation_view(db, reservation_id)


@tool(writes=["passengers", "reservations"])
async def check_in_passengers(
    db: Db, member_id: str, reservation_id: str, passenger_ids: list[str]
) -> dict[str, Any]:
    """Check passengers in for their flight; check-in opens the day before departure.

    Args:
        member_id: The member who owns the reservation.
        reservation_id: The reservation, such as 'R-5001'.
        passenger_ids: The passengers on that reservation to check in, such as ['P-7001', 'P-7002'].
    """
    res = await _owned_reservation(db, member_id, reservation_id)
    if res["status"] not in ("confirmed", "checked_in"):
        raise ToolError(f"reservation {reservation_id} is {res['status']}; it cannot be checked in")
    flight = await _flight(db, res["flight_id"])
    _require_open(flight)
    if flight["departure_date"] not in CHECK_IN_DATES:
        raise ToolError(
            f"check-in for flight {flight['flight_id']} on {flight['departure_date']} is not open; "
            "it opens the day before departure"
        )
    if not passenger_ids:
        raise ToolError("passenger_ids is empty")
    if len(set(passenger_ids)) != len(passenger_ids):
        raise ToolError("passenger_ids lists a passenger twice")
    on_board = {p["passenger_id"]: p for p in await _passengers(db, reservation_id)}
    for passenger_id in passenger_ids:
        if passenger_id not in on_board:
            raise ToolError(f"passenger {passenger_id} is not on reservation {reservation_id}")
        if on_board[passenger_id]["checked_in"]:
            raise ToolError(f"passenger {passenger_id} is already checked in")
        await db.execute("UPDATE passengers SET checked_in = 1 WHERE passenger_id = ?", (passenger_id,))
    await db.execute(
        "UPDATE reservations SET status = 'checked_in' WHERE reservation_id = ?", (reservation_id,)
    )
    return await _reservation_view(db, reservation_id)


@tool(writes=["payments", "members"])
async def issue_delay_compensation(db: Db, member_id: str, reservation_id: str) -> dict[str, Any]:
    """Credit compensation for a cancelled or long-delayed flight as travel credit, once per reservation.

    100.00 per passenger when the airline cancelled the flight; 50.00 per passenger when it was
    delayed by at least 120 minutes. The amount is fixed; it cannot be chosen.

    Args:
        member_id: The member who owns the reservation.
        reservation_id: The affected reservation, such as 'R-5001'.
    """
    res = await _owned_reservation(db, member_id, reservation_id)
    if res["status"] == "cancelled":
        raise ToolError(f"reservation {reservation_id} is cancelled; it is not eligible for compensation")
    already = await db.execute_fetchall(
        "SELECT payment_id FROM payments WHERE reservation_id = ? AND kind = 'compensation'",
        (reservation_id,),
    )
    if already:
        raise ToolError(f"reservation {reservation_id} was already compensated ({already[0][0]})")
    flight = await _flight(db, res["flight_id"])
    if flight["status"] == "cancelled":
        each, reason = COMPENSATION_CANCELLED, f"flight {flight['flight_number']} cancelled"
    elif flight["delay_minutes"] >= COMPENSATION_MIN_DELAY:
        each, reason = (
            COMPENSATION_DELAYED,
            f"flight {flight['flight_number']} delayed {flight['delay_minutes']} min",
        )
    else:
        raise ToolError(
            f"flight {flight['flight_id']} is {flight['status']} with a delay of "
            f"{flight['delay_minutes']} minutes; compensation needs a cancellation or a delay of at least "
            f"{COMPENSATION_MIN_DELAY} minutes"
        )
    amount = round(each * len(await _passengers(db, reservation_id)), 2)
    await _adjust_credit(db, member_id, amount)
    await _record_payment(db, reservation_id, "compensation", "travel_credit", None, amount, reason)
    view = await _reservation_view(db, reservation_id)
    view["compensation"] = amount
    view["travel_credit"] = (await _member(db, member_id))["travel_credit"]
    return view
