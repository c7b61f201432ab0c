"""Call shapes small models write that the reader once left as text (issue #39), and the rule
that a call is read only where it stands as a call.

The captured ones are in tests/fixtures/local_model_outputs.json (`source` says which run wrote
them; `test_harness_toolcalls.py` parses every entry); these tests hold each shape on its own.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from envforge.harness import parse_tool_calls

from support.paths import FIXTURES

CALL = {"name": "get_member", "arguments": {"member_id": "G-114"}}


def calls_of(text: str) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in parse_tool_calls(text)[1]]


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"name": "get_member", "arguments": json.dumps({"member_id": "G-114"})}),
        "{" + json.dumps(CALL) + "}",
        '{{"name": "get_member", "arguments": {{"member_id": "G-114"}}}}',
        "```json\n{" + json.dumps(CALL) + "}\n```",
        "<tool_call>{" + json.dumps(CALL) + "}</tool_call>",
        '{\n  "name": "get_member", // the lookup\n  "arguments": {"member_id": "G-114"} // by id\n}',
        json.dumps(CALL) + '\n{"member_id": "G-114", "status": "act',
    ],
    ids=[
        "arguments-as-json-string",
        "doubled-outer",
        "every-brace-doubled",
        "doubled-fenced",
        "doubled-tagged",
        "line-comments",
        "result-cut-off",
    ],
)
def test_a_call_in_a_miswritten_shape_is_read(text: str) -> None:
    assert calls_of(text) == [("get_member", {"member_id": "G-114"})]


@pytest.mark.parametrize(
    "text",
    [
        "Use {" + json.dumps(CALL) + "} to look the member up.",
        "To look it up I would write " + json.dumps(CALL),
        '{"error": "not found"}\n' + json.dumps(CALL),
        json.dumps(CALL) + " and then I will tell you",
        '{{"name": "get_member", "arguments": {{"member_id": "G-114"}}}} {{"user": 1}}',
        '{"note": "see http://example.com // not a comment"}',
    ],
    ids=[
        "doubled-in-prose",
        "call-after-prose",
        "after-invented-result",
        "prose-after-call",
        "doubled-with-a-non-call",
        "url-in-a-string",
    ],
)
def test_a_call_that_does_not_stand_as_a_call_stays_text(text: str) -> None:
    rest, calls = parse_tool_calls(text)
    assert calls == [] and rest == text


def test_a_comment_marker_inside_a_string_is_kept() -> None:
    text = '{"name": "send", "arguments": {"url": "http://x.org/a"} // send it\n}'
    assert calls_of(text) == [("send", {"url": "http://x.org/a"})]


def test_the_captured_outputs_of_the_re_measure_are_fixtures() -> None:
    captured = json.loads((FIXTURES / "local_model_outputs.json").read_text())
    ours = {c["id"]: c for c in captured if c.get("source", "").startswith("envforge eval envs/gym")}
    assert len(ours) == 6
    # `// comments` after values, and string arguments before a result cut off by the token limit
    assert ours["qwen2.5-coder-0.5b-eval-gym-0-00001"]["calls"][0]["name"] == "book_class"
    assert (
        ours["qwen2.5-coder-0.5b-eval-retail_orders-0-00005"]["calls"][0]["arguments"]["address_id"]
        == "O-5001"
    )
    # a call after a result the model invented is not run
    assert ours["qwen2.5-coder-0.5b-eval-retail_orders-0-00000"]["calls"] == []
