"""Tools of a gym's booking desk."""

from __future__ import annotations

from typing import Any, Literal

from envforge.server import Db, ToolError, tool

Day = Literal["mon", "tue", "wed", "thu", "fri", "sat"]
MEMBER = "member_id, name, plan, status"
CLASS = "class_id, name, day, premium, capacity, booked"
BOOKING = "booking_id, class_id, member_id, status"


@tool
async def get_member(db: Db, member_id: str) -> dict[str, Any]:
    """Look up a gym member by id, with plan and membership status.

    Args:
        member_id: Member id such as 'G-101'.
    """
    return await db.require_one(
        f"SELECT {MEMBER} FROM members WHERE member_id = ?", (member_id,), "member not found"
    )


@tool
async def list_classes(db: Db, day: Day | None = None) -> list[dict[str, Any]]:
    """List the scheduled classes, optionally on one weekday, with free places.

    Args:
        day: Only classes on this day; one of: mon, tue, wed, thu, fri, sat.
    """
    if day is None:
        return await db.fetch_all(f"SELECT {CLASS} FROM classes ORDER BY class_id")
    return await db.fetch_all(f"SELECT {CLASS} FROM classes WHERE day = ? ORDER BY class_id", (day,))


@tool
async def get_class(db: Db, class_id: str) -> dict[str, Any]:
    """Get one class with its capacity and bookings.

    Args:
        class_id: Class id such as 'CL-201'.
    """
    return await db.require_one(
        f"SELECT {CLASS} FROM classes WHERE class_id = ?", (class_id,), f"class {class_id} not found"
    )


@tool(writes=["bookings", "classes"])
async def book_class(db: Db, member_id: str, class_id: str) -> dict[str, Any]:
    """Book an active member into a class that has a free place; premium classes need a premium plan.

    Args:
        member_id: The member to book.
        class_id: The class.
    """
    member = await get_member(db, member_id)
    if member["status"] != "active":
        raise ToolError(f"member {member_id} is {member['status']}")
    klass = await get_class(db, class_id)
    if klass["premium"] and member["plan"] != "premium":
        raise ToolError(f"class {class_id} needs a premium plan")
    if klass["booked"] >= klass["capacity"]:
        raise ToolError(f"class {class_id} is full")
    dup = await db.fetch_all(
        "SELECT booking_id FROM bookings WHERE member_id = ? AND class_id = ? AND status = 'booked'",
        (member_id, class_id),
    )
    if dup:
        raise ToolError(f"member {member_id} is already booked ({dup[0]['booking_id']})")
    n = (await db.fetch_all("SELECT MAX(CAST(substr(booking_id, 4) AS INTEGER)) AS n FROM bookings"))[0][
        "n"
    ] or 0
    booking_id = f"BK-{n + 1}"
    await db.execute(
        "INSERT INTO bookings (booking_id, class_id, member_id, status) VALUES (?, ?, ?, 'booked')",
        (booking_id, class_id, member_id),
    )
    await db.execute("UPDATE classes SET booked = booked + 1 WHERE class_id = ?", (class_id,))
    return {"booking_id": booking_id, "class_id": class_id, "member_id": member_id, "status": "booked"}


@tool(writes=["bookings", "classes"])
async def cancel_booking(db: Db, booking_id: str) -> dict[str, Any]:
    """Cancel a booking; the place becomes free again.

    Args:
        booking_id: Booking id such as 'BK-301'.
    """
    booking = await db.require_one(
        f"SELECT {BOOKING} FROM bookings WHERE booking_id = ?", (booking_id,), "booking not found"
    )
    if booking["status"] != "booked":
        raise ToolError(f"booking {booking_id} is already cancelled")
    await db.execute("UPDATE bookings SET status = 'cancelled' WHERE booking_id = ?", (booking_id,))
    await db.execute("UPDATE classes SET booked = booked - 1 WHERE class_id = ?", (booking["class_id"],))
    return {**booking, "status": "cancelled"}


@tool(writes=["members"])
async def freeze_membership(db: Db, member_id: str) -> dict[str, Any]:
    """Freeze an active membership; a frozen member cannot book classes.

    Args:
        member_id: The member whose membership is frozen.
    """
    member = await get_member(db, member_id)
    if member["status"] != "active":
        raise ToolError(f"member {member_id} is already {member['status']}")
    await db.execute("UPDATE members SET status = 'frozen' WHERE member_id = ?", (member_id,))
    return {**member, "status": "frozen"}
