"""Scenarios read as a person would put them: attacks on stiff, machine-made wording.

Each class of stiffness found in the bundled tasks gets a test over every bundled task file and a
small render that shows the rule itself: the user named in the third person ("freeze membership
for member G-114" said to member G-114), code words ("because wrong_size"), a label repeated in
what the user knows ("variant ids: V-1; variant ids: V-2"), a numbered name as the persona
("Member 114"), a money column read out with its unit glued on ("the daily rate cents"), and a
description put in quotes as if the user would say those words.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import envforge
from envforge.server import load_env
from envforge.synth import (
    Dag,
    Fact,
    Phrases,
    derive_phrases,
    load_phrases,
    load_tasks,
    missing_facts,
    render_scenario,
)

from support.paths import REPO, bundled_env_dirs

ENVS_WITH_TASKS = [d for d in bundled_env_dirs() if (d / "tasks.jsonl").exists()]
CODE_WORD = re.compile(r"\b[a-z]+(?:_[a-z0-9]+)+\b")


def _wish_lines(instruction: str) -> list[str]:
    """The lines the user speaks from: wishes, conditions and questions (not the facts list)."""
    return [line for line in instruction.splitlines() if not line.startswith("You know:")]


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_the_user_is_never_named_in_the_third_person(env_dir: Path) -> None:
    """The principal is the user: "your membership", never "the membership of member G-114". A
    principal that is no person (a channel a Slack task stays in) is not the user, and is named."""
    phrases = load_phrases(load_env(env_dir))
    checked, named = 0, 0
    for task in load_tasks(env_dir):
        principal = task.dag.principal
        if principal is None or len(principal.key) != 1:
            continue
        entity = phrases.entities.get(principal.table)
        if entity is None or not entity.person:
            named += 1
            continue
        (value,) = principal.key.values()
        me = f"{entity.singular} {value}"
        for line in _wish_lines(task.scenario.instruction):
            assert not re.search(rf"\b{re.escape(me)}\b", line), f"{task.id}: {line!r}"
        checked += 1
    assert checked or named, f"{env_dir.name}: no task has a principal to check"


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_code_words_units_and_quoted_descriptions_are_never_said(env_dir: Path) -> None:
    for task in load_tasks(env_dir):
        text = task.scenario.instruction
        for word in CODE_WORD.findall(text):  # an id keeps its form; any other code word is said as words
            assert any(word in f.value for f in task.scenario.known_facts if "id" in f.name), (task.id, word)
        assert not re.search(r"\b(?!in )\w+ cents\b", text), f"{task.id}: {text!r}"
        assert '"the ' not in text, f"{task.id}: a description in quotes: {text!r}"
        # every fact the verifier needs is still said, code words as words
        assert missing_facts(task.scenario, text) == [], task.id


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_each_thing_the_user_knows_is_labelled_once(env_dir: Path) -> None:
    for task in load_tasks(env_dir):
        known = next((ln for ln in task.scenario.instruction.splitlines() if ln.startswith("You know:")), "")
        body = known.removeprefix("You know: ").rsplit(" Give these only when asked.", 1)[0]
        labels = [part.split(":", 1)[0] for part in body.split("; ") if part]
        assert len(labels) == len(set(labels)), f"{task.id}: {known!r}"


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_no_persona_is_a_numbered_row(env_dir: Path) -> None:
    for task in load_tasks(env_dir):
        name = task.scenario.persona.split(",")[0]
        assert not re.fullmatch(r"[A-Za-z]+ #?\d+", name), f"{task.id}: persona {task.scenario.persona!r}"


# --------------------------------------------------------------------------- the rules, one render each


def _car_rental() -> tuple[Phrases, Any]:
    env = load_env(REPO / "envs" / "car_rental")
    return load_phrases(env), env


def _call(node_id: str, name: str, arguments: dict[str, Any], write: bool = True) -> dict[str, Any]:
    return {
        "id": node_id,
        "kind": "call",
        "text": name,
        "call": {"name": name, "arguments": arguments},
        "write": write,
        "args": [{"param": p, "source": "user"} for p in arguments],
    }


def _render(nodes: list[dict[str, Any]], facts: dict[str, Any], principal: dict[str, Any] | None) -> Any:
    phrases, _ = _car_rental()
    dag = Dag.model_validate({"nodes": nodes, "edges": [], "principal": principal})
    return render_scenario(
        "car_rental", dag, [Fact(name=k, value=v) for k, v in facts.items()], [], {}, [], phrases
    )


RENT = _call("n0", "rent_car", {"customer_id": "C-509", "car_id": "V-621", "days": 7})
ME = {"table": "customers", "key": {"customer_id": "C-509"}, "name": "Luis Ibarra"}


def test_a_wish_for_oneself_does_not_name_oneself() -> None:
    scenario = _render([RENT], {"customer_id": "C-509", "car_id": "V-621", "days": 7}, ME)
    wish = scenario.instruction.splitlines()[0]
    assert wish == "You want to rent car V-621 for 7 days.", wish
    # the id is still what the user knows, to give when asked
    assert "customer id: C-509" in scenario.instruction
    # for someone else, the other customer is named
    other = _render(
        [RENT], {"customer_id": "C-509", "car_id": "V-621", "days": 7}, {**ME, "key": {"customer_id": "C-1"}}
    )
    assert "for customer C-509" in other.instruction


def test_code_words_are_said_as_words_and_still_count_as_said() -> None:
    node = _call("n0", "return_car", {"rental_id": "R-1"})
    node["call"]["arguments"]["reason"] = "wrong_size"  # an optional argument the phrase has no place for
    scenario = _render([node], {"rental_id": "R-1", "reason": "wrong_size"}, None)
    assert "wrong size" in scenario.instruction and "wrong_size" not in scenario.instruction
    assert missing_facts(scenario, scenario.instruction) == []


def test_repeated_labels_are_merged() -> None:
    second = _call("n1", "rent_car", {"customer_id": "C-509", "car_id": "V-622", "days": 2})
    facts = [
        Fact(name="car_id", value="V-621"),
        Fact(name="car_id (step 2)", value="V-622"),
        Fact(name="days", value=7),
    ]
    phrases, _ = _car_rental()
    dag = Dag.model_validate({"nodes": [RENT, second], "edges": [], "principal": ME})
    text = render_scenario("car_rental", dag, facts, [], {}, [], phrases).instruction
    assert "You know: car ids: V-621 and V-622; days: 7." in text, text


def test_a_numbered_row_is_no_persona() -> None:
    scenario = _render([RENT], {"car_id": "V-621"}, {**ME, "name": "Customer 509"})
    assert scenario.persona == "A customer of the car rental service"


def test_derived_phrases_put_the_wish_as_a_person_would() -> None:
    """The synthesized envs' vocabulary is derived, so the deriver itself must speak plainly."""
    phrases = derive_phrases(load_env(REPO / "envs" / "car_rental"))
    assert phrases.tools["send_to_maintenance"].phrase == "send car {car_id} to maintenance"
    assert phrases.tools["rent_car"].phrase == "rent car {car_id} for customer {customer_id} for {days} days"
    assert phrases.tools["return_car"].phrase == "return the car of rental {rental_id}"
    helpdesk = derive_phrases(load_env(REPO / "envs" / "helpdesk_lite"))
    assert helpdesk.tools["assign_ticket"].phrase == "assign ticket {ticket_id} to agent {agent_id}"
    assert helpdesk.tools["add_comment"].phrase == "add comment on ticket {ticket_id} with body {body}"
    library = derive_phrases(load_env(REPO / "envs" / "library"))
    assert library.tools["list_member_loans"].phrase == "the loans of member {member_id}"
    assert library.tools["place_hold"].phrase == "place hold on book {book_id} for member {member_id}"


