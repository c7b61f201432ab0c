"""The user-error (MEU) detector's precision and recall on the labeled set, per kind.

ERPO masks what the detector flags, so these figures say how much of training's signal it keeps
right. The set (`tests/fixtures/meu_labeled.jsonl`) is built from the bundled envs' tasks by
`envforge.harness.user_error_set`; `--generate` rewrites it (same seed, same bytes).

Rows: the rules alone, and with `--judge MODEL` also the rules then that judge (any
OpenAI-compatible endpoint: `--judge openai/NAME --judge-api-base http://127.0.0.1:PORT/v1`, or
`--judge local[/NAME]`: a packaged model served for the run by the same launcher as the CLI's
`--judge local`, one server for the whole run).

`--harness-runs` also counts false alarms outside the set: every task of the bundled envs played by
the built-in agents (oracle, noop, random, and the adversaries golden_prefix and spray) with the
scripted user, which never errs, through the real harness.

usage: python benchmarks/bench_meu.py [--generate] [--judge MODEL [--judge-api-base URL]] [--misses]
                                      [--per-label N] [--harness-runs]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import anyio
from _util import REPO

from envforge.harness import (
    DEFAULT_PER_ENV,
    DEFAULT_SEED,
    EvalConfig,
    Evaluation,
    InfraError,
    LabeledConversation,
    LLMConfig,
    LocalModelError,
    LocalServerError,
    aclose_http_sessions,
    build_set,
    bundled_env_dirs,
    dump_set,
    evaluate,
    is_local_spec,
    load_set,
    rules_only,
    rules_then_judge,
    run_eval,
    running_local_server,
    task_index,
    user_error_table,
)

FIXTURE = REPO / "tests" / "fixtures" / "meu_labeled.jsonl"


HARNESS_AGENTS = ("oracle", "noop", "random", "golden_prefix", "spray")


async def harness_false_alarms(env_dirs: list[Path]) -> None:
    """Trials whose user is the scripted one (it never errs): every flag is a false alarm."""
    print("\n| agent (scripted user) | trials | flagged as user error |\n|---|---|---|")
    for agent in HARNESS_AGENTS:
        with tempfile.TemporaryDirectory() as tmp:
            _, records = await run_eval(env_dirs, EvalConfig(agent=agent, concurrency=8), Path(tmp) / "run")
        flagged = [f"{r.task_id}: {r.user_error_reason}" for r in records if r.user_error]
        print(f"| {agent} | {len(records)} | {len(flagged)} |")
        for line in flagged[:5]:
            print(f"  {line}")


def first_per_label(items: list[LabeledConversation], n: int) -> list[LabeledConversation]:
    """A stated, deterministic subset: the first `n` items of each label in the set's order (a
    local judge on two busy cores takes tens of seconds per conversation)."""
    seen: dict[str, int] = {}
    kept = []
    for item in items:
        seen[item.label] = seen.get(item.label, 0) + 1
        if seen[item.label] <= n:
            kept.append(item)
    return kept


async def main(args: argparse.Namespace) -> int:
    envs_root = REPO / "envs"
    if args.generate:
        items = await build_set(bundled_env_dirs(envs_root), seed=args.seed, per_env=args.per_env)
        args.set.write_bytes(dump_set(items))
        print(f"wrote {len(items)} items to {args.set}")
    if not args.set.is_file():
        print(f"error: no labeled set at {args.set} (run with --generate)", file=sys.stderr)
        return 2
    items = load_set(args.set)
    if args.per_label:
        items = first_per_label(items, args.per_label)
        print(f"subset: the first {args.per_label} items of each label ({len(items)} items)", file=sys.stderr)
    tasks = task_index(items, envs_root)
    results: dict[str, Evaluation] = {"rules": await evaluate(items, tasks, rules_only)}
    if args.judge and is_local_spec(args.judge):
        try:
            with running_local_server(args.judge) as server:
                print(f"local judge: {server.model.name} at {server.base_url}", file=sys.stderr)
                judge = server.llm_config(0.0)
                try:
                    results[f"rules + {args.judge}"] = await evaluate(
                        items, tasks, rules_then_judge(judge), concurrency=args.concurrency
                    )
                finally:
                    await aclose_http_sessions()  # before the server stops under them
        except (LocalModelError, LocalServerError, InfraError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    elif args.judge:
        judge = LLMConfig(model=args.judge, api_base=args.judge_api_base, temperature=0.0)
        results[f"rules + {args.judge}"] = await evaluate(
            items, tasks, rules_then_judge(judge), concurrency=args.concurrency
        )
    print(user_error_table(results))
    if args.harness_runs:
        await harness_false_alarms(bundled_env_dirs(envs_root))
    if args.misses:
        for name, result in results.items():
            print(f"\n{name}: false alarms: {result.false_alarm_items}")
            print(f"{name}: misses: {result.misses}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", type=Path, default=FIXTURE, help="the labeled set (JSON lines)")
    parser.add_argument("--generate", action="store_true", help="rebuild the set from the bundled envs first")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--per-env", type=int, default=DEFAULT_PER_ENV)
    parser.add_argument(
        "--judge", help="model judging what the rules let through (litellm/OpenAI-style name)"
    )
    parser.add_argument("--judge-api-base", help="the judge's OpenAI-compatible base URL")
    parser.add_argument("--concurrency", type=int, default=1, help="judge calls in flight")
    parser.add_argument("--per-label", type=int, help="only the first N items of each label")
    parser.add_argument("--misses", action="store_true", help="list the false alarms and missed items")
    parser.add_argument(
        "--harness-runs", action="store_true", help="also count flags on built-in agents' runs"
    )
    sys.exit(anyio.run(main, parser.parse_args()))
