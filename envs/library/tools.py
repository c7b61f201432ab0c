"""Tools of the lending library. The clock is frozen at TODAY so the same calls give the same state."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from envforge.server import Db, ToolError, tool

TODAY = "2025-03-14"
LOAN_DAYS = 21
Genre = Literal["fiction", "history", "science", "children", "poetry"]
MEMBER = "member_id, name, email, status, max_loans"
BOOK = "book_id, title, author, genre, copies_total, copies_available"
LOAN = "loan_id, book_id, member_id, loaned_on, due_on, returned_on, status"
HOLD = "hold_id, book_id, member_id, placed_on, status"


async def _next_id(db: Db, table: str, column: str, prefix: str) -> str:
    rows = await db.fetch_all(f"SELECT MAX(CAST(substr({column}, 3) AS INTEGER)) AS n FROM {table}")
    return f"{prefix}{(rows[0]['n'] or 0) + 1}"


@tool
async def get_member(db: Db, member_id: str) -> dict[str, Any]:
    """Look up a library member by id: name, status and loan limit.

    Args:
        member_id: Member id such as 'M-1001'.
    """
    return await db.require_one(
        f"SELECT {MEMBER} FROM members WHERE member_id = ?", (member_id,), f"member {member_id} not found"
    )


@tool
async def search_books(db: Db, genre: Genre | None = None) -> list[dict[str, Any]]:
    """List books, optionally of one genre, with how many copies are available.

    Args:
        genre: Only books of this genre.
    """
    if genre is None:
        return await db.fetch_all(f"SELECT {BOOK} FROM books ORDER BY book_id")
    return await db.fetch_all(f"SELECT {BOOK} FROM books WHERE genre = ? ORDER BY book_id", (genre,))


@tool
async def get_book(db: Db, book_id: str) -> dict[str, Any]:
    """Get one book with its copy counts.

    Args:
        book_id: Book id such as 'B-2001'.
    """
    return await db.require_one(
        f"SELECT {BOOK} FROM books WHERE book_id = ?", (book_id,), f"book {book_id} not found"
    )


@tool
async def list_member_loans(db: Db, member_id: str) -> list[dict[str, Any]]:
    """The loans of a member that are not returned yet.

    Args:
        member_id: The member id.
    """
    await get_member(db, member_id)
    return await db.fetch_all(
        f"SELECT {LOAN} FROM loans WHERE member_id = ? AND status = 'active' ORDER BY loan_id", (member_id,)
    )


async def _active_member(db: Db, member_id: str) -> dict[str, Any]:
    member = await get_member(db, member_id)
    if member["status"] != "active":
        raise ToolError(f"member {member_id} is {member['status']}")
    return member


@tool(writes=["loans", "books"])
async def checkout_book(db: Db, member_id: str, book_id: str) -> dict[str, Any]:
    """Lend an available copy of a book to an active member who is under their loan limit. Due in 21 days.

    Args:
        member_id: The borrowing member.
        book_id: The book to lend.
    """
    member = await _active_member(db, member_id)
    book = await get_book(db, book_id)
    if book["copies_available"] < 1:
        raise ToolError(f"book {book_id} has no copy available; place a hold instead")
    active = await db.fetch_all(
        "SELECT COUNT(*) AS n FROM loans WHERE member_id = ? AND status = 'active'", (member_id,)
    )
    if active[0]["n"] >= member["max_loans"]:
        raise ToolError(f"member {member_id} already has {member['max_loans']} loans (the limit)")
    loan_id = await _next_id(db, "loans", "loan_id", "L-")
    due = (dt.date.fromisoformat(TODAY) + dt.timedelta(days=LOAN_DAYS)).isoformat()
    await db.execute(
        "INSERT INTO loans (loan_id, book_id, member_id, loaned_on, due_on, returned_on, status) "
        "VALUES (?, ?, ?, ?, ?, NULL, 'active')",
        (loan_id, book_id, member_id, TODAY, due),
    )
    await db.execute("UPDATE books SET copies_available = copies_available - 1 WHERE book_id = ?", (book_id,))
    return await db.require_one(f"SELECT {LOAN} FROM loans WHERE loan_id = ?", (loan_id,), "loan not found")


@tool(writes=["loans", "books"])
async def return_book(db: Db, loan_id: str) -> dict[str, Any]:
    """Return a loaned copy; the copy becomes available again.

    Args:
        loan_id: Loan id such as 'L-3001'.
    """
    loan = await db.require_one(
        f"SELECT {LOAN} FROM loans WHERE loan_id = ?", (loan_id,), f"loan {loan_id} not found"
    )
    if loan["status"] != "active":
        raise ToolError(f"loan {loan_id} was already returned on {loan['returned_on']}")
    await db.execute(
        "UPDATE loans SET status = 'returned', returned_on = ? WHERE loan_id = ?", (TODAY, loan_id)
    )
    await db.execute(
        "UPDATE books SET copies_available = copies_available + 1 WHERE book_id = ?", (loan["book_id"],)
    )
    return await db.require_one(f"SELECT {LOAN} FROM loans WHERE loan_id = ?", (loan_id,), "loan not found")


@tool(writes=["holds"])
async def place_hold(db: Db, member_id: str, book_id: str) -> dict[str, Any]:
    """Reserve a book that has no copy available for an active member.

    Args:
        member_id: The member who waits for the book.
        book_id: The book to reserve.
    """
    await _active_member(db, member_id)
    book = await get_book(db, book_id)
    if book["copies_available"] > 0:
        raise ToolError(
            f"book {book_id} has {book['copies_available']} copies available; check it out instead"
        )
    dup = await db.fetch_all(
        "SELECT hold_id FROM holds WHERE member_id = ? AND book_id = ? AND status = 'waiting'",
        (member_id, book_id),
    )
    if dup:
        raise ToolError(f"member {member_id} already holds book {book_id} ({dup[0]['hold_id']})")
    hold_id = await _next_id(db, "holds", "hold_id", "H-")
    await db.execute(
        "INSERT INTO holds (hold_id, book_id, member_id, placed_on, status) VALUES (?, ?, ?, ?, 'waiting')",
        (hold_id, book_id, member_id, TODAY),
    )
    return await db.require_one(f"SELECT {HOLD} FROM holds WHERE hold_id = ?", (hold_id,), "hold not found")


@tool(writes=["holds"])
async def cancel_hold(db: Db, hold_id: str) -> dict[str, Any]:
    """Cancel a waiting hold.

    Args:
        hold_id: The hold id.
    """
    hold = await db.require_one(
        f"SELECT {HOLD} FROM holds WHERE hold_id = ?", (hold_id,), f"hold {hold_id} not found"
    )
    if hold["status"] != "waiting":
        raise ToolError(f"hold {hold_id} is {hold['status']}")
    await db.execute("UPDATE holds SET status = 'cancelled' WHERE hold_id = ?", (hold_id,))
    return {**hold, "status": "cancelled"}
