"""How well a local-model user follows its instruction, against the scripted user on the same tasks.

The oracle agent (deterministic: it makes the task's golden calls, asks for consent where the
env's policy wants it, then says "All done." with the required outputs) plays each task twice:
once with the scripted user, once with a packaged model as the user (`local` = Qwen2.5-Coder-0.5B,
the default of `--user local`). The agent is the same both times, so every difference is the
user's. Per conversation:

- *opened with a request*: the user's first message asks for something (not empty, no control
  token, not in the agent's voice, not only thanks or a refusal), and how many of those are the
  scripted user's own words (`LLMUser.start` puts them in place of a model's second opening that
  still asked nothing);
- *reward as scripted*: the trial's reward equals the scripted user's on the same task (a user
  that declines a matching consent request, or stops before the agent is done, lowers it);
- *stopped by itself*: the user said `###STOP###` (or asked for a transfer) rather than the
  conversation running into a limit or an idle loop;
- *replies after done*: the user's messages after the oracle's "All done." (1 = it stopped at
  once, as the scripted user does);
- *endings*: how the conversations ended (`Termination`).

usage: python benchmarks/bench_user_instruction.py [--user local[/NAME]] [--envs a,b] [--limit N]
                                                   [--max-turns T] [--keep DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
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
    TrialRecord,
    is_local_spec,
    only_closing,
    run_eval,
    running_local_server,
)

ENVS = REPO / "envs"
DONE = "All done."
"""How the oracle agent's last message starts (`harness.agents.OracleAgent`)."""


async def play(env_dirs: list[Path], config: EvalConfig, keep: Path | None) -> list[TrialRecord]:
    """The trials of `config`, in task order; the run is kept under `keep` (for `envforge report`)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = keep / config.user.replace("/", "-") if keep else Path(tmp) / "run"
        _, records = await run_eval(env_dirs, config, out)
    return sorted(records, key=lambda r: r.trial_key)


AGENT_VOICE = re.compile(
    r"\b(?:i(?:'d| would) be (?:happy|glad) to (?:help|assist)|i can help|i'?m here to help|i am here to help"
    r"|how (?:can|may) i (?:help|assist)|what can i do for you|happy to assist|provide me with)\b",
    re.I,
)
"""An opening that speaks as the agent ("Hello! I'd be happy to help you ..."): no request."""


def opening(rec: TrialRecord) -> str:
    return next((m.content or "" for m in rec.messages if m.role == "user"), "")


def opened_with_request(rec: TrialRecord) -> bool:
    """The user's first message asks for something: not empty, no control token, not in the
    agent's voice, not only thanks or a refusal ("I'm sorry, but I can't assist with that.")."""
    first = opening(rec)
    return (
        bool(first.strip())
        and "###" not in first
        and not AGENT_VOICE.search(first)
        and not only_closing(first)
    )


def replies_after_done(rec: TrialRecord) -> int | None:
    """The user's messages after the oracle's first "All done." (None: the agent never got there)."""
    said = [(m.content or "") if m.role == "assistant" else "" for m in rec.messages]
    at = next((i for i, text in enumerate(said) if text.startswith(DONE)), None)
    if at is None:
        return None
    return sum(1 for m in rec.messages[at + 1 :] if m.role == "user")


def row(
    name: str, records: list[TrialRecord], scripted: dict[str, float], seconds: float, words: dict[str, str]
) -> str:
    """One user's line; `words` are the scripted user's openings, by task: an opening equal to its
    task's is the request `LLMUser.start` put in place of a model's opening that asked nothing."""
    n = len(records)
    after = [a for a in (replies_after_done(r) for r in records) if a is not None]
    endings = Counter(str(r.termination) for r in records)

    def rate(count: int) -> str:
        return f"{count}/{n}"

    return (
        f"| {name} | {n} | {rate(sum(opened_with_request(r) for r in records))} "
        f"({sum(opening(r) == words.get(r.task_id) for r in records)} in the scripted words) "
        f"| {rate(sum(r.reward == scripted.get(r.task_id) for r in records))} "
        f"| {rate(sum(r.termination in ('user_stop', 'transfer') for r in records))} "
        f"| {sum(after) / len(after):.1f} ({len(after)} reached) "
        f"| {', '.join(f'{k} {v}' for k, v in sorted(endings.items()))} "
        f"| {seconds / max(n, 1):.0f} s |"
    )


def config_for(user: str, user_llm: LLMConfig | None, args: argparse.Namespace) -> EvalConfig:
    return EvalConfig(
        agent="oracle",
        user=user,
        user_llm=user_llm,
        concurrency=1,
        limit=args.limit,
        limits=Limits(max_turns=args.max_turns, trial_timeout_s=args.timeout),
    )


def main(args: argparse.Namespace) -> int:
    env_dirs = [ENVS / e for e in args.envs.split(",")]
    rows = [
        "| user | conversations | opened with a request | reward as scripted | stopped by itself "
        "| replies after done (mean) | endings | per conversation |",
        "|---|---|---|---|---|---|---|---|",
    ]
    t0 = time.perf_counter()
    base = anyio.run(play, env_dirs, config_for("scripted", None, args), args.keep)
    scripted = {r.task_id: r.reward for r in base}
    words = {r.task_id: opening(r) for r in base}
    rows.append(row("scripted", base, scripted, time.perf_counter() - t0, words))
    print(rows[-1], file=sys.stderr, flush=True)
    try:
        with running_local_server(args.user) as server:
            t0 = time.perf_counter()
            records = anyio.run(
                play, env_dirs, config_for(args.user, server.llm_config(args.temperature), args), args.keep
            )
            rows.append(row(args.user, records, scripted, time.perf_counter() - t0, words))
    except (LocalModelError, LocalServerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(rows))
    for r in records:
        last = next((m.content or "" for m in reversed(r.messages) if m.role == "user"), "")
        was = scripted.get(r.task_id, 0.0)
        print(
            f"  {r.task_id}: {r.termination}, reward {r.reward:.2f} (scripted {was:.2f}), "
            f"{sum(m.role == 'user' for m in r.messages)} user messages, last: {last[:80]!r}"
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--user", default="local", help="the local model playing the user")
    parser.add_argument("--envs", default="gym,retail_orders,flight_booking")
    parser.add_argument("--limit", type=int, default=1, help="first N tasks of each env")
    parser.add_argument("--max-turns", type=int, default=6, help="user/agent exchanges per trial")
    parser.add_argument("--timeout", type=float, default=300.0, help="wall-clock limit per trial (s)")
    parser.add_argument("--keep", type=Path, help="keep both runs under this folder (it must not hold them)")
    parser.add_argument("--temperature", type=float, default=0.0, help="the user's sampling temperature")
    args = parser.parse_args()
    if not is_local_spec(args.user):
        parser.error("--user must be local or local/NAME")
    sys.exit(main(args))
