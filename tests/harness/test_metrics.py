"""Metrics over a hand-built run: pass^k against hand-computed values, dedup, truncation, CIs, buckets."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from envforge.harness import (
    AgentName,
    Fault,
    RewardPart,
    RunManifest,
    RunReadError,
    Termination,
    TrialRecord,
    TrialStatus,
    TruncatedRecordWarning,
    Usage,
    UserName,
    bootstrap_ci,
    bucket,
    pass_hat_k,
    print_summary,
    read_run,
    summarize,
)


def rec(
    env: str, task: str, trial: int, reward: float = 0.0, status: str = "completed", **kw: Any
) -> TrialRecord:
    return TrialRecord(
        run_id="r1",
        trial_key=f"{env}/{task}/{trial}",
        env=env,
        task_id=task,
        trial=trial,
        seed=trial,
        status=status,  # type: ignore[arg-type]
        termination="user_stop",
        messages=[],
        reward=reward,
        started_at=1000.0 + trial,
        duration_s=1.0,
        agent="agent-model",
        user="user-model",
        **kw,
    )


def manifest(trials: int = 4) -> RunManifest:
    return RunManifest(
        run_id="r1",
        created_at=1_700_000_000.0,
        envs=["bank", "shop"],
        env_dirs=["envs/bank", "envs/shop"],
        task_ids={"bank": ["a", "b", "c"], "shop": ["d"]},
        trials=trials,
        agent="agent-model",
        user="user-model",
        concurrency=4,
        seed=0,
    )


def fixed_records() -> list[TrialRecord]:
    """bank: 3 tasks x 4 trials with 4, 3 and 1 successes (one failure a context overflow);
    shop: task d with 2 counted trials (1 success) and 2 infra failures."""
    out = []
    for task, successes in (("a", 4), ("b", 3), ("c", 1)):
        for t in range(4):
            out.append(rec("bank", task, t, 1.0 if t < successes else 0.0, difficulty={"calls": 2}))
    out[-1] = rec("bank", "c", 3, 0.0, status="context_overflow", difficulty={"calls": 2})
    out += [
        rec("shop", "d", 0, 1.0, difficulty={"calls": 5}),
        rec("shop", "d", 1, 0.5, difficulty={"calls": 5}, user_error=True),
        rec("shop", "d", 2, 0.0, status="infra_failure", difficulty={"calls": 5}),
        rec("shop", "d", 3, 0.0, status="infra_failure", difficulty={"calls": 5}),
    ]
    return out


def write_run(run_dir: Path, records: list[TrialRecord], trials: int = 4, tail: str = "") -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "manifest.json").write_text(manifest(trials).model_dump_json())
    lines = "".join(r.model_dump_json() + "\n" for r in records)
    (run_dir / "trials.jsonl").write_text(lines + tail)
    return run_dir


def test_pass_hat_k_matches_hand_computed_values() -> None:
    part = summarize(fixed_records(), trials=4)["envs"]["bank"]
    # C(c,k)/C(n,k) with n = 4 and c = 4, 3, 1, averaged over the three tasks.
    expected = [
        (4 / 4 + 3 / 4 + 1 / 4) / 3,  # k=1
        (6 / 6 + 3 / 6 + 0 / 6) / 3,  # k=2: C(4,2)=6, C(3,2)=3, C(1,2)=0
        (4 / 4 + 1 / 4 + 0 / 4) / 3,  # k=3: C(4,3)=4, C(3,3)=1
        (1 / 1 + 0 + 0) / 3,  # k=4
    ]
    assert part["pass_hat_k"] == pytest.approx(expected)
    assert part["pass_hat_k"] == pytest.approx([2 / 3, 1 / 2, 5 / 12, 1 / 3])
    assert part["n_tasks"] == 3 and part["n_trials"] == 12  # the context overflow is an attempt
    assert part["mean_reward"] == pytest.approx(2 / 3)


def test_pass_hat_k_skips_tasks_with_too_few_trials() -> None:
    assert pass_hat_k([(4, 2), (2, 2)], 3) == pytest.approx(math.comb(2, 3) / math.comb(4, 3))
    assert pass_hat_k([(2, 2)], 3) is None
    assert pass_hat_k([], 1) is None


def test_infra_failures_are_excluded_but_counted() -> None:
    s = summarize(fixed_records(), trials=4)
    shop = s["envs"]["shop"]
    assert shop["n_trials"] == 2 and shop["infra_failures"] == 2
    # n = 2 counted, c = 1: pass^1 = 1/2, pass^2 = C(1,2)/C(2,2) = 0, k = 3, 4 undefined.
    assert shop["pass_hat_k"] == [pytest.approx(0.5), 0.0, None, None]
    assert shop["mean_reward"] == pytest.approx(0.75)
    assert shop["user_error_rate"] == pytest.approx(0.5)
    overall = s["overall"]
    assert overall["n_tasks"] == 4 and overall["n_trials"] == 14 and overall["infra_failures"] == 2
    # k=1 over all four tasks; k=3 only over the bank tasks (shop's task has 2 counted trials).
    assert overall["pass_hat_k"][0] == pytest.approx((1 + 0.75 + 0.25 + 0.5) / 4)
    assert overall["pass_hat_k"][2] == pytest.approx(5 / 12)
    assert overall["user_error_rate"] == pytest.approx(1 / 14)
    assert overall["statuses"] == {"completed": 13, "context_overflow": 1, "infra_failure": 2}


def test_summary_shape_is_json_and_deterministic() -> None:
    records = fixed_records()
    a = summarize(records, trials=4)
    b = summarize(list(reversed(records)), trials=4)
    assert set(a) == {"overall", "envs"} and list(a["envs"]) == ["bank", "shop"]
    required = {"n_tasks", "n_trials", "pass_hat_k", "mean_reward", "infra_failures", "user_error_rate"}
    required |= {"cost_usd", "pass_1_ci", "mean_reward_ci", "tokens", "by_difficulty"}
    for part in [a["overall"], *a["envs"].values()]:
        assert required <= set(part)
        assert len(part["pass_hat_k"]) == 4
    assert json.dumps(a, sort_keys=False) == json.dumps(b, sort_keys=False)
    with pytest.raises(ValueError):
        summarize(records, trials=0)


def test_read_run_last_record_per_key_wins(tmp_path: Path) -> None:
    records = fixed_records()
    # Resume re-ran shop/d/2: the infra failure is superseded by a success appended later.
    records.append(rec("shop", "d", 2, 1.0, difficulty={"calls": 5}))
    m, current = read_run(write_run(tmp_path / "run", records))
    assert m.trials == 4 and len(current) == 16
    d2 = next(r for r in current if r.trial_key == "shop/d/2")
    assert d2.status == "completed" and d2.reward == 1.0
    shop = summarize(current, m.trials)["envs"]["shop"]
    assert shop["infra_failures"] == 1 and shop["n_trials"] == 3
    assert shop["pass_hat_k"][:3] == pytest.approx([2 / 3, 1 / 3, 0.0])  # n=3, c=2
    # Same answer when summarize gets the raw file order itself.
    assert summarize(records, 4) == summarize(current, 4)


def test_truncated_last_line_is_ignored_with_warning(tmp_path: Path) -> None:
    records = fixed_records()
    torn = records[0].model_dump_json()[:57]  # a crash mid-write: no closing brace, no newline
    run = write_run(tmp_path / "run", records, tail=torn)
    with pytest.warns(TruncatedRecordWarning, match=r"skipped 1 unreadable line\(s\) at line 17"):
        _, current = read_run(run)
    assert len(current) == 16


def test_torn_line_followed_by_resume_append_keeps_the_appended_record(tmp_path: Path) -> None:
    records = fixed_records()
    torn = records[0].model_dump_json()[:57]  # crash mid-write, then resume appends without a newline
    rerun = rec("shop", "d", 2, 1.0, difficulty={"calls": 5})
    run = write_run(tmp_path / "run", records, tail=torn + rerun.model_dump_json() + "\n")
    with pytest.warns(TruncatedRecordWarning, match="torn record before an appended one"):
        _, current = read_run(run)
    assert next(r for r in current if r.trial_key == "shop/d/2").status == "completed"


def test_broken_middle_line_is_skipped_and_reported(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", fixed_records())
    lines = (run / "trials.jsonl").read_text().splitlines()
    lines[3] = lines[3][:40]
    (run / "trials.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(TruncatedRecordWarning, match=r"at line 4;"):
        _, current = read_run(run)
    assert len(current) == 15


def test_read_run_missing_dir_and_manifest(tmp_path: Path) -> None:
    with pytest.raises(RunReadError, match="no such run directory"):
        read_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunReadError, match=r"no manifest\.json"):
        read_run(tmp_path / "empty")
    run = write_run(tmp_path / "run", [])
    (run / "trials.jsonl").unlink()
    assert read_run(run)[1] == []


def test_bootstrap_ci_remembered_equals_computed() -> None:
    """The remembered interval is the one a fresh computation gives, and a caller's list is its own."""

    def _bootstrap(values: list[float], resamples: int, seed: int) -> list[float]:
        """The interval as first written: 1000 `random.choices` resamples from `Random(seed)`."""
        rng = random.Random(seed)
        means = sorted(sum(rng.choices(values, k=len(values))) / len(values) for _ in range(resamples))
        pos = [q * (resamples - 1) for q in ((1.0 - 0.95) / 2, 1.0 - (1.0 - 0.95) / 2)]
        return [means[int(p)] + (means[int(p) + 1] - means[int(p)]) * (p - int(p)) for p in pos]

    values = [0.0, 0.25, 1.0, 1.0, 0.5, 1 / 3]
    first = bootstrap_ci(values)
    assert first == list(_bootstrap(values, 1000, 0)) == bootstrap_ci(list(values))
    assert first is not None
    first.append(9.0)  # mutating the answer must not reach the next caller
    assert bootstrap_ci(values) == list(_bootstrap(values, 1000, 0))
    assert bootstrap_ci([0, 1, 1]) == list(_bootstrap([0, 1, 1], 1000, 0))  # ints: not remembered


