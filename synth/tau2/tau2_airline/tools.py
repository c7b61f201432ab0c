"""τ²-bench's airline tools (`AirlineTools`), ported onto SQLite with τ²-identical behaviour.

Why so literal: results, errors and DB hashes must be comparable with the published benchmark,
so every tool keeps τ²'s name, description, parameter schema, result text, error message and
quirks, including the ones that look like bugs (see the τ² reference README, airline part). Each
tool reads the records it needs into the exact dict shapes τ²'s pydantic models dump to, runs
τ²'s own logic on them expression by expression (so a wrongly typed argument fails with the very
Python error τ² shows), and writes back only what τ² would have changed.

Arguments arrive unvalidated (`argument_errors = "python"`), as in τ², which hands the LLM's JSON
straight to a Python method. Where τ² builds a pydantic model (`FlightInfo(**d)`, `Passenger`,
`Payment`, `Reservation`, `Certificate`), the port builds the same model, so lax coercion and
the validation error text are pydantic's own; only the version in the error's help URL is set to
the one τ²'s reference data was made with (`TAU2_PYDANTIC`).

Two things differ from τ² on purpose, both only for calls τ² itself mishandles: a call that fails
half-way is rolled back whole (τ² keeps what its in-memory DB had changed), and a value τ² would
store unvalidated but the tables cannot hold (a bool or a list as a baggage count, a passenger that
is not an object) is refused instead of stored.
"""

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from copy import deepcopy
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from envforge.server import Db, ToolError, tool

#: The pydantic minor version τ²'s reference outputs were produced with (its error texts link to
#: https://errors.pydantic.dev/<version>/...).
TAU2_PYDANTIC = "2.12"
_ERRORS_URL = re.compile(r"https://errors\.pydantic\.dev/[0-9]+\.[0-9]+/")

ADDRESS_FIELDS = ("address1", "address2", "city", "country", "state", "zip")
CABINS = ("basic_economy", "economy", "business")
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_CERTIFICATE_IDS = ("certificate_3221322", "certificate_3221323", "certificate_3221324")
#: τ²'s fixed clock: every booking is made at this time.
NOW = "2024-05-15T15:00:00"

# ---------------------------------------------------------------------------------------------
# τ²'s input models (tau2.domains.airline.data_model), with τ²'s field descriptions: they are
# the `$defs` of the tool schemas, and building them validates exactly as τ² does.


class FlightInfo(BaseModel):
    flight_number: str = Field(description="Flight number, such as 'HAT001'.")
    date: str = Field(description="The date for the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.")


class Passenger(BaseModel):
    first_name: str = Field(description="Passenger's first name")
    last_name: str = Field(description="Passenger's last name")
    dob: str = Field(description="Date of birth in YYYY-MM-DD format")


class Payment(BaseModel):
    payment_id: str = Field(description="Unique identifier for the payment")
    amount: int = Field(description="Payment amount in dollars")


class ReservationFlight(BaseModel):
    flight_number: str
    origin: str
    destination: str
    date: str
    price: int


class Reservation(BaseModel):
    reservation_id: str
    user_id: str
    origin: str
    destination: str
    flight_type: Literal["round_trip", "one_way"]
    cabin: Literal["business", "economy", "basic_economy"]
    flights: list[ReservationFlight]
    passengers: list[Passenger]
    payment_history: list[Payment]
    created_at: str
    total_baggages: int
    nonfree_baggages: int
    insurance: Literal["yes", "no"]
    status: Literal["cancelled"] | None = None


class Certificate(BaseModel):
    source: Literal["certificate"]
    id: str
    amount: float


# ---------------------------------------------------------------------------------------------
# Errors as τ² shows them.


def _pydantic_text(exc: ValidationError) -> str:
    return _ERRORS_URL.sub(f"https://errors.pydantic.dev/{TAU2_PYDANTIC}/", str(exc))


@contextmanager
def _as_tau2_errors() -> Iterator[None]:
    """Any exception τ²'s own code would raise on these values, as the `Error: {e}` τ² shows.

    τ² catches every exception of a tool and shows `str(e)`; running its logic on the same Python
    values raises the same exceptions here (a `KeyError` for an unknown cabin, an `AttributeError`
    for a flight that is not an object, a `TypeError` for arithmetic on a string)."""
    try:
        yield
    except ToolError:
        raise
    except ValidationError as exc:
        raise ToolError(_pydantic_text(exc)) from None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, ArithmeticError) as exc:
        raise ToolError(str(exc)) from None