SERVICE_TOOLS = """
from envforge.server import Db, tool


@tool(writes=["slack_messages"])
async def slack_post_message(db: Db, channel_id: str, text: str) -> dict:
    \"\"\"Post a new message to a Slack channel.\"\"\"
    return {}


@tool(writes=["slack_messages"])
async def slack_reply_to_thread(db: Db, channel_id: str, thread_ts: str, text: str) -> dict:
    \"\"\"Reply to a specific message thread in Slack.\"\"\"
    return {}


@tool
async def slack_get_channel_history(db: Db, channel_id: str) -> list:
    \"\"\"Get recent messages from a channel.\"\"\"
    return []
"""


def test_the_service_every_tool_is_prefixed_with_is_not_said(tmp_path: Path) -> None:
    # a real model's Slack env (MCP's tool names, its tables prefixed alike): "slack reply to
    # thread with channel id ..." spelled the tool's name out, in 29 of 50 tasks
    root = tmp_path / "slack"
    root.mkdir()
    (root / "env.toml").write_text('name = "slack"\ndescription = "d"\nseed = "seed.json"\n')
    (root / "schema.sql").write_text(
        "CREATE TABLE slack_channels (id TEXT PRIMARY KEY, name TEXT);\n"
        "CREATE TABLE slack_messages (id TEXT PRIMARY KEY, channel_id TEXT REFERENCES slack_channels(id),"
        " text TEXT);\n"
    )
    (root / "seed.json").write_text("{}")
    (root / "policy.md").write_text("Be helpful.\n")
    (root / "tools.py").write_text(SERVICE_TOOLS)
    phrases = derive_phrases(load_env(root))
    assert {t: p.phrase for t, p in phrases.tools.items()} == {
        "slack_post_message": "post message on channel {channel_id} with text {text}",
        "slack_reply_to_thread": (
            "reply to thread on channel {channel_id} with thread ts {thread_ts} and text {text}"
        ),
        "slack_get_channel_history": "the history of channel {channel_id}",
    }
    assert phrases.entities["slack_channels"].singular == "channel"


