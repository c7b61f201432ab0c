"""Realism measures on hand-built tasks: each way a task can read like a macro script, tell one
story badly, or repeat another is written the way a generator (or a policy hunting for easy
tasks) would slip it through, and must be caught; the look-alikes a person would write must not."""

from __future__ import annotations

from typing import Any

from envforge.server import load_env
from envforge.synth import (
    Call,
    CallNode,
    Dag,
    DagEdge,
    Difficulty,
    Fact,
    Principal,
    ReasonNode,
    Task,
    UserScenario,
    dead_reads,
    duplicate_groups,
    has_numbered_steps,
    load_phrases,
    measure_realism,
    stiff_wording,
    task_principals,
    tool_descriptions_in,
    tool_names_in,
)

from support.paths import REPO

TOOLS = [
    "get_order",
    "list_customer_orders",
    "cancel_order",
    "get_customer",
    "place_order",
    "add_checked_bags",
    "find_customer_by_email",
]


def call(node_id: str, name: str, write: bool = False, **arguments: Any) -> CallNode:
    return CallNode(id=node_id, text=name, call=Call(name=name, arguments=arguments), write=write)


def make_task(
    task_id: str,
    nodes: list[Any],
    edges: list[DagEdge] | None = None,
    *,
    instruction: str = "I'd like my most recent order cancelled, please.",
    outputs: list[str] | None = None,
    facts: list[Fact] | None = None,
    end_hash: str | None = None,
    principal: Principal | None = None,
) -> Task:
    calls = [n.call for n in nodes if isinstance(n, CallNode) and n.executed]
    return Task(
        id=task_id,
        env="shop",
        seed="0",
        dag=Dag(nodes=nodes, edges=edges or [], principal=principal),
        scenario=UserScenario(
            persona="Ada", instruction=instruction, known_facts=facts or [], must_be_told=outputs or []
        ),
        golden_calls=calls,
        golden_hash=end_hash or f"h-{task_id}",
        golden_cents_hash=end_hash or f"h-{task_id}",
        golden_diff={},
        required_outputs=outputs or [],
        checkpoints=[],
        difficulty=Difficulty(calls=len(calls), writes=0, reasoning=0, depth=len(nodes), tables=1),
    )


def data(source: str, target: str) -> DagEdge:
    return DagEdge(source=source, target=target, kind="data")


# --------------------------------------------------------------------------- tool names


def test_an_instruction_naming_a_tool_is_caught_in_any_case_and_spaced_out() -> None:
    assert tool_names_in("Please call get_order for O-1 and tell me its status.", TOOLS) == ["get_order"]
    assert tool_names_in("Run GET_CUSTOMER on me.", TOOLS) == ["get_customer"]
    assert tool_names_in("First find customer  by email for ada@x.org.", TOOLS) == ["find_customer_by_email"]
    assert tool_names_in("Use list_customer_orders; then cancel_order.", TOOLS) == [
        "cancel_order",
        "list_customer_orders",
    ]


def test_a_person_saying_what_they_want_names_no_tool() -> None:
    # two-word phrases are how people speak; identifiers inside longer words are not the tool
    assert tool_names_in("Please cancel order O-7 and place order for new shoes.", TOOLS) == []
    assert tool_names_in("My reference is get_order_v2 and x_get_order.", TOOLS) == []
    assert tool_names_in("Could you list my customer orders?", TOOLS) == []
    assert tool_names_in("I'd like to add checked bags to my trip.", TOOLS) == []


# --------------------------------------------------------------------------- numbered steps


def test_numbered_step_lists_are_caught_as_lines_inline_and_by_reference() -> None:
    assert has_numbered_steps("Do this:\n1. Find my order.\n2. Cancel it.")
    assert has_numbered_steps("  1) look me up\n  2) refund me")
    assert has_numbered_steps("Please 1. find my order 2. cancel it.")
    assert has_numbered_steps("Cancel the order from the result of step 2.")
    assert has_numbered_steps("Step 1: find me. Step 2: cancel.")


