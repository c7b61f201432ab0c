"""Tools of a car rental desk. The clock is frozen at TODAY so the same calls give the same state."""

from __future__ import annotations

from typing import Any, Literal

from envforge.server import Db, ToolError, tool

TODAY = "2025-03-14"
Category = Literal["economy", "compact", "suv", "van"]
CUSTOMER = "customer_id, name, licence_valid"
CAR = "car_id, model, category, daily_rate_cents, status, location_id"
RENTAL = "rental_id, car_id, customer_id, start_date, days, total_cents, status"


@tool
async def get_customer(db: Db, customer_id: str) -> dict[str, Any]:
    """Look up a customer by id, with their licence status.

    Args:
        customer_id: Customer id such as 'C-501'.
    """
    return await db.require_one(
        f"SELECT {CUSTOMER} FROM customers WHERE customer_id = ?", (customer_id,), "customer not found"
    )


@tool
async def list_available_cars(
    db: Db, location_id: str, category: Category | None = None
) -> list[dict[str, Any]]:
    """Cars available for rent at a location, optionally of one category.

    Args:
        location_id: The location id, such as 'LOC-1'.
        category: Only cars of this category.
    """
    await db.require_one(
        "SELECT location_id FROM locations WHERE location_id = ?", (location_id,), "location not found"
    )
    sql = f"SELECT {CAR} FROM cars WHERE location_id = ? AND status = 'available'"
    params: tuple[Any, ...] = (location_id,)
    if category is not None:
        sql += " AND category = ?"
        params = (location_id, category)
    return await db.fetch_all(sql + " ORDER BY car_id", params)


@tool
async def get_car(db: Db, car_id: str) -> dict[str, Any]:
    """Get one car with its daily rate and status.

    Args:
        car_id: Car id such as 'V-601'.
    """
    return await db.require_one(
        f"SELECT {CAR} FROM cars WHERE car_id = ?", (car_id,), f"car {car_id} not found"
    )


@tool(writes=["rentals", "cars"])
async def rent_car(db: Db, customer_id: str, car_id: str, days: int) -> dict[str, Any]:
    """Rent an available car to a customer with a valid licence for 1-30 days.

    Args:
        customer_id: The renting customer.
        car_id: The car to rent.
        days: Rental length in days (1-30).
    """
    customer = await get_customer(db, customer_id)
    if not customer["licence_valid"]:
        raise ToolError(f"customer {customer_id} has no valid licence on file")
    car = await get_car(db, car_id)
    if car["status"] != "available":
        raise ToolError(f"car {car_id} is {car['status']}")
    if not 1 <= days <= 30:
        raise ToolError("days must be between 1 and 30")
    n = (await db.fetch_all("SELECT MAX(CAST(substr(rental_id, 3) AS INTEGER)) AS n FROM rentals"))[0][
        "n"
    ] or 0
    rental_id = f"R-{n + 1}"
    await db.execute(
        "INSERT INTO rentals (rental_id, car_id, customer_id, start_date, days, total_cents, status) "
        "VALUES (?, ?, ?, ?, ?, ?, 'open')",
        (rental_id, car_id, customer_id, TODAY, days, days * car["daily_rate_cents"]),
    )
    await db.execute("UPDATE cars SET status = 'rented' WHERE car_id = ?", (car_id,))
    return await db.require_one(
        f"SELECT {RENTAL} FROM rentals WHERE rental_id = ?", (rental_id,), "rental not found"
    )


@tool(writes=["rentals", "cars"])
async def return_car(db: Db, rental_id: str) -> dict[str, Any]:
    """Close an open rental; the car becomes available again.

    Args:
        rental_id: Rental id such as 'R-701'.
    """
    rental = await db.require_one(
        f"SELECT {RENTAL} FROM rentals WHERE rental_id = ?", (rental_id,), "rental not found"
    )
    if rental["status"] != "open":
        raise ToolError(f"rental {rental_id} is already closed")
    await db.execute("UPDATE rentals SET status = 'closed' WHERE rental_id = ?", (rental_id,))
    await db.execute("UPDATE cars SET status = 'available' WHERE car_id = ?", (rental["car_id"],))
    return {**rental, "status": "closed"}


@tool(writes=["cars"])
async def send_to_maintenance(db: Db, car_id: str) -> dict[str, Any]:
    """Take an available car out of service for maintenance.

    Args:
        car_id: The car id.
    """
    car = await get_car(db, car_id)
    if car["status"] != "available":
        raise ToolError(f"car {car_id} is {car['status']}; only available cars go to maintenance")
    await db.execute("UPDATE cars SET status = 'maintenance' WHERE car_id = ?", (car_id,))
    return {**car, "status": "maintenance"}