_MISSAID_ARTICLE = re.compile(r"(?i)\b(?:an (?:user|unit|use|one|euro)|a (?:hour|honest))\b")


@pytest.mark.parametrize("env_dir", bundled_env_dirs(), ids=lambda p: p.name)
def test_articles_are_said_as_the_words_sound(env_dir: Path) -> None:
    for task in load_tasks(env_dir):
        said = f"{task.scenario.persona}\n{task.scenario.instruction}"
        assert not _MISSAID_ARTICLE.search(said), (task.id, said[:200])


async def test_a_user_is_a_user_not_an_user() -> None:
    # a real model's Slack env, whose people are its users: "An user of the slack service"
    report = await envforge.synthesize_tasks_async(load_env(REPO / "envs" / "slack"), 5)
    assert report.tasks
    assert {t.scenario.persona for t in report.tasks} == {"A user of the slack service"}


def test_a_value_too_far_back_to_name_is_no_task() -> None:
    """ "the car on file" names no car: an honest agent could not tell which one is meant, so
    the renderer refuses (and synthesis drops the build) rather than ship an unsolvable task."""
    from envforge.synth import VagueReference

    vague = _call("n0", "send_to_maintenance", {"car_id": "V-633"})
    vague["args"] = [{"param": "car_id", "source": "node", "node": "n-gone", "key": "car_id"}]
    with pytest.raises(VagueReference):
        _render([vague], {}, None)


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_no_bundled_task_refers_to_something_on_file(env_dir: Path) -> None:
    for task in load_tasks(env_dir):
        assert " on file" not in task.scenario.instruction, f"{task.id}: {task.scenario.instruction!r}"


def test_an_id_keeps_its_exact_form() -> None:
    """A code word is said as words, but an id is what the agent must type: never respelled."""
    node = _call("n0", "return_car", {"rental_id": "ordered_by_mistake"})
    scenario = _render([node], {"rental_id": "ordered_by_mistake"}, None)
    assert "rental ordered_by_mistake" in scenario.instruction
    assert "rental id: ordered_by_mistake" in scenario.instruction


STIFF = {
    "a count of one with a plural noun": re.compile(
        r"(?<![\w.,-])1 (?:days|nights|bags|checked bags|cars|copies|seats)\b"
    ),
    "a total of a total": re.compile(r"\btotal total\b"),
    "a relation read out as a noun": re.compile(r"\bthe (?:assigned to|created by|owned by)\b"),
    "a label glued to a description": re.compile(r"\b\w+ id the\b"),
}


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_no_bundled_instruction_reads_stiffly(env_dir: Path) -> None:
    for task in load_tasks(env_dir):
        for what, pattern in STIFF.items():
            found = pattern.search(task.scenario.instruction)
            assert found is None, f"{task.id}: {what}: {found and found.group(0)!r}"


def test_one_of_a_kind_is_singular_and_other_counts_stay_plural() -> None:
    one = _render(
        [
            {
                **RENT,
                "call": {
                    "name": "rent_car",
                    "arguments": {"customer_id": "C-509", "car_id": "V-621", "days": 1},
                },
            }
        ],
        {},
        ME,
    )
    assert "rent car V-621 for 1 day." in one.instruction, one.instruction
    assert "for 7 days." in _render([RENT], {}, ME).instruction


