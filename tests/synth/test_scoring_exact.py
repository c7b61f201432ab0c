"""The exact answer rule: whole values, the renderings that count, the spread-of-candidates rule,
the honest oracle on every bundled env, and τ² imports keeping τ²'s substring rule unless told.

The rule itself is written down in `synth/task/scoring.py`'s docstring and `docs/scoring.md`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envforge.cli.main import app
from envforge.harness import EvalConfig, render_report, rescore, run_eval, summarize
from envforge.server import load_env
from envforge.synth import (
    MAX_OTHER_CANDIDATES,
    Call,
    Dag,
    Difficulty,
    Fact,
    Task,
    UserScenario,
    cents_hash,
    load_tasks,
    number_tokens,
    oracle_messages,
    outputs_missing,
    parse_number,
    score_episode,
    stated_numbers,
    synthesize,
    with_answers,
)

from support.paths import REPO, TAU2_RETAIL, bundled_env_dirs
from support.skips import TAU2_NO_DATA, tau2_data_missing


def found(required: str, *said: str, known: str = "", shown: tuple[str, ...] = ()) -> bool:
    return not outputs_missing([required], list(said), known_text=known, shown_messages=shown)


def make_task(outputs: list[str], instruction: str = "Tell me the figure.", **extra: object) -> Task:
    return Task(
        id="t",
        env="bank",
        seed="0:0",
        dag=Dag(nodes=[], edges=[]),
        scenario=UserScenario(persona="p", instruction=instruction, known_facts=[], must_be_told=outputs),
        golden_calls=[],
        golden_hash="x",
        golden_cents_hash=cents_hash({}),
        golden_diff={},
        required_outputs=outputs,
        checkpoints=[],
        difficulty=Difficulty(calls=0, writes=0, reasoning=1, depth=1, tables=0),
        reward_basis=["outputs"],
        **extra,  # type: ignore[arg-type]
    )


# --------------------------------------------------------------------------- whole values


@pytest.mark.parametrize("gamed", ["The total is 15.", "Total: 250", "error 503"])
def test_the_three_gamed_answers_earn_nothing(gamed: str) -> None:
    task = make_task(["5"])
    score = score_episode(task, {}, [gamed])
    assert score.reward == 0.0 and score.outputs_missing == ["5"] and score.answer_rule == "exact"


@pytest.mark.parametrize(
    "said",
    ["The total is 5.", "5.0", "5.00 in all", "$5", "you owe 5 dollars", "5 loans", "(5)", "5%", "five is 5"],
)
def test_renderings_of_the_same_number_count(said: str) -> None:
    assert found("5", said)


@pytest.mark.parametrize(
    "said",
    ["five", "15", "50", "5.5", "0.5", "P-5", "W5", "5th", "2024-05-01", "10:05", "5-10", "5,5", "5e3", "v5"],
)
def test_numbers_inside_other_tokens_or_in_words_do_not_count(said: str) -> None:
    assert not found("5", said)


def test_thousands_separators_currency_and_decimals() -> None:
    assert found("1250", "1,250") and found("1250", "$1,250.00") and found("1022.00", "1022")
    assert found("1022.00", "€1,022.0") and found("-3", "a change of -3") and found("45.10", "45.1")
    assert not found("1250", "1,25") and not found("1250", "12,50") and not found("25", "250")
    assert not found("1250", "1,2500") and not found("45.10", "45.11") and not found("3", "-3")
    assert [str(n.value) for n in number_tokens("1,2,3 and 1, 2, 3")] == ["1", "2", "3"]
    assert parse_number("1022.00") is not None and parse_number("P-104") is None


@pytest.mark.parametrize("edge", ["5\n.5", "1,\n250", "-\n3", "$\n5", "10:\n05", "a\n7b", "7\n,8", "P-\n4"])
def test_numbers_parsed_by_blocks_of_lines_are_the_whole_text_numbers(edge: str) -> None:
    """Tokens next to line breaks, on either side of a block boundary, count as in the whole text."""
    lines = [str(i) for i in range(300)]
    for at in (0, 127, 128, 255, 299):
        text = "\n".join([*lines[:at], edge, *lines[at:], "$1,250.00 and R-104 and -3"])
        whole: dict[str, set[object]] = {}
        for n in number_tokens(text):
            whole.setdefault(n.kind, set()).add(n.value)
        assert stated_numbers(text) == whole


def test_strings_match_whole_after_normalisation() -> None:
    assert found("P-104", "Your order P-104.") and found("p-104", "(P-104)")
    assert not found("P-104", "P-1045") and not found("P-104", "P-104-2") and not found("P-104", "XP-104")
    assert found("Springfield, IL", "shipped to springfield  IL today")
    assert found("Main St.", "on main st, apt 4") and not found("cotton", "cottons")
    assert found("Ünïcode Name", "hi ünïcode name!") and not found("polyester", "polyester-blend")


# --------------------------------------------------------------------------- several candidates


def test_a_natural_sentence_with_other_facts_passes() -> None:
    """Numbers beside a worked-out answer pass when the agent was shown them (a tool result, the
    user): the total summed from the order's items, the street number from the customer's record."""
    sentence = "Order #W123 total is $45.10, shipped to 12 Main St; you have 3 orders."
    task = make_task(["45.10", "3"])
    items = '[{"name": "lamp", "price": 20.0}, {"name": "chair", "price": 25.1}]'
    customer = '{"customer_id": "C-7", "address": "12 Main St"}'
    shown = [items, customer, "How many orders?"]
    assert score_episode(task, {}, [sentence], shown_messages=shown).reward == 1.0
    # the cost of the rule: a total read off the order's record is an answer the agent could
    # have copied with the record, so it is stated alone (beside it only the other outputs)
    record = '{"order_id": "W123", "total": 45.1}'
    read = score_episode(task, {}, [sentence], shown_messages=[record, customer, "How many orders?"])
    assert read.outputs_missing == ["45.10"]
    alone = "Order #W123 total is $45.10; you have 3 orders."
    assert score_episode(task, {}, [alone], shown_messages=[record, customer]).reward == 1.0
    itemised = "Order W123 holds a lamp ($20.00) and a chair ($25.10): total $45.10."
    items = ['[{"name": "lamp", "price": 20.0}, {"name": "chair", "price": 25.1}]']
    assert score_episode(make_task(["45.10"]), {}, [itemised], shown_messages=items).reward == 1.0
    # a figure the agent worked out itself is a value it was not shown: the cost of the rule
    counted = "Order W123 has 2 items: a lamp ($20.00) and a chair ($25.10), total $45.10."
    assert score_episode(make_task(["45.10"]), {}, [counted], shown_messages=items).reward == 0.0


def test_a_number_the_agent_was_never_shown_is_a_candidate() -> None:
    """Unshown, the same sentence's 12 is a value from nowhere: an answer among made-up numbers
    is a hedge, however few they are."""
    sentence = "Order #W123 total is $45.10, shipped to 12 Main St; you have 3 orders."
    assert score_episode(make_task(["45.10", "3"]), {}, [sentence]).reward == 0.0
    assert not found("3", "It is 2 or 3.") and not found("2", "It is 1, 2 or 3.")
    assert found("3", "It is 2 or 3.", shown=("capacity 2",))


def test_several_candidates_for_one_output_earn_nothing() -> None:
    values = [str(v) for v in range(3, 3 + MAX_OTHER_CANDIDATES + 2)]
    shown_apart = (" ".join(values[1:]),)
    assert not found("3", f"It is {' or '.join(values)}.", shown=shown_apart)
    assert found("3", f"It is {' or '.join(values[:-1])}.", shown=shown_apart)
    # shown with the answer, the same values are no alibi: naming them is copying what was shown
    assert not found("3", f"It is {' or '.join(values[:-1])}.", shown=(" ".join(values),))
    assert not found("3", f"It is {' or '.join(values[:-1])}.", shown=(*shown_apart, "3"))
    spray = " ".join(str(v) for v in range(1000))
    assert not found("882.00", spray, shown=(spray,))
    ids = ", ".join(f"P-{i}" for i in range(100, 110))
    assert not found("P-104", ids, shown=(ids,))
    assert not found("P-104", "P-103, P-104 or P-105") and found("P-104", "P-103, P-104", shown=("P-103",))


def test_dates_and_times_are_kinds_of_their_own() -> None:
    """A date among every date of a month, or a time among a day's half hours, is a hedge too
    (under `--answers strict`, τ² outputs hold such values); said alone, it is the answer."""
    may = ", ".join(f"2024-05-{d:02d}" for d in range(1, 32))
    assert not found("2024-05-17", f"It is one of {may}.") and found("2024-05-17", "On 2024-05-17.")
    halves = " ".join(f"{h:02d}:{m:02d}" for h in range(24) for m in (0, 30))
    assert not found("14:30", halves) and found("14:30", "Pick-up at 14:30 sharp.")


def test_a_hedge_across_number_kinds_is_one_hedge() -> None:
    """A decimal "4.00" states the value 4 as "4" does: integers and amounts are one pool, so
    a hedge cannot hide three more values behind decimal points."""
    hedge = "It is 1, 2 or 3 - or possibly 4.00, 5.00 or 6.00."
    shown = ("1 2 3 4 5 6",)
    for answer in ("1", "4", "6"):
        assert not found(answer, hedge, shown=shown), answer
    assert found("4", "That is 4.00 in all.")


def test_shown_working_is_no_list_of_candidates() -> None:
    """The addends of a sum that adds up are working, not other answers; working that does not add
    up stays a list of numbers (and a result written only as an operand is not stated)."""
    assert found("101", "81 + 14 + 6 = 101 in total.")
    assert found("12000.00", "$4,500.00 + $7,500.00 = $12,000.00")
    assert found("7", "2 * 3 + 1 = 7, so 7 it is.") and found("5", "10 / 2 = 5")
    assert not found("101", "81 + 14 + 7 = 101 in total.")
    assert not found("14", "81 + 14 + 6 = 101 in total.")
    assert not found("3", "1 + 1 = 2, 1 + 2 = 3, 2 + 2 = 4")


def test_the_tasks_own_values_are_not_other_candidates() -> None:
    facts = [Fact(name="flight", value=118), Fact(name="orders", value=["P-7", "P-9"])]
    scenario = UserScenario(persona="p", instruction="i", known_facts=facts, must_be_told=["3", "P-8"])
    calls = [Call(name="book", arguments={"flight": 118, "seats": 4, "nights": 2})]
    task = make_task(["3", "P-8"]).model_copy(update={"scenario": scenario, "golden_calls": calls})
    said = ["Flight 118 has 4 seats for your 2 nights; 3 bags allowed. Orders P-7, P-8 and P-9."]
    assert score_episode(task, {}, said).reward == 1.0
    assert score_episode(make_task(["3", "P-8"]), {}, said).reward == 0.0
    # the instruction's prose is no source of free candidates
    prose = make_task(["4"], instruction="Count the items of step 1, step 2 and step 3.")
    assert score_episode(prose, {}, ["1, 2, 3, 4 or 5"]).reward == 0.0


# --------------------------------------------------------------------------- the bundled tasks


@pytest.mark.parametrize("env_dir", bundled_env_dirs(), ids=lambda p: p.name)
def test_envforge_check_passes_with_the_honest_oracle(env_dir: Path) -> None:
    """`envforge check` replays every bundled task and scores the oracle's answer (among its checks)."""
    result = CliRunner().invoke(app, ["check", str(env_dir)])
    assert result.exit_code == 0, result.output
    tasks = load_tasks(env_dir)
    assert all(t.answer_rule == "exact" for t in tasks)
    assert all(score_episode(t, {}, oracle_messages(t)).outputs == 1.0 for t in tasks)


