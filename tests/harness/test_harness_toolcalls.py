"""Tool calls written as text, in every form the local models emit, and tools rendered into a prompt.

The captured outputs (tests/fixtures/local_model_outputs.json) are answers the packaged models
gave through the real server to retail_orders first turns (written by
`benchmarks/bench_local_models.py --capture`), and turns Qwen2.5-Coder wrote while `envforge
train` trained it (their `source` says so); each entry says which calls it must parse to.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from envforge.harness.llm import LLMConfig, MalformedOutput, complete, to_openai
from envforge.harness.records import Message, ToolCall, TrialRecord
from envforge.harness.tool_use import tool_call_validity
from envforge.harness.toolcalls import (
    MalformedToolCall,
    extract_tool_calls,
    parse_tool_calls,
    render_tools,
    tools_into_prompt,
)

from support.paths import FIXTURES

CAPTURED = json.loads((FIXTURES / "local_model_outputs.json").read_text())


def calls_of(text: str) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in parse_tool_calls(text)[1]]


@pytest.mark.parametrize("case", CAPTURED, ids=[c["id"] for c in CAPTURED])
def test_captured_outputs_parse_to_their_calls(case: dict[str, Any]) -> None:
    expected = [(c["name"], c["arguments"]) for c in case["calls"]]
    if case.get("malformed"):
        with pytest.raises(MalformedToolCall):
            parse_tool_calls(case["content"])
        return
    assert calls_of(case["content"]) == expected


def test_qwen_tags_several_calls_and_text_around_them() -> None:
    text = (
        "Let me look both up.\n"
        '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "O-1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_customer", "arguments": {"customer_id": "C-2"}}\n</tool_call>'
    )
    rest, calls = parse_tool_calls(text)
    assert rest == "Let me look both up."
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_order", {"order_id": "O-1"}),
        ("get_customer", {"customer_id": "C-2"}),
    ]
    assert len({c.id for c in calls}) == 2


def test_a_list_of_calls_in_one_tag_is_every_call() -> None:
    text = (
        '<tool_call>[{"name": "get_order", "arguments": {"order_id": "O-1"}}, '
        '{"name": "get_customer", "arguments": {"customer_id": "C-2"}}]</tool_call>'
    )
    rest, calls = parse_tool_calls(text)
    assert rest is None
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_order", {"order_id": "O-1"}),
        ("get_customer", {"customer_id": "C-2"}),
    ]
    assert len({c.id for c in calls}) == 2


def test_the_result_a_model_invents_after_its_call_stays_text() -> None:
    rest, calls = parse_tool_calls('{"name": "get_class", "arguments": {"class_id": "CL-1"}}{"capacity": 2}')
    assert [(c.name, c.arguments) for c in calls] == [("get_class", {"class_id": "CL-1"})]
    assert rest == '{"capacity": 2}'  # kept, not lost: the env's own result answers the call


def test_a_call_written_after_an_invented_result_is_not_run() -> None:
    # the second call acts on a value the env never returned
    text = (
        '{"name": "get_class", "arguments": {"class_id": "CL-1"}}{"capacity": 2}'
        '{"name": "book_class", "arguments": {"class_id": "CL-1", "seats": 2}}'
    )
    rest, calls = parse_tool_calls(text)
    assert [c.name for c in calls] == ["get_class"]
    assert rest is not None and "book_class" in rest


def test_an_invented_result_before_any_call_is_no_call() -> None:
    text = '{"capacity": 2}{"name": "book_class", "arguments": {"class_id": "CL-1"}}'
    assert parse_tool_calls(text) == (text, [])


def test_a_closing_brace_too_many_after_a_call_is_dropped() -> None:
    call = '{"name": "get_book", "arguments": {"book_id": "B-1"}}'
    assert calls_of(call + "\n}") == calls_of(call + "}}") == [("get_book", {"book_id": "B-1"})]
    assert parse_tool_calls(call + "}}}") == (call + "}}}", [])  # more than a slip: not a call


def test_a_python_literal_call_is_a_call() -> None:
    text = "{'name': 'get_drug', 'arguments': {'drug_id': 'D-201', 'ok': True, 'n': None}}"
    assert calls_of(text) == [("get_drug", {"drug_id": "D-201", "ok": True, "n": None})]


@pytest.mark.parametrize(
    "text",
    [
        "{'name': 'get_drug', 'arguments': {'ids': {1, 2}}}",  # a set
        "{'name': 'get_drug', 'arguments': {'ids': (1, 2)}}",  # a tuple
        "{'name': 'get_drug', 'arguments': {1: 'D-201'}}",  # a key JSON would turn into a string
        "{'name': 'get_drug', 'arguments': {'drug_id': b'D-201'}}",  # bytes
    ],
)
def test_a_python_literal_json_cannot_write_is_no_call(text: str) -> None:
    assert parse_tool_calls(text) == (text, [])


def test_reading_a_python_literal_runs_no_code(tmp_path: Any) -> None:
    marker = tmp_path / "ran"
    text = f"{{'name': __import__('pathlib').Path({str(marker)!r}).touch(), 'arguments': {{}}}}"
    assert parse_tool_calls(text) == (text, [])
    assert not marker.exists()


def test_unclosed_tag_at_the_end_still_counts() -> None:
    # A token limit can cut the closing tag off.
    assert calls_of('<tool_call>{"name": "get_product", "arguments": {"product_id": "P-1"}}') == [
        ("get_product", {"product_id": "P-1"})
    ]


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_product", "arguments": {"product_id": "P-104"}}',
        '```json\n{"name": "get_product", "arguments": {"product_id": "P-104"}}\n```',
        '```\n{"name": "get_product", "parameters": {"product_id": "P-104"}}\n```',
        '{"name": "get_product", "arguments": "{\\"product_id\\": \\"P-104\\"}"}',
        '[{"name": "get_product", "arguments": {"product_id": "P-104"}}]',
        '{"function": {"name": "get_product", "arguments": {"product_id": "P-104"}}}',
    ],
)
def test_bare_json_forms(text: str) -> None:
    assert calls_of(text) == [("get_product", {"product_id": "P-104"})]


def test_several_bare_objects_in_one_message() -> None:
    text = (
        '{"name": "get_order", "arguments": {"order_id": "O-1"}}\n'
        '{"name": "get_order", "arguments": {"order_id": "O-2"}}'
    )
    assert calls_of(text) == [("get_order", {"order_id": "O-1"}), ("get_order", {"order_id": "O-2"})]


@pytest.mark.parametrize(
    "text",
    [
        "Your order O-1 has shipped.",
        '{"status": "shipped"}',  # JSON for the user, not call-shaped
        'The call would be {"name": "get_order"} but I need the id first.',  # JSON inside prose
        "",
    ],
)
def test_plain_text_stays_text(text: str) -> None:
    rest, calls = parse_tool_calls(text)
    assert calls == [] and rest == text


def test_arguments_that_are_not_an_object_reach_the_orchestrator_as_unparsed() -> None:
    (call,) = parse_tool_calls('{"name": "get_order", "arguments": "O-1"}')[1]
    assert call.name == "get_order" and "__unparsed__" in call.arguments


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>get_order(O-1)</tool_call>",
        '<tool_call>{"arguments": {"order_id": "O-1"}}</tool_call>',
        '<tool_call>{"name": "get_order", "arguments": {"order_id": </tool_call>',
        '<tool_call>[{"name": "get_order", "arguments": {}}, "and then"]</tool_call>',
        "<tool_call>[]</tool_call>",
    ],
)
def test_a_tagged_call_that_is_not_one_is_malformed(text: str) -> None:
    with pytest.raises(MalformedToolCall):
        parse_tool_calls(text)


def test_structured_calls_are_left_alone() -> None:
    message = Message(
        role="assistant",
        content='{"name": "x", "arguments": {}}',
        tool_calls=[ToolCall(id="a", name="get_order", arguments={"order_id": "O-1"})],
    )
    assert extract_tool_calls(message) is message


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order",
            "description": "Look up an order.\nMore detail here.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "include": {"type": "array", "items": {"enum": ["items", "payments"]}},
                    "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                },
                "required": ["order_id"],
            },
        },
    }
]


def test_tools_render_compactly() -> None:
    assert render_tools(TOOLS) == (
        '- get_order(order_id: str, include?: list["items"|"payments"], limit?: int): Look up an order.'
    )


def test_conversation_for_a_model_without_tool_support() -> None:
    messages = [
        {"role": "system", "content": "Policy."},
        {"role": "user", "content": "Where is O-1?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_order", "arguments": '{"order_id": "O-1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'},
    ]
    out = tools_into_prompt(messages, TOOLS)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Policy.")
    assert "- get_order(" in out[0]["content"] and "<tool_call>" in out[0]["content"]
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "get_order", "arguments": {"order_id": "O-1"}}</tool_call>',
    }
    assert out[3] == {"role": "user", "content": '<tool_response>\n{"status": "shipped"}\n</tool_response>'}
    assert all("tool_calls" not in m for m in out)
    # What the model then writes in that form comes back as a call.
    assert calls_of(out[2]["content"]) == [("get_order", {"order_id": "O-1"})]


async def test_complete_turns_text_calls_into_tool_calls_and_malformed_ones_into_the_agents_fault() -> None:
    cfg = LLMConfig(
        model="openai/m",
        mock_response='```json\n{"name": "get_order", "arguments": {"order_id": "O-1"}}\n```',
    )
    message, _ = await complete(cfg, [{"role": "user", "content": "hi"}], tools=TOOLS)
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("get_order", {"order_id": "O-1"})]
    assert message.content is None
    # Without tools on offer, the same text is just text.
    message, _ = await complete(cfg, [{"role": "user", "content": "hi"}])
    assert message.tool_calls == [] and message.content is not None
    bad = LLMConfig(model="openai/m", mock_response="<tool_call>get_order(O-1)</tool_call>")
    with pytest.raises(MalformedOutput):
        await complete(bad, [{"role": "user", "content": "hi"}], tools=TOOLS)


def _record(messages: list[Message], status: str = "completed", calls: int = 1) -> TrialRecord:
    return TrialRecord.model_validate(
        {
            "run_id": "r",
            "trial_key": "e/t/0",
            "env": "e",
            "task_id": "t",
            "trial": 0,
            "seed": 0,
            "status": status,
            "termination": "user_stop",
            "messages": [m.model_dump() for m in messages],
            "usage": {"agent": {"calls": calls}},
            "started_at": 0.0,
            "duration_s": 0.0,
            "agent": "local",
            "user": "scripted",
        }
    )


def test_tool_call_validity_counts_turns() -> None:
    good = ToolCall(id="a", name="get_order", arguments={"order_id": "O-1"})
    unknown = ToolCall(id="b", name="get_ordr", arguments={})
    record = _record(
        [
            Message(role="user", content="hi"),
            Message(role="assistant", tool_calls=[good]),
            Message(role="tool", tool_call_id="a", content="{}"),
            Message(role="assistant", tool_calls=[unknown]),
            Message(role="tool", tool_call_id="b", content="Error: unknown tool 'get_ordr'", is_error=True),
            Message(role="assistant", content="Done."),
        ]
    )
    malformed = _record([Message(role="user", content="hi")], status="malformed_output")
    builtin = _record([Message(role="assistant", tool_calls=[good])], calls=0)
    assert tool_call_validity([record, malformed, builtin]) == {
        "agent_turns": 4,
        "tool_call_turns": 3,
        "valid_tool_call_turns": 1,
        "valid_share": 0.25,
    }


def test_a_call_without_text_is_sent_without_content() -> None:
    """llama-cpp-python's server (the local runtime) answers 422 to `"content": null` beside tool
    calls — every second turn of a local agent failed so; the spec lets content be absent."""
    call = ToolCall(id="a", name="get_order", arguments={"order_id": "O-1"})
    (sent,) = to_openai([Message(role="assistant", tool_calls=[call])])
    assert "content" not in sent and sent["tool_calls"][0]["function"]["name"] == "get_order"
    (said,) = to_openai([Message(role="assistant", content="Looking.", tool_calls=[call])])
    assert said["content"] == "Looking."


def test_prose_around_fenced_calls() -> None:
    """Qwen2.5-Coder in a real eval turn: prose, then one fenced call per step, cut off at the
    token limit (the last fence never closes)."""
    text = (
        "Here are the responses for each of the functions:\n\n"
        '```json\n{\n  "name": "get_product",\n  "arguments": {\n    "product_id": "P-104"\n  }\n}\n```\n\n'
        '```json\n{"name": "search_products", "arguments": {"query": "lamp"}}\n```\n\n'
        '```json\n{\n  "name": "get_ord'
    )
    rest, calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_product", {"product_id": "P-104"}),
        ("search_products", {"query": "lamp"}),
    ]
    assert rest == "Here are the responses for each of the functions:"


def test_fenced_code_that_is_not_a_call_stays_text() -> None:
    text = "Use this:\n```python\nprint(1)\n```"
    assert parse_tool_calls(text) == (text, [])
    mixed = '```json\n{"name": "get_order", "arguments": {}}\n```\n```json\n{"status": 1}\n```'
    assert parse_tool_calls(mixed) == (mixed, [])
