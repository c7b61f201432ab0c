"""Tools of the Brightwell Analytics IT service desk.

The desk's clock is frozen at NOW so that the same calls always produce the same state: new
tickets and comments are stamped with it, and SLA breaches are judged against it. New ids are
the table's highest number plus one, never random.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from envforge.server import Db, ToolError, tool

NOW = "2025-03-14T09:00:00"
TODAY = NOW[:10]
IT_DEPARTMENT_ID = "D-20"

Priority = Literal["low", "medium", "high", "critical"]
Category = Literal["hardware", "software", "access", "network", "account", "other"]
TicketStatus = Literal["open", "in_progress", "on_hold", "resolved", "closed"]
AssetType = Literal["laptop", "phone", "monitor", "tablet"]
AssetStatus = Literal["in_stock", "assigned", "in_repair", "retired"]

# Status changes update_ticket_status may make; 'open' leaves only by assignment, 'closed' only by
# close_ticket, so neither appears as a target here.
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "in_progress": ("on_hold", "resolved"),
    "on_hold": ("in_progress", "resolved"),
    "resolved": ("in_progress",),
}
ONE_PER_EMPLOYEE = ("laptop", "phone")

EMPLOYEE_COLUMNS = (
    "employee_id, first_name, last_name, email, department_id, role, title, manager_id, status, hire_date"
)
TICKET_COLUMNS = (
    "ticket_id, requester_id, assignee_id, category, priority, status, subject, description, asset_id, "
    "created_at, due_at, resolved_at, resolution"
)
ASSET_COLUMNS = "asset_id, asset_type, model, serial_number, status, assigned_to, purchase_date"
LICENSE_COLUMNS = "license_id, product, vendor, seat_limit, seats_used, expires_on"


# ---------------------------------------------------------------- helpers


async def _next_id(db: Db, sql: str, prefix: str, first: int) -> str:
    """The next id after the highest in use: deterministic, unlike a random or clock-based one."""
    rows = await db.fetch_all(sql)
    highest = rows[0]["n"] if rows and rows[0]["n"] is not None else first - 1
    return f"{prefix}{highest + 1}"


def _plus_hours(timestamp: str, hours: int) -> str:
    return (dt.datetime.fromisoformat(timestamp) + dt.timedelta(hours=hours)).isoformat()


async def _employee(db: Db, employee_id: str) -> dict[str, Any]:
    row = await db.fetch_one(
        f"SELECT {EMPLOYEE_COLUMNS} FROM employees WHERE employee_id = ?", (employee_id,)
    )
    if row is None:
        raise ToolError(f"employee {employee_id} not found")
    return row


async def _active_employee(db: Db, employee_id: str) -> dict[str, Any]:
    employee = await _employee(db, employee_id)
    if employee["status"] != "active":
        raise ToolError(f"employee {employee_id} is {employee['status']}, not active")
    return employee


async def _ticket(db: Db, ticket_id: str) -> dict[str, Any]:
    row = await db.fetch_one(f"SELECT {TICKET_COLUMNS} FROM tickets WHERE ticket_id = ?", (ticket_id,))
    if row is None:
        raise ToolError(f"ticket {ticket_id} not found")
    return row


async def _asset(db: Db, asset_id: str) -> dict[str, Any]:
    row = await db.fetch_one(f"SELECT {ASSET_COLUMNS} FROM assets WHERE asset_id = ?", (asset_id,))
    if row is None:
        raise ToolError(f"asset {asset_id} not found")
    return row


async def _license(db: Db, license_id: str) -> dict[str, Any]:
    row = await db.fetch_one(f"SELECT {LICENSE_COLUMNS} FROM licenses WHERE license_id = ?", (license_id,))
    if row is None:
        raise ToolError(f"license {license_id} not found")
    return row


async def _resolution_hours(db: Db, priority: str) -> int:
    row = await db.fetch_one("SELECT resolution_hours FROM sla_rules WHERE priority = ?", (priority,))
    if row is None:
        raise ToolError(f"no SLA rule for priority {priority!r}")
    return int(row["resolution_hours"])


def _not_finished(ticket: dict[str, Any], action: str) -> None:
    if ticket["status"] in ("resolved", "closed"):
        raise ToolError(f"ticket {ticket['ticket_id']} is {ticket['status']}; cannot {action}")


# ---------------------------------------------------------------- read tools


@tool
async def get_employee(db: Db, employee_id: str) -> dict[str, Any]:
    """Get an employee's profile with their department, assigned assets and software licenses.

    Args:
        employee_id: The employee id, such as 'E-1001'.
    """
    employee = await _employee(db, employee_id)
    dept = await db.fetch_one(
        "SELECT name FROM departments WHERE department_id = ?", (employee["department_id"],)
    )
    employee["department_name"] = dept["name"] if dept else None
    employee["assets"] = await db.fetch_all(
        "SELECT asset_id, asset_type, model, serial_number FROM assets "
        "WHERE assigned_to = ? ORDER BY asset_id",
        (employee_id,),
    )
    employee["licenses"] = await db.fetch_all(
        "SELECT l.license_id, l.product FROM license_assignments a JOIN licenses l USING (license_id) "
        "WHERE a.employee_id = ? ORDER BY l.license_id",
        (employee_id,),
    )
    return employee


@tool
async def find_employees(
    db: Db, email: str | None = None, name: str | None = None, department_id: str | None = None
) -> list[dict[str, Any]]:
    """Search employees by exact email, by part of their name, or by department. Filters combine.

    Args:
        email: The full email address (case-insensitive), such as 'clara.jensen@brightwell.example'.
        name: Part of the first or last name, or the full name (case-insensitive).
        department_id: A department id, such as 'D-20' (Information Technology).
    """
    if email is None and name is None and department_id is None:
        raise ToolError("give at least one of email, name or department_id")
    clauses: list[str] = []
    params: list[Any] = []
    if email is not None:
        clauses.append("lower(email) = lower(?)")
        params.append(email.strip())
    if name is not None:
        clauses.append("lower(first_name || ' ' || last_name) LIKE '%' || lower(?) || '%'")
        params.append(name.strip())
    if department_id is not None:
        clauses.append("department_id = ?")
        params.append(department_id)
    return await db.fetch_all(
        "SELECT employee_id, first_name, last_name, email, department_id, title, status FROM employees "
        f"WHERE {' AND '.join(clauses)} ORDER BY employee_id",
        tuple(params),
    )


@tool
async def list_departments(db: Db) -> list[dict[str, Any]]:
    """List the departments with their cost center and the employee id of the department head."""
    return await db.fetch_all(
        "SELECT d.department_id, d.name, d.cost_center, "
        "(SELECT e.employee_id FROM employees e LEFT JOIN employees m ON m.employee_id = e.manager_id "
        " WHERE e.department_id = d.department_id "
        " AND (m.employee_id IS NULL OR m.department_id <> e.department_id) "
        " ORDER BY e.employee_id LIMIT 1) AS manager_id "
        "FROM departments d ORDER BY d.department_id"
    )


@tool
async def get_ticket(db: Db, ticket_id: str) -> dict[str, Any]:
    """Get a ticket with its comments and whether it breached its SLA resolution deadline.

    Args:
        ticket_id: The ticket id, such as 'T-3001'.
    """
    ticket = await _ticket(db, ticket_id)
    ticket["sla_breached"] = (ticket["resolved_at"] or NOW) > ticket["due_at"]
    ticket["comments"] = await db.fetch_all(
        "SELECT comment_id, author_id, body, is_internal, created_at FROM ticket_comments "
        "WHERE ticket_id = ? ORDER BY created_at, comment_id",
        (ticket_id,),
    )
    return ticket


@tool
async def list_tickets(
    db: Db,
    status: TicketStatus | None = None,
    priority: Priority | None = None,
    category: Category | None = None,
    requester_id: str | None = None,
    assignee_id: str | None = None,
) -> list[dict[str, Any]]:
    """List tickets (summaries, oldest first) matching all the given filters.

    Args:
        status: Only tickets in this status.
        priority: Only tickets with this priority.
        category: Only tickets in this category.
        requester_id: Only tickets raised by this employee id.
        assignee_id: Only tickets assigned to this employee id.
    """
    clauses: list[str] = ["1 = 1"]
    params: list[Any] = []
    for column, value in (
        ("status", status),
        ("priority", priority),
        ("category", category),
        ("requester_id", requester_id),
        ("assignee_id", assignee_id),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    return await db.fetch_all(
        "SELECT ticket_id, subject, category, priority, status, requester_id, assignee_id, "
        f"created_at, due_at FROM tickets WHERE {' AND '.join(clauses)} ORDER BY ticket_id",
        tuple(params),
    )


@tool
async def get_asset(db: Db, asset_id: str) -> dict[str, Any]:
    """Get an asset (laptop, phone, monitor or tablet): model, serial number, status and holder.

    Args:
        asset_id: The asset id, such as 'A-201'.
    """
    return await _asset(db, asset_id)


@tool
async def list_assets(
    db: Db,
    asset_type: AssetType | None = None,
    status: AssetStatus | None = None,
    employee_id: str | None = None,
) -> list[dict[str, Any]]:
    """List assets matching all the given filters, e.g. laptops in stock, or everything an employee holds.

    Args:
        asset_type: Only assets of this type.
        status: Only assets in this status.
        employee_id: Only assets assigned to this employee id.
    """
    clauses: list[str] = ["1 = 1"]
    params: list[Any] = []
    for column, value in (("asset_type", asset_type), ("status", status), ("assigned_to", employee_id)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    return await db.fetch_all(
        f"SELECT {ASSET_COLUMNS} FROM assets WHERE {' AND '.join(clauses)} ORDER BY asset_id", tuple(params)
    )


@tool
async def list_licenses(db: Db) -> list[dict[str, Any]]:
    """List the software licenses with seats used, seats available and expiry."""
    rows = await db.fetch_all(f"SELECT {LICENSE_COLUMNS} FROM licenses ORDER BY license_id")
    for row in rows:
        row["seats_available"] = row["seat_limit"] - row["seats_used"]
        row["expired"] = row["expires_on"] < TODAY
    return rows


@tool
async def get_license(db: Db, license_id: str) -> dict[str, Any]:
    """Get a software license with its seat usage and the employees holding a seat.

    Args:
        license_id: The license id, such as 'L-01'.
    """
    license_ = await _license(db, license_id)
    license_["seats_available"] = license_["seat_limit"] - license_["seats_used"]
    license_["expired"] = license_["expires_on"] < TODAY
    license_["holders"] = await db.fetch_all(
        "SELECT e.employee_id, e.first_name, e.last_name FROM license_assignments a "
        "JOIN employees e USING (employee_id) WHERE a.license_id = ? ORDER BY e.employee_id",
        (license_id,),
    )
    return license_


@tool
async def get_sla_rules(db: Db) -> list[dict[str, Any]]:
    """List the SLA per priority: hours from ticket creation to first response and to resolution."""
    return await db.fetch_all(
        "SELECT priority, response_hours, resolution_hours FROM sla_rules ORDER BY resolution_hours"
    )


# ---------------------------------------------------------------- write tools: tickets


@tool(writes=["tickets"])
async def create_ticket(
    db: Db,
    requester_id: str,
    category: Category,
    priority: Priority,
    subject: str,
    description: str,
    asset_id: str | None = None,
) -> dict[str, Any]:
    """Open a new ticket for an employee. It starts 'open' and unassigned, due per the priority's SLA.

    Args:
        requester_id: The employee id of the person the ticket is for (must be active).
        category: What the problem is about.
        priority: How urgent it is; it sets the due time.
        subject: A short summary.
        description: The details the requester gave.
        asset_id: The requester's asset the problem concerns, if any (must be assigned to the requester).
    """
    await _active_employee(db, requester_id)
    if not subject.strip():
        raise ToolError("subject must not be empty")
    if asset_id is not None:
        asset = await _asset(db, asset_id)
        if asset["assigned_to"] != requester_id:
            raise ToolError(f"asset {asset_id} is not assigned to employee {requester_id}")
    ticket_id = await _next_id(
        db, "SELECT MAX(CAST(substr(ticket_id, 3) AS INTEGER)) AS n FROM tickets", "T-", 3001
    )
    due_at = _plus_hours(NOW, await _resolution_hours(db, priority))
    await db.execute(
        f"INSERT INTO tickets ({TICKET_COLUMNS}) "
        "VALUES (?, ?, NULL, ?, ?, 'open', ?, ?, ?, ?, ?, NULL, NULL)",
        (ticket_id, requester_id, category, priority, subject.strip(), description, asset_id, NOW, due_at),
    )
    return await _ticket(db, ticket_id)


@tool(writes=["tickets"])
async def assign_ticket(db: Db, ticket_id: str, assignee_id: str) -> dict[str, Any]:
    """Assign (or reassign) a ticket to an active IT employee. An 'open' ticket becomes 'in_progress'.

    Args:
        ticket_id: The ticket id.
        assignee_id: The employee id of the IT staff member who will work on it.
    """
    ticket = await _ticket(db, ticket_id)
    _not_finished(ticket, "assign it")
    assignee = await _employee(db, assignee_id)
    if assignee["department_id"] != IT_DEPARTMENT_ID:
        raise ToolError(f"employee {assignee_id} is not in the IT department; tickets go to IT staff only")
    if assignee["status"] != "active":
        raise ToolError(f"employee {assignee_id} is {assignee['status']} and cannot take tickets")
    if ticket["assignee_id"] == assignee_id:
        raise ToolError(f"ticket {ticket_id} is already assigned to {assignee_id}")
    status = "in_progress" if ticket["status"] == "open" else ticket["status"]
    await db.execute(
        "UPDATE tickets SET assignee_id = ?, status = ? WHERE ticket_id = ?", (assignee_id, status, ticket_id)
    )
    return await _ticket(db, ticket_id)


@tool(writes=["tickets"])
async def update_ticket_status(
    db: Db,
    ticket_id: str,
    status: Literal["in_progress", "on_hold", "resolved"],
    resolution: str | None = None,
) -> dict[str, Any]:
    """Move an assigned ticket between in_progress, on_hold and resolved (resolved -> in_progress reopens it).

    Args:
        ticket_id: The ticket id.
        status: The new status.
        resolution: How the problem was solved; required when, and only when, status is 'resolved'.
    """
    ticket = await _ticket(db, ticket_id)
    current = ticket["status"]
    if current == "open":
        raise ToolError(f"ticket {ticket_id} is open and unassigned; assign it before changing its status")
    if current == "closed":
        raise ToolError(f"ticket {ticket_id} is closed; closed tickets cannot change")
    if current == status:
        raise ToolError(f"ticket {ticket_id} is already {status}")
    if status not in TRANSITIONS[current]:
        allowed = ", ".join(f"'{s}'" for s in TRANSITIONS[current])
        raise ToolError(f"cannot move ticket {ticket_id} from '{current}' to '{status}' (allowed: {allowed})")
    if status == "resolved":
        if resolution is None or not resolution.strip():
            raise ToolError("a resolution is required to resolve a ticket")
        await db.execute(
            "UPDATE tickets SET status = 'resolved', resolved_at = ?, resolution = ? WHERE ticket_id = ?",
            (NOW, resolution.strip(), ticket_id),
        )
    else:
        if resolution is not None:
            raise ToolError("a resolution is only accepted when status is 'resolved'")
        await db.execute(
            "UPDATE tickets SET status = ?, resolved_at = NULL, resolution = NULL WHERE ticket_id = ?",
            (status, ticket_id),
        )
    return await _ticket(db, ticket_id)


@tool(writes=["tickets"])
async def change_ticket_priority(db: Db, ticket_id: str, priority: Priority) -> dict[str, Any]:
    """Change an unresolved ticket's priority; its due time is recomputed from its creation time.

    Args:
        ticket_id: The ticket id.
        priority: The new priority.
    """
    ticket = await _ticket(db, ticket_id)
    _not_finished(ticket, "change its priority")
    if ticket["priority"] == priority:
        raise ToolError(f"ticket {ticket_id} already has priority '{priority}'")
    due_at = _plus_hours(ticket["created_at"], await _resolution_hours(db, priority))
    await db.execute(
        "UPDATE tickets SET priority = ?, due_at = ? WHERE ticket_id = ?", (priority, due_at, ticket_id)
    )
    return await _ticket(db, ticket_id)


@tool(writes=["tickets"])
async def close_ticket(db: Db, ticket_id: str, employee_id: str) -> dict[str, Any]:
    """Close a resolved ticket, on the word of its requester or the requester's manager.

    Args:
        ticket_id: The ticket id.
        employee_id: The employee id of the active person confirming the fix (requester or their manager).
    """
    ticket = await _ticket(db, ticket_id)
    await _active_employee(db, employee_id)
    if ticket["status"] == "closed":
        raise ToolError(f"ticket {ticket_id} is already closed")
    if ticket["status"] != "resolved":
        raise ToolError(f"only resolved tickets can be closed; ticket {ticket_id} is {ticket['status']}")
    requester = await _employee(db, ticket["requester_id"])
    if employee_id not in (requester["employee_id"], requester["manager_id"]):
        raise ToolError(
            f"employee {employee_id} is neither the requester of ticket {ticket_id} "
            "nor the requester's manager"
        )
    await db.execute("UPDATE tickets SET status = 'closed' WHERE ticket_id = ?", (ticket_id,))
    return await _ticket(db, ticket_id)


@tool(writes=["ticket_comments"])
async def add_ticket_comment(
    db: Db, ticket_id: str, author_id: str, body: str, is_internal: bool = False
) -> dict[str, Any]:
    """Add a comment to a ticket that is not closed. Internal notes may only be written by IT staff.

    Args:
        ticket_id: The ticket id.
        author_id: The employee id of the author: the requester, the requester's manager, or IT staff.
        body: The comment text.
        is_internal: True for an IT-internal note the requester does not see.
    """
    ticket = await _ticket(db, ticket_id)
    if ticket["status"] == "closed":
        raise ToolError(f"ticket {ticket_id} is closed; comments are no longer accepted")
    author = await _active_employee(db, author_id)
    requester = await _employee(db, ticket["requester_id"])
    in_it = author["department_id"] == IT_DEPARTMENT_ID
    if not in_it and author_id not in (requester["employee_id"], requester["manager_id"]):
        raise ToolError(
            f"employee {author_id} may not comment on ticket {ticket_id}: "
            "only the requester, the requester's manager or IT staff may"
        )
    if is_internal and not in_it:
        raise ToolError("only IT staff may write internal notes")
    if not body.strip():
        raise ToolError("body must not be empty")
    comment_id = await _next_id(
        db, "SELECT MAX(CAST(substr(comment_id, 3) AS INTEGER)) AS n FROM ticket_comments", "C-", 5001
    )
    await db.execute(
        "INSERT INTO ticket_comments (comment_id, ticket_id, author_id, body, is_internal, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (comment_id, ticket_id, author_id, body.strip(), int(is_internal), NOW),
    )
    row = await db.fetch_one(
        "SELECT comment_id, ticket_id, author_id, body, is_internal, created_at FROM ticket_comments "
        "WHERE comment_id = ?",
        (comment_id,),
    )
    assert row is not None
    return row


# ---------------------------------------------------------------- write tools: assets and licenses


@tool(writes=["assets"])
async def assign_asset(db: Db, asset_id: str, employee_id: str) -> dict[str, Any]:
    """Hand an in-stock asset to an active employee (at most one laptop and one phone each).

    Args:
        asset_id: The asset id; it must be 'in_stock'.
        employee_id: The employee id of the new holder.
    """
    asset = await _asset(db, asset_id)
    await _active_employee(db, employee_id)
    if asset["status"] == "assigned":
        raise ToolError(
            f"asset {asset_id} is already assigned to {asset['assigned_to']}; it must be returned first"
        )
    if asset["status"] != "in_stock":
        raise ToolError(f"asset {asset_id} is {asset['status']} and cannot be assigned")
    if asset["asset_type"] in ONE_PER_EMPLOYEE:
        held = await db.fetch_one(
            "SELECT asset_id FROM assets WHERE assigned_to = ? AND asset_type = ?",
            (employee_id, asset["asset_type"]),
        )
        if held is not None:
            raise ToolError(
                f"employee {employee_id} already has a {asset['asset_type']} ({held['asset_id']}); "
                "return it before assigning another"
            )
    await db.execute(
        "UPDATE assets SET status = 'assigned', assigned_to = ? WHERE asset_id = ?", (employee_id, asset_id)
    )
    return await _asset(db, asset_id)


@tool(writes=["assets"])
async def return_asset(db: Db, asset_id: str, condition: Literal["working", "damaged"]) -> dict[str, Any]:
    """Take back an assigned asset: a working one goes back in stock, a damaged one to repair.

    Args:
        asset_id: The asset id; it must be 'assigned'.
        condition: The state the asset came back in.
    """
    asset = await _asset(db, asset_id)
    if asset["status"] != "assigned":
        raise ToolError(f"asset {asset_id} is {asset['status']}, not assigned to anyone")
    status = "in_stock" if condition == "working" else "in_repair"
    await db.execute(
        "UPDATE assets SET status = ?, assigned_to = NULL WHERE asset_id = ?", (status, asset_id)
    )
    return await _asset(db, asset_id)


@tool(writes=["licenses", "license_assignments"])
async def assign_licenses(db: Db, employee_id: str, license_ids: list[str]) -> dict[str, Any]:
    """Give an active employee a seat on each listed license: all of them, or none if any cannot be given.

    Args:
        employee_id: The employee id.
        license_ids: The license ids, such as ['L-03', 'L-08'].
    """
    if not license_ids:
        raise ToolError("license_ids must name at least one license")
    if len(set(license_ids)) != len(license_ids):
        raise ToolError("license_ids lists a license more than once")
    await _active_employee(db, employee_id)
    for license_id in license_ids:
        license_ = await _license(db, license_id)
        label = f"license {license_id} ({license_['product']})"
        if license_["expires_on"] < TODAY:
            raise ToolError(f"{label} expired on {license_['expires_on']}")
        held = await db.fetch_one(
            "SELECT 1 AS held FROM license_assignments WHERE license_id = ? AND employee_id = ?",
            (license_id, employee_id),
        )
        if held is not None:
            raise ToolError(f"employee {employee_id} already holds {label}")
        if license_["seats_used"] >= license_["seat_limit"]:
            raise ToolError(
                f"{label} has no free seats ({license_['seats_used']} of {license_['seat_limit']} used)"
            )
    for license_id in license_ids:
        await db.execute(
            "INSERT INTO license_assignments (license_id, employee_id) VALUES (?, ?)",
            (license_id, employee_id),
        )
        await db.execute(
            "UPDATE licenses SET seats_used = seats_used + 1 WHERE license_id = ?", (license_id,)
        )
    return {"employee_id": employee_id, "licenses": [await _license(db, lid) for lid in license_ids]}


@tool(writes=["licenses", "license_assignments"])
async def revoke_license(db: Db, license_id: str, employee_id: str) -> dict[str, Any]:
    """Take a license seat away from an employee, freeing it for someone else.

    Args:
        license_id: The license id.
        employee_id: The employee id holding the seat.
    """
    license_ = await _license(db, license_id)
    await _employee(db, employee_id)
    held = await db.fetch_one(
        "SELECT 1 AS held FROM license_assignments WHERE license_id = ? AND employee_id = ?",
        (license_id, employee_id),
    )
    if held is None:
        raise ToolError(f"employee {employee_id} does not hold license {license_id} ({license_['product']})")
    await db.execute(
        "DELETE FROM license_assignments WHERE license_id = ? AND employee_id = ?", (license_id, employee_id)
    )
    await db.execute("UPDATE licenses SET seats_used = seats_used - 1 WHERE license_id = ?", (license_id,))
    return await _license(db, license_id)
