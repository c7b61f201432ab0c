"""Built-in agents on every bundled env, user-error detection, scoring parts, the run dir, resume."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import anyio
import pytest

from envforge.harness import (
    STOP,
    EvalConfig,
    Limits,
    LLMConfig,
    Message,
    OracleAgent,
    RunConfigMismatch,
    RunDir,
    RunExists,
    ScriptedUser,
    ToolCall,
    detect_user_error,
    load_env_tasks,
    rescore,
    rule_user_error,
    run_eval,
    score_trial,
    summarize,
)
from envforge.server import state_hash
from envforge.synth import ActionCheck, load_tasks

from support.paths import REPO, bundled_env_dirs

ENV_DIRS = [p for p in bundled_env_dirs() if (p / "tasks.jsonl").exists()]
RETAIL = REPO / "envs" / "retail_orders"


def first_ids(env_dir: Path, n: int = 3) -> list[str]:
    return [t.id for t in load_tasks(env_dir)[:n]]


@pytest.mark.parametrize("env_dir", ENV_DIRS, ids=lambda p: p.name)
async def test_oracle_passes_and_noop_fails_every_bundled_env(env_dir: Path, tmp_path: Path) -> None:
    ids = first_ids(env_dir)
    oracle_manifest, oracle = await run_eval(
        [env_dir], EvalConfig(agent="oracle", task_ids=ids), tmp_path / "oracle"
    )
    assert [r.status for r in oracle] == ["completed"] * 3
    assert summarize(oracle, oracle_manifest.trials)["overall"]["pass_hat_k"] == [1.0]
    assert all(r.termination == "user_stop" and not r.user_error for r in oracle)
    noop_manifest, noop = await run_eval([env_dir], EvalConfig(agent="noop", task_ids=ids), tmp_path / "noop")
    assert summarize(noop, noop_manifest.trials)["overall"]["pass_hat_k"] == [0.0]
    assert all(not any(m.tool_calls for m in r.messages) for r in noop)


async def test_random_agent_is_seeded_and_schema_valid(tmp_path: Path) -> None:
    ids = first_ids(RETAIL, 2)
    _, a = await run_eval([RETAIL], EvalConfig(agent="random", task_ids=ids, seed=7), tmp_path / "a")
    _, b = await run_eval([RETAIL], EvalConfig(agent="random", task_ids=ids, seed=7), tmp_path / "b")
    calls = [[(c.name, c.arguments) for m in r.messages for c in m.tool_calls] for r in a]
    assert calls == [[(c.name, c.arguments) for m in r.messages for c in m.tool_calls] for r in b]
    assert all(len(c) == 3 for c in calls)
    tool_texts = [m.content or "" for r in a for m in r.messages if m.role == "tool"]
    assert not any("validation" in t.lower() and "required" in t.lower() for t in tool_texts)


async def test_run_dir_refuses_overwrite_and_mismatched_resume_and_rescores(tmp_path: Path) -> None:
    ids = first_ids(RETAIL, 2)
    out = tmp_path / "run"
    manifest, records = await run_eval([RETAIL], EvalConfig(agent="oracle", task_ids=ids, trials=2), out)
    assert json.loads((out / "manifest.json").read_text())["run_id"] == manifest.run_id
    assert len((out / "trials.jsonl").read_text().splitlines()) == 4
    with pytest.raises(RunExists):
        await run_eval([RETAIL], EvalConfig(agent="oracle", task_ids=ids, trials=2), out)
    with pytest.raises(RunConfigMismatch, match="agent: run has 'oracle', now 'noop'"):
        await run_eval([RETAIL], EvalConfig(agent="noop", task_ids=ids, trials=2), out, resume=True)
    # resuming a finished run runs nothing and keeps one line per key
    _, again = await run_eval(
        [RETAIL], EvalConfig(agent="oracle", task_ids=ids, trials=2, concurrency=1), out, resume=True
    )
    assert len((out / "trials.jsonl").read_text().splitlines()) == 4
    assert [r.reward for r in again] == [1.0] * 4
    # re-scoring from stored diffs reproduces the rewards; a tampered diff changes the verdict
    rescored = (await rescore(out)).records
    assert sorted(r.reward for r in rescored) == [1.0] * 4
    assert all(r.final_diff for r in records)
    lines = (out / "trials.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec["final_diff"] = {}
    et = load_env_tasks(RETAIL)  # its hash made to match, as a run whose trial changed nothing writes it
    rec["final_state_hash"] = state_hash(et.final_from_diff(et.task(rec["task_id"]), {}))
    (out / "trials.jsonl").write_text("\n".join([json.dumps(rec), *lines[1:]]) + "\n")
    rescored = {r.trial_key: r for r in (await rescore(out, write=True)).records}
    assert rescored[rec["trial_key"]].reward == 0.0 and not rescored[rec["trial_key"]].score.state_match
    assert (out / "rescored.jsonl").exists()


async def test_interrupted_run_resumes_every_trial_exactly_once(tmp_path: Path) -> None:
    ids = first_ids(RETAIL, 4)
    out = tmp_path / "run"
    config = EvalConfig(agent="oracle", task_ids=ids, trials=2, concurrency=2)
    seen: list[str] = []
    with anyio.CancelScope() as scope:

        def on_record(record) -> None:
            seen.append(record.trial_key)
            if len(seen) == 3:
                scope.cancel()

        await run_eval([RETAIL], config, out, on_record=on_record)
    written = [r.trial_key for r in RunDir(out).read_records()]
    assert 3 <= len(written) < 8
    _, records = await run_eval([RETAIL], config, out, resume=True)
    keys = [r.trial_key for r in RunDir(out).read_records()]
    assert Counter(keys) == Counter({f"retail_orders/{t}/{k}": 1 for t in ids for k in range(2)})
    assert keys[: len(written)] == written
    assert [r.reward for r in records] == [1.0] * 8


async def test_resume_after_a_torn_last_line_keeps_every_trial(tmp_path: Path) -> None:
    """A crash mid-write leaves half a line; the resumed run's records must not be glued onto it."""
    ids = first_ids(RETAIL, 2)
    out = tmp_path / "run"
    config = EvalConfig(agent="oracle", task_ids=ids, trials=1, concurrency=1)
    await run_eval([RETAIL], config, out)
    trials = out / "trials.jsonl"
    lines = trials.read_text().splitlines(keepends=True)
    trials.write_text(lines[0] + lines[1][: len(lines[1]) // 2])  # the second record was torn
    await run_eval([RETAIL], config, out, resume=True)
    keys = [r.trial_key for r in RunDir(out).read_records()]
    assert sorted(keys) == sorted(f"retail_orders/{t}/0" for t in ids)
    assert trials.read_text().splitlines()[-1].startswith("{")


class AskingOracle(OracleAgent):
    """Asks for every known fact once, then behaves as the oracle."""

    def __init__(self, task) -> None:
        super().__init__(task, load_env_tasks(RETAIL).policy_rules)
        self.asked = False

    async def respond(self, messages, tools, client):
        if not self.asked:
            self.asked = True
            names = " and ".join(f.name for f in self.task.scenario.known_facts)
            return Message(role="assistant", content=f"Could you give me your {names}?")
        return await super().respond(messages, tools, client)


async def test_lying_scripted_user_is_flagged_and_honest_one_is_not(tmp_path: Path) -> None:
    et = load_env_tasks(RETAIL)
    task = next(t for t in et.tasks if any(f.name == "customer_id" for f in t.scenario.known_facts))
    config = EvalConfig(agent="oracle", task_ids=[task.id])
    _, honest = await run_eval([RETAIL], config, tmp_path / "honest", make_agent=lambda t, s: AskingOracle(t))
    assert honest[0].reward == 1.0 and not honest[0].user_error
    truth = next(f.value for f in task.scenario.known_facts if f.name == "customer_id")
    _, lying = await run_eval(
        [RETAIL],
        config,
        tmp_path / "lying",
        make_agent=lambda t, s: AskingOracle(t),
        make_user=lambda t: ScriptedUser(t, lies={"customer_id": "C-1999"}),
    )
    rec = lying[0]
    assert "C-1999" in rec.messages[2].content
    assert rec.user_error and "C-1999" in rec.user_error_reason and truth in rec.user_error_reason


class EndlessAsker(OracleAgent):
    """Asks for a known fact again and again, never calls a tool."""

    async def respond(self, messages, tools, client):
        name = self.task.scenario.known_facts[0].name
        return Message(role="assistant", content=f"Could you confirm your {name} once more?")


async def test_an_agent_that_asks_forever_is_not_masked_as_a_user_error(tmp_path: Path) -> None:
    """The attack on the mask: keep asking, so that the scripted user runs out of patience and
    ends the conversation mid-question, which the rules call the user's premature stop. The user
    outlasts the run's exchange limit instead: the trial ends at max_turns, a failure of the agent,
    with reward 0 and no user error."""
    et = load_env_tasks(RETAIL)
    task = next(t for t in et.tasks if t.scenario.known_facts)
    config = EvalConfig(agent="oracle", task_ids=[task.id], limits={"max_turns": 12})
    _, records = await run_eval([RETAIL], config, tmp_path / "run", make_agent=lambda t, s: EndlessAsker(t))
    (rec,) = records
    assert rec.termination == "max_turns" and rec.reward == 0.0, (rec.termination, rec.reward)
    assert not rec.user_error, rec.user_error_reason


async def test_premature_stop_rule_and_llm_judge_fallback() -> None:
    task = load_tasks(RETAIL)[0]
    asked = [
        Message(role="user", content="I need help."),
        Message(role="assistant", content="Which order do you mean?"),
        Message(role="user", content=STOP),
    ]
    error, reason = rule_user_error(task, asked)
    assert error and "asking a question" in reason
    fine = [
        Message(role="user", content="I need help."),
        Message(role="assistant", content="Done."),
        Message(role="user", content=STOP),
    ]
    assert rule_user_error(task, fine) == (False, None)
    judge = LLMConfig(
        model="openai/judge", mock_response='{"user_error": true, "reason": "asked for a refund"}'
    )
    error, reason, usage = await detect_user_error(task, fine, judge)
    assert error and reason == "judge: asked for a refund" and usage.calls == 1
    no = LLMConfig(model="openai/judge", mock_response='{"user_error": false, "reason": ""}')
    assert (await detect_user_error(task, fine, no))[:2] == (False, None)


async def test_actions_and_nl_assertions_parts() -> None:
    et = load_env_tasks(RETAIL)
    task = et.tasks[0]
    first = task.golden_calls[0]
    task = task.model_copy(
        update={
            "reward_basis": ["state", "outputs", "actions", "nl_assertions"],
            "action_checks": [ActionCheck(name=first.name, arguments=first.arguments)],
            "nl_assertions": ["The agent states the total."],
        }
    )
    from envforge.server import Fleet

    fleet = Fleet([et.env])
    episode = await fleet.create_episode(et.env.name)
    for call in task.golden_calls:
        await fleet.call(episode.id, call.name, call.arguments)
    final, _ = await fleet.export(episode.id)
    await fleet.aclose()
    oracle = OracleAgent(task)
    messages = [Message(role="user", content="hi")]
    for _ in range(len(task.golden_calls) + 1):
        messages.append(await oracle.respond(messages, [], None))  # type: ignore[arg-type]
    unjudged = await score_trial(task, final, messages, status="completed")
    assert unjudged.score.reward == 1.0 and unjudged.not_judged == ["nl_assertions"]
    assert unjudged.parts == {"state": 1.0, "outputs": 1.0, "actions": 1.0}
    met = '{"results": [{"expectedOutcome": "x", "reasoning": "seen", "metExpectation": %s}]}'
    yes = LLMConfig(model="openai/judge", mock_response=met % "true")
    judged = await score_trial(task, final, messages, status="completed", judge=yes)
    assert judged.score.reward == 1.0 and judged.parts["nl_assertions"] == 1.0 and not judged.not_judged
    assert judged.judge_usage is not None and judged.judge_usage.calls == 1
    no = LLMConfig(model="openai/judge", mock_response=met % "false")
    assert (await score_trial(task, final, messages, status="completed", judge=no)).score.reward == 0.0
    wrong = [m.model_copy(update={"tool_calls": []}) for m in messages]
    assert (await score_trial(task, final, wrong, status="completed")).parts["actions"] == 0.0
    assert (await score_trial(task, final, messages, status="max_turns")).score.reward == 0.0


class SlowAgent:
    """Thinks for longer than the trial's wall-clock limit."""

    async def respond(self, messages, tools, client):
        await anyio.sleep(5)
        return Message(role="assistant", content="done")


class FumblingAgent:
    """Calls a tool that does not exist, over and over."""

    def __init__(self) -> None:
        self.n = 0

    async def respond(self, messages, tools, client):
        self.n += 1
        call = ToolCall(id=f"c{self.n}", name="no_such_tool", arguments={})
        return Message(role="assistant", tool_calls=[call])


@pytest.mark.parametrize(
    ("make", "limits", "status"),
    [
        (SlowAgent, Limits(trial_timeout_s=0.3), "timeout"),
        (FumblingAgent, Limits(max_tool_errors=3, max_steps=50), "max_errors"),
    ],
)
async def test_trial_limits_end_trials_with_their_own_status_and_zero_reward(tmp_path, make, limits, status):
    ids = first_ids(RETAIL, 1)
    config = EvalConfig(agent="oracle", task_ids=ids, trials=1, concurrency=1, limits=limits)
    _, records = await run_eval([RETAIL], config, tmp_path / "run", make_agent=lambda task, seed: make())
    assert [(r.status, r.reward) for r in records] == [(status, 0.0)]
    if status == "max_errors":
        errors = [m for m in records[0].messages if m.role == "tool" and m.is_error]
        assert len(errors) == limits.max_tool_errors + 1  # that many are tolerated; the next one ends it
        assert "unknown tool 'no_such_tool'" in errors[0].content


async def test_collector_is_quiet_while_trials_run_and_restored_after(tmp_path: Path) -> None:
    """While trials run, what the run set up is frozen out of the collector's walks and the first
    threshold is raised; afterwards both are as they were, also when the run is cancelled."""
    import gc

    before = gc.get_threshold(), gc.get_freeze_count()
    during: list[tuple[tuple[int, int, int], int]] = []
    config = EvalConfig(agent="oracle", task_ids=first_ids(RETAIL, 2))
    await run_eval(
        [RETAIL],
        config,
        tmp_path / "a",
        on_record=lambda r: during.append((gc.get_threshold(), gc.get_freeze_count())),
    )
    assert len(during) == 2 and all(t[0] > before[0][0] and n > 0 for t, n in during)
    assert (gc.get_threshold(), gc.get_freeze_count()) == before
    with anyio.CancelScope() as scope:
        await run_eval([RETAIL], config, tmp_path / "b", on_record=lambda r: scope.cancel())
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


async def test_loop_lag_probe_writes_its_figures_when_asked(tmp_path: Path, monkeypatch) -> None:
    """`ENVFORGE_LOOP_LAG=path`: the run writes the event loop's lag while trials ran (off unset)."""
    config = EvalConfig(agent="oracle", task_ids=first_ids(RETAIL, 2))
    await run_eval([RETAIL], config, tmp_path / "off")
    assert not (tmp_path / "lag.json").exists()
    monkeypatch.setenv("ENVFORGE_LOOP_LAG", str(tmp_path / "lag.json"))
    await run_eval([RETAIL], config, tmp_path / "on")
    lag = json.loads((tmp_path / "lag.json").read_text())
    assert set(lag) == {"samples", "p50_ms", "p99_ms", "max_ms"}
    if lag["samples"]:
        assert 0 <= lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"]
