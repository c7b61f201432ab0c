"""A tiny fake OpenAI-compatible server for envsynth tests: it serves RECORDED, hand-written responses.

It reads the stage and round from the first line of the system prompt (`envsynth stage=... round=...`)
and answers with the recording for that key, so the pipeline's real litellm HTTP path is exercised
without any model. Every request is kept in `requests` for assertions.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from envforge.synth.envsynth.llm import STAGE_LINE, LLMError, lookup


def build_fake_openai(
    recordings: dict[str, str], api_key: str | None = None
) -> tuple[Starlette, list[dict[str, Any]]]:
    """The app and the request bodies it answered; with `api_key`, a request without that bearer
    key is refused with 401, as envforge's own local server refuses it."""
    requests: list[dict[str, Any]] = []

    async def completions(request: Request) -> JSONResponse:
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "invalid api key"}}, status_code=401)
        body = await request.json()
        requests.append(body)
        system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
        m = STAGE_LINE.search(system)
        if m is None:
            return JSONResponse({"error": {"message": "no envsynth stage line"}}, status_code=400)
        try:
            text = lookup(recordings, m["stage"], int(m["round"]))
        except LLMError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=404)
        prompt_tokens = sum(len(x["content"]) for x in body["messages"]) // 4
        return JSONResponse(
            {
                "id": f"fake-{len(requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "fake"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(text) // 4,
                    "total_tokens": prompt_tokens + len(text) // 4,
                },
            }
        )

    routes = [Route(p, completions, methods=["POST"]) for p in ("/v1/chat/completions", "/chat/completions")]
    return Starlette(routes=routes), requests
