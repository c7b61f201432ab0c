"""A completion is the policy's to write: whatever JSON it puts in a turn, reading the turn for a
tool call ends in a call or in no call (a final answer), never in an exception that stops the
rollout, envforge's or trl's (which reads calls through `read_tool_calls_as_envforge`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from envforge.integrations.trl import read_tool_calls_as_envforge
from envforge.trainer import parse_tool_call

DEEP = "[" * 100_000 + "]" * 100_000
FORMS = {
    "bare": '{"name": "get_car", "arguments": {"a": ' + DEEP + "}}",
    "tagged": '<tool_call>{"name": "get_car", "arguments": {"a": ' + DEEP + "}}</tool_call>",
    "plain": "get_car {" + '"a": ' + DEEP + "}",
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_json_nested_past_the_decoder_is_no_call(form: str) -> None:
    assert parse_tool_call(FORMS[form], ["get_car"]) is None


def test_trl_reader_takes_such_a_turn_for_text() -> None:
    reader = read_tool_calls_as_envforge(SimpleNamespace())  # str responses never reach decode()
    message = reader.parse_response(FORMS["bare"], tools=[{"function": {"name": "get_car"}}])
    assert message == {"role": "assistant", "content": FORMS["bare"]}
