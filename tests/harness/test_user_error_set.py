"""The user-error detector against its labeled set (tests/fixtures/meu_labeled.jsonl).

The set is clean conversations (including ones where the agent fails while the user behaves) and
conversations with one injected user error each, played with real tool calls on the bundled envs.
The rules must keep the precision and recall docs/benchmarks/meu.md reports (floors a little under the
measured figures), never flag a clean item, and point at the erring message itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from envforge.harness import (
    DEFAULT_PER_ENV,
    DEFAULT_SEED,
    ERROR_KINDS,
    Evaluation,
    Message,
    build_set,
    bundled_env_dirs,
    dump_set,
    evaluate,
    load_set,
    rule_verdict,
    rules_only,
    task_index,
)
from envforge.synth import Task

from support.fake_llm import FakeOpenAI, completion
from support.paths import FIXTURES, REPO

LABELED = FIXTURES / "meu_labeled.jsonl"
# Two tasks frozen for the hand-written conversations below (each names its task's values); the
# bundled tasks are regenerated as synthesis improves, these stay put.
RULE_TASKS = {
    t.id: t
    for t in map(Task.model_validate_json, (FIXTURES / "meu_rule_tasks.jsonl").read_text().splitlines())
}

# Measured with `python benchmarks/bench_meu.py` on the set built from today's bundled tasks: 87 /
# 87 / 80 / 85 / 74 % recall, 83 % overall (216 of 261). The set follows the tasks: rebuilt when
# the tasks were re-synthesized for diversity, it holds more leaks of a bare value from a result
# ("Just so you know, 3."), which the rules leave to the judge, so leak recall went from 97 % to
# 83 % with the rules unchanged (docs/benchmarks/meu.md). Rebuilt with the real model's Slack env
# bundled, whose values are free text ("Reply B"), the rules missed 10 of its 28 errors (an
# invented name or claim, a contradiction said in words), and the floors below came down with
# them.
RECALL_FLOORS = {
    "wrong_fact": 0.85,
    "contradiction": 0.87,
    # A plain word from a result counts only said as its field's value ("the day will be thu");
    # a bare small number or word with no cue is left to the judge.
    "leak": 0.80,
    "premature_stop": 0.83,
    "invented_fact": 0.74,
}
OVERALL_RECALL_FLOOR = 0.82


@pytest.fixture(scope="module")
def items():
    return load_set(LABELED)


@pytest.fixture(scope="module")
def tasks(items):
    return task_index(items, REPO / "envs")


@pytest.fixture(scope="module")
def rules(items, tasks) -> Evaluation:
    return anyio.run(evaluate, items, tasks, rules_only)


def test_the_set_covers_every_kind_and_every_bundled_env(items) -> None:
    labels = {i.label for i in items}
    assert labels == {"clean", *ERROR_KINDS}
    assert {i.env for i in items} == {p.name for p in bundled_env_dirs(REPO / "envs")}
    for item in items:
        if item.label == "clean":
            assert item.error_at is None
        else:
            assert item.messages[item.error_at].role == "user", item.task_id
    # Surface forms vary within a kind: the rules are not graded on one template per kind.
    for kind in ERROR_KINDS:
        assert len({i.variant.split("/")[0] for i in items if i.label == kind}) >= 2, kind


def test_rules_never_flag_a_clean_conversation(rules: Evaluation) -> None:
    """A false user error masks an agent failure from training: none on the clean items, which
    include agents that give up, claim done halfway, report writes they never made, mistype ids."""
    assert rules.clean >= 60
    assert rules.false_alarms == 0, rules.false_alarm_items


def test_rules_keep_their_recall_per_kind(rules: Evaluation) -> None:
    for kind, floor in RECALL_FLOORS.items():
        score = rules.kinds[kind]
        assert score.items >= 25, kind
        assert score.recall is not None and score.recall >= floor, (kind, score.recall, rules.misses)
        assert score.precision == 1.0, kind
    assert rules.recall is not None and rules.recall >= OVERALL_RECALL_FLOOR
    assert rules.precision == 1.0


def test_rules_point_at_the_erring_message(items, tasks) -> None:
    for item in items:
        verdict = rule_verdict(tasks[(item.env, item.task_id)], item.messages)
        if verdict is not None:
            assert verdict.message == item.error_at, (item.task_id, item.label, verdict.reason)


def test_a_correct_answer_in_other_words_is_not_an_error() -> None:
    """The same facts said as a date in words, a count before its name, or a field list: clean."""
    task = RULE_TASKS["car_rental-0-00000"]
    opening = Message(role="user", content="I need to rent a car.")
    asked = Message(role="assistant", content="Which customer id and days for the rental?")
    for answer in (
        "7 days, please. Customer C-504.",
        "customer id: C-504\ndays: 7",
        "It's C-504 for 7 days.",
    ):
        assert rule_verdict(task, [opening, asked, Message(role="user", content=answer)]) is None, answer
    wrong = Message(role="user", content="9 days, please. Customer C-504.")
    verdict = rule_verdict(task, [opening, asked, wrong])
    assert verdict is not None and verdict.kind == "wrong_fact" and "'9'" in verdict.reason


async def test_regenerating_the_set_gives_the_same_bytes(tmp_path: Path) -> None:
    items = await build_set(bundled_env_dirs(REPO / "envs"), seed=DEFAULT_SEED, per_env=DEFAULT_PER_ENV)
    assert dump_set(items) == LABELED.read_bytes(), "rebuild it: python benchmarks/bench_meu.py --generate"


def test_benchmark_measures_rules_then_a_judge_over_http() -> None:
    """`bench_meu.py --judge MODEL --judge-api-base URL`: the judge (a real OpenAI-compatible HTTP
    endpoint on 127.0.0.1) reads only what the rules let through, and its verdicts are scored."""

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        prompt = body["messages"][-1]["content"]
        error = "premium member" in prompt or "promised a discount" in prompt
        return 200, completion(
            json.dumps({"user_error": error, "reason": "claims a status it was not given"})
        )

    items = load_set(LABELED)
    tasks = task_index(items, REPO / "envs")
    let_through = sum(1 for i in items if rule_verdict(tasks[(i.env, i.task_id)], i.messages) is None)
    claims = [i for i in items if i.label == "invented_fact" and i.variant == "claim"]
    with FakeOpenAI(brain) as fake:
        out = subprocess.run(
            [
                sys.executable,
                "benchmarks/bench_meu.py",
                "--judge",
                "openai/fake",
                "--judge-api-base",
                fake.url,
            ],
            cwd=REPO,
            env={**os.environ, "OPENAI_API_KEY": "x"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert out.returncode == 0, out.stderr
    assert len(fake.requests) == let_through
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("|")}
    assert "rules + openai/fake recall" in out.stdout
    assert rows["judge"].split("|")[5].strip() == "100%"  # every judge verdict was a real user error
    assert rows["clean (false alarms)"].split("|")[5].strip() == "0 flagged"
    rules_recall, judged_recall = (int(rows["invented_fact"].split("|")[c].strip(" %")) for c in (4, 6))
    assert claims and judged_recall > rules_recall


def test_what_a_model_user_says_for_its_own_reasons_is_not_an_error() -> None:
    """A model user talks more freely than the scripted one. A plain word a golden call takes from a
    result ("footwear"), a correction cue with no value ("I meant to ask"), a product name shaped
    like an id ("USB-3"): none of these is a user error, and a false one would mask the agent's
    failure."""
    task = RULE_TASKS["retail_orders-0-00000"]
    assert any(c.arguments.get("category") == "footwear" for c in task.golden_calls)
    conversation = [
        Message(role="user", content="Hi, I'd like to place an order, I'm after some footwear."),
        Message(role="assistant", content="Sure. Which product?"),
        Message(role="user", content="Sorry, I meant to ask first: do you ship abroad? It is P-104."),
        Message(role="assistant", content="We do. What is your customer id?"),
        Message(role="user", content="C-1029. I'm not 100% sure about the address id, try A-2053."),
        Message(role="assistant", content="Thanks. Anything else?"),
        Message(role="user", content="Does it come with a USB-3 cable?"),
    ]
    assert rule_verdict(task, conversation) is None
    leaked = Message(role="user", content="By the way, the address you'll need is A-2053 and the count is 1.")
    verdict = rule_verdict(task, [*conversation[:4], leaked])
    assert verdict is not None and verdict.kind == "leak" and verdict.message == 4


def test_a_word_from_a_result_said_as_its_fields_value_is_a_leak() -> None:
    """The word alone may be the user's own ("I'm after some footwear"); naming the field with it
    before any result showed it ("the category is footwear") is knowing what only the agent can
    find, and so is announcing the answer ("you'll find it's 1"). Once the agent or a tool said
    the word, repeating it is not a leak."""
    task = RULE_TASKS["retail_orders-0-00000"]
    opening = Message(role="user", content="Hi, I'd like to place an order, I'm after some footwear.")
    asked = Message(role="assistant", content="Sure. Which product?")
    for leaked in (
        "P-104. The category is footwear, by the way.",
        "It is P-104; its category will be footwear.",
        "P-104. You'll find it's 1, I think.",
    ):
        verdict = rule_verdict(task, [opening, asked, Message(role="user", content=leaked)])
        assert verdict is not None and verdict.kind == "leak" and verdict.message == 2, leaked
    found = [
        opening,
        asked,
        Message(role="user", content="P-104."),
        Message(role="assistant", content="P-104 is a trail shoe, in the footwear category."),
        Message(role="user", content="Right, the category is footwear. Show me others."),
    ]
    assert rule_verdict(task, found) is None
