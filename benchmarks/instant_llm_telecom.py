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

The whole response goes out in one write with TCP_NODELAY: a header write followed by a body write
costs ~40 ms per answer (Nagle's algorithm against delayed ACKs) and would time the fake, not the
harness. `GET /stats` gives the request counts per role.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PHONE = re.compile(r"\b\d{3}-\d{3}-\d{4}\b")
LINE_ID = re.compile(r"\bL\d{4}\b")
FALLBACK_PHONE = "555-123-2002"
USER_TOOL = "check_status_bar"
COUNTS = {"agent": 0, "user": 0, "judge": 0}
LOCK = threading.Lock()


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def tool_names(body: dict[str, Any]) -> set[str]:
    return {t.get("function", {}).get("name", "") for t in body.get("tools") or [] if isinstance(t, dict)}


def role_of(body: dict[str, Any]) -> str:
    if USER_TOOL in tool_names(body):
        return "user"
    if body.get("tools"):
        return "agent"
    system = " ".join(text_of(m) for m in body.get("messages", []) if m.get("role") == "system")
    return "judge" if "metExpectation" in system else "user"


def agent_move(messages: list[dict[str, Any]]) -> tuple[str | None, list[tuple[str, dict[str, Any]]]]:
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


def user_move(
    messages: list[dict[str, Any]], has_tools: bool
) -> tuple[str | None, list[tuple[str, dict[str, Any]]]]:
    """The user's messages arrive with the roles swapped (the agent's turns as `user`), so its own
    earlier replies are the `assistant` messages."""
    own = [m for m in messages if m.get("role") == "assistant"]
    if not own:
        system = " ".join(text_of(m) for m in messages if m.get("role") == "system")
        found = PHONE.findall(system)
        return (
            f"Hi, my phone number is {found[0] if found else FALLBACK_PHONE}. My mobile data is not working.",
            [],
        )
    if has_tools and not any(m.get("tool_calls") for m in own):
        return None, [(USER_TOOL, {})]
    return "###STOP###", []


def judge_move(messages: list[dict[str, Any]]) -> str:
    talk = "\n".join(text_of(m) for m in messages)
    expected = re.findall(r"^\s*-\s*(.+)$", talk, re.M) or ["the outcome"]
    return json.dumps(
        {
            "results": [
                {"expectedOutcome": e, "reasoning": "not met", "metExpectation": False} for e in expected
            ]
        }
    )


def answer(body: dict[str, Any]) -> dict[str, Any]:
    role = role_of(body)
    with LOCK:
        COUNTS[role] += 1
    messages = body.get("messages") or []
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if role in ("agent", "user"):
        content, calls = (
            agent_move(messages) if role == "agent" else user_move(messages, bool(body.get("tools")))
        )
        message["content"] = content
        if calls:
            index = len(messages)
            message["tool_calls"] = [
                {
                    "id": f"call_{index}_{i}",
                    "type": "function",
                    "function": {"name": n, "arguments": json.dumps(a)},
                }
                for i, (n, a) in enumerate(calls)
            ]
    else:
        message["content"] = judge_move(messages)
    prompt = sum(len(text_of(m)) for m in messages) // 4
    completion = len(json.dumps(message)) // 4
    return {
        "id": "chatcmpl-instant",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "fake"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        head = (
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode()
        self.wfile.write(head + data)  # one write: see the module docstring

    def do_GET(self) -> None:
        with LOCK:
            self._send(200, dict(COUNTS))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._send(400, {"error": "body is not JSON"})
            return
        self._send(200, answer(body))

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8767
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