def _lookup(value: Any) -> str | None:
    """`value` as a key of one of τ²'s dicts (`value in self.db.users`): only a str can be one.

    An unhashable value fails as τ²'s dict lookup fails (`unhashable type: 'list'`)."""
    hash(value)
    return value if isinstance(value, str) else None


def _models(values: Any, model: type[BaseModel]) -> Any:
    """τ²'s `if all(isinstance(x, dict) for x in xs): xs = [Model(**x) for x in xs]`."""
    if all(isinstance(value, dict) for value in values):
        return [model(**value) for value in values]
    return values


# ---------------------------------------------------------------------------------------------
# Reading records in τ²'s dump shapes.

_RESERVATION_COLUMNS = (
    "reservation_id, user_id, origin, destination, flight_type, cabin, created_at, "
    "total_baggages, nonfree_baggages, insurance, status"
)


async def _get_reservation(db: Db, reservation_id: Any) -> dict[str, Any]:
    """τ²'s `Reservation.model_dump()` (fields in model order, lists in stored order)."""
    rows = await db.execute_fetchall(
        f"SELECT {_RESERVATION_COLUMNS} FROM reservations WHERE reservation_id = ?",
        (_lookup(reservation_id),),
    )
    if not rows:
        raise ToolError(f"Reservation {reservation_id} not found")
    (rid, uid, origin, destination, flight_type, cabin, created, total, nonfree, insurance, status) = rows[0]
    flights = await db.execute_fetchall(
        "SELECT flight_number, origin, destination, date, price FROM reservation_flights "
        "WHERE reservation_id = ? ORDER BY position",
        (rid,),
    )
    passengers = await db.execute_fetchall(
        "SELECT first_name, last_name, dob FROM reservation_passengers "
        "WHERE reservation_id = ? ORDER BY position",
        (rid,),
    )
    payments = await db.execute_fetchall(
        "SELECT payment_id, amount FROM reservation_payments WHERE reservation_id = ? ORDER BY position",
        (rid,),
    )
    return {
        "reservation_id": rid,
        "user_id": uid,
        "origin": origin,
        "destination": destination,
        "flight_type": flight_type,
        "cabin": cabin,
        "flights": [
            {"flight_number": n, "origin": o, "destination": d, "date": day, "price": p}
            for n, o, d, day, p in flights
        ],
        "passengers": [{"first_name": f, "last_name": la, "dob": b} for f, la, b in passengers],
        "payment_history": [{"payment_id": p, "amount": a} for p, a in payments],
        "created_at": created,
        "total_baggages": total,
        "nonfree_baggages": nonfree,
        "insurance": insurance,
        "status": status,
    }


def _payment_method(row: tuple[Any, ...]) -> dict[str, Any]:
    """(id, source, brand, last_four, amount) as τ²'s CreditCard / GiftCard / Certificate dump."""
    method_id, source, brand, last_four, amount = row
    if source == "credit_card":
        return {"source": source, "id": method_id, "brand": brand, "last_four": last_four}
    return {"source": source, "id": method_id, "amount": amount}


async def _get_user(db: Db, user_id: Any) -> dict[str, Any]:
    """τ²'s `User.model_dump()`: payment methods and reservations in stored order."""
    rows = await db.execute_fetchall(
        "SELECT user_id, first_name, last_name, address1, address2, city, country, state, zip, email, dob, "
        "saved_passengers, membership FROM users WHERE user_id = ?",
        (_lookup(user_id),),
    )
    if not rows:
        raise ToolError(f"User {user_id} not found")
    row = rows[0]
    uid = row[0]
    methods = await db.execute_fetchall(
        "SELECT payment_method_id, source, brand, last_four, amount FROM payment_methods "
        "WHERE user_id = ? ORDER BY position",
        (uid,),
    )
    reservations = await db.execute_fetchall(
        "SELECT reservation_id FROM user_reservations WHERE user_id = ? ORDER BY position", (uid,)
    )
    return {
        "user_id": uid,
        "name": {"first_name": row[1], "last_name": row[2]},
        "address": dict(zip(ADDRESS_FIELDS, row[3:9], strict=True)),
        "email": row[9],
        "dob": row[10],
        "payment_methods": {m[0]: _payment_method(m) for m in methods},
        "saved_passengers": json.loads(row[11]),
        "membership": row[12],
        "reservations": [r[0] for r in reservations],
    }


