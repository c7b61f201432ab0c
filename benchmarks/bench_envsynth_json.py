"""The probe agents' JSON with and without a JSON-schema constraint, from a packaged local model.

The tester and checker stages are the ones whose answer env synthesis parses as JSON. To measure
them on an env that works, the code and prose stages (schema, tools, seed, policy, rules) answer
from the hand-written recordings in tests/fixtures/envsynth/<set>, and only the tester and the
checker ask the model: once free, once constrained (llama.cpp's `json_object` + schema). Per doc
set and mode it prints whether each JSON answer parsed, the llm_probe gate's checks passed, and
whether every gate passed; one server serves every run.

usage: python benchmarks/bench_envsynth_json.py [--model local] [--sets library,gym,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import envforge
from envforge.synth.envsynth import (
    JSON_SCHEMAS,
    LiteLLMResponder,
    LLMError,
    ReplayResponder,
    Reply,
    Structured,
    SynthSettings,
    load_docs,
    load_recordings,
    strip_fences,
    synthesize_env,
)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "envsynth"
SETS = ("library", "gym", "car_rental", "helpdesk_lite", "pharmacy")


class Probed:
    """Recordings for the code and prose stages, the model for the JSON ones; counts what parsed."""

    def __init__(self, replay: ReplayResponder, model: LiteLLMResponder) -> None:
        self.replay, self.live, self.model = replay, model, model.model
        self.answers: list[tuple[str, bool]] = []

    async def complete(self, stage: str, round_: int, messages: list[dict[str, str]]) -> Reply:
        if stage not in JSON_SCHEMAS:
            return await self.replay.complete(stage, round_, messages)
        reply = await self.live.complete(stage, round_, messages)
        try:
            json.loads(strip_fences(reply.text))
            ok = True
        except ValueError:
            ok = False
        self.answers.append((stage, ok))
        return reply


async def one(name: str, cfg: envforge.LLMConfig, structured: Structured | None) -> dict[str, object]:
    live = LiteLLMResponder(
        cfg.model,
        cfg.api_base,
        api_key=cfg.api_key,
        structured=structured,
        timeout=cfg.timeout_s,
        max_tokens=1024,
    )
    responder = Probed(ReplayResponder(load_recordings(FIXTURES / name)), live)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            report = await synthesize_env(
                load_docs(REPO / "envs" / name / "docs"),
                Path(tmp) / name,
                responder,
                SynthSettings(name=name, max_rounds=0),
            )
        except LLMError as exc:
            return {"set": name, "error": str(exc)}
    probe = (
        next((g for g in report.rounds[0].gates if g.name == "llm_probe"), None) if report.rounds else None
    )
    return {
        "set": name,
        "schema": structured or "off",
        "json_parsed": sum(ok for _, ok in responder.answers),
        "json_answers": len(responder.answers),
        "probe_checks": f"{probe.passed_checks}/{probe.checks}" if probe else "-",
        "probe_passed": bool(probe and probe.passed),
        "accepted": report.status == "accepted",
        "why": (report.reasons[:2] if report.status != "accepted" else []),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(args: argparse.Namespace) -> int:
    rows = []
    with envforge.local_model_servers({"probe": args.model}) as configs:
        cfg = configs["probe"]
        for name in args.sets.split(","):
            for mode in args.modes.split(","):
                structured: Structured | None = None if mode == "off" else "llama.cpp"
                row = asyncio.run(one(name, cfg, structured))
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="local")
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--out", default="")
    parser.add_argument("--modes", default="off,llama.cpp", help="off, llama.cpp, or both")
    raise SystemExit(main(parser.parse_args()))
