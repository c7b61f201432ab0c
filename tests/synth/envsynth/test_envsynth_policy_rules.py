"""`synth env` derives the env's policy_rules.toml from its policy.md and tools, and gates it.

The model's rules file is a reward: each broken answer below would have shipped (and been scored
by) on the pipeline without the policy gates. Each must be refused with a hint that names the rule
and what is wrong, the hint must reach the model in the repair round, and the repaired answer must
be accepted. Recorded library answers (tests/fixtures/envsynth/library) stand in for the model; only
the policy_rules answers change.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import envforge
from envforge.server import load_env
from envforge.synth import load_policy_rules
from envforge.synth.envsynth import (
    GATES,
    ReplayResponder,
    SynthesisReport,
    SynthSettings,
    gate_kept,
    gate_rules,
    load_docs,
    load_recordings,
    synthesize_env,
)

from support.paths import ENVSYNTH_FIXTURES, REPO

LIBRARY_DOCS = REPO / "envs" / "library" / "docs"
GOOD = (REPO / "envs" / "library" / "policy_rules.toml").read_text(encoding="utf-8")


class Spy:
    """Recorded answers, with every prompt kept."""

    model = "spy"

    def __init__(self, answers: dict[str, str]) -> None:
        self.inner = ReplayResponder(answers)
        self.prompts: dict[tuple[str, int], str] = {}

    async def complete(self, stage: str, round_: int, messages: list[dict[str, str]]) -> Any:
        self.prompts[(stage, round_)] = "\n".join(m["content"] for m in messages)
        return await self.inner.complete(stage, round_, messages)


async def synth(out: Path, *rules: str, max_rounds: int = 3) -> tuple[SynthesisReport, Spy]:
    answers = load_recordings(ENVSYNTH_FIXTURES / "library")
    for round_, text in enumerate(rules):
        answers[f"policy_rules:{round_}"] = f"```toml\n{text}```\n"
    spy = Spy(answers)
    cfg = SynthSettings(name="library", max_rounds=max_rounds)
    return await synthesize_env(load_docs(LIBRARY_DOCS), out, spy, cfg), spy


async def test_a_good_rules_file_passes_and_ships(tmp_path: Path) -> None:
    report, spy = await synth(tmp_path / "library", GOOD)
    assert report.status == "accepted", report.reasons
    assert {g.name: g.passed for g in report.rounds[0].gates} == dict.fromkeys(GATES, True)
    kept = next(g for g in report.rounds[0].gates if g.name == "policy_kept")
    assert kept.checks == report.tasks >= 3  # one check per verified task
    shipped = tmp_path / "library" / "policy_rules.toml"
    assert shipped.read_text(encoding="utf-8") == GOOD
    rules = load_policy_rules(load_env(tmp_path / "library"))
    assert rules is not None and rules.identity_tools == ("get_member",) and rules.confirms
    # the model was asked from the policy.md and tools.py it had written, in the format
    prompt = spy.prompts[("policy_rules", 0)]
    assert "envsynth stage=policy_rules round=0 prompt=policy_rules/v4" in prompt
    assert "## policy.md\n# Library desk policy" in prompt and "\n- checkout_book(" in prompt
    assert "[writes " in prompt.split("\n- checkout_book(")[1].splitlines()[0]  # its kind, from tools.py
    assert "[identity]" in prompt and "[[lookup]]" in prompt
    assert (
        json.loads((tmp_path / "library" / "synthesis.json").read_text())["prompt_versions"]["policy_rules"]
        == "policy_rules/v4"
    )


BROKEN = {
    "missing_tool": (
        '[identity]\ntools = ["verify_member"]\n',
        "policy_rules",
        "unknown tool(s): verify_member (the env's tools: cancel_hold, checkout_book, get_book",
    ),
    "identity_write": (
        '[identity]\ntools = ["checkout_book"]\n',
        "policy_rules",
        "[identity] tools: checkout_book is a write (writes loans, books); an identity check is a read",
    ),
    "guards_a_read": (
        '[identity]\ntools = ["get_member"]\n\n[[lookup]]\nparam = "genre"\ntools = ["search_books"]\n',
        "policy_rules",
        "[[lookup]] param = 'genre': no write takes genre, so the rule guards nothing",
    ),
    "exempts_a_read": (
        '[confirmation]\nrequired = true\nexempt = ["get_book"]\n',
        "policy_rules",
        "[confirmation] exempt: get_book is a read; the rule guards writes only",
    ),
    "lookup_tool_cannot_take_it": (
        '[[lookup]]\nparam = "book_id"\ntools = ["search_books", "get_book"]\n',
        "policy_rules",
        "the first, search_books, does not take book_id",
    ),
    "forbidden_argument_unknown": (
        '[[forbidden]]\ntool = "cancel_hold"\narguments = {member_id = "M-1001"}\nreason = "x"\n',
        "policy_rules",
        "[[forbidden]] tool = 'cancel_hold': member_id is not one of its parameters (hold_id)",
    ),
    # parses and names reads and writes rightly, yet no agent keeping it can solve the tasks
    "identity_unkeepable": (
        '[identity]\ntools = ["search_books"]\n',
        "policy_kept",
        "[identity]: none of tools ['search_books'] can be called from what the user knows",
    ),
    "bans_what_tasks_need": (
        '[[forbidden]]\ntool = "checkout_book"\nreason = "lending is by a human"\n',
        "policy_kept",
        "checkout_book: forbidden (lending is by a human): [[forbidden]]: the rule bans a call the task",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
async def test_a_broken_rules_file_is_refused_with_the_hint_then_repaired(tmp_path: Path, case: str) -> None:
    bad, gate, hint = BROKEN[case]
    report, spy = await synth(tmp_path / "library", bad, GOOD)
    first = report.rounds[0]
    failed = [g for g in first.gates if not g.passed]
    assert [g.name for g in failed] == [gate]
    assert any(hint in p for p in failed[0].problems), failed[0].problems
    assert first.repaired == ["policy_rules"]
    repair = spy.prompts[("policy_rules", 1)]
    assert "failed these checks" in repair and hint in repair and bad.strip() in repair
    assert report.status == "accepted", report.reasons
    assert {g.name: g.passed for g in report.rounds[1].gates} == dict.fromkeys(GATES, True)
    assert (tmp_path / "library" / "policy_rules.toml").read_text(encoding="utf-8") == GOOD


async def test_rules_never_repaired_reject_the_env(tmp_path: Path) -> None:
    out = tmp_path / "library"
    bad = '[identity]\ntools = ["checkout_book"]\n'
    report, _ = await synth(out, bad, bad, max_rounds=1)
    assert report.status == "rejected"
    assert report.reasons[0] == "gate 'policy_rules' still fails after 1 repair rounds"
    assert not out.exists()
    kept = tmp_path / ".rejected" / "library" / "rejected_candidate"
    assert (kept / "policy_rules.toml.txt").read_text(encoding="utf-8") == bad


@pytest.mark.parametrize(
    ("rules", "kept"),
    [
        (GOOD, True),
        ('[identity]\ntools = ["list_member_loans"]\n', True),  # its rows name the one member
        (BROKEN["identity_unkeepable"][0], False),
        (BROKEN["bans_what_tasks_need"][0], False),
    ],
)
def test_policy_kept_agrees_with_the_harness_oracle(tmp_path: Path, rules: str, kept: bool) -> None:
    """The gate stands in for the oracle synth may not import: where it passes, the harness's
    oracle keeping the same rules scores 1 on every task; where it fails, the oracle does not."""
    root = tmp_path / "library"
    shutil.copytree(REPO / "envs" / "library", root)
    lines = (root / "tasks.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "tasks.jsonl").write_text("".join(lines[:6]), encoding="utf-8")
    (root / "policy_rules.toml").write_text(rules, encoding="utf-8")
    env = load_env(root)
    assert gate_rules(env, root).passed
    assert asyncio.run(gate_kept(env, root)).passed is kept
    run = envforge.evaluate([root], envforge.EvalConfig(agent="oracle"))
    assert len(run.records) == 6 and (run.pass_hat_k(1) == 1.0) is kept