async def _get_flight(db: Db, flight_number: Any) -> dict[str, Any]:
    rows = await db.execute_fetchall(
        "SELECT flight_number, origin, destination, scheduled_departure_time_est, scheduled_arrival_time_est "
        "FROM flights WHERE flight_number = ?",
        (_lookup(flight_number),),
    )
    if not rows:
        raise ToolError(f"Flight {flight_number} not found")
    keys = (
        "flight_number",
        "origin",
        "destination",
        "scheduled_departure_time_est",
        "scheduled_arrival_time_est",
    )
    return dict(zip(keys, rows[0], strict=True))


_DATE_COLUMNS = (
    "status, seats_basic_economy, seats_economy, seats_business, price_basic_economy, price_economy, "
    "price_business, actual_departure_time_est, actual_arrival_time_est, estimated_departure_time_est, "
    "estimated_arrival_time_est"
)


def _flight_date(row: tuple[Any, ...]) -> dict[str, Any]:
    """A flight_dates row as τ²'s FlightDateStatus model of its status dumps it."""
    status, sb, se, sbus, pb, pe, pbus, act_dep, act_arr, est_dep, est_arr = row
    if status == "available":
        return {
            "status": status,
            "available_seats": {"basic_economy": sb, "economy": se, "business": sbus},
            "prices": {"basic_economy": pb, "economy": pe, "business": pbus},
        }
    if status == "landed":
        return {"status": status, "actual_departure_time_est": act_dep, "actual_arrival_time_est": act_arr}
    if status == "flying":
        return {"status": status, "actual_departure_time_est": act_dep, "estimated_arrival_time_est": est_arr}
    if status in ("on time", "delayed"):
        return {
            "status": status,
            "estimated_departure_time_est": est_dep,
            "estimated_arrival_time_est": est_arr,
        }
    return {"status": status}


async def _get_flight_instance(db: Db, flight_number: Any, date: Any) -> dict[str, Any]:
    """τ²'s `_get_flight_instance`: the flight must exist, then its date."""
    flight = await _get_flight(db, flight_number)
    rows = await db.execute_fetchall(
        f"SELECT {_DATE_COLUMNS} FROM flight_dates WHERE flight_number = ? AND date = ?",
        (flight["flight_number"], _lookup(date)),
    )
    if not rows:
        raise ToolError(f"Flight {flight_number} not found on date {date}")
    return _flight_date(rows[0])


async def _search_direct_flight(
    db: Db, date: Any, origin: Any = None, destination: Any = None, leave_after: str | None = None
) -> list[dict[str, Any]]:
    """τ²'s `_search_direct_flight`: available flight-dates in db.json flight order, as DirectFlight."""
    clauses, params = [], []
    for column, value in (("origin", origin), ("destination", destination)):
        if value is not None:
            if not isinstance(value, str):  # equal to no airport code; τ² compares with ==
                return []
            clauses.append(f"f.{column} = ?")
            params.append(value)
    where = " AND ".join(clauses) or "1"
    if not isinstance(date, str):
        # τ² tests `date in flight.dates` for each flight matching origin and destination.
        if await db.execute_fetchall(f"SELECT 1 FROM flights f WHERE {where} LIMIT 1", tuple(params)):
            hash(date)
        return []
    rows = await db.execute_fetchall(
        "SELECT f.flight_number, f.origin, f.destination, f.scheduled_departure_time_est, "
        "f.scheduled_arrival_time_est, d.seats_basic_economy, d.seats_economy, d.seats_business, "
        "d.price_basic_economy, d.price_economy, d.price_business "
        f"FROM flights f JOIN flight_dates d ON d.flight_number = f.flight_number AND d.date = ? "
        f"WHERE {where} AND d.status = 'available' ORDER BY f.position",
        (date, *params),
    )
    results = []
    for number, o, d, dep, arr, sb, se, sbus, pb, pe, pbus in rows:
        if leave_after is not None and not dep >= leave_after:
            continue
        results.append(
            {
                "flight_number": number,
                "origin": o,
                "destination": d,
                "status": "available",
                "scheduled_departure_time_est": dep,
                "scheduled_arrival_time_est": arr,
                "date": None,
                "available_seats": {"basic_economy": sb, "economy": se, "business": sbus},
                "prices": {"basic_economy": pb, "economy": pe, "business": pbus},
            }
        )
    return results