def test_prices_counts_and_single_numbers_are_not_steps() -> None:
    assert not has_numbered_steps("My order cost $12.50 and had 2 items; refund 1 of them.")
    assert not has_numbered_steps("I have 1. That's all, and version 2.0 of the app.")
    assert not has_numbered_steps("You received order #W2378156 and want to exchange 2 items.")


# --------------------------------------------------------------------------- dead reads


def test_a_read_whose_result_feeds_nothing_is_dead() -> None:
    nodes = [
        call("n0", "get_customer", customer_id="C-1"),
        call("n1", "get_order", order_id="O-9"),  # looked up, then ignored
        call("n2", "cancel_order", write=True, order_id="O-5"),
    ]
    task = make_task("t", nodes, [data("n0", "n2")])
    assert dead_reads(task) == ["n1"]


def test_reads_feeding_an_argument_a_reasoning_node_or_a_told_output_are_live() -> None:
    nodes = [
        call("n0", "get_customer", customer_id="C-1"),
        call("n1", "list_customer_orders", customer_id="C-1"),
        ReasonNode(id="n2", text="count", op="count", source="n1", path=["orders"], value=2),
        call("n3", "get_order", order_id="O-5"),
        call("n4", "cancel_order", write=True, order_id="O-5"),
    ]
    task = make_task("t", nodes, [data("n0", "n4"), data("n1", "n2")], outputs=["2", "shipped"])
    # n3's result is the status the user asked to be told ("shipped"): live only given results
    assert dead_reads(task) == ["n3"]
    results = ['{"customer_id": "C-1"}', '{"orders": []}', '{"order_id": "O-5", "status": "Shipped"}', "ok"]
    assert dead_reads(task, results) == []
    # results that do not line up with the golden calls are not read
    assert dead_reads(task, results[:2]) == ["n3"]


def test_without_recorded_data_flow_reads_are_judged_by_value() -> None:
    # τ²'s shape: a linear DAG of control edges over the gold actions
    nodes = [
        call("n0", "get_customer", customer_id="C-1"),
        call("n1", "get_order", order_id="O-5"),  # the user gave O-5: its result feeds nothing new
        call("n2", "cancel_order", write=True, order_id="O-5", refund_to="PM-3"),
    ]
    edges = [
        DagEdge(source="n0", target="n1", kind="control"),
        DagEdge(source="n1", target="n2", kind="control"),
    ]
    task = make_task("t", nodes, edges, facts=[Fact(name="order_id", value="O-5")])
    assert dead_reads(task) is None  # no flow recorded, no results: not judged
    results = [
        '{"customer_id": "C-1", "payment_methods": [{"id": "PM-3"}]}',
        '{"order_id": "O-5", "customer_id": "C-1"}',
        "cancelled",
    ]
    assert dead_reads(task, results) == ["n1"]


# --------------------------------------------------------------------------- duplicates


def test_tasks_repeating_golden_calls_or_end_state_and_outputs_are_duplicates() -> None:
    same_calls = [call("n0", "cancel_order", write=True, order_id="O-5")]
    a = make_task("a", same_calls, end_hash="E1")
    b = make_task("b", same_calls, end_hash="E2", instruction="Cancel O-5 for me.")  # reworded only
    c = make_task("c", [call("n0", "get_order", order_id="O-5")], end_hash="E3", outputs=["Pending"])
    d = make_task("d", [call("n0", "get_order", order_id="O-6")], end_hash="E3", outputs=[" pending"])
    e = make_task("e", [call("n0", "get_order", order_id="O-6")], end_hash="E4", outputs=["x"])
    # e repeats d's calls, so c, d, e are one task
    assert duplicate_groups([a, b, c, d, e]) == [["a", "b"], ["c", "d", "e"]]
    f = make_task("f", [call("n0", "get_order", order_id="O-7")], end_hash="E3", outputs=["shipped"])
    assert duplicate_groups([a, f]) == []
    assert measure_realism("shop", [a, b, c, d, e, f], TOOLS).duplicates == 3


