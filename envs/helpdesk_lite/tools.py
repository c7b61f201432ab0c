"""Tools of a small helpdesk. The clock is frozen at NOW so the same calls give the same state."""

from __future__ import annotations

from typing import Any, Literal

from envforge.server import Db, ToolError, tool

NOW = "2025-03-14T09:00:00"
Priority = Literal["low", "normal", "urgent"]
TICKET = "ticket_id, subject, priority, status, agent_id, created_at, resolution"


@tool
async def get_ticket(db: Db, ticket_id: str) -> dict[str, Any]:
    """Get a ticket with its status, priority and assignee.

    Args:
        ticket_id: Ticket id such as 'HT-101'.
    """
    return await db.require_one(
        f"SELECT {TICKET} FROM tickets WHERE ticket_id = ?", (ticket_id,), f"ticket {ticket_id} not found"
    )


@tool
async def list_open_tickets(db: Db, priority: Priority | None = None) -> list[dict[str, Any]]:
    """Open tickets, oldest first, optionally of one priority.

    Args:
        priority: Only tickets of this priority.
    """
    sql = f"SELECT {TICKET} FROM tickets WHERE status = 'open'"
    if priority is None:
        return await db.fetch_all(sql + " ORDER BY created_at, ticket_id")
    return await db.fetch_all(sql + " AND priority = ? ORDER BY created_at, ticket_id", (priority,))


@tool
async def get_agent(db: Db, agent_id: str) -> dict[str, Any]:
    """Look up a support agent and how many open tickets they hold.

    Args:
        agent_id: Agent id such as 'AG-1'.
    """
    agent = await db.require_one(
        "SELECT agent_id, name, on_duty FROM agents WHERE agent_id = ?", (agent_id,), "agent not found"
    )
    rows = await db.fetch_all(
        "SELECT COUNT(*) AS n FROM tickets WHERE agent_id = ? AND status = 'open'", (agent_id,)
    )
    return {**agent, "open_tickets": rows[0]["n"]}


async def _open_ticket(db: Db, ticket_id: str) -> dict[str, Any]:
    ticket = await get_ticket(db, ticket_id)
    if ticket["status"] != "open":
        raise ToolError(f"ticket {ticket_id} is already resolved")
    return ticket


@tool(writes=["tickets"])
async def assign_ticket(db: Db, ticket_id: str, agent_id: str) -> dict[str, Any]:
    """Assign an open ticket to an on-duty agent.

    Args:
        ticket_id: The ticket id.
        agent_id: The agent to assign.
    """
    ticket = await _open_ticket(db, ticket_id)
    agent = await get_agent(db, agent_id)
    if not agent["on_duty"]:
        raise ToolError(f"agent {agent_id} is not on duty")
    if ticket["agent_id"] == agent_id:
        raise ToolError(f"ticket {ticket_id} is already assigned to {agent_id}")
    await db.execute("UPDATE tickets SET agent_id = ? WHERE ticket_id = ?", (agent_id, ticket_id))
    return {**ticket, "agent_id": agent_id}


@tool(writes=["comments"])
async def add_comment(db: Db, ticket_id: str, body: str) -> dict[str, Any]:
    """Add a comment to a ticket that is not resolved.

    Args:
        ticket_id: The ticket id.
        body: The comment text.
    """
    await _open_ticket(db, ticket_id)
    if not body.strip():
        raise ToolError("the comment is empty")
    n = (await db.fetch_all("SELECT MAX(CAST(substr(comment_id, 4) AS INTEGER)) AS n FROM comments"))[0][
        "n"
    ] or 0
    comment_id = f"CM-{n + 1}"
    await db.execute(
        "INSERT INTO comments (comment_id, ticket_id, body, created_at) VALUES (?, ?, ?, ?)",
        (comment_id, ticket_id, body, NOW),
    )
    return {"comment_id": comment_id, "ticket_id": ticket_id, "body": body, "created_at": NOW}


@tool(writes=["tickets"])
async def resolve_ticket(db: Db, ticket_id: str, resolution: str) -> dict[str, Any]:
    """Resolve an assigned open ticket with a resolution note.

    Args:
        ticket_id: The ticket id.
        resolution: How it was resolved.
    """
    ticket = await _open_ticket(db, ticket_id)
    if ticket["agent_id"] is None:
        raise ToolError(f"ticket {ticket_id} has no assignee; assign it first")
    if not resolution.strip():
        raise ToolError("the resolution is empty")
    await db.execute(
        "UPDATE tickets SET status = 'resolved', resolution = ? WHERE ticket_id = ?", (resolution, ticket_id)
    )
    return {**ticket, "status": "resolved", "resolution": resolution}
