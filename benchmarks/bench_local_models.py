"""Local models through the local server: load time, prompt and generation speed, first-turn tool calls.

For each packaged model (harness/local_models.py) whose packages are installed: assemble and
verify the GGUF, start the server (time until it answers = load time), then on retail_orders'
real first turn — its policy as the system prompt, its tools (in the model's own tool format, or
rendered into the prompt for models without one) and the first user message of a task:

- time to first token on the cold prompt (`max_tokens=1`: prompt processing only), and prompt
  tokens/s from it;
- generated tokens/s: the same prompt again (its prefix now cached) with a fixed answer length;
- tool-call validity on the first turns of N tasks (each a new user message after the cached
  policy + tools): the share of answers with a well-formed call to a tool the env has, and the
  share whose first call is the task's first golden call. Text answers are read by the harness's
  own parser (`harness.toolcalls`), so text-form calls count the way they count in `eval`.

usage: python benchmarks/bench_local_models.py [--models a,b] [--tasks N] [--capture FILE]
`--capture` writes the raw answers as a fixture (tests/fixtures/local_model_outputs.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from envforge.harness import (
    LOCAL_MODELS,
    LocalServer,
    assemble,
    local_model_available,
    parse_tool_calls,
    request_text,
    start_local_server,
    stop_local_server,
    tools_into_prompt,
)
from envforge.server import load_env
from envforge.synth import load_tasks

REPO = Path(__file__).resolve().parents[1]
ENV = REPO / "envs" / "retail_orders"
GEN_TOKENS = 128


def env_tools() -> tuple[str, list[dict[str, Any]]]:
    env = load_env(ENV)
    tools = [
        {
            "type": "function",
            "function": {"name": s.name, "description": s.description, "parameters": s.input_schema},
        }
        for s in env.tools.values()
    ]
    return env.policy, tools


def timed_post(server: LocalServer, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    response = httpx.post(
        server.base_url + "/chat/completions",
        json={"model": server.model.name, **body},
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=900,
    )
    response.raise_for_status()
    return time.perf_counter() - started, response.json()


def first_turn(server: LocalServer, policy: str, tools: list[dict[str, Any]], user: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": policy}, {"role": "user", "content": user}]
    if server.model.tools_in_template:
        return {"messages": messages, "tools": tools}
    return {"messages": tools_into_prompt(messages, tools)}


def bench_model(name: str, n_tasks: int, console: Console) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    model = LOCAL_MODELS[name]
    t0 = time.perf_counter()
    path = assemble(model)
    assemble_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    server = start_local_server(model, path)
    load_s = time.perf_counter() - t0
    policy, tools = env_tools()
    tasks = load_tasks(ENV)[:n_tasks]
    captured: list[dict[str, Any]] = []
    try:
        body = first_turn(server, policy, tools, request_text(tasks[0]))
        ttft_s, cold = timed_post(server, {**body, "max_tokens": 1, "temperature": 0})
        console.print(
            f"{name}: loaded in {load_s:.1f} s; "
            f"first prompt {cold['usage']['prompt_tokens']} tokens in {ttft_s:.1f} s"
        )
        prompt_tokens = cold["usage"]["prompt_tokens"]
        count = [{"role": "user", "content": "Count from 1 to 300, separated by spaces."}]
        gen_s, warm = timed_post(server, {"messages": count, "max_tokens": GEN_TOKENS, "temperature": 0})
        generated = warm["usage"]["completion_tokens"]
        valid = right = 0
        turn_s: list[float] = []
        names = {t["function"]["name"] for t in tools}
        for task in tasks:
            body = first_turn(server, policy, tools, request_text(task))
            try:
                took, raw = timed_post(server, {**body, "temperature": 0, "max_tokens": model.max_tokens})
            except httpx.HTTPError as exc:
                console.print(f"  {task.id}: {type(exc).__name__}: {exc}; server log: {server.log_path}")
                raise
            turn_s.append(took)
            message = raw["choices"][0]["message"]
            content = message.get("content") or ""
            malformed = False
            try:
                calls = [
                    (c["function"]["name"], c["function"]["arguments"])
                    for c in message.get("tool_calls") or []
                ]
                if not calls:
                    calls = [(c.name, c.arguments) for c in parse_tool_calls(content)[1]]
            except ValueError:
                calls, malformed = [], True
            ok = bool(calls) and all(n in names and "__unparsed__" not in a for n, a in calls)
            valid += ok
            right += bool(calls) and calls[0][0] == task.golden_calls[0].name
            console.print(f"  {task.id}: {took:.1f} s, valid={ok}, {content[:100]!r}")
            if content and not message.get("tool_calls"):
                captured.append(
                    {
                        "id": f"{name}-{task.id}",
                        "model": name,
                        "content": content,
                        "calls": [{"name": n, "arguments": a} for n, a in calls],
                    }
                    | ({"malformed": True} if malformed else {})
                )
    finally:
        stop_local_server(server)
    row = {
        "model": name,
        "assemble_s": assemble_s,
        "load_s": load_s,
        "prompt_tokens": prompt_tokens,
        "ttft_s": ttft_s,
        "prompt_tok_s": prompt_tokens / ttft_s,
        "gen_tok_s": generated / gen_s,
        "first_turns": len(tasks),
        "valid_share": valid / len(tasks),
        "right_tool_share": right / len(tasks),
        "mean_turn_s": sum(turn_s) / len(turn_s),
    }
    return row, captured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(LOCAL_MODELS))
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--capture", type=Path)
    args = parser.parse_args()
    console = Console()
    rows, captured = [], []
    for name in args.models.split(","):
        if not local_model_available(LOCAL_MODELS[name]):
            console.print(f"{name}: packages not installed, skipped")
            continue
        row, raw = bench_model(name, args.tasks, console)
        rows.append(row)
        captured += raw
        console.print(row)
        if args.capture:
            args.capture.write_text(json.dumps(captured, indent=1) + "\n")
    table = Table(title="Local models on retail_orders' first turn")
    for col in (
        "model",
        "load s",
        "prompt tok",
        "TTFT s",
        "prompt tok/s",
        "gen tok/s",
        "valid calls",
        "right tool",
        "turn s",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["model"],
            f"{r['load_s']:.1f}",
            str(r["prompt_tokens"]),
            f"{r['ttft_s']:.1f}",
            f"{r['prompt_tok_s']:.0f}",
            f"{r['gen_tok_s']:.1f}",
            f"{r['valid_share']:.0%} of {r['first_turns']}",
            f"{r['right_tool_share']:.0%}",
            f"{r['mean_turn_s']:.1f}",
        )
    console.print(table)
    if args.capture:
        args.capture.write_text(json.dumps(captured, indent=1) + "\n")


if __name__ == "__main__":
    main()
