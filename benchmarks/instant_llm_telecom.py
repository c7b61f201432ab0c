"""An instant fake OpenAI-compatible chat server playing τ²-bench telecom's first turns.

Usage: python benchmarks/instant_llm_telecom.py PORT

The telecom counterpart of `instant_llm_airline.py`: it answers at once with no model behind it,
so a harness run is timed with the LLM cost removed, and it plays the same shape of script on
telecom's tools, the user's own phone included, so both harnesses do the same dual-control work
per simulation. Each answer depends only on the request body; the step is read off the messages.

- USER (its tools include the phone's `check_status_bar`, or it has no tools and is no judge):
  a request naming the phone number from its instructions; then, once, `check_status_bar` on its
  own phone; then `###STOP###`.
- AGENT (any other request with tools): `get_customer_by_phone` with the first phone number seen
  in the conversation, then `get_details_by_id` for the first line id in that record, then the
  text "All done." (at once when a tool result is an error).
- JUDGE (no tools; the system prompt asks for `metExpectation`): every expectation not met.

The server (one write per answer, `GET /stats`) is `_instant_fake.py`'s.
"""

from __future__ import annotations

import re
from typing import Any

from _instant_fake import Move, Script, serve, system_text, text_of

PHONE = re.compile(r"\b\d{3}-\d{3}-\d{4}\b")
LINE_ID = re.compile(r"\bL\d{4}\b")
FALLBACK_PHONE = "555-123-2002"
USER_TOOL = "check_status_bar"


def is_user(body: dict[str, Any]) -> bool:
    """The user's requests carry the phone's tools."""
    return any(t.get("function", {}).get("name") == USER_TOOL for t in body.get("tools") or [])


def agent_move(messages: list[dict[str, Any]]) -> Move:
    calls_made = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    last_result = next((text_of(m) for m in reversed(messages) if m.get("role") == "tool"), "")
    if calls_made and (not last_result or last_result.startswith("Error")):
        return "All done.", []
    if calls_made == 0:
        talk = " ".join(text_of(m) for m in messages if m.get("role") in ("user", "assistant"))
        found = PHONE.findall(talk)
        return None, [("get_customer_by_phone", {"phone_number": found[0] if found else FALLBACK_PHONE})]
    if calls_made == 1 and (line := LINE_ID.search(last_result)):
        return None, [("get_details_by_id", {"id": line.group(0)})]
    return "All done.", []


def user_move(body: dict[str, Any]) -> Move:
    """The user's requests carry the roles swapped (the agent's turns as `user`): its own earlier
    replies are the `assistant` messages."""
    messages = body.get("messages") or []
    own = [m for m in messages if m.get("role") == "assistant"]
    if not own:
        found = PHONE.findall(system_text(messages))
        number = found[0] if found else FALLBACK_PHONE
        return f"Hi, my phone number is {number}. My mobile data is not working.", []
    if body.get("tools") and not any(m.get("tool_calls") for m in own):
        return None, [(USER_TOOL, {})]
    return "###STOP###", []


if __name__ == "__main__":
    serve(Script(agent=agent_move, user=user_move, is_user=is_user), default_port=8767)
