"""The scorer's parts on hand-made cases: state to the cent, τ-bench output matching, checkpoints;
the one reward composer (only the basis's parts scored, the same reward from the offline scorer and
the harness's trial scorer)."""

from __future__ import annotations

import pytest

from envforge.harness import Message, ToolCall, score_trial
from envforge.synth import (
    SCORERS,
    ActionCheck,
    Call,
    Checkpoint,
    Dag,
    Difficulty,
    Evidence,
    RewardPart,
    RowCheck,
    Task,
    UserScenario,
    apply_diff,
    cents_hash,
    compose_reward,
    diff_states,
    oracle_messages,
    score_episode,
)

GOLDEN = {
    "accounts": [{"id": "A-1", "balance": 70.5}, {"id": "A-2", "balance": 30.0}],
    "notes": [{"id": 1, "body": "refund"}],
}


def make_task(outputs: list[str] | None = None, basis: list[str] | None = None) -> Task:
    return Task(
        id="t",
        env="bank",
        seed="0:0",
        dag=Dag(nodes=[], edges=[]),
        scenario=UserScenario(persona="p", instruction="i", known_facts=[], must_be_told=outputs or []),
        golden_calls=[],
        golden_hash="x",
        golden_cents_hash=cents_hash(GOLDEN),
        golden_diff={},
        required_outputs=outputs or [],
        checkpoints=[
            Checkpoint(
                node="n1",
                tool="transfer",
                rows=[RowCheck(table="accounts", key={"id": "A-1"}, row={"id": "A-1", "balance": 70.5})],
            ),
            Checkpoint(
                node="n2", tool="delete_note", rows=[RowCheck(table="notes", key={"id": 2}, row=None)]
            ),
        ],
        difficulty=Difficulty(calls=0, writes=2, reasoning=0, depth=0, tables=2),
        reward_basis=basis or ["state", "outputs"],  # type: ignore[arg-type]
    )


def _with(balance: float, notes: list | None = None) -> dict:
    return {
        "accounts": [{"id": "A-1", "balance": balance}, {"id": "A-2", "balance": 30.0}],
        "notes": notes if notes is not None else [{"id": 1, "body": "refund"}],
    }


def test_state_matches_to_the_cent() -> None:
    task = make_task()
    assert score_episode(task, _with(70.5), []).state_match
    assert score_episode(task, _with(70.500000001), []).state_match
    assert score_episode(task, _with(70.50000001), [], golden_state=GOLDEN).state_match
    miss = score_episode(task, _with(70.51), [])
    assert not miss.state_match and miss.reward == 0.0
    assert not score_episode(task, _with(70.51), [], golden_state=GOLDEN).state_match


def test_outputs_use_the_tau_bench_rule_under_substring() -> None:
    task = make_task(outputs=["1234.50", "O-1001"]).model_copy(update={"answer_rule": "substring"})
    good = score_episode(task, GOLDEN, ["Your refund of $1,234.50 for order o-1001 is done."])
    assert good.outputs == 1.0 and good.outputs_missing == [] and good.reward == 1.0
    half = score_episode(task, GOLDEN, ["Refunded 1234.5 for O-1001"])
    assert half.outputs == 0.5 and half.outputs_missing == ["1234.50"] and half.reward == 0.0
    assert score_episode(task, GOLDEN, oracle_messages(task)).reward == 1.0


def test_outputs_compare_values_under_exact() -> None:
    task = make_task(outputs=["1234.50", "O-1001"])
    good = score_episode(task, GOLDEN, ["Your refund of $1,234.50 for order o-1001 is done."])
    assert good.outputs == 1.0 and good.reward == 1.0 and good.answer_rule == "exact"
    assert score_episode(task, GOLDEN, ["Refunded 1234.5 for O-1001"]).reward == 1.0
    half = score_episode(task, GOLDEN, ["Refunded 1234.55 for O-10011"])
    assert half.outputs == 0.0 and half.outputs_missing == ["1234.50", "O-1001"]
    assert score_episode(task, GOLDEN, oracle_messages(task)).reward == 1.0


def test_checkpoints_give_partial_credit_when_in_the_basis() -> None:
    task = make_task(basis=["checkpoints"])
    full = score_episode(task, GOLDEN, [])
    assert (full.checkpoints, full.checkpoints_passed, full.checkpoints_total, full.reward) == (
        1.0,
        2,
        2,
        1.0,
    )
    one = score_episode(task, _with(70.5, notes=[{"id": 2, "body": "x"}]), [])
    assert one.checkpoints == 0.5 and one.reward == 0.5 and not one.state_match
    none = score_episode(task, _with(1.0, notes=[{"id": 2, "body": "x"}]), [])
    assert none.checkpoints == 0.0
    # Default basis ignores checkpoints: the state part decides.
    assert score_episode(make_task(), _with(70.5, notes=[{"id": 2, "body": "x"}]), []).reward == 0.0


