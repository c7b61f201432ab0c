"""The server half of the instant fake models (`instant_llm_airline.py`, `instant_llm_telecom.py`).

A fake is a `Script`: how to tell the caller's role from a request, and the agent's and the
user's next move read off the messages. This module turns a script into an OpenAI-compatible
chat-completions server that answers at once: the whole response goes out in one write with
TCP_NODELAY (a header write followed by a body write costs ~40 ms per answer, Nagle's algorithm
against delayed ACKs, and would time the fake, not the harness), and `GET /stats` gives the request
counts per role so a run can show it used the fake.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Move = tuple[str | None, list[tuple[str, dict[str, Any]]]]
"""A turn: its text (or None) and its tool calls as (name, arguments)."""


@dataclass(frozen=True)
class Script:
    agent: Callable[[list[dict[str, Any]]], Move]
    user: Callable[[dict[str, Any]], Move]
    """Gets the whole request body (a user with tools of its own may call them)."""
    is_user: Callable[[dict[str, Any]], bool] = lambda body: False
    """Whether a request that carries tools is the user's (dual control) rather than the agent's."""


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def system_text(messages: list[dict[str, Any]]) -> str:
    return " ".join(text_of(m) for m in messages if m.get("role") == "system")


def judge_answer(messages: list[dict[str, Any]]) -> str:
    """Every expected outcome not met (τ²'s NL-assertion contract: `metExpectation`)."""
    talk = "\n".join(text_of(m) for m in messages)
    expected = re.findall(r"^\s*-\s*(.+)$", talk, re.M) or ["the outcome"]
    results = [{"expectedOutcome": e, "reasoning": "not met", "metExpectation": False} for e in expected]
    return json.dumps({"results": results})


class _Fake:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.counts = {"agent": 0, "user": 0, "judge": 0}
        self.lock = threading.Lock()

    def role_of(self, body: dict[str, Any]) -> str:
        if body.get("tools"):
            return "user" if self.script.is_user(body) else "agent"
        return "judge" if "metExpectation" in system_text(body.get("messages") or []) else "user"

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        role = self.role_of(body)
        with self.lock:
            self.counts[role] += 1
        messages = body.get("messages") or []
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if role == "judge":
            message["content"] = judge_answer(messages)
        else:
            content, calls = self.script.agent(messages) if role == "agent" else self.script.user(body)
            message["content"] = content
            if calls:
                message["tool_calls"] = [
                    {
                        "id": f"call_{len(messages)}_{i}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                    for i, (name, args) in enumerate(calls)
                ]
        prompt = sum(len(text_of(m)) for m in messages) // 4
        completion = len(json.dumps(message)) // 4
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return {
            "id": "chatcmpl-instant",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }


def serve(script: Script, default_port: int) -> None:
    """Serve `script` on 127.0.0.1 at the port given as the first argument (or `default_port`)."""
    fake = _Fake(script)

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
            with fake.lock:
                self._send(200, dict(fake.counts))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                self._send(400, {"error": "body is not JSON"})
                return
            self._send(200, fake.answer(body))

        def log_message(self, format: str, *args: Any) -> None:
            pass

    port = int(sys.argv[1]) if len(sys.argv) > 1 else default_port
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
