"""Play an envforge episode through OpenEnv's stock client (docs/integrations.md#openenv).

    python examples/openenv_episode.py --smoke       # offline: one scored episode, exit 0
    python examples/openenv_episode.py --model PATH --env envs/library --task library-0-00003
    python examples/openenv_episode.py --agent oracle --env envs/car_rental

The server is OpenEnv's own app (`envforge.integrations.openenv.openenv_app`), served by uvicorn
on 127.0.0.1; the client is OpenEnv's `EnvClient` typed with envforge's action, observation and
state (`envforge.integrations.openenv.EnvforgeEnv`). The agent is a local causal
LM (`--model`; with `--smoke`, a tiny random one built here when torch and transformers are
installed, the `train` extra) or envforge's oracle. It calls tools in the `<tool_call>` form
envforge's trainer reads; anything else it writes goes to envforge's simulated user, whose reply
comes back as the next observation, until the user stops and the reward arrives.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


class ModelAgent:
    """A local causal LM as an envforge agent: the env's policy and tools as the system message,
    the conversation through the tokenizer's chat template, one generation per action."""

    def __init__(self, model_dir: str, system: str, max_new_tokens: int) -> None:
        from transformers import AutoModelForCausalLM

        from envforge.trainer import load_tokenizer

        self.tokenizer = load_tokenizer(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir)
        self.system = system
        self.max_new_tokens = max_new_tokens

    async def respond(self, messages: list[Any], tools: list[dict[str, Any]], client: Any) -> Any:
        import torch

        from envforge.harness import Message, ToolCall
        from envforge.trainer import parse_tool_call

        names = [t["function"]["name"] for t in tools]
        listed = "\n".join(f"- {t['function']['name']}: {t['function']['description']}" for t in tools)
        chat = [{"role": "system", "content": f"{self.system}\n\nTools:\n{listed}\n{CALL_FORMAT}"}]
        for m in messages:
            if m.tool_calls:
                calls = [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]
                text = "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)
                chat.append({"role": "assistant", "content": text})
            else:
                chat.append({"role": m.role, "content": m.content or ""})
        ids = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
        with torch.no_grad():
            out = self.model.generate(ids, max_new_tokens=self.max_new_tokens, do_sample=False)
        text = self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
        call = parse_tool_call(text, names)
        if call is None:
            return Message(role="assistant", content=text)
        return Message(
            role="assistant", tool_calls=[ToolCall(id="call", name=call.name, arguments=call.arguments)]
        )


CALL_FORMAT = 'To call a tool, write only <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>.'


def serve(app: Any) -> tuple[str, Any, threading.Thread]:
    """`app` served by uvicorn in a thread on 127.0.0.1, on a port the OS picks."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # proxy_headers off: the per-client session cap counts the peer's own address
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", proxy_headers=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the OpenEnv app did not start on 127.0.0.1:{port}")
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server, thread


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="one episode offline, on a tiny model or the oracle"
    )
    parser.add_argument("--env", action="append", type=Path, help="an env folder (repeatable)")
    parser.add_argument("--task", help="the task to play (default: the first env's first task)")
    parser.add_argument("--agent", choices=["model", "oracle"], help="default: a model where one is at hand")
    parser.add_argument("--model", help="a local causal LM folder (transformers)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-steps", type=int, default=30, help="actions before the episode is cut")
    args = parser.parse_args(argv)
    if not (args.smoke or args.model or args.agent == "oracle"):
        parser.error("give --model PATH, --agent oracle, or --smoke")

    from envforge.synth import load_policy_rules, load_tasks

    env_dirs = args.env or [REPO / "envs" / "library"]
    try:  # the arguments first: OpenEnv's import alone takes seconds (it loads gradio)
        tasks = {t.id: t for d in env_dirs for t in load_tasks(d)}
        task_id = args.task or load_tasks(env_dirs[0])[0].id
        if task_id not in tasks:
            raise ValueError(f"no task {task_id!r} in {', '.join(map(str, env_dirs))}")
        from envforge.harness import build_agent
        from envforge.integrations.openenv import EnvforgeEnv, openenv_app
        from envforge.integrations.openenv_play import play
        from envforge.server import load_env

        app = openenv_app(env_dirs, max_steps=args.max_steps)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    task = tasks[task_id]
    env = load_env(next(d for d in env_dirs if any(t.id == task_id for t in load_tasks(d))))
    has_ml = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
    agent_kind = args.agent or ("model" if args.model or (args.smoke and has_ml) else "oracle")

    url, server, thread = serve(app)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if agent_kind == "model":
                model_dir = args.model
                if model_dir is None:  # --smoke: a tiny random model over the env's own words
                    from envforge.trainer import build_tiny_model

                    corpus = [
                        env.policy,
                        task.scenario.instruction,
                        *(s.description for s in env.tools.values()),
                    ]
                    model_dir = str(build_tiny_model(Path(tmp) / "model", corpus))
                max_new = min(args.max_new_tokens, 16) if args.smoke else args.max_new_tokens
                agent: Any = ModelAgent(model_dir, env.policy, max_new)
            else:
                agent = build_agent("oracle", task, seed=0, policy=env.policy, rules=load_policy_rules(env))

            async def episode() -> Any:
                async with EnvforgeEnv(base_url=url) as client:
                    return await play(client, agent, task_id=task_id, max_actions=args.max_steps + 1)

            played = asyncio.run(episode())
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    for m in played.messages:
        said = (
            m.content
            if not m.tool_calls
            else ", ".join(f"{c.name}({json.dumps(c.arguments)})" for c in m.tool_calls)
        )
        print(f"{m.role:>9}: {(said or '').strip()[:160]}")
    print(
        f"{agent_kind} played {task_id} through OpenEnv's client: reward {played.reward} "
        f"({played.status}; {', '.join(f'{k} {v:g}' for k, v in played.parts.items())})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