async def test_synthesized_figures_say_what_they_count() -> None:
    """A bare figure ("2") is stated with its entity and unit, and synthesis stays deterministic."""
    env = load_env(REPO / "envs" / "gym")
    runs = [(await synthesize(env, 20, 0)).tasks for _ in range(2)]
    assert [t.model_dump_json() for t in runs[0]] == [t.model_dump_json() for t in runs[1]]
    with_outputs = [t for t in runs[0] if t.required_outputs]
    assert with_outputs
    for task in with_outputs:
        (figure,) = task.required_outputs
        told = next(line for line in task.scenario.instruction.splitlines() if line.startswith("Make sure"))
        assert told.endswith(f": {figure}.") and ("how many of" in told or "the total" in told), told
        assert "(a whole number)" in told or "(to the cent)" in told, told
        assert score_episode(task, {}, oracle_messages(task)).outputs == 1.0


def test_the_strict_mode_rewrites_only_substring_tasks() -> None:
    exact, substring = make_task(["5"]), make_task(["5"], answer_rule="substring")
    assert with_answers([exact, substring], "task") == [exact, substring]
    strict = with_answers([exact, substring], "strict")
    assert strict[0] is exact and strict[1].answer_rule == "exact"


# --------------------------------------------------------------------------- τ² imports