# ---------------------------------------------------------------------------------------------
# Writing τ²'s changes back.


def _storable(value: Any, what: str) -> Any:
    """A value τ² would store unvalidated, if a column can hold it as τ² dumps it."""
    if value is None or (isinstance(value, int | float | str) and not isinstance(value, bool)):
        return value
    raise ToolError(f"{what} must be a number or a string, got {type(value).__name__}")


_PARTS = ("row", "flights", "passengers", "payments")


async def _save_reservation(
    db: Db, r: dict[str, Any], *, new: bool = False, parts: tuple[str, ...] = _PARTS
) -> None:
    """Write a reservation dump back: `parts` of it (its own row, its segments, passengers and
    payments), so that a tool writes only the tables τ² changes with it."""
    rid = r["reservation_id"]
    if "row" in parts:
        values = (
            r["user_id"],
            r["origin"],
            r["destination"],
            r["flight_type"],
            _storable(r["cabin"], "cabin"),
            r["created_at"],
            _storable(r["total_baggages"], "total_baggages"),
            _storable(r["nonfree_baggages"], "nonfree_baggages"),
            r["insurance"],
            r["status"],
        )
        if new:
            await db.execute(
                f"INSERT INTO reservations ({_RESERVATION_COLUMNS}, position) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                "(SELECT COALESCE(MAX(position), -1) + 1 FROM reservations))",
                (rid, *values),
            )
        else:
            await db.execute(
                "UPDATE reservations SET user_id = ?, origin = ?, destination = ?, flight_type = ?, "
                "cabin = ?, created_at = ?, total_baggages = ?, nonfree_baggages = ?, insurance = ?, "
                "status = ? WHERE reservation_id = ?",
                (*values, rid),
            )
    if "flights" in parts:
        await db.execute("DELETE FROM reservation_flights WHERE reservation_id = ?", (rid,))
        await db.executemany(
            "INSERT INTO reservation_flights (reservation_id, position, flight_number, origin, destination, "
            "date, price) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (rid, i, f["flight_number"], f["origin"], f["destination"], f["date"], f["price"])
                for i, f in enumerate(r["flights"])
            ],
        )
    if "passengers" in parts:
        for p in r["passengers"]:
            if not isinstance(p, dict):
                raise ToolError(f"each passenger must be an object, got {type(p).__name__}")
        await db.execute("DELETE FROM reservation_passengers WHERE reservation_id = ?", (rid,))
        await db.executemany(
            "INSERT INTO reservation_passengers (reservation_id, position, first_name, last_name, dob) "
            "VALUES (?, ?, ?, ?, ?)",
            [(rid, i, p["first_name"], p["last_name"], p["dob"]) for i, p in enumerate(r["passengers"])],
        )
    if "payments" in parts:
        await db.execute("DELETE FROM reservation_payments WHERE reservation_id = ?", (rid,))
        await db.executemany(
            "INSERT INTO reservation_payments (reservation_id, position, payment_id, amount) "
            "VALUES (?, ?, ?, ?)",
            [(rid, i, p["payment_id"], p["amount"]) for i, p in enumerate(r["payment_history"])],
        )


async def _set_amount(db: Db, user_id: str, method_id: str, amount: float) -> None:
    await db.execute(
        "UPDATE payment_methods SET amount = ? WHERE user_id = ? AND payment_method_id = ?",
        (amount, user_id, method_id),
    )


async def _payment_for_update(db: Db, user: dict[str, Any], payment_id: Any, total_price: Any) -> Any:
    """τ²'s `_payment_for_update`: the method must be the user's and not a certificate; a gift card
    is charged `total_price` even when it is negative (a downgrade credits it)."""
    methods = user["payment_methods"]
    if payment_id not in methods:
        raise ToolError("Payment method not found")
    method = methods[payment_id]
    if method["source"] == "certificate":
        raise ToolError("Certificate cannot be used to update reservation")
    elif method["source"] == "gift_card" and method["amount"] < total_price:
        raise ToolError("Gift card balance is not enough")
    if method["source"] == "gift_card":
        method["amount"] -= total_price
        await _set_amount(db, user["user_id"], payment_id, method["amount"])
    payment = None
    if total_price != 0:
        payment = Payment(payment_id=payment_id, amount=total_price).model_dump()
    return payment


