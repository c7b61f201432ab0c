"""The bundled it_tickets env: it loads, and every write tool both succeeds and refuses as its policy says.

Every call goes through `Fleet.call` against the real seed database, so these tests pin the ids and
texts that task synthesis and agents will see. A refusal must leave the state hash untouched; a
success must change it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from envforge.server import Environment, Fleet, ToolResult, load_env

from support.paths import ENVS

ENV_DIR = ENVS / "it_tickets"
NOW = "2025-03-14T09:00:00"


@pytest.fixture(scope="module")
def env() -> Environment:
    return load_env(ENV_DIR)


@dataclass
class Desk:
    """One episode of the env, with calls that check what a write did to the state hash."""

    fleet: Fleet
    episode_id: str

    async def state_hash(self) -> str:
        return (await self.fleet.export(self.episode_id))[1]

    async def call(self, tool: str, **arguments: Any) -> ToolResult:
        return await self.fleet.call(self.episode_id, tool, arguments)

    async def read(self, tool: str, **arguments: Any) -> Any:
        result = await self.call(tool, **arguments)
        assert not result.is_error, result.text
        return json.loads(result.text)

    async def write(self, tool: str, **arguments: Any) -> Any:
        before = await self.state_hash()
        result = await self.call(tool, **arguments)
        assert not result.is_error, result.text
        assert await self.state_hash() != before, f"{tool} succeeded but changed nothing"
        return json.loads(result.text)

    async def refused(self, tool: str, **arguments: Any) -> str:
        before = await self.state_hash()
        result = await self.call(tool, **arguments)
        assert result.is_error, f"{tool} should have been refused: {result.text}"
        assert await self.state_hash() == before, f"refused {tool} changed the state"
        return result.text


async def _open_desk(env: Environment) -> AsyncIterator[Desk]:
    fleet = Fleet([env])
    try:
        episode = await fleet.create_episode(env.name)
        yield Desk(fleet, episode.id)
    finally:
        await fleet.aclose()


@pytest.fixture
async def desk(env: Environment) -> AsyncIterator[Desk]:
    async for d in _open_desk(env):
        yield d


# ---------------------------------------------------------------- shape


def test_env_shape(env: Environment) -> None:
    writers = {name for name, spec in env.tools.items() if not spec.read_only}
    assert env.name == "it_tickets"
    assert len(env.tools) >= 10
    assert len(writers) >= 5
    seed = env.seed_state()
    assert sum(len(rows) for rows in seed.values()) >= 150
    assert {"employees", "assets", "licenses", "license_assignments", "tickets", "ticket_comments"} <= set(
        seed
    )
    table_names = {t.name for t in env.tables}
    for name in writers:
        assert set(env.tools[name].writes) <= table_names, name
    policy_lines = env.policy.strip().splitlines()
    assert 25 <= len(policy_lines) <= 60


def test_seed_is_consistent(env: Environment) -> None:
    seed = env.seed_state()
    held = {}
    for row in seed["license_assignments"]:
        held[row["license_id"]] = held.get(row["license_id"], 0) + 1
    for lic in seed["licenses"]:
        assert lic["seats_used"] == held.get(lic["license_id"], 0), lic["license_id"]
    it_staff = {e["employee_id"] for e in seed["employees"] if e["department_id"] == "D-20"}
    assert all(t["assignee_id"] in it_staff for t in seed["tickets"] if t["assignee_id"])
    statuses = {t["status"] for t in seed["tickets"]}
    assert statuses == {"open", "in_progress", "on_hold", "resolved", "closed"}


def test_list_and_literal_parameters_are_typed(env: Environment) -> None:
    schema = env.tools["assign_licenses"].input_schema["properties"]["license_ids"]
    assert schema["type"] == "array" and schema["items"] == {"type": "string"}
    priority = env.tools["change_ticket_priority"].input_schema["properties"]["priority"]
    assert priority["enum"] == ["low", "medium", "high", "critical"]


# ---------------------------------------------------------------- reads


async def test_reads_feed_ids_to_writes(desk: Desk) -> None:
    found = await desk.read("find_employees", email="Liam.Xu@brightwell.example")
    assert [e["employee_id"] for e in found] == ["E-1065"]
    employee = await desk.read("get_employee", employee_id="E-1020")
    assert employee["department_name"] == "Sales"
    assert {a["asset_id"] for a in employee["assets"]} == {"A-222", "A-224", "A-239", "A-256"}
    assert [lic["license_id"] for lic in employee["licenses"]] == ["L-02"]
    ticket = await desk.read("get_ticket", ticket_id="T-3064")
    assert ticket["requester_id"] == "E-1002" and ticket["assignee_id"] == "E-1054"
    assert ticket["sla_breached"] is True  # due 2025-03-13T08:35, still in progress at NOW
    opened = await desk.read("list_tickets", status="open", priority="high")
    assert [t["ticket_id"] for t in opened] == ["T-3061", "T-3063", "T-3067", "T-3068"]
    stock = await desk.read("list_assets", asset_type="laptop", status="in_stock")
    assert [a["asset_id"] for a in stock] == ["A-207", "A-218", "A-220", "A-261"]
    autocad = await desk.read("get_license", license_id="L-09")
    assert autocad["expired"] is True and autocad["seats_available"] == 1
    heads = {d["department_id"]: d["manager_id"] for d in await desk.read("list_departments")}
    assert heads["D-20"] == "E-1013"
    text = (await desk.call("get_ticket", ticket_id="T-9999")).text
    assert text == "Error: ticket T-9999 not found"


async def test_bad_enum_value_is_rejected_before_the_tool_runs(desk: Desk) -> None:
    text = await desk.refused("change_ticket_priority", ticket_id="T-3064", priority="urgent")
    assert text.startswith("Error: argument 'priority'")


# ---------------------------------------------------------------- write tools: successes


async def test_create_ticket(desk: Desk) -> None:
    ticket = await desk.write(
        "create_ticket",
        requester_id="E-1020",
        category="hardware",
        priority="high",
        subject="Laptop fan very loud",
        description="The fan runs at full speed all day.",
        asset_id="A-224",
    )
    assert ticket["ticket_id"] == "T-3073"
    assert ticket["status"] == "open" and ticket["assignee_id"] is None
    assert ticket["created_at"] == NOW and ticket["due_at"] == "2025-03-15T09:00:00"
    second = await desk.write(
        "create_ticket",
        requester_id="E-1020",
        category="access",
        priority="low",
        subject="Need access to Tableau dashboards",
        description="For the quarterly pipeline review.",
    )
    assert second["ticket_id"] == "T-3074" and second["due_at"] == "2025-03-21T09:00:00"


async def test_assign_ticket(desk: Desk) -> None:
    ticket = await desk.write("assign_ticket", ticket_id="T-3063", assignee_id="E-1051")
    assert (ticket["status"], ticket["assignee_id"]) == ("in_progress", "E-1051")
    on_hold = await desk.write("assign_ticket", ticket_id="T-3065", assignee_id="E-1039")
    assert (on_hold["status"], on_hold["assignee_id"]) == ("on_hold", "E-1039")


async def test_update_ticket_status(desk: Desk) -> None:
    held = await desk.write("update_ticket_status", ticket_id="T-3064", status="on_hold")
    assert held["status"] == "on_hold"
    resolved = await desk.write(
        "update_ticket_status", ticket_id="T-3064", status="resolved", resolution="Re-registered the add-in."
    )
    assert resolved["status"] == "resolved"
    assert (resolved["resolved_at"], resolved["resolution"]) == (NOW, "Re-registered the add-in.")
    reopened = await desk.write("update_ticket_status", ticket_id="T-3046", status="in_progress")
    assert (reopened["status"], reopened["resolved_at"], reopened["resolution"]) == (
        "in_progress",
        None,
        None,
    )


async def test_change_ticket_priority(desk: Desk) -> None:
    ticket = await desk.write("change_ticket_priority", ticket_id="T-3064", priority="critical")
    assert ticket["priority"] == "critical"
    assert ticket["due_at"] == "2025-03-10T16:35:00"  # created 2025-03-10T08:35 + 8 h


async def test_close_ticket(desk: Desk) -> None:
    by_manager = await desk.write("close_ticket", ticket_id="T-3046", employee_id="E-1005")
    assert by_manager["status"] == "closed" and by_manager["resolution"]
    by_requester = await desk.write("close_ticket", ticket_id="T-3049", employee_id="E-1005")
    assert by_requester["status"] == "closed"


async def test_add_ticket_comment(desk: Desk) -> None:
    comment = await desk.write(
        "add_ticket_comment", ticket_id="T-3064", author_id="E-1002", body="Still broken after the update."
    )
    assert comment == {
        "comment_id": "C-5095",
        "ticket_id": "T-3064",
        "author_id": "E-1002",
        "body": "Still broken after the update.",
        "is_internal": 0,
        "created_at": NOW,
    }
    note = await desk.write(
        "add_ticket_comment",
        ticket_id="T-3064",
        author_id="E-1054",
        body="Vendor patch pending.",
        is_internal=True,
    )
    assert (note["comment_id"], note["is_internal"]) == ("C-5096", 1)
    ticket = await desk.read("get_ticket", ticket_id="T-3064")
    assert [c["comment_id"] for c in ticket["comments"]][-2:] == ["C-5095", "C-5096"]


async def test_assign_and_return_asset(desk: Desk) -> None:
    asset = await desk.write("assign_asset", asset_id="A-207", employee_id="E-1065")
    assert (asset["status"], asset["assigned_to"]) == ("assigned", "E-1065")
    returned = await desk.write("return_asset", asset_id="A-224", condition="working")
    assert (returned["status"], returned["assigned_to"]) == ("in_stock", None)
    damaged = await desk.write("return_asset", asset_id="A-256", condition="damaged")
    assert (damaged["status"], damaged["assigned_to"]) == ("in_repair", None)
    # with the old laptop returned, E-1020 may take another one
    replacement = await desk.write("assign_asset", asset_id="A-218", employee_id="E-1020")
    assert replacement["assigned_to"] == "E-1020"


async def test_assign_and_revoke_licenses(desk: Desk) -> None:
    result = await desk.write("assign_licenses", employee_id="E-1066", license_ids=["L-03", "L-08"])
    assert result["employee_id"] == "E-1066"
    assert [(lic["license_id"], lic["seats_used"]) for lic in result["licenses"]] == [
        ("L-03", 22),
        ("L-08", 10),
    ]
    employee = await desk.read("get_employee", employee_id="E-1066")
    assert [lic["license_id"] for lic in employee["licenses"]] == ["L-03", "L-08"]
    # Salesforce is full: free E-1020's seat, then the new hire can have it
    freed = await desk.write("revoke_license", license_id="L-02", employee_id="E-1020")
    assert (freed["seats_used"], freed["seat_limit"]) == (9, 10)
    given = await desk.write("assign_licenses", employee_id="E-1065", license_ids=["L-02"])
    assert given["licenses"][0]["seats_used"] == 10


# ---------------------------------------------------------------- write tools: refusals


REFUSALS = [
    (
        "create_ticket",
        {
            "requester_id": "E-1026",
            "category": "account",
            "priority": "low",
            "subject": "x",
            "description": "y",
        },
        "Error: employee E-1026 is terminated, not active",
    ),
    (
        "create_ticket",
        {
            "requester_id": "E-1020",
            "category": "hardware",
            "priority": "low",
            "subject": "Laptop",
            "description": "z",
            "asset_id": "A-207",
        },
        "Error: asset A-207 is not assigned to employee E-1020",
    ),
    (
        "assign_ticket",
        {"ticket_id": "T-3063", "assignee_id": "E-1020"},
        "Error: employee E-1020 is not in the IT department; tickets go to IT staff only",
    ),
    (
        "assign_ticket",
        {"ticket_id": "T-3063", "assignee_id": "E-1060"},
        "Error: employee E-1060 is on_leave and cannot take tickets",
    ),
    (
        "assign_ticket",
        {"ticket_id": "T-3046", "assignee_id": "E-1051"},
        "Error: ticket T-3046 is resolved; cannot assign it",
    ),
    (
        "assign_ticket",
        {"ticket_id": "T-3064", "assignee_id": "E-1054"},
        "Error: ticket T-3064 is already assigned to E-1054",
    ),
    (
        "update_ticket_status",
        {"ticket_id": "T-3061", "status": "in_progress"},
        "Error: ticket T-3061 is open and unassigned; assign it before changing its status",
    ),
    (
        "update_ticket_status",
        {"ticket_id": "T-3064", "status": "resolved"},
        "Error: a resolution is required to resolve a ticket",
    ),
    (
        "update_ticket_status",
        {"ticket_id": "T-3046", "status": "on_hold"},
        "Error: cannot move ticket T-3046 from 'resolved' to 'on_hold' (allowed: 'in_progress')",
    ),
    (
        "update_ticket_status",
        {"ticket_id": "T-3001", "status": "in_progress"},
        "Error: ticket T-3001 is closed; closed tickets cannot change",
    ),
    (
        "change_ticket_priority",
        {"ticket_id": "T-3064", "priority": "medium"},
        "Error: ticket T-3064 already has priority 'medium'",
    ),
    (
        "change_ticket_priority",
        {"ticket_id": "T-3001", "priority": "high"},
        "Error: ticket T-3001 is closed; cannot change its priority",
    ),
    (
        "close_ticket",
        {"ticket_id": "T-3064", "employee_id": "E-1002"},
        "Error: only resolved tickets can be closed; ticket T-3064 is in_progress",
    ),
    (
        "close_ticket",
        {"ticket_id": "T-3046", "employee_id": "E-1039"},
        "Error: employee E-1039 is neither the requester of ticket T-3046 nor the requester's manager",
    ),
    (
        "close_ticket",
        {"ticket_id": "T-3001", "employee_id": "E-1053"},
        "Error: ticket T-3001 is already closed",
    ),
    (
        "add_ticket_comment",
        {"ticket_id": "T-3001", "author_id": "E-1053", "body": "Thanks"},
        "Error: ticket T-3001 is closed; comments are no longer accepted",
    ),
    (
        "add_ticket_comment",
        {"ticket_id": "T-3064", "author_id": "E-1020", "body": "Me too"},
        "Error: employee E-1020 may not comment on ticket T-3064: "
        "only the requester, the requester's manager or IT staff may",
    ),
    (
        "add_ticket_comment",
        {"ticket_id": "T-3064", "author_id": "E-1002", "body": "Hidden", "is_internal": True},
        "Error: only IT staff may write internal notes",
    ),
    (
        "assign_asset",
        {"asset_id": "A-224", "employee_id": "E-1065"},
        "Error: asset A-224 is already assigned to E-1020; it must be returned first",
    ),
    (
        "assign_asset",
        {"asset_id": "A-207", "employee_id": "E-1020"},
        "Error: employee E-1020 already has a laptop (A-224); return it before assigning another",
    ),
    (
        "assign_asset",
        {"asset_id": "A-204", "employee_id": "E-1065"},
        "Error: asset A-204 is in_repair and cannot be assigned",
    ),
    (
        "assign_asset",
        {"asset_id": "A-207", "employee_id": "E-1026"},
        "Error: employee E-1026 is terminated, not active",
    ),
    (
        "return_asset",
        {"asset_id": "A-207", "condition": "working"},
        "Error: asset A-207 is in_stock, not assigned to anyone",
    ),
    (
        "return_asset",
        {"asset_id": "A-201", "condition": "damaged"},
        "Error: asset A-201 is retired, not assigned to anyone",
    ),
    (
        "assign_licenses",
        {"employee_id": "E-1065", "license_ids": ["L-03", "L-02"]},
        "Error: license L-02 (Salesforce Sales Cloud) has no free seats (10 of 10 used)",
    ),
    (
        "assign_licenses",
        {"employee_id": "E-1065", "license_ids": ["L-09"]},
        "Error: license L-09 (Autodesk AutoCAD) expired on 2025-02-28",
    ),
    (
        "assign_licenses",
        {"employee_id": "E-1020", "license_ids": ["L-02"]},
        "Error: employee E-1020 already holds license L-02 (Salesforce Sales Cloud)",
    ),
    (
        "assign_licenses",
        {"employee_id": "E-1065", "license_ids": ["L-03", "L-03"]},
        "Error: license_ids lists a license more than once",
    ),
    (
        "assign_licenses",
        {"employee_id": "E-1065", "license_ids": ["L-99"]},
        "Error: license L-99 not found",
    ),
    (
        "revoke_license",
        {"license_id": "L-02", "employee_id": "E-1065"},
        "Error: employee E-1065 does not hold license L-02 (Salesforce Sales Cloud)",
    ),
]


@pytest.mark.parametrize(("tool", "arguments", "expected"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_refusals_leave_state_unchanged(
    desk: Desk, tool: str, arguments: dict[str, Any], expected: str
) -> None:
    assert await desk.refused(tool, **arguments) == expected


def test_every_write_tool_has_a_refusal_case(env: Environment) -> None:
    writers = {name for name, spec in env.tools.items() if not spec.read_only}
    assert writers == {tool for tool, _, _ in REFUSALS}


async def test_all_or_nothing_license_grant_keeps_earlier_seats(desk: Desk) -> None:
    await desk.refused("assign_licenses", employee_id="E-1065", license_ids=["L-03", "L-02"])
    jira = await desk.read("get_license", license_id="L-03")
    assert jira["seats_used"] == 21
    assert "E-1065" not in {h["employee_id"] for h in jira["holders"]}


# ---------------------------------------------------------------- determinism


SCRIPT: list[tuple[str, dict[str, Any]]] = [
    (
        "create_ticket",
        {
            "requester_id": "E-1066",
            "category": "access",
            "priority": "medium",
            "subject": "Jira access",
            "description": "New starter needs Jira.",
        },
    ),
    ("assign_ticket", {"ticket_id": "T-3073", "assignee_id": "E-1024"}),
    ("assign_licenses", {"employee_id": "E-1066", "license_ids": ["L-03"]}),
    ("add_ticket_comment", {"ticket_id": "T-3073", "author_id": "E-1024", "body": "Seat assigned."}),
    (
        "update_ticket_status",
        {"ticket_id": "T-3073", "status": "resolved", "resolution": "Jira seat granted."},
    ),
    ("close_ticket", {"ticket_id": "T-3073", "employee_id": "E-1005"}),
    ("assign_asset", {"asset_id": "A-261", "employee_id": "E-1066"}),
    ("assign_licenses", {"employee_id": "E-1066", "license_ids": ["L-04"]}),  # refused: no free seat
]


async def test_same_calls_give_same_state(env: Environment) -> None:
    hashes, texts = [], []
    for _ in range(2):
        async for desk in _open_desk(env):
            outputs = [(await desk.call(tool, **args)).text for tool, args in SCRIPT]
            hashes.append(await desk.state_hash())
            texts.append(outputs)
    assert hashes[0] == hashes[1]
    assert texts[0] == texts[1]
    assert hashes[0] != env.seed_hash()
    assert texts[0][-1].startswith("Error: license L-04")
    assert not any(t.startswith("Error") for t in texts[0][:-1])