def test_bootstrap_ci_is_deterministic_and_contains_mean() -> None:
    values = [1.0, 0.75, 0.25, 0.5, 0.0, 1.0, 0.9, 0.1]
    ci = bootstrap_ci(values)
    assert ci == bootstrap_ci(values)
    mean = sum(values) / len(values)
    assert ci is not None and ci[0] < mean < ci[1]
    assert 0.0 <= ci[0] and ci[1] <= 1.0
    assert bootstrap_ci([0.4]) == [pytest.approx(0.4), pytest.approx(0.4)]
    assert bootstrap_ci([]) is None
    assert bootstrap_ci(values, seed=1) != ci  # the seed matters, so the fixed seed is what pins it
    s = summarize(fixed_records(), 4)["overall"]
    assert s["pass_1_ci"][0] <= s["pass_hat_k"][0] <= s["pass_1_ci"][1]
    assert s["mean_reward_ci"][0] <= s["mean_reward"] <= s["mean_reward_ci"][1]


def test_difficulty_buckets() -> None:
    assert [bucket({"calls": c}) for c in (1, 2, 3, 4, 5, 9)] == [
        "easy",
        "easy",
        "medium",
        "medium",
        "hard",
        "hard",
    ]
    assert bucket({}) == "unknown"
    by = summarize(fixed_records(), 4)["overall"]["by_difficulty"]
    assert list(by) == ["easy", "medium", "hard"]
    assert by["easy"]["n_tasks"] == 3 and by["easy"]["pass_hat_k"][0] == pytest.approx(2 / 3)
    assert by["medium"]["n_tasks"] == 0 and by["medium"]["mean_reward"] is None
    assert by["hard"]["n_tasks"] == 1 and by["hard"]["infra_failures"] == 2
    by = summarize([rec("bank", "z", 0, 1.0)], 1)["overall"]["by_difficulty"]
    assert by["unknown"]["n_tasks"] == 1