def test_the_scripted_user_says_its_wishes_in_the_first_person() -> None:
    """The scenario says "your loans" to the user; the user says "my loans" to the agent, and a
    value it gives (a quoted note, a fact) stays exactly as the verifier needs it."""
    from envforge.harness import request_text

    assign = _call("n0", "rent_car", {"customer_id": "C-509", "car_id": "V-621", "days": 7})
    scenario = _render([assign], {"customer_id": "C-509", "car_id": "V-621", "days": 7}, ME)
    scenario = scenario.model_copy(
        update={
            "instruction": 'You want to add the note "check your email" to your rental, by you, '
            + "to yourself.\n"
            + scenario.instruction
        }
    )
    tasks = load_tasks(REPO / "envs" / "car_rental")
    task = tasks[0].model_copy(update={"scenario": scenario})
    said = request_text(task)
    assert said.startswith('I want to add the note "check your email" to my rental, by me, to myself.'), said
    for env_dir in ENVS_WITH_TASKS:
        for task in load_tasks(env_dir):
            outside_quotes = re.sub(r'"[^"\n]*"', "", request_text(task))
            assert not re.search(r"\byour\b|\byourself\b", outside_quotes), (task.id, outside_quotes)


def _description_repeats(text: str) -> list[str]:
    """Runs of seven words starting with "the" that a scenario's wishes say more than once (a
    quoted value is the user's own words, and the closing question may name its subject again)."""
    lines = [ln for ln in _wish_lines(text) if not ln.startswith("Make sure")]
    said = re.sub(r'"[^"\n]*"', '""', " ".join(lines))
    words = said.split()
    out = []
    for i, word in enumerate(words[:-6]):
        run = " ".join(words[i : i + 7])
        if word.lower() != "the" or '""' in run:  # the same wish with other quoted words: two notes
            continue
        first, again = said.find(run), said.find(run, said.find(run) + 1)
        # said again in full on purpose when something else was named in between ("that
        # ticket" would then point at it)
        named_between = re.search(r"\b[A-Z]+-\d+\b", said[first + len(run) : again])
        if again > first and not named_between and run not in out:
            out.append(run)
    return out


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_a_thing_described_once_is_then_that_thing(env_dir: Path) -> None:
    """ "the order whose status is processing among your orders", said four times in one scenario,
    is read as four orders; once described, it is "that order"."""
    for task in load_tasks(env_dir):
        assert _description_repeats(task.scenario.instruction) == [], (task.id, task.scenario.instruction)


def test_the_user_found_by_a_lookup_is_the_user() -> None:
    """The customer an email lookup finds is the user: "cancel order O-5008", not "cancel order
    O-5008 of the customer of the account registered to …", and their id, which they never
    knew, is not handed to them."""
    phrases = load_phrases(load_env(REPO / "envs" / "retail_orders"))
    lookup = _call("n0", "find_customer_by_email", {"email": "ada@example.com"}, write=False)
    cancel = _call("n1", "cancel_order", {"customer_id": "C-1031", "order_id": "O-5008", "reason": "other"})
    cancel["args"][0] = {"param": "customer_id", "source": "node", "node": "n0", "key": "customer_id"}
    me = {"table": "customers", "key": {"customer_id": "C-1031"}, "name": "Ada Park"}
    dag = Dag.model_validate({"nodes": [lookup, cancel], "edges": [], "principal": me})
    facts = [Fact(name="email", value="ada@example.com"), Fact(name="order_id", value="O-5008")]
    data = {"n0": {"customer_id": "C-1031"}}
    text = render_scenario("retail_orders", dag, facts, [], data, [], phrases).instruction
    assert text.splitlines()[0] == "You want to cancel order O-5008, because other.", text
    assert "C-1031" not in text


def test_counts_of_yes_no_and_empty_columns_read_as_questions() -> None:
    from envforge.synth import ReasonNode

    phrases, _ = _car_rental()
    read = _call("n0", "list_available_cars", {"location_id": "LOC-1"}, write=False)
    flagged = ReasonNode(id="r0", text="sum", op="sum", source="n0", field="is_electric", value=2)
    empty = ReasonNode(id="r1", text="count", op="count", source="n0", field="notes", equals="", value=1)
    dag = Dag.model_validate({"nodes": [read, flagged, empty], "edges": [], "principal": None})
    text = render_scenario("car_rental", dag, [], ["2", "1"], {}, [], phrases).instruction
    assert "how many of the available cars of location LOC-1 are electric (a whole number): 2" in text, text
    assert "how many of the available cars of location LOC-1 have no notes (a whole number): 1" in text, text


