"""An instant fake OpenAI-compatible chat server playing τ²-bench airline's first turns.

Usage: python benchmarks/instant_llm_airline.py PORT

The airline counterpart of the shared retail fake (`../shared/bench/instant_llm.py`): it answers at
once with no model behind it, so a harness run is timed with the LLM cost removed, and it plays
the same shape of script on airline's own tools, so both harnesses do the same work per simulation
(three agent turns with two real lookups, two user turns, a judge call where the task has NL
assertions). Each answer depends only on the request body; the step is read off the messages.

- AGENT (the request carries `tools`): `get_user_details` with the first user id seen in the
  conversation, then `get_reservation_details` for the first reservation id in those details,
  then the text "All done." (at once when a tool result is an error).
- JUDGE (no tools; the system prompt asks for `metExpectation`): every expectation not met.
- USER (anything else): a request naming the user id from its instructions, then `###STOP###`.

The server (one write per answer, `GET /stats`) is `_instant_fake.py`'s.
"""

from __future__ import annotations

import re
from typing import Any

from _instant_fake import Move, Script, serve, system_text, text_of

USER_ID = re.compile(r"\b[a-z]+_[a-z]+_\d{3,5}\b")
RESERVATIONS = re.compile(r'"reservations"\s*:\s*\[\s*"([A-Z0-9]{6})"')
FALLBACK_USER = "mia_li_3668"


def agent_move(messages: list[dict[str, Any]]) -> Move:
    calls_made = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    last_result = next((text_of(m) for m in reversed(messages) if m.get("role") == "tool"), "")
    if calls_made and (not last_result or last_result.startswith("Error")):
        return "All done.", []
    if calls_made == 0:
        talk = " ".join(text_of(m) for m in messages if m.get("role") in ("user", "assistant"))
        found = USER_ID.findall(talk)
        return None, [("get_user_details", {"user_id": found[0] if found else FALLBACK_USER})]
    if calls_made == 1 and (reservation := RESERVATIONS.search(last_result)):
        return None, [("get_reservation_details", {"reservation_id": reservation.group(1)})]
    return "All done.", []


def user_move(body: dict[str, Any]) -> Move:
    """The user's requests carry the roles swapped (the agent's turns as `user`): its own earlier
    replies are the `assistant` messages."""
    messages = body.get("messages") or []
    if any(m.get("role") == "assistant" for m in messages):
        return "###STOP###", []
    found = USER_ID.findall(system_text(messages))
    return f"Hi, my user id is {found[0] if found else FALLBACK_USER}. Can you look at my reservation?", []


if __name__ == "__main__":
    serve(Script(agent=agent_move, user=user_move), default_port=8766)