def test_reward_is_the_product_of_the_basis_parts() -> None:
    task = make_task(outputs=["42"], basis=["state", "outputs", "checkpoints"])
    assert score_episode(task, GOLDEN, ["it is 42"]).reward == 1.0
    assert score_episode(task, GOLDEN, ["no idea"]).reward == 0.0
    assert score_episode(task, _with(1.0), ["it is 42"]).reward == 0.0


def test_diffs_round_trip() -> None:
    pks = {"accounts": ("id",), "notes": ("id",)}
    before = _with(100.0, notes=[{"id": 2, "body": "old"}])
    diff = diff_states(pks, before, GOLDEN)
    assert diff["accounts"].updated[0].before == {"balance": 100.0}
    assert [r["id"] for r in diff["notes"].inserted] == [1] and [r["id"] for r in diff["notes"].deleted] == [
        2
    ]
    assert apply_diff(pks, before, diff) == GOLDEN


def test_parts_needing_a_judge_are_reported_not_guessed() -> None:
    """τ² tasks carry `nl_assertions`: the offline scorer leaves them out of the reward and says so."""
    task = make_task(basis=["state", "nl_assertions", "actions"])
    ok = score_episode(task, GOLDEN, [])
    assert ok.reward == 1.0 and ok.not_judged == ["nl_assertions", "actions"]
    bad = score_episode(task, _with(1.0), [])
    assert bad.reward == 0.0 and bad.not_judged == ["nl_assertions", "actions"]
    assert score_episode(make_task(), GOLDEN, []).not_judged == []


def test_every_reward_part_has_one_scorer() -> None:
    assert set(SCORERS) == set(RewardPart)


def test_only_the_parts_the_basis_names_are_scored_and_multiplied() -> None:
    half_done = _with(70.5, notes=[{"id": 1, "body": "refund"}, {"id": 2, "body": "x"}])
    task = make_task(["42"], basis=["checkpoints", "outputs"])
    reward = compose_reward(task, Evidence(half_done, ["it is 42"]))
    assert reward.value == 0.5 and list(reward.parts) == ["checkpoints", "outputs"]
    assert reward.parts[RewardPart.CHECKPOINTS].reason == "1 of 2 checkpoint(s) hold"
    silent = compose_reward(task, Evidence(half_done, ["no idea"]))
    assert silent.value == 0.0 and silent.parts[RewardPart.OUTPUTS].missing == ("42",)


def test_an_unfinished_episode_earns_nothing_whatever_its_parts() -> None:
    task = make_task()
    assert compose_reward(task, Evidence(GOLDEN)).value == 1.0
    assert compose_reward(task, Evidence(GOLDEN, finished=False)).value == 0.0


def test_parts_the_evidence_cannot_judge_are_reported_not_guessed() -> None:
    task = make_task(basis=["state", "actions"]).model_copy(
        update={"action_checks": [ActionCheck(name="refund", arguments={"id": "A-1"})]}
    )
    unrecorded = compose_reward(task, Evidence(GOLDEN))
    assert unrecorded.value == 1.0 and unrecorded.not_judged == [RewardPart.ACTIONS]
    wrong = compose_reward(task, Evidence(GOLDEN, agent_calls=[Call(name="refund", arguments={"id": "A-2"})]))
    assert wrong.value == 0.0 and not wrong.not_judged
    right = compose_reward(task, Evidence(GOLDEN, agent_calls=[Call(name="refund", arguments={"id": "A-1"})]))
    assert right.value == 1.0


@pytest.mark.parametrize(
    "basis",
    [["state", "outputs"], ["checkpoints"], ["outputs", "checkpoints", "state"], ["state", "actions"]],
)
async def test_the_harness_and_the_offline_scorer_give_the_same_reward(basis: list[str]) -> None:
    task = make_task(["42"], basis=basis).model_copy(
        update={"action_checks": [ActionCheck(name="refund", arguments={"id": "A-1"})]}
    )
    call = ToolCall(id="c1", name="refund", arguments={"id": "A-1"})
    for state in (GOLDEN, _with(1.0), _with(70.5, notes=[{"id": 2, "body": "x"}])):
        for said in ("it is 42", "no idea"):
            messages = [
                Message(role="user", content="hi"),
                Message(role="assistant", content=None, tool_calls=[call]),
                Message(role="assistant", content=said),
            ]
            offline = score_episode(task, state, [said])
            trial = await score_trial(task, state, messages, status="completed")
            assert trial.score.reward == offline.reward
            outputs = 0.0 if offline.outputs_missing else 1.0
            judged = {
                "state": float(offline.state_match),
                "outputs": outputs,
                "checkpoints": offline.checkpoints,
            }
            assert trial.parts == {p: judged.get(p, 1.0) for p in basis}  # the call matches: actions 1.0