# ---------------------------------------------------------------------------------------------
# Parameter types: τ²'s parameter descriptions, verbatim.

ReservationId = Annotated[str, Field(description="The reservation ID, such as 'ZFA04Y'.")]
PaymentId = Annotated[
    str,
    Field(
        description="The payment id stored in user profile, such as 'credit_card_7815826', "
        "'gift_card_7815826', 'certificate_7815826'."
    ),
]
Cabin = Literal["business", "economy", "basic_economy"]
SearchOrigin = Annotated[str, Field(description="The origin city airport in three letters, such as 'JFK'.")]
SearchDestination = Annotated[
    str, Field(description="The destination city airport in three letters, such as 'LAX'.")
]

# ---------------------------------------------------------------------------------------------
# The tools, in τ²'s order.


@tool(
    writes=[
        "reservations",
        "reservation_flights",
        "reservation_passengers",
        "reservation_payments",
        "payment_methods",
        "flight_dates",
        "user_reservations",
    ],
    description="Book a reservation.",
)
async def book_reservation(
    db: Db,
    user_id: Annotated[
        str, Field(description="The ID of the user to book the reservation such as 'sara_doe_496'`.")
    ],
    origin: Annotated[str, Field(description="The IATA code for the origin city such as 'SFO'.")],
    destination: Annotated[str, Field(description="The IATA code for the destination city such as 'JFK'.")],
    flight_type: Annotated[
        Literal["round_trip", "one_way"],
        Field(description="The type of flight such as 'one_way' or 'round_trip'."),
    ],
    cabin: Annotated[
        Cabin, Field(description="The cabin class such as 'basic_economy', 'economy', or 'business'.")
    ],
    flights: Annotated[
        list[FlightInfo | dict],
        Field(description="An array of objects containing details about each piece of flight."),
    ],
    passengers: Annotated[
        list[Passenger | dict],
        Field(description="An array of objects containing details about each passenger."),
    ],
    payment_methods: Annotated[
        list[Payment | dict],
        Field(description="An array of objects containing details about each payment method."),
    ],
    total_baggages: Annotated[
        int, Field(description="The total number of baggage items to book the reservation.")
    ],
    nonfree_baggages: Annotated[
        int, Field(description="The number of non-free baggage items to book the reservation.")
    ],
    insurance: Annotated[Literal["yes", "no"], Field(description="Whether the reservation has insurance.")],
) -> dict[str, Any]:
    """Book flights for passengers, paid by the given methods; every check runs before any change."""
    with _as_tau2_errors():
        flights = _models(flights, FlightInfo)
        passengers = _models(passengers, Passenger)
        payment_methods = _models(payment_methods, Payment)
        user = await _get_user(db, user_id)
        taken = {
            r[0]
            for r in await db.execute_fetchall(
                "SELECT reservation_id FROM reservations WHERE reservation_id IN (?, ?, ?)",
                NEW_RESERVATION_IDS,
            )
        }
        reservation_id = next((r for r in NEW_RESERVATION_IDS if r not in taken), None)
        if reservation_id is None:
            raise ToolError("Too many reservations")
        reservation = Reservation(
            reservation_id=reservation_id,
            user_id=user_id,
            origin=origin,
            destination=destination,
            flight_type=flight_type,
            cabin=cabin,
            flights=[],
            passengers=deepcopy(passengers),
            payment_history=deepcopy(payment_methods),
            created_at=NOW,
            total_baggages=total_baggages,
            nonfree_baggages=nonfree_baggages,
            insurance=insurance,
        ).model_dump()
        total_price = 0
        booked: list[str] = []
        for flight_info in flights:
            flight = await _get_flight(db, flight_info.flight_number)
            flight_date_data = await _get_flight_instance(db, flight_info.flight_number, flight_info.date)
            if flight_date_data["status"] != "available":
                raise ToolError(
                    f"Flight {flight_info.flight_number} not available on date {flight_info.date}"
                )
            if flight_date_data["available_seats"][cabin] < len(passengers):
                raise ToolError(f"Not enough seats on flight {flight_info.flight_number}")
            price = flight_date_data["prices"][cabin]
            reservation["flights"].append(
                ReservationFlight(
                    origin=flight["origin"],
                    destination=flight["destination"],
                    flight_number=flight_info.flight_number,
                    date=flight_info.date,
                    price=price,
                ).model_dump()
            )
            booked.append(flight["flight_number"])
            total_price += price * len(passengers)
        if insurance == "yes":
            total_price += 30 * len(passengers)
        total_price += 50 * nonfree_baggages
        methods = user["payment_methods"]
        for payment_method in payment_methods:
            payment_id = payment_method.payment_id
            amount = payment_method.amount
            if payment_id not in methods:
                raise ToolError(f"Payment method {payment_id} not found")
            user_payment_method = methods[payment_id]
            if user_payment_method["source"] in {"gift_card", "certificate"}:
                if user_payment_method["amount"] < amount:
                    raise ToolError(f"Not enough balance in payment method {payment_id}")
        total_payment = sum(payment.amount for payment in payment_methods)
        if total_payment != total_price:
            raise ToolError(
                f"Payment amount does not add up, total price is {total_price}, but paid {total_payment}"
            )
        uid = user["user_id"]
        for payment_method in payment_methods:
            payment_id = payment_method.payment_id
            user_payment_method = methods[payment_id]  # a certificate paid with twice: KeyError, as in τ²
            if user_payment_method["source"] == "gift_card":
                user_payment_method["amount"] -= payment_method.amount
                await _set_amount(db, uid, payment_id, user_payment_method["amount"])
            elif user_payment_method["source"] == "certificate":
                methods.pop(payment_id)
                await db.execute(
                    "DELETE FROM payment_methods WHERE user_id = ? AND payment_method_id = ?",
                    (uid, payment_id),
                )
        seats = f"seats_{cabin}"  # cabin is one of CABINS: Reservation validated it
        for flight_info, number in zip(flights, booked, strict=True):
            await db.execute(
                f"UPDATE flight_dates SET {seats} = {seats} - ? WHERE flight_number = ? AND date = ?",
                (len(passengers), number, flight_info.date),
            )
        await _save_reservation(db, reservation, new=True)
        await db.execute(
            "INSERT INTO user_reservations (user_id, position, reservation_id) VALUES "
            "(?, (SELECT COALESCE(MAX(position), -1) + 1 FROM user_reservations WHERE user_id = ?), ?)",
            (uid, uid, reservation_id),
        )
        return reservation


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
    with _as_tau2_errors():
        if not all(char in "0123456789+-*/(). " for char in expression):
            raise ToolError("Invalid characters in expression")
        try:
            return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))
        except Exception as exc:  # the agent reads τ²'s f"Error: {e}" for any failure of its expression
            raise ToolError(str(exc)) from exc