# --------------------------------------------------------------------------- principals


def test_a_task_wandering_between_two_customers_has_two_principals() -> None:
    nodes = [
        call("n0", "list_customer_orders", customer_id="C-1"),
        call("n1", "place_order", write=True, customer_id="C-2", variant_ids=["V-1"]),
    ]
    two = make_task("two", nodes)
    assert task_principals(two) == ["C-1", "C-2"]
    one = make_task("one", [call("n0", "get_order", order_id="O-5")])
    assert task_principals(one) == []
    # the order's owner, named in its result, is whose story it is
    assert task_principals(one, ['{"order_id": "O-5", "user_id": "ada_1", "items": [{"user_id": "x"}]}']) == [
        "ada_1"
    ]
    # a recorded principal is the answer, whatever the calls touch
    pinned = make_task("p", nodes, principal=Principal(table="customers", key={"customer_id": "C-1"}))
    assert task_principals(pinned) == ["C-1"]
    r = measure_realism("shop", [two, one, pinned], TOOLS)
    assert (r.principals, r.multi_principal_tasks, r.no_principal_tasks) == (2, 1, 1)


def test_ids_of_things_and_of_staff_are_not_principals() -> None:
    nodes = [call("n0", "get_order", order_id="O-5", assignee_id="E-9", product_id="P-1")]
    assert task_principals(make_task("t", nodes)) == []


# --------------------------------------------------------------------------- per env


def test_env_measures_count_procedural_tasks_and_spread_task_shape() -> None:
    plain = make_task("a", [call("n0", "cancel_order", write=True, order_id="O-5")])
    scripted = make_task(
        "b",
        [
            call("n0", "get_order", order_id="O-6"),
            call("n1", "cancel_order", write=True, order_id="O-6"),
            ReasonNode(id="n2", text="count", op="count", source="n0", value=1),
        ],
        [data("n0", "n1")],
        instruction="1. Get the order.\n2. Cancel it with cancel_order.",
    )
    r = measure_realism("shop", [plain, scripted], TOOLS)
    assert (r.procedural, r.procedural_share, r.tool_name_tasks, r.numbered_step_tasks) == (1, 0.5, 1, 1)
    assert (r.calls.min, r.calls.median, r.calls.max, r.calls.mean) == (1, 1.5, 2, 1.5)
    assert (r.writes.max, r.reasoning.max, r.reasoning.mean) == (1, 1, 0.5)
    assert r.examples["procedural"] == ["b"]
    # its tool name is also a raw code word
    assert r.strict_failures() == ["1 procedural instructions", "1 stiffly worded instructions"]


def test_the_median_is_not_the_mean_of_a_skewed_env() -> None:
    sizes = [1, 1, 6]
    tasks = [
        make_task(
            f"t{i}", [call(f"n{j}", "cancel_order", write=True, order_id=f"O-{i}-{j}") for j in range(n)]
        )
        for i, n in enumerate(sizes)
    ]
    calls = measure_realism("shop", tasks, TOOLS).calls
    assert (calls.min, calls.median, calls.max, calls.mean) == (1, 1.0, 6, 2.67)


DESCRIPTIONS = {
    "get_customer": "Get a customer's profile with their addresses and payment methods (gift cards too).",
    "cancel_order": "Cancel a pending order.",
}


