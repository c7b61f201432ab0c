"""Evaluate a model on envforge environments with inspect_ai (docs/integrations.md).

    python examples/inspect_eval.py --smoke     # offline: one sample, scored, its log written; exit 0
    python examples/inspect_eval.py --model hf/PATH --env envs/car_rental --limit 5
    inspect view --log-dir LOG_DIR              # the logs, in inspect's viewer

The task, the agent loop, the tools, the simulated user and the score come from
`envforge.integrations.inspect_tasks`; the eval and its log are inspect's own. With `--smoke` the
model is inspect's `mockllm/model` whose turns envforge's oracle agent writes (the harness's
`OracleAgent`: the task's golden calls, the checks the env's policy wants, its required outputs),
so the one sample scores 1.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def oracle_model(env_dir: Path, task_id: str) -> Any:
    """inspect's mockllm, each turn written by envforge's oracle agent for `task_id`."""
    from inspect_ai.model import (
        ChatCompletionChoice,
        ChatMessage,
        ChatMessageAssistant,
        ChatMessageTool,
        ChatMessageUser,
        ModelOutput,
        ModelUsage,
        get_model,
    )
    from inspect_ai.tool import ToolCall as InspectCall

    from envforge.harness import Message, ToolCall, build_agent
    from envforge.server import load_env
    from envforge.synth import load_policy_rules, load_tasks

    env = load_env(env_dir)
    task = next(t for t in load_tasks(env_dir) if t.id == task_id)
    agent = build_agent("oracle", task, seed=0, policy=env.policy, rules=load_policy_rules(env))
    tools = [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": schema}}
        for t in env.tools.values()
        for schema in [t.input_schema]
    ]

    def conversation(messages: list[ChatMessage]) -> list[Message]:
        out = []
        for m in messages:
            if isinstance(m, ChatMessageUser):
                out.append(Message(role="user", content=m.text))
            elif isinstance(m, ChatMessageAssistant) and m.tool_calls:
                calls = [ToolCall(id=c.id, name=c.function, arguments=c.arguments) for c in m.tool_calls]
                out.append(Message(role="assistant", tool_calls=calls))
            elif isinstance(m, ChatMessageAssistant):
                out.append(Message(role="assistant", content=m.text))
            elif isinstance(m, ChatMessageTool):
                failed = m.error is not None
                out.append(Message(role="tool", content=m.text, tool_call_id=m.tool_call_id, is_error=failed))
        return out

    async def respond(messages: list[ChatMessage], *_: Any) -> ModelOutput:
        reply = await agent.respond(conversation(messages), tools, None)  # type: ignore[arg-type]
        said = reply if isinstance(reply, Message) else reply.message
        if said.tool_calls:
            calls = [
                InspectCall(id=c.id, function=c.name, arguments=dict(c.arguments)) for c in said.tool_calls
            ]
            message = ChatMessageAssistant(content="", tool_calls=calls, model="mockllm", source="generate")
            out = ModelOutput(model="mockllm", choices=[ChatCompletionChoice(message=message)])
        else:
            out = ModelOutput.from_content("mockllm", said.content or "")
        out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return out

    return get_model("mockllm/model", custom_outputs=respond)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="one sample, offline, envforge's oracle as the model"
    )
    parser.add_argument("--model", help="an inspect model (e.g. openai-api/local/NAME, mockllm/model)")
    parser.add_argument("--base-url", help="the model's OpenAI-compatible server, for openai-api/... models")
    parser.add_argument("--env", type=Path, default=REPO / "envs" / "car_rental", help="an env folder")
    parser.add_argument("--limit", type=int, default=None, help="tasks to play")
    parser.add_argument("--user", default="scripted", help='"scripted", or a litellm model playing the user')
    parser.add_argument("--log-dir", type=Path, default=None, help="where inspect writes its logs")
    args = parser.parse_args(argv)
    if not args.smoke and not args.model:
        parser.error("give --model MODEL, or --smoke")

    try:
        import inspect_ai
    except ImportError:
        print('error: inspect_ai is not installed: pip install -e ".[inspect]"', file=sys.stderr)
        return 2
    from inspect_ai.log import read_eval_log
    from inspect_ai.model import get_model

    from envforge.integrations.inspect_tasks import envforge_task

    try:
        task = envforge_task(args.env, limit=1 if args.smoke else args.limit, user=args.user)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.smoke:
        model = oracle_model(args.env, str(task.dataset[0].id))
    else:
        model = get_model(args.model, base_url=args.base_url)
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = args.log_dir or (Path(tmp) if args.smoke else Path("logs"))
        (log,) = inspect_ai.eval(task, model=model, log_dir=str(log_dir), display="none")
        log = read_eval_log(log.location)
        for sample in log.samples or []:
            for score in (sample.scores or {}).values():
                print(f"{sample.id}: {score.value} ({score.explanation})")
        kept = "" if args.log_dir or not args.smoke else " (removed on exit: --log-dir DIR keeps it)"
        print(f"log: {log.location}{kept}\nview: inspect view --log-dir {log_dir}")
        if log.status != "success":
            print(f"error: the eval ended {log.status}: {log.error}", file=sys.stderr)
            return 1
        if args.smoke and not (log.samples and log.samples[0].scores):
            print("error: the smoke sample was not scored", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