@tool(writes=["reservations", "reservation_payments"], description="Cancel the whole reservation.")
async def cancel_reservation(db: Db, reservation_id: ReservationId) -> dict[str, Any]:
    """Cancel unconditionally: a negative payment for every entry already in the history; seats,
    gift cards and certificates are left as they are (τ² does not release or refund them)."""
    with _as_tau2_errors():
        reservation = await _get_reservation(db, reservation_id)
        refunds = [
            Payment(payment_id=p["payment_id"], amount=-p["amount"]).model_dump()
            for p in reservation["payment_history"]
        ]
        reservation["payment_history"].extend(refunds)
        reservation["status"] = "cancelled"
        await _save_reservation(db, reservation, parts=("row", "payments"))
        return reservation


@tool(description="Get the details of a reservation.")
async def get_reservation_details(
    db: Db, reservation_id: Annotated[str, Field(description="The reservation ID, such as '8JX2WO'.")]
) -> dict[str, Any]:
    """The reservation as τ² dumps it."""
    with _as_tau2_errors():
        return await _get_reservation(db, reservation_id)


@tool(description="Get the details of a user, including their reservations.")
async def get_user_details(
    db: Db, user_id: Annotated[str, Field(description="The user ID, such as 'sara_doe_496'.")]
) -> dict[str, Any]:
    """The user as τ² dumps it."""
    with _as_tau2_errors():
        return await _get_user(db, user_id)