def test_an_instruction_copying_a_tool_description_is_procedural() -> None:
    copied = "Please get a customer's  profile with their addresses and payment methods for C-1."
    assert tool_descriptions_in(copied, DESCRIPTIONS) == ["get_customer"]
    # a short description is how people speak ("cancel a pending order")
    assert tool_descriptions_in("Could you cancel a pending order of mine?", DESCRIPTIONS) == []
    task = make_task("t", [call("n0", "get_customer", customer_id="C-1")], instruction=copied)
    r = measure_realism("shop", [task], TOOLS, descriptions=DESCRIPTIONS)
    assert (r.procedural, r.tool_description_tasks, r.tool_name_tasks) == (1, 1, 0)
    assert measure_realism("shop", [task], TOOLS).procedural == 0


# --------------------------------------------------------------------------- stiff wording


def test_machine_made_wording_is_caught_by_class() -> None:
    me = Principal(table="members", key={"member_id": "G-114"}, name="Ada Park")
    node = call("n0", "freeze_membership", write=True, member_id="G-114")
    cases = {
        "user in the third person": "You want to freeze membership for member G-114.",
        "code word": "You want to cancel order O-1 because wrong_size.",
        "on file": "You want to return the book on file.",
        "plural after one": "You want to rent car V-1 for 1 days.",
        "total total": "Make sure the agent tells you the total total of your orders.",
        "repeated label": "You want X.\nYou know: car id: V-1; car id: V-2. Give these only when asked.",
    }
    for reason, instruction in cases.items():
        task = make_task("t", [node], instruction=instruction, principal=me)
        assert reason in stiff_wording(task), (reason, stiff_wording(task))
    numbered = make_task("t", [node], instruction="You want to freeze your membership.")
    numbered = numbered.model_copy(
        update={
            "scenario": numbered.scenario.model_copy(update={"persona": "Member 114, a member of the gym"})
        }
    )
    assert stiff_wording(numbered) == ["numbered persona"]


def test_a_principal_that_is_no_person_may_be_named() -> None:
    # a real model's Slack env: the channels are the owner table (every message references one),
    # and "post message on channel C-14" was counted the user in the third person in all 50 tasks
    channel = Principal(table="slack_channels", key={"id": "C-14"}, name="general")
    node = call("n0", "slack_post_message", write=True, channel_id="C-14", text="hi")
    task = make_task("t", [node], instruction="You want to post message on channel C-14.", principal=channel)
    assert stiff_wording(task, people={"slack_users"}) == []
    assert stiff_wording(task, people={"slack_channels"}) == ["user in the third person"]
    assert stiff_wording(task) == ["user in the third person"]  # no phrases known: as before
    assert measure_realism("slack", [task], ["slack_post_message"], people={"slack_users"}).stiff_tasks == 0


def test_plain_wording_and_ids_are_not_stiff() -> None:
    me = Principal(table="members", key={"member_id": "G-114"}, name="Ada Park")
    node = call("n0", "freeze_membership", write=True, member_id="G-114")
    task = make_task(
        "t",
        [node],
        instruction=(
            "You want to freeze your membership and hear about order ordered_by_mistake.\n"
            "You know: member id: G-114; order id: ordered_by_mistake. Give these only when asked."
        ),
        facts=[Fact(name="member_id", value="G-114"), Fact(name="order_id", value="ordered_by_mistake")],
        principal=me,
    )
    assert stiff_wording(task) == []
    # τ²'s own words: an id named as one is no code word
    tau2 = make_task(
        "t", [node], instruction="You just created your user id mei_patel_7272 and ordered 1 item."
    )
    assert stiff_wording(tau2) == []
    assert measure_realism("shop", [task, tau2], TOOLS).stiff_tasks == 0


def test_the_people_of_a_bundled_env_are_its_tables_of_persons() -> None:
    # what `envforge check` and `bench_realism.py` both pass as `people`: the benchmark once passed
    # none and counted all 60 of the bundled Slack's tasks stiff where `check` counted 0
    assert load_phrases(load_env(REPO / "envs" / "slack")).person_tables() == {"slack_users"}
    assert load_phrases(load_env(REPO / "envs" / "retail_orders")).person_tables() == {"customers"}
