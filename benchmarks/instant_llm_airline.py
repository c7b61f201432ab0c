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

USER_ID = re.compile(r"\b[a-z]+_[a-z]+_\d{3,5}\b")
RESERVATIONS = re.compile(r'"reservations"\s*:\s*\[\s*"([A-Z0-9]{6})"')
FALLBACK_USER = "mia_li_3668"
COUNTS = {"agent": 0, "user": 0, "judge": 0}
LOCK = threading.Lock()


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def role_of(body: dict[str, Any]) -> str:
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
        found = USER_ID.findall(talk)
        return None, [("get_user_details", {"user_id": found[0] if found else FALLBACK_USER})]
    if calls_made == 1 and (reservation := RESERVATIONS.search(last_result)):
        return None, [("get_reservation_details", {"reservation_id": reservation.group(1)})]
    return "All done.", []


def user_move(messages: list[dict[str, Any]]) -> str:
    if any(m.get("role") == "assistant" for m in messages):
        return "###STOP###"
    system = " ".join(text_of(m) for m in messages if m.get("role") == "system")
    found = USER_ID.findall(system)
    return f"Hi, my user id is {found[0] if found else FALLBACK_USER}. Can you look at my reservation?"


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
    if role == "agent":
        content, calls = agent_move(messages)
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
        message["content"] = user_move(messages) if role == "user" else judge_move(messages)
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
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8766
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
