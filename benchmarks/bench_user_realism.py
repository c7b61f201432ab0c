"""User realism with a real model: how often a local-model user leaks a fact or invents one.

A packaged model (`local` = Qwen2.5-Coder-0.5B by default) plays the simulated user through the
same launcher as `eval --user local` (one server for the run), against the oracle agent (or a
model agent given with `--agent`), on two task sets: the bundled envs' tasks (`--envs`, the first
`--limit` of each) and τ² retail's train split (the first `--tau2-limit`; `envforge import tau2
../shared/tau2/retail --out envs/tau2_retail` first). Each conversation is read by the MEU rules
(`harness.user_error_rules`, 100% precision on the labeled set): a `leak` is a hidden fact (a
value the agent had to find, a required output) stated before the agent surfaced it, an
`invented_fact` a typed value (id, email, date, amount) neither in the user's scenario nor said to
it. The rules report the first error of a conversation, so the rates are of conversations whose
first user error is of that kind; other kinds are counted apart, and so are conversations whose
user opened with the stop token (no request at all: neither leak nor invention can happen there).

usage: python benchmarks/bench_user_realism.py [--user local[/NAME]] [--agent oracle|local[/NAME]]
                                               [--envs a,b] [--limit N] [--tau2-limit M] [--max-turns T]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import anyio
from _util import REPO

from envforge.harness import (
    EvalConfig,
    Limits,
    LLMConfig,
    LocalModelError,
    LocalServerError,
    Message,
    is_local_spec,
    load_env_tasks,
    rule_verdict,
    run_eval,
    running_local_server,
)

ENVS = REPO / "envs"
TAU2 = ENVS / "tau2_retail"


Verdict = tuple[str, str | None, str | None, bool]


def opens_with_stop(messages: list[Message]) -> bool:
    """The user's first message is the stop token, in any spacing ("### STOP###"): no request made."""
    first = next((m.content or "" for m in messages if m.role == "user"), "")
    return re.sub(r"\s", "", first).upper().startswith("###STOP")


async def play(env_dirs: list[Path], config: EvalConfig) -> list[Verdict]:
    """(task id, the first user-error kind the rules find, its reason, whether the user opened with
    the stop token) per conversation."""
    with tempfile.TemporaryDirectory() as tmp:
        _, records = await run_eval(env_dirs, config, Path(tmp) / "run")
    tasks = {t.id: t for d in env_dirs for t in load_env_tasks(d).tasks}
    out = []
    for r in records:
        verdict = rule_verdict(tasks[r.task_id], r.messages)
        kind, why = (verdict.kind, verdict.reason) if verdict else (None, None)
        out.append((r.task_id, kind, why, opens_with_stop(r.messages)))
    return out


def report(name: str, verdicts: list[Verdict]) -> str:
    n = len(verdicts)
    kinds = Counter(kind for _, kind, _, _ in verdicts if kind)
    stopped = sum(stop for *_, stop in verdicts)
    other = sum(v for k, v in kinds.items() if k not in ("leak", "invented_fact"))

    def rate(count: int) -> str:
        return f"{count}/{n} ({100 * count / n:.0f}%)" if n else "–"

    return (
        f"| {name} | {n} | {rate(kinds['leak'])} | {rate(kinds['invented_fact'])} | {rate(other)} "
        f"| {rate(stopped)} |"
    )


def main(args: argparse.Namespace) -> int:
    bundled = [ENVS / e for e in args.envs.split(",")]
    sets: list[tuple[str, list[Path], str | None, int]] = [
        (f"bundled ({args.envs}, first {args.limit} each)", bundled, None, args.limit)
    ]
    if (TAU2 / "tasks.jsonl").is_file():
        sets.append((f"τ² retail train (first {args.tau2_limit})", [TAU2], "train", args.tau2_limit))
    else:
        print("tau2_retail not imported; only the bundled set", file=sys.stderr)
    rows = [
        "| task set | conversations | leak | invented fact | other user errors | opened with stop |",
        "|---|---|---|---|---|---|",
    ]
    examples: list[str] = []
    try:
        with running_local_server(args.user) as user_server:
            agent_llm: LLMConfig | None = None
            for name, dirs, split, limit in sets:
                config = EvalConfig(
                    agent=args.agent,
                    user=args.user,
                    agent_llm=agent_llm,
                    user_llm=user_server.llm_config(args.temperature),
                    concurrency=1,
                    split=split,
                    limit=limit,
                    limits=Limits(max_turns=args.max_turns, trial_timeout_s=args.timeout),
                )
                if is_local_spec(args.agent):
                    with running_local_server(args.agent) as agent_server:
                        config.agent_llm = agent_server.llm_config(0.0)
                        verdicts = anyio.run(play, dirs, config)
                else:
                    verdicts = anyio.run(play, dirs, config)
                rows.append(report(name, verdicts))
                examples += [f"{name}: {task}: {kind}: {why}" for task, kind, why, _ in verdicts if kind]
                print(rows[-1], file=sys.stderr, flush=True)
    except (LocalModelError, LocalServerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(rows))
    for line in examples:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--user", default="local", help="the local model playing the user")
    parser.add_argument("--agent", default="oracle", help="oracle, or local[/NAME]")
    parser.add_argument("--envs", default="retail_orders,it_tickets,flight_booking")
    parser.add_argument("--limit", type=int, default=2, help="first N tasks of each bundled env")
    parser.add_argument("--tau2-limit", type=int, default=5, help="first M τ² train tasks")
    parser.add_argument("--max-turns", type=int, default=4, help="user/agent exchanges per trial")
    parser.add_argument("--timeout", type=float, default=600.0, help="wall-clock limit per trial (s)")
    parser.add_argument("--temperature", type=float, default=0.0, help="the user's sampling temperature")
    args = parser.parse_args()
    if not is_local_spec(args.user):
        parser.error("--user must be local or local/NAME")
    sys.exit(main(args))
