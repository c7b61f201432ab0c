"""The bundled flight_booking env: it loads, its write tools enforce their rules, and it is deterministic.

Every write tool is exercised through `Fleet.call` on real SQLite: a success must change the state
(and only tables the tool declares in `writes`), and a refusal must show the exact message and
leave the state hash untouched. Ids refer to the committed seed.json; today is 2025-06-10.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from envforge.server import Environment, Fleet, State, load_env

from support.paths import ENVS

ENV_DIR = ENVS / "flight_booking"


@pytest.fixture(scope="module")
def env() -> Environment:
    return load_env(ENV_DIR)


@pytest.fixture
async def fleet(env: Environment) -> AsyncIterator[Fleet]:
    f = Fleet([env])
    yield f
    await f.aclose()


@pytest.fixture
async def ep(fleet: Fleet) -> str:
    return (await fleet.create_episode("flight_booking")).id


def _row(state: State, table: str, **match: Any) -> dict[str, Any]:
    rows = [r for r in state[table] if all(r[k] == v for k, v in match.items())]
    assert len(rows) == 1, (table, match, rows)
    return rows[0]


async def _ok(fleet: Fleet, ep: str, tool: str, args: dict[str, Any]) -> tuple[Any, State, State]:
    """Call a write tool that must succeed; returns (result, state before, state after)."""
    before, before_hash = await fleet.export(ep)
    result = await fleet.call(ep, tool, args)
    assert not result.is_error, result.text
    after, after_hash = await fleet.export(ep)
    assert after_hash != before_hash
    changed = {t for t in after if after[t] != before[t]}
    assert changed <= set(fleet.env("flight_booking").tools[tool].writes), (tool, changed)
    return json.loads(result.text), before, after


async def _refused(fleet: Fleet, ep: str, tool: str, args: dict[str, Any], message: str) -> None:
    _, before_hash = await fleet.export(ep)
    result = await fleet.call(ep, tool, args)
    assert result.is_error
    assert result.text == f"Error: {message}"
    _, after_hash = await fleet.export(ep)
    assert after_hash == before_hash


# --- shape ----------------------------------------------------------------------------------


def test_env_shape(env: Environment) -> None:
    assert env.name == "flight_booking"
    writes = [t for t in env.tools.values() if t.writes]
    assert len(env.tools) >= 10
    assert len(writes) >= 5
    assert sum(len(rows) for rows in env.seed_state().values()) >= 150
    assert len(env.tables) >= 4
    assert env.tools["check_in_passengers"].input_schema["properties"]["passenger_ids"]["items"] == {
        "type": "string"
    }
    assert env.tools["upgrade_cabin"].input_schema["properties"]["cabin"]["enum"] == [
        "economy",
        "premium_economy",
        "business",
    ]
    table_names = {t.name for t in env.tables}
    for spec in writes:
        assert set(spec.writes) <= table_names, spec.name


async def test_read_tools_return_ids_under_column_names(fleet: Fleet, ep: str) -> None:
    member = json.loads((await fleet.call(ep, "find_member", {"email": "Jonas.Silva@example.com"})).text)
    assert member["member_id"] == "M-1013"
    profile = json.loads((await fleet.call(ep, "get_member", {"member_id": "M-1013"})).text)
    assert [p["payment_method_id"] for p in profile["payment_methods"]] == ["PM-2018"]
    assert "R-5031" in [r["reservation_id"] for r in profile["reservations"]]
    found = json.loads(
        (
            await fleet.call(
                ep, "search_flights", {"origin": "JFK", "destination": "LAX", "departure_date": "2025-06-17"}
            )
        ).text
    )
    assert [f["flight_id"] for f in found] == ["FL-213", "FL-214"]
    assert found[0]["cabins"][0] == {"cabin": "economy", "fare": 289.0, "seats_available": 0}
    missing = await fleet.call(ep, "get_reservation", {"reservation_id": "R-1"})
    assert missing.is_error and missing.text == "Error: reservation R-1 not found"


# --- book_reservation -------------------------------------------------------------------------

TWO_PASSENGERS = [
    {"first_name": "Jonas", "last_name": "Silva", "date_of_birth": "1970-04-10"},
    {"first_name": "Marta", "last_name": "Silva", "date_of_birth": "1974-02-19"},
]


async def test_book_reservation_splits_credit_and_card(fleet: Fleet, ep: str) -> None:
    args = {
        "member_id": "M-1013",
        "flight_id": "FL-214",
        "cabin": "economy",
        "passengers": TWO_PASSENGERS,
        "payment_method_id": "PM-2018",
        "travel_credit_amount": 50,
    }
    res, before, after = await _ok(fleet, ep, "book_reservation", args)
    assert res["reservation_id"] == "R-5059"
    assert res["status"] == "confirmed" and res["fare_per_passenger"] == 312.0 and res["amount_paid"] == 624.0
    assert [p["passenger_id"] for p in res["passengers"]] == ["P-7111", "P-7112"]
    assert [(p["source"], p["amount"]) for p in res["payments"]] == [("travel_credit", 50.0), ("card", 574.0)]
    assert _row(after, "members", member_id="M-1013")["travel_credit"] == 0.0
    sold = [
        _row(s, "flight_cabins", flight_id="FL-214", cabin="economy")["seats_sold"] for s in (before, after)
    ]
    assert sold[1] == sold[0] + 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"flight_id": "FL-213"}, "flight FL-213 has 0 economy seat(s) left; 2 needed"),
        ({"flight_id": "FL-207"}, "flight FL-207 is departed; it is closed for sales and changes"),
        ({"flight_id": "FL-294", "cabin": "business"}, "flight FL-294 has no business cabin"),
        (
            {"member_id": "M-1007", "payment_method_id": "PM-2009"},
            "member M-1007 is suspended and cannot make purchases or changes",
        ),
        (
            {"member_id": "M-1003", "payment_method_id": "PM-2004"},
            "payment method PM-2004 expired in 2025-03",
        ),
        ({"payment_method_id": "PM-2024"}, "payment method PM-2024 does not belong to member M-1013"),
        ({"travel_credit_amount": 80.0}, "member M-1013 has 50.00 in travel credit; 80.00 requested"),
        ({"payment_method_id": None}, "624.00 is due: a payment_method_id is required"),
        ({"passengers": []}, "a reservation holds 1 to 6 passengers; 0 given"),
        (
            {"passengers": [{"first_name": "A", "last_name": "B", "date_of_birth": "2025-07-01"}]},
            "date_of_birth 2025-07-01 is not in the past",
        ),
    ],
)
async def test_book_reservation_refusals(fleet: Fleet, ep: str, args: dict[str, Any], message: str) -> None:
    base = {
        "member_id": "M-1013",
        "flight_id": "FL-214",
        "cabin": "economy",
        "passengers": TWO_PASSENGERS,
        "payment_method_id": "PM-2018",
    }
    call = {k: v for k, v in {**base, **args}.items() if v is not None}
    await _refused(fleet, ep, "book_reservation", call, message)


# --- cancel_reservation -----------------------------------------------------------------------


async def test_cancel_reservation_charges_fee_by_cabin_and_tier(fleet: Fleet, ep: str) -> None:
    quote = json.loads(
        (await fleet.call(ep, "quote_cancellation", {"member_id": "M-1013", "reservation_id": "R-5031"})).text
    )
    assert (quote["cancellation_fee"], quote["refund_total"]) == (100.0, 163.0)
    res, before, after = await _ok(
        fleet, ep, "cancel_reservation", {"member_id": "M-1013", "reservation_id": "R-5031"}
    )
    assert res["status"] == "cancelled" and res["cancellation_fee"] == 100.0 and res["refund_total"] == 163.0
    assert _row(after, "payments", payment_id="PAY-9079") == {
        "payment_id": "PAY-9079",
        "reservation_id": "R-5031",
        "kind": "refund",
        "source": "card",
        "payment_method_id": "PM-2018",
        "amount": 163.0,
        "description": "cancellation refund",
    }
    sold = [
        _row(s, "flight_cabins", flight_id="FL-209", cabin="economy")["seats_sold"] for s in (before, after)
    ]
    assert sold[1] == sold[0] - 1


async def test_cancel_reservation_returns_travel_credit(fleet: Fleet, ep: str) -> None:
    # platinum economy: no fee; 150.00 of travel credit goes back to the balance, the rest to the card
    res, _, after = await _ok(
        fleet, ep, "cancel_reservation", {"member_id": "M-1012", "reservation_id": "R-5012"}
    )
    assert res["refund_total"] == 2636.0 and res["amount_paid"] == 0.0
    assert _row(after, "members", member_id="M-1012")["travel_credit"] == 400.75


@pytest.mark.parametrize(
    ("member_id", "reservation_id", "message"),
    [
        ("M-1001", "R-5031", "reservation R-5031 does not belong to member M-1001"),
        (
            "M-1003",
            "R-5043",
            "reservation R-5043 is checked_in; only confirmed reservations can be cancelled",
        ),
        ("M-1017", "R-5035", "reservation R-5035 is flown; only confirmed reservations can be cancelled"),
        ("M-1017", "R-5051", "reservation R-5051 is cancelled; only confirmed reservations can be cancelled"),
        ("M-9999", "R-5031", "member M-9999 not found"),
    ],
)
async def test_cancel_reservation_refusals(
    fleet: Fleet, ep: str, member_id: str, reservation_id: str, message: str
) -> None:
    await _refused(
        fleet, ep, "cancel_reservation", {"member_id": member_id, "reservation_id": reservation_id}, message
    )


# --- change_flight ----------------------------------------------------------------------------


async def test_change_flight_charges_fee_and_fare_difference(fleet: Fleet, ep: str) -> None:
    # basic economy, 3 passengers: 3 x 75.00 fee + 3 x (277.00 - 286.00) = 198.00
    args = {
        "member_id": "M-1017",
        "reservation_id": "R-5054",
        "flight_id": "FL-209",
        "payment_method_id": "PM-2024",
    }
    res, before, after = await _ok(fleet, ep, "change_flight", args)
    assert res["flight_id"] == "FL-209" and res["fare_per_passenger"] == 277.0
    assert res["payments"][-1]["amount"] == 198.0 and res["payments"][-1]["payment_method_id"] == "PM-2024"
    for flight_id, delta in (("FL-210", -3), ("FL-209", 3)):
        sold = [
            _row(s, "flight_cabins", flight_id=flight_id, cabin="economy")["seats_sold"]
            for s in (before, after)
        ]
        assert sold[1] - sold[0] == delta


async def test_change_flight_to_cheaper_fare_returns_credit(fleet: Fleet, ep: str) -> None:
    # platinum, 4 passengers: no fee, 4 x (623.00 - 659.00) = -144.00 back as travel credit
    args = {"member_id": "M-1012", "reservation_id": "R-5012", "flight_id": "FL-290"}
    res, _, after = await _ok(fleet, ep, "change_flight", args)
    assert res["payments"][-1]["kind"] == "refund" and res["payments"][-1]["amount"] == 144.0
    assert _row(after, "members", member_id="M-1012")["travel_credit"] == 394.75


async def test_change_flight_after_airline_cancellation_is_free(fleet: Fleet, ep: str) -> None:
    args = {"member_id": "M-1028", "reservation_id": "R-5049", "flight_id": "FL-270"}
    res, before, after = await _ok(fleet, ep, "change_flight", args)
    assert res["flight_id"] == "FL-270" and res["fare_per_passenger"] == 139.0
    assert before["payments"] == after["payments"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"flight_id": "FL-229"},
            "flight FL-229 flies LAX-JFK, not JFK-LAX; only same-route changes are allowed",
        ),
        ({"payment_method_id": None}, "198.00 is due: a payment_method_id is required"),
        ({"flight_id": "FL-210"}, "reservation R-5054 is already on flight FL-210"),
        ({"flight_id": "FL-207"}, "flight FL-207 is departed; it is closed for sales and changes"),
        (
            {"member_id": "M-1011", "reservation_id": "R-5040", "flight_id": "FL-213"},
            "flight FL-213 has 0 economy seat(s) left; 2 needed",
        ),
        (
            {"member_id": "M-1007", "reservation_id": "R-5037", "flight_id": "FL-229"},
            "member M-1007 is suspended and cannot make purchases or changes",
        ),
        (
            {"member_id": "M-1010", "reservation_id": "R-5010", "flight_id": "FL-249"},
            "reservation R-5010 is checked_in; only confirmed reservations can change",
        ),
    ],
)
async def test_change_flight_refusals(fleet: Fleet, ep: str, args: dict[str, Any], message: str) -> None:
    base = {
        "member_id": "M-1017",
        "reservation_id": "R-5054",
        "flight_id": "FL-209",
        "payment_method_id": "PM-2024",
    }
    call = {k: v for k, v in {**base, **args}.items() if v is not None}
    await _refused(fleet, ep, "change_flight", call, message)


# --- upgrade_cabin ----------------------------------------------------------------------------


async def test_upgrade_cabin_takes_the_last_seat(fleet: Fleet, ep: str) -> None:
    # economy 701.00 -> business 2383.00: 1682.00, 100.00 of it from travel credit
    args = {
        "member_id": "M-1005",
        "reservation_id": "R-5050",
        "cabin": "business",
        "payment_method_id": "PM-2006",
        "travel_credit_amount": 100.0,
    }
    res, _, after = await _ok(fleet, ep, "upgrade_cabin", args)
    assert res["cabin"] == "business" and res["fare_per_passenger"] == 2383.0 and res["amount_paid"] == 2383.0
    assert [(p["source"], p["amount"]) for p in res["payments"][-2:]] == [
        ("travel_credit", 100.0),
        ("card", 1582.0),
    ]
    business = _row(after, "flight_cabins", flight_id="FL-285", cabin="business")
    assert business["seats_sold"] == business["capacity"]
    await _refused(
        fleet,
        ep,
        "upgrade_cabin",
        {"member_id": "M-1005", "reservation_id": "R-5050", "cabin": "business"},
        "business is not higher than the current cabin business; upgrades only go up",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"cabin": "economy"}, "economy is not higher than the current cabin economy; upgrades only go up"),
        ({"payment_method_id": "PM-2007"}, "payment method PM-2007 expired in 2025-02"),
        ({"member_id": "M-1003", "reservation_id": "R-5048"}, "flight FL-294 has no business cabin"),
        (
            {"member_id": "M-1005", "reservation_id": "R-5005"},
            "flight FL-279 is cancelled; it is closed for sales and changes",
        ),
        (
            {"member_id": "M-1010", "reservation_id": "R-5050"},
            "reservation R-5050 does not belong to member M-1010",
        ),
    ],
)
async def test_upgrade_cabin_refusals(fleet: Fleet, ep: str, args: dict[str, Any], message: str) -> None:
    base = {
        "member_id": "M-1005",
        "reservation_id": "R-5050",
        "cabin": "business",
        "payment_method_id": "PM-2006",
    }
    await _refused(fleet, ep, "upgrade_cabin", {**base, **args}, message)


# --- add_checked_bags -------------------------------------------------------------------------


async def test_add_checked_bags_beyond_allowance_costs_40_each(fleet: Fleet, ep: str) -> None:
    args = {
        "member_id": "M-1017",
        "reservation_id": "R-5054",
        "passenger_id": "P-7103",
        "bags": 2,
        "payment_method_id": "PM-2025",
    }
    res, _, after = await _ok(fleet, ep, "add_checked_bags", args)
    assert res["free_bags_per_passenger"] == 0
    assert _row(after, "passengers", passenger_id="P-7103")["checked_bags"] == 2
    assert (res["payments"][-1]["amount"], res["payments"][-1]["payment_method_id"]) == (80.0, "PM-2025")


async def test_add_checked_bags_within_allowance_is_free(fleet: Fleet, ep: str) -> None:
    # platinum in business: 2 + 2 free bags, capped at 3
    args = {"member_id": "M-1028", "reservation_id": "R-5028", "passenger_id": "P-7061", "bags": 1}
    res, before, after = await _ok(fleet, ep, "add_checked_bags", args)
    assert res["free_bags_per_passenger"] == 3
    assert _row(after, "passengers", passenger_id="P-7061")["checked_bags"] == 3
    assert before["payments"] == after["payments"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"member_id": "M-1025", "reservation_id": "R-5038", "passenger_id": "P-7074", "bags": 1},
            "passenger P-7074 has 3 bag(s); at most 3 are allowed per passenger",
        ),
        ({"passenger_id": "P-7061"}, "passenger P-7061 is not on reservation R-5054"),
        ({"payment_method_id": None}, "80.00 is due: a payment_method_id is required"),
        ({"bags": 0}, "bags must be at least 1"),
        (
            {"reservation_id": "R-5035", "passenger_id": "P-7068"},
            "reservation R-5035 is flown; bags can no longer be added",
        ),
    ],
)
async def test_add_checked_bags_refusals(fleet: Fleet, ep: str, args: dict[str, Any], message: str) -> None:
    base = {
        "member_id": "M-1017",
        "reservation_id": "R-5054",
        "passenger_id": "P-7103",
        "bags": 2,
        "payment_method_id": "PM-2025",
    }
    call = {k: v for k, v in {**base, **args}.items() if v is not None}
    await _refused(fleet, ep, "add_checked_bags", call, message)


# --- check_in_passengers ----------------------------------------------------------------------


async def test_check_in_passengers(fleet: Fleet, ep: str) -> None:
    args = {"member_id": "M-1013", "reservation_id": "R-5031", "passenger_ids": ["P-7064"]}
    res, _, after = await _ok(fleet, ep, "check_in_passengers", args)
    assert res["status"] == "checked_in" and res["passengers"][0]["checked_in"] is True
    assert _row(after, "passengers", passenger_id="P-7064")["checked_in"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"member_id": "M-1023", "reservation_id": "R-5053", "passenger_ids": ["P-7100"]},
            "check-in for flight FL-266 on 2025-06-13 is not open; it opens the day before departure",
        ),
        (
            {"member_id": "M-1010", "reservation_id": "R-5010", "passenger_ids": ["P-7026", "P-7023"]},
            "passenger P-7023 is already checked in",
        ),
        (
            {"member_id": "M-1013", "reservation_id": "R-5031", "passenger_ids": ["P-7026"]},
            "passenger P-7026 is not on reservation R-5031",
        ),
        (
            {"member_id": "M-1013", "reservation_id": "R-5031", "passenger_ids": ["P-7064", "P-7064"]},
            "passenger_ids lists a passenger twice",
        ),
        (
            {"member_id": "M-1028", "reservation_id": "R-5049", "passenger_ids": ["P-7091"]},
            "flight FL-271 is cancelled; it is closed for sales and changes",
        ),
    ],
)
async def test_check_in_passengers_refusals(
    fleet: Fleet, ep: str, args: dict[str, Any], message: str
) -> None:
    await _refused(fleet, ep, "check_in_passengers", args, message)


# --- issue_delay_compensation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("member_id", "reservation_id", "amount"),
    [("M-1017", "R-5054", 150.0), ("M-1028", "R-5049", 400.0), ("M-1017", "R-5035", 100.0)],
)
async def test_issue_delay_compensation(
    fleet: Fleet, ep: str, member_id: str, reservation_id: str, amount: float
) -> None:
    args = {"member_id": member_id, "reservation_id": reservation_id}
    res, before, after = await _ok(fleet, ep, "issue_delay_compensation", args)
    assert res["compensation"] == amount
    credit = [_row(s, "members", member_id=member_id)["travel_credit"] for s in (before, after)]
    assert credit[1] == round(credit[0] + amount, 2) == res["travel_credit"]
    await _refused(
        fleet,
        ep,
        "issue_delay_compensation",
        args,
        f"reservation {reservation_id} was already compensated (PAY-9079)",
    )


@pytest.mark.parametrize(
    ("member_id", "reservation_id", "message"),
    [
        (
            "M-1015",
            "R-5015",
            "flight FL-258 is delayed with a delay of 75 minutes; "
            "compensation needs a cancellation or a delay of at least 120 minutes",
        ),
        ("M-1006", "R-5006", "reservation R-5006 was already compensated (PAY-9077)"),
        ("M-1029", "R-5045", "reservation R-5045 is cancelled; it is not eligible for compensation"),
        ("M-1017", "R-5049", "reservation R-5049 does not belong to member M-1017"),
    ],
)
async def test_issue_delay_compensation_refusals(
    fleet: Fleet, ep: str, member_id: str, reservation_id: str, message: str
) -> None:
    args = {"member_id": member_id, "reservation_id": reservation_id}
    await _refused(fleet, ep, "issue_delay_compensation", args, message)


# --- determinism ------------------------------------------------------------------------------

SEQUENCE: list[tuple[str, dict[str, Any]]] = [
    (
        "book_reservation",
        {
            "member_id": "M-1013",
            "flight_id": "FL-214",
            "cabin": "premium_economy",
            "passengers": TWO_PASSENGERS,
            "payment_method_id": "PM-2018",
            "travel_credit_amount": 20.5,
        },
    ),
    (
        "upgrade_cabin",
        {
            "member_id": "M-1013",
            "reservation_id": "R-5059",
            "cabin": "business",
            "payment_method_id": "PM-2018",
        },
    ),
    (
        "add_checked_bags",
        {
            "member_id": "M-1013",
            "reservation_id": "R-5059",
            "passenger_id": "P-7112",
            "bags": 3,
            "payment_method_id": "PM-2018",
        },
    ),
    (
        "change_flight",
        {
            "member_id": "M-1017",
            "reservation_id": "R-5054",
            "flight_id": "FL-209",
            "payment_method_id": "PM-2024",
        },
    ),
    ("issue_delay_compensation", {"member_id": "M-1028", "reservation_id": "R-5049"}),
    ("cancel_reservation", {"member_id": "M-1028", "reservation_id": "R-5049"}),
    ("check_in_passengers", {"member_id": "M-1010", "reservation_id": "R-5010", "passenger_ids": ["P-7026"]}),
    ("cancel_reservation", {"member_id": "M-1013", "reservation_id": "R-5059"}),
]


async def test_same_calls_same_state(fleet: Fleet, env: Environment) -> None:
    hashes = []
    for _ in range(2):
        episode = await fleet.create_episode("flight_booking")
        for tool, args in SEQUENCE:
            result = await fleet.call(episode.id, tool, args)
            assert not result.is_error, (tool, result.text)
        hashes.append((await fleet.export(episode.id))[1])
        await fleet.close_episode(episode.id)
    assert hashes[0] == hashes[1] != env.seed_hash()