AIRPORTS = (
    ("SFO", "San Francisco"),
    ("JFK", "New York"),
    ("LAX", "Los Angeles"),
    ("ORD", "Chicago"),
    ("DFW", "Dallas"),
    ("DEN", "Denver"),
    ("SEA", "Seattle"),
    ("ATL", "Atlanta"),
    ("MIA", "Miami"),
    ("BOS", "Boston"),
    ("PHX", "Phoenix"),
    ("IAH", "Houston"),
    ("LAS", "Las Vegas"),
    ("MCO", "Orlando"),
    ("EWR", "Newark"),
    ("CLT", "Charlotte"),
    ("MSP", "Minneapolis"),
    ("DTW", "Detroit"),
    ("PHL", "Philadelphia"),
    ("LGA", "LaGuardia"),
)


@tool(description="Returns a list of all available airports.")
async def list_all_airports(db: Db) -> list[dict[str, str]]:
    """τ²'s fixed list, written into the tool (not read from the DB)."""
    return [{"iata": iata, "city": city} for iata, city in AIRPORTS]


@tool(description="Search for direct flights between two cities on a specific date.")
async def search_direct_flight(
    db: Db,
    origin: SearchOrigin,
    destination: SearchDestination,
    date: Annotated[
        str, Field(description="The date of the flight in the format 'YYYY-MM-DD', such as '2024-01-01'.")
    ],
) -> list[dict[str, Any]]:
    """Available flights on `date`, with `date` itself null in each result (as τ² leaves it)."""
    with _as_tau2_errors():
        return await _search_direct_flight(db, date=date, origin=origin, destination=destination)


@tool(description="Search for one-stop flights between two cities on a specific date.")
async def search_onestop_flight(
    db: Db,
    origin: SearchOrigin,
    destination: SearchDestination,
    date: Annotated[
        str, Field(description="The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.")
    ],
) -> list[list[dict[str, Any]]]:
    """Pairs of legs: the second leaves the first's destination at or after its arrival (compared
    as strings), on the next day of May when the first arrives "+1" (τ²'s fixed month)."""
    with _as_tau2_errors():
        results = []
        for result1 in await _search_direct_flight(db, date=date, origin=origin, destination=None):
            result1["date"] = date
            date2 = f"2024-05-{int(date[-2:]) + 1}" if "+1" in result1["scheduled_arrival_time_est"] else date
            for result2 in await _search_direct_flight(
                db,
                date=date2,
                origin=result1["destination"],
                destination=destination,
                leave_after=result1["scheduled_arrival_time_est"],
            ):
                result2["date"] = date2
                results.append([result1, result2])
        return results


@tool(writes=["payment_methods"], description="Send a certificate to a user. Be careful!")
async def send_certificate(
    db: Db,
    user_id: Annotated[
        str, Field(description="The ID of the user to book the reservation, such as 'sara_doe_496'.")
    ],
    amount: Annotated[int, Field(description="The amount of the certificate to send.")],
) -> str:
    """Add the first of τ²'s three certificate ids the user lacks; the message echoes `amount` as given."""
    with _as_tau2_errors():
        user = await _get_user(db, user_id)
        for payment_id in NEW_CERTIFICATE_IDS:
            if payment_id not in user["payment_methods"]:
                certificate = Certificate(id=payment_id, amount=amount, source="certificate")
                await db.execute(
                    "INSERT INTO payment_methods (user_id, payment_method_id, position, source, amount) "
                    "VALUES (?, ?, (SELECT COALESCE(MAX(position), -1) + 1 FROM payment_methods "
                    "WHERE user_id = ?), 'certificate', ?)",
                    (user["user_id"], payment_id, user["user_id"], certificate.amount),
                )
                return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
        raise ToolError("Too many certificates")


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


@tool(
    writes=["reservations", "reservation_payments", "payment_methods"],
    description="Update the baggage information of a reservation.",
)
async def update_reservation_baggages(
    db: Db,
    reservation_id: Annotated[str, Field(description="The reservation ID, such as 'ZFA04Y'")],
    total_baggages: Annotated[
        int, Field(description="The updated total number of baggage items included in the reservation.")
    ],
    nonfree_baggages: Annotated[
        int, Field(description="The updated number of non-free baggage items included in the reservation.")
    ],
    payment_id: PaymentId,
) -> dict[str, Any]:
    """Charge 50 per added non-free bag (never a refund); both counts are stored as given."""
    with _as_tau2_errors():
        reservation = await _get_reservation(db, reservation_id)
        user = await _get_user(db, reservation["user_id"])
        total_price = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
        payment = await _payment_for_update(db, user, payment_id, total_price)
        if payment is not None:
            reservation["payment_history"].append(payment)
        reservation["total_baggages"] = total_baggages
        reservation["nonfree_baggages"] = nonfree_baggages
        await _save_reservation(db, reservation, parts=("row", "payments"))
        return reservation