# --------------------------------------------------------------------------- references that point right


def _entity_tables(env_dir: Path) -> dict[str, str]:
    return {e.singular: table for table, e in load_phrases(load_env(env_dir)).entities.items()}


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_every_that_points_back_to_the_last_one_described(env_dir: Path) -> None:
    """ "among the books with that genre" with no genre said before names nothing; "resolve that
    ticket" after "ticket HT-114" was named points at HT-114, whatever the golden call says."""
    nouns = _entity_tables(env_dir)
    for task in load_tasks(env_dir):
        body = "\n".join(_wish_lines(task.scenario.instruction))
        for m in re.finditer(r"\bthat ([a-z]+)(?: ([a-z]+))?\b", body):
            noun = f"{m.group(1)} {m.group(2)}" if f"{m.group(1)} {m.group(2)}" in nouns else m.group(1)
            before = body[: m.start()]
            described = [x.start() for x in re.finditer(rf"\b(?:the|your) {re.escape(noun)}\b", before)]
            named = [x.start() for x in re.finditer(rf"\b{re.escape(noun)}s? [A-Z]+-\d+", before)]
            assert described, f"{task.id}: {m.group(0)!r} with nothing said before: {body!r}"
            assert not named or max(named) < max(described), f"{task.id}: {m.group(0)!r} after a named one"


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_the_new_thing_is_one_the_task_made(env_dir: Path) -> None:
    """ "ship it to the new address" is a lie when no address was added (the golden call used
    the address of a cancelled order), and ambiguous when two were."""
    nouns = _entity_tables(env_dir)
    for task in load_tasks(env_dir):
        for m in re.finditer(r"\bthe new ([a-z]+(?: [a-z]+)?)\b", task.scenario.instruction):
            table = nouns.get(m.group(1)) or nouns.get(m.group(1).split()[0])
            if table is None:
                continue
            made = task.golden_diff.get(table)
            assert made is not None and len(made.inserted) == 1, f"{task.id}: {m.group(0)!r}"


def test_the_users_own_words_are_never_reworded() -> None:
    """A note or a comment body is what the verifier compares: "Escalated by E-1056", "Waited 1
    days" or "Forwarded to agent AG-3 by your team" stay as given, in the scenario and in what
    the scripted user says."""
    from envforge.harness import request_text

    phrases = load_phrases(load_env(REPO / "envs" / "helpdesk_lite"))
    body = "Forwarded to agent AG-3 by your team, 1 days ago"
    comment = _call("n0", "add_comment", {"ticket_id": "HT-1", "body": body})
    assign = _call("n1", "assign_ticket", {"ticket_id": "HT-1", "agent_id": "AG-3"})
    me = {"table": "agents", "key": {"agent_id": "AG-3"}, "name": "Ines Ortega"}
    dag = Dag.model_validate({"nodes": [comment, assign], "edges": [], "principal": me})
    facts = [
        Fact(name="ticket_id", value="HT-1"),
        Fact(name="body", value=body),
        Fact(name="agent_id", value="AG-3"),
    ]
    scenario = render_scenario("helpdesk_lite", dag, facts, [], {}, [], phrases)
    wishes = scenario.instruction.splitlines()
    assert wishes[0] == f"You want to add comment on ticket HT-1 with body {body}.", wishes[0]
    assert wishes[1] == "You also want to assign ticket HT-1 to yourself.", wishes[1]
    task = load_tasks(REPO / "envs" / "helpdesk_lite")[0].model_copy(update={"scenario": scenario})
    said = request_text(task)
    assert f"with body {body}." in said and "to myself" in said, said
    quoted = scenario.model_copy(
        update={
            "instruction": 'You want to add the note "You want to restart; if not, you want to call" to it.'
        }
    )
    assert '"You want to restart; if not, you want to call"' in request_text(
        task.model_copy(update={"scenario": quoted})
    )


