"""Evaluate a model on envforge environments through verifiers (docs/integrations.md#verifiers).

    python examples/verifiers_eval.py --smoke     # offline: the packaged local model, one episode
    python examples/verifiers_eval.py --base-url http://127.0.0.1:8000/v1 --model NAME \\
        --env envs/car_rental --limit 5

The env, its tasks, envforge's simulated user and the reward come from
`envforge.integrations.verifiers`; the episode runner (`Env.serving()`, `Env.run_episode`), the
interception server in front of the model and the trace are verifiers' own. `vf-eval` runs the
same env from the command line (`examples/envforge_verifiers.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMOKE_MODEL = "local/smollm2"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="one episode on the packaged local model, offline"
    )
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint (…/v1)")
    parser.add_argument("--model", help="the model name the endpoint serves")
    parser.add_argument("--api-key-var", default="OPENAI_API_KEY", help="env variable holding the key")
    parser.add_argument("--env", action="append", type=Path, help="an env folder (repeatable)")
    parser.add_argument("--limit", type=int, default=None, help="tasks per env")
    parser.add_argument("--user", default="scripted", help="envforge's simulated user: scripted, or a model")
    args = parser.parse_args(argv)
    if not args.smoke and not (args.base_url and args.model):
        parser.error("give --base-url and --model, or --smoke")
    try:
        import verifiers.v1 as vf

        from envforge.integrations.verifiers import load_environment
    except ImportError as exc:
        print(
            f"error: verifiers is not installed ({exc}); see docs/integrations.md#verifiers", file=sys.stderr
        )
        return 1

    env_dirs = args.env or [REPO / "envs" / "car_rental"]
    limit = 1 if args.smoke and args.limit is None else args.limit
    try:
        env = load_environment(env_dirs, limit=limit, user=args.user, max_user_turns=4 if args.smoke else 30)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with ExitStack() as stack:
        if args.smoke:
            from envforge.harness import local_model_ready, running_local_server

            if not local_model_ready(SMOKE_MODEL):
                print(f"error: {SMOKE_MODEL} is not installed (the `local` extra)", file=sys.stderr)
                return 1
            server = stack.enter_context(running_local_server(SMOKE_MODEL))
            base_url, model, key_var = server.base_url, server.model.name, "ENVFORGE_SMOKE_KEY"
            os.environ[key_var] = server.api_key
        else:
            base_url, model, key_var = args.base_url, args.model, args.api_key_var
        client = vf.EvalClientConfig(base_url=base_url, api_key_var=key_var)
        ctx = vf.ModelContext(
            model=model, client=client, sampling=vf.SamplingConfig(max_tokens=64) if args.smoke else None
        )
        episodes = asyncio.run(_evaluate(env, ctx))
    for episode in episodes:
        (trace,) = episode.traces
        reward = trace.rewards.get("envforge")
        score = "error" if reward is None or reward.score is None else f"{reward.score:.2f}"
        print(f"{episode.task.data.id}: reward {score} in {trace.num_turns} model turns")
        if not episode.ok:
            for error in episode.errors or trace.errors:
                print(f"  {error.type}: {error.message.splitlines()[0] if error.message else ''}")
    scored = [e for e in episodes if e.traces and e.traces[0].rewards.get("envforge") is not None]
    return 0 if scored and len(scored) == len(episodes) else 1


async def _evaluate(env: object, ctx: object) -> list[object]:
    async with env.serving():  # type: ignore[attr-defined]
        return [await env.run_episode(task, ctx) for task in env.taskset]  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