def test_tokens_and_cost_per_role() -> None:
    usage = {"agent": Usage(calls=3, prompt_tokens=100, completion_tokens=10, cost_usd=0.25)}
    records = [
        rec("bank", "a", 0, 1.0, usage={**usage, "user": Usage(calls=1, prompt_tokens=5, cost_usd=0.5)}),
        rec("bank", "a", 1, 0.0, status="infra_failure", usage=usage),  # failed runs still cost money
    ]
    part = summarize(records, 2)["overall"]
    assert list(part["tokens"]) == ["agent", "user", "judge"]
    assert part["tokens"]["agent"] == {
        "calls": 6,
        "prompt_tokens": 200,
        "completion_tokens": 20,
        "cost_usd": 0.5,
    }
    assert part["tokens"]["judge"]["calls"] == 0
    assert part["cost_usd"] == pytest.approx(1.0)


def test_print_summary_table() -> None:
    console = Console(record=True, width=200)
    print_summary(summarize(fixed_records(), 4), console)
    text = console.export_text()
    for needle in ("bank", "shop", "overall", "pass^1", "pass^4", "0.667", "[0."):
        assert needle in text


@pytest.mark.parametrize(
    ("status", "fault", "counted"),
    [
        ("completed", "none", True),
        ("timeout", "agent", True),
        ("context_overflow", "agent", True),
        ("max_errors", "agent", True),
        ("infra_failure", "infra", False),
    ],
)
def test_records_written_before_fault_existed_still_read(
    tmp_path: Path, status: str, fault: str, counted: bool
) -> None:
    """An older trials.jsonl line has a status and no `fault`: whose side it was comes from the status."""
    old = json.loads(rec("shop", "a", 0, 0.0, status=status).model_dump_json())
    del old["fault"], old["env_errors"]
    run = write_run(tmp_path / "run", [], tail=json.dumps(old) + "\n")
    _, (read,) = read_run(run)
    assert (read.fault, read.counted) == (fault, counted)
    assert summarize([read], 4)["overall"]["n_trials"] == int(counted)