tau2 = pytest.mark.skipif(tau2_data_missing("tasks.json"), reason=TAU2_NO_DATA)
#: τ² task 24 must tell the user "polyester" and "cotton" (and makes no calls).
TAU2_TASK = "24"


@pytest.fixture(scope="module")
def tau2_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`envforge import tau2` of one τ² task that asks for outputs, into a fresh env folder."""
    root = tmp_path_factory.mktemp("tau2answers")
    src = root / "src"
    src.mkdir()
    for name in ("db.json", "policy.md"):
        shutil.copy(TAU2_RETAIL / name, src / name)
    raw = json.loads((TAU2_RETAIL / "tasks.json").read_text(encoding="utf-8"))
    (src / "tasks.json").write_text(json.dumps([t for t in raw if t["id"] == TAU2_TASK]), encoding="utf-8")
    (src / "split_tasks.json").write_text(json.dumps({"base": [TAU2_TASK]}), encoding="utf-8")
    env_dir = root / "tau2_retail"
    result = CliRunner().invoke(app, ["import", "tau2", str(src), "-o", str(env_dir)])
    assert result.exit_code == 0, result.output
    return env_dir


def _score_cli(env_dir: Path, tmp_path: Path, message: str, *extra: str) -> dict:
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps([{"message": message}]), encoding="utf-8")
    args = ["score", str(env_dir), "--task", TAU2_TASK, "--actions", str(actions), "--json", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@tau2
def test_tau2_imports_keep_the_substring_rule_and_strict_changes_it(tau2_env: Path, tmp_path: Path) -> None:
    (task,) = load_tasks(tau2_env)
    assert task.answer_rule == "substring" and task.required_outputs == ["polyester", "cotton"]
    # τ²'s rule: substrings count, so "polyesters" and "cottons" communicate both outputs.
    loose = "The shirts come in polyesters and cottons."
    by_task = _score_cli(tau2_env, tmp_path, loose)
    assert by_task["answer_rule"] == "substring" and by_task["outputs_missing"] == []
    strict = _score_cli(tau2_env, tmp_path, loose, "--answers", "strict")
    assert strict["answer_rule"] == "exact" and strict["outputs_missing"] == ["polyester", "cotton"]
    honest = _score_cli(tau2_env, tmp_path, "They come in polyester and cotton.", "--answers", "strict")
    assert honest["outputs_missing"] == []
    # A task file written before the field existed: τ² tasks read back as substring, others exact.
    line = json.loads((tau2_env / "tasks.jsonl").read_text(encoding="utf-8").splitlines()[0])
    del line["answer_rule"]
    assert Task.model_validate(line).answer_rule == "substring"
    assert Task.model_validate({**line, "source": "synth"}).answer_rule == "exact"


@tau2
async def test_eval_strict_is_recorded_and_reported(tau2_env: Path, tmp_path: Path) -> None:
    runs = {}
    for answers in ("task", "strict"):
        config = EvalConfig(agent="oracle", answers=answers)  # type: ignore[arg-type]
        runs[answers] = await run_eval([tau2_env], config, tmp_path / answers)
    for answers, rule in (("task", "substring"), ("strict", "exact")):
        manifest, records = runs[answers]
        assert manifest.answers == answers
        assert [r.score.answer_rule for r in records if r.score] == [rule]
        summary = summarize(records, manifest.trials)
        assert summary["overall"]["answer_rules"] == {rule: 1}
        assert f"{rule} (1 trial)" in render_report(manifest, records, summary)
    # re-scoring a stored run applies the mode its manifest recorded
    assert [r.score.answer_rule for r in (await rescore(tmp_path / "strict")).records if r.score] == ["exact"]
    assert [r.score.answer_rule for r in (await rescore(tmp_path / "task")).records if r.score] == [
        "substring"
    ]
    # resuming under another mode is refused: the rule is part of what a run measures
    with pytest.raises(Exception, match="answers"):
        await run_eval([tau2_env], EvalConfig(agent="oracle"), tmp_path / "strict", resume=True)
