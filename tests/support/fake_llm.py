"""Fake remote models on 127.0.0.1: an OpenAI-compatible chat server answered by a script (the agent
and the user of a task played by the policy), and a vLLM completions server speaking token ids."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from envforge.harness import confirmation_request
from envforge.server import load_env
from envforge.synth import Call, Task, identity_call, load_policy_rules

from support.paths import ENVS

Brain = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


def completion(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": "fake",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


class FakeOpenAI:
    """`POST /v1/chat/completions` answered by `brain(body) -> (status, json)`; every request is kept."""

    def __init__(self, brain: Brain) -> None:
        self.brain = brain
        self.requests: list[dict[str, Any]] = []
        self.user_agents: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                fake.requests.append(body)
                fake.user_agents.append(self.headers.get("user-agent", ""))
                status, payload = fake.brain(body)
                data = json.dumps(payload).encode()
                head = (
                    f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n"
                ).encode()
                self.wfile.write(head + data)  # one write: no Nagle stall between headers and body

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def agent_script(task: Task) -> list[Call | str]:
    """What an agent keeping the env's declared policy sends, one item per turn: the identity call
    the user's facts fill (`identity_call`), then the golden calls, each write the rules want
    confirmed after `confirmation_request(call)` (the user's yes comes between)."""
    env = load_env(ENVS / task.env)
    rules = load_policy_rules(env)
    if rules is None:
        return list(task.golden_calls)
    script: list[Call | str] = []
    if any(rules.needs_identity(c.name) for c in task.golden_calls):
        schemas = {name: spec.input_schema for name, spec in env.tools.items()}
        identity = identity_call(rules, schemas, {f.name: f.value for f in task.scenario.known_facts})
        assert identity is not None, task.id
        script.append(identity)
    for call in task.golden_calls:
        if rules.needs_confirmation(call.name):
            script.append(confirmation_request(call))
        script.append(call)
    return script


def confirmations(task: Task) -> int:
    """How many times the agent of `agent_script` asks the user's yes."""
    return sum(isinstance(step, str) for step in agent_script(task))


def scripted_brain(task: Task) -> Brain:
    """A model that plays both roles: the agent keeps the policy on its way through the golden
    calls (`agent_script`), then reports; the user asks, says yes to each confirmation request,
    then stops."""
    script = agent_script(task)

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        messages = body["messages"]
        if body["model"] == "fake-user":
            if len(messages) <= 2:
                return 200, completion("Please help me with my order.")
            asked = "(yes/no)" in (messages[-1].get("content") or "")
            return 200, completion("Yes, please go ahead." if asked else "###STOP###")
        done = sum(1 for m in messages if m["role"] == "assistant")
        if done < len(script):
            step = script[done]
            if isinstance(step, str):
                return 200, completion(step)
            return 200, completion(
                tool_calls=[
                    {
                        "id": f"call_{done}",
                        "type": "function",
                        "function": {"name": step.name, "arguments": json.dumps(step.arguments)},
                    }
                ]
            )
        return 200, completion("Done: " + "; ".join(task.required_outputs))

    return brain


class FakeVLLM:
    """Answers /v1/completions with scripted token ids as `token_id:<n>` and records requests."""

    def __init__(self, script: list[list[int]]) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.syncs: list[dict[str, Any]] = []

    async def completions(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        if not all(isinstance(t, int) for t in body["prompt"]) or not body.get("return_tokens_as_token_ids"):
            return JSONResponse({"error": "expected token ids"}, status_code=400)
        ids = self.script[(len(self.requests) - 1) % len(self.script)][: body["max_tokens"]]
        return JSONResponse(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "text": "",
                        "finish_reason": "stop",
                        "logprobs": {
                            "tokens": [f"token_id:{t}" for t in ids],
                            "token_logprobs": [-0.25 * (k + 1) for k in range(len(ids))],
                            "top_logprobs": [{f"token_id:{t}": -0.25 * (k + 1)} for k, t in enumerate(ids)],
                            "text_offset": [0] * len(ids),
                        },
                    }
                ],
                "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)},
            }
        )

    async def update(self, request: Request) -> JSONResponse:
        self.syncs.append(await request.json())
        return JSONResponse({"ok": True})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/update_weights", self.update, methods=["POST"]),
            ]
        )