OLD_LINE = {
    "run_id": "r1",
    "trial_key": "shop/a/0",
    "env": "shop",
    "task_id": "a",
    "trial": 0,
    "seed": 0,
    "status": "max_turns",
    "termination": "max_steps",
    "messages": [],
    "score": {
        "reward": 0.0,
        "state_match": True,
        "outputs": 0.5,
        "outputs_missing": ["42"],
        "checkpoints": 1.0,
        "checkpoints_passed": 1,
        "checkpoints_total": 1,
        "basis": ["state", "outputs", "nl_assertions"],
        "not_judged": ["nl_assertions"],
    },
    "reward": 0.0,
    "parts": {"state": 1.0, "outputs": 0.0},
    "not_judged": ["nl_assertions"],
    "started_at": 1000.0,
    "duration_s": 1.0,
    "agent": "oracle",
    "user": "scripted",
}


def test_records_written_as_plain_strings_read_back_as_the_vocabularies(tmp_path: Path) -> None:
    """A line written before the closed vocabularies were enums (status, termination, reward parts
    as plain strings, no `fault`) reads back as their members, and is written back as the same
    strings."""
    run = write_run(tmp_path / "run", [], tail=json.dumps(OLD_LINE) + "\n")
    _, (read,) = read_run(run)
    assert read.status is TrialStatus.MAX_TURNS and read.fault is Fault.AGENT
    assert read.termination is Termination.MAX_STEPS
    assert read.score is not None
    assert read.score.basis == [RewardPart.STATE, RewardPart.OUTPUTS, RewardPart.NL_ASSERTIONS]
    assert all(isinstance(p, RewardPart) for p in [*read.score.basis, *read.score.not_judged])
    assert read.agent == AgentName.ORACLE and read.user == UserName.SCRIPTED
    again = json.loads(read.model_dump_json())
    assert {k: again[k] for k in OLD_LINE} == OLD_LINE | {"score": again["score"]}
    assert again["score"]["basis"] == OLD_LINE["score"]["basis"]  # type: ignore[index]


@pytest.mark.parametrize("trials", [1, 2, 4])
def test_summary_with_env_failures_fits_80_columns(trials: int) -> None:
    """The summary beside pass^k of a run whose env failed some trials: pass^k `w/ env` (each
    figure whole, 0.500 here, never `0.5…`) and the env failure count, in 80 columns with whole
    env names, however many pass^k columns there are."""
    records = []
    for env in ("car_rental", "flight_booking", "helpdesk_lite"):
        for task in ("a", "b"):
            for t in range(trials):
                fault = {"fault": "env"} if task == "b" else {}
                records.append(rec(env, task, t, 1.0 if task == "a" else 0.0, **fault))
    console = Console(record=True, width=80)
    print_summary(summarize(records, trials), console)
    text = console.export_text()
    too_wide = [line for line in text.splitlines() if len(line.rstrip()) > 80]
    assert not too_wide and "…" not in text, text
    for k in range(1, trials + 1):
        assert f"pass^{k}" in text, text
    for env in ("car_rental", "flight_booking", "helpdesk_lite", "overall"):
        rows = [line.split() for line in text.splitlines() if line.startswith(env)]
        cells = [cell for row in rows for cell in row]
        assert cells.count("1.000") >= trials and cells.count("0.500") == trials, text
        assert str(trials * (3 if env == "overall" else 1)) in cells, text  # the env failures