@tool(
    writes=["reservations", "reservation_flights", "reservation_payments", "payment_methods"],
    description="Update the flight information of a reservation.",
)
async def update_reservation_flights(
    db: Db,
    reservation_id: ReservationId,
    cabin: Annotated[Cabin, Field(description="The cabin class of the reservation")],
    flights: Annotated[
        list[FlightInfo | dict],
        Field(
            description="An array of objects containing details about each piece of flight in the ENTIRE "
            "new reservation. Even if the a flight segment is not changed, it should still be included in "
            "the array."
        ),
    ],
    payment_id: PaymentId,
) -> dict[str, Any]:
    """Replace the segments: one kept (same flight and date, same cabin) keeps its price and needs
    no seat; others are priced now. The difference is charged, or credited, to `payment_id`.
    Seat counts are not changed (τ² does not)."""
    with _as_tau2_errors():
        flights = _models(flights, FlightInfo)
        reservation = await _get_reservation(db, reservation_id)
        user = await _get_user(db, reservation["user_id"])
        total_price = 0
        reservation_flights = []
        n_passengers = len(reservation["passengers"])
        for flight_info in flights:
            matching_reservation_flight = next(
                (
                    reservation_flight
                    for reservation_flight in reservation["flights"]
                    if reservation_flight["flight_number"] == flight_info.flight_number
                    and reservation_flight["date"] == flight_info.date
                    and cabin == reservation["cabin"]
                ),
                None,
            )
            if matching_reservation_flight:
                total_price += matching_reservation_flight["price"] * n_passengers
                reservation_flights.append(matching_reservation_flight)
                continue
            flight = await _get_flight(db, flight_info.flight_number)
            flight_date_data = await _get_flight_instance(db, flight_info.flight_number, flight_info.date)
            if flight_date_data["status"] != "available":
                raise ToolError(
                    f"Flight {flight_info.flight_number} not available on date {flight_info.date}"
                )
            if flight_date_data["available_seats"][cabin] < n_passengers:
                raise ToolError(f"Not enough seats on flight {flight_info.flight_number}")
            reservation_flight = ReservationFlight(
                flight_number=flight_info.flight_number,
                date=flight_info.date,
                price=flight_date_data["prices"][cabin],
                origin=flight["origin"],
                destination=flight["destination"],
            ).model_dump()
            total_price += reservation_flight["price"] * n_passengers
            reservation_flights.append(reservation_flight)
        total_price -= sum(flight["price"] for flight in reservation["flights"]) * n_passengers
        payment = await _payment_for_update(db, user, payment_id, total_price)
        if payment is not None:
            reservation["payment_history"].append(payment)
        reservation["flights"] = reservation_flights
        reservation["cabin"] = cabin
        await _save_reservation(db, reservation, parts=("row", "flights", "payments"))
        return reservation


@tool(
    writes=["reservation_passengers"],
    description="Update the passenger information of a reservation.",
)
async def update_reservation_passengers(
    db: Db,
    reservation_id: ReservationId,
    passengers: Annotated[
        list[Passenger | dict],
        Field(description="An array of objects containing details about each passenger."),
    ],
) -> dict[str, Any]:
    """Replace the passengers; only their number is checked."""
    with _as_tau2_errors():
        passengers = _models(passengers, Passenger)
        reservation = await _get_reservation(db, reservation_id)
        if len(passengers) != len(reservation["passengers"]):
            raise ToolError("Number of passengers does not match")
        reservation["passengers"] = [
            p.model_dump() if isinstance(p, Passenger) else deepcopy(p) for p in passengers
        ]
        await _save_reservation(db, reservation, parts=("passengers",))
        return reservation


@tool(description="Get the status of a flight.")
async def get_flight_status(
    db: Db,
    flight_number: Annotated[str, Field(description="The flight number.")],
    date: Annotated[str, Field(description="The date of the flight.")],
) -> str:
    """The status alone, a bare string (`landed`, `available`, ...)."""
    with _as_tau2_errors():
        return (await _get_flight_instance(db, flight_number, date))["status"]