def test_a_count_is_never_taken_for_the_user() -> None:
    """A principal whose id is a bare number is not every 7 in the scenario."""
    seven = {**ME, "key": {"customer_id": 7}}
    rent = _call("n0", "rent_car", {"customer_id": 7, "car_id": "V-621", "days": 7})
    assert "rent car V-621 for 7 days." in _render([rent], {}, seven).instruction
    other = _call("n0", "rent_car", {"customer_id": "C-10-B", "car_id": "V-621", "days": 2})
    text = _render([other], {}, {**ME, "key": {"customer_id": "C-10"}}).instruction
    assert "for customer C-10-B" in text, text


def test_a_value_read_from_inside_a_result_is_not_said_as_the_results_own() -> None:
    """The reservation's status read out of a member's profile is not "the status of your
    profile" (the profile's own status differs): such a task is not rendered, so not shipped."""
    from envforge.synth import VagueReference

    phrases = load_phrases(load_env(REPO / "envs" / "flight_booking"))
    member = _call("n0", "get_member", {"member_id": "M-1"}, write=False)
    cancel = _call("n1", "cancel_reservation", {"member_id": "M-1", "reservation_id": "R-1"})
    cancel["args"][1] = {"param": "reservation_id", "source": "node", "node": "n0", "key": "reservation_id"}
    dag = Dag.model_validate({"nodes": [member, cancel], "edges": [], "principal": None})
    nested = {
        "n0": {"member_id": "M-1", "reservation_id": "R-9", "reservations": [{"reservation_id": "R-1"}]}
    }
    with pytest.raises(VagueReference):
        render_scenario("flight_booking", dag, [Fact(name="member_id", value="M-1")], [], nested, [], phrases)
    top = {"n0": {"member_id": "M-1", "reservations": [{"reservation_id": "R-1"}]}}
    text = render_scenario("flight_booking", dag, [Fact(name="member_id", value="M-1")], [], top, [], phrases)
    assert "R-1" not in text.instruction


def test_a_pick_from_rows_of_another_kind_names_the_row() -> None:
    """Picking a drug id out of the prescriptions is "the drug of the one whose rx id is …",
    never "the drug whose rx id is …" (a drug has no rx id)."""
    from envforge.synth import ReasonNode

    phrases = load_phrases(load_env(REPO / "envs" / "pharmacy"))
    listing = _call("n0", "list_prescriptions", {"patient_id": "P-1"}, write=False)
    pick = ReasonNode(
        id="r0", text="filter", op="filter", source="n0", field="rx_id", equals="RX-3", select="drug_id"
    )
    restock = _call("n1", "restock_drug", {"drug_id": "D-2", "quantity": 30})
    restock["args"][0] = {"param": "drug_id", "source": "node", "node": "r0", "key": "drug_id"}
    dag = Dag.model_validate({"nodes": [listing, pick, restock], "edges": [], "principal": None})
    facts = [Fact(name="patient_id", value="P-1"), Fact(name="quantity", value=30)]
    text = render_scenario("pharmacy", dag, facts, [], {}, [], phrases).instruction
    assert "the drug of the one whose rx id is RX-3 among the prescriptions of patient P-1" in text, text


def test_that_never_points_past_a_thing_named_in_other_words() -> None:
    """After "add the address 1257 Park Place", "that address" would mean the new one: an
    earlier address is said in full again."""
    phrases = load_phrases(load_env(REPO / "envs" / "retail_orders"))
    order = _call("n0", "get_order", {"order_id": "O-1"}, write=False)
    first = _call(
        "n1", "update_order_address", {"customer_id": "C-1", "order_id": "O-2", "address_id": "A-5"}
    )
    first["args"][2] = {"param": "address_id", "source": "node", "node": "n0", "key": "address_id"}
    add = _call(
        "n2",
        "add_address",
        {"customer_id": "C-1", "line1": "1257 Park Place", "city": "Boston", "state": "MA", "zip": "02116"},
    )
    again = _call(
        "n3", "update_order_address", {"customer_id": "C-1", "order_id": "O-3", "address_id": "A-5"}
    )
    again["args"][2] = {"param": "address_id", "source": "node", "node": "n0", "key": "address_id"}
    dag = Dag.model_validate({"nodes": [order, first, add, again], "edges": [], "principal": None})
    facts = [Fact(name="order_id", value="O-1")]
    text = render_scenario(
        "retail_orders", dag, facts, [], {"n0": {"address_id": "A-5"}}, [], phrases
    ).instruction
    last = text.splitlines()[2]
    assert "that address" not in last and "the address of your order O-1" in last, text
