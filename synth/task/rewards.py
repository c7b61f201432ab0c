"""The one reward composer: a scorer per reward part, and the function that multiplies them.

Every place that rewards an episode — `envforge score`, self-verification and the adversaries,
the harness's trials and re-scoring, the trainer's rollouts — calls `compose_reward`, so a reward
means the same thing wherever it is read. A task's `reward_basis` names the parts it is scored
on; the reward is the product of the named parts that could be judged, in the basis's order (so
the float is the same whoever computes it), and 0 for an episode that did not finish.

A scorer judges one part from the task and the episode's evidence. It returns None when the
evidence cannot judge its part (no agent calls recorded for `actions`, no judge's verdict for
`nl_assertions`, no trajectory for `policy`): the part is reported as not judged and left out of
the product rather than guessed. Synthesis makes no model calls, so the verdict on
`nl_assertions` is made by the caller that owns a judge (the harness) and handed over in
`Evidence.verdicts`.

The `policy` part belongs to the env, not the task: where the caller hands over the env's
declared policy rules (`Evidence.policy`, from `policy_rules.toml`), every task of that env is
scored on it too, so a golden end state reached by skipping the identity check or the user's
yes earns 0. An env that declares no rules (τ² imports, by default) has no policy part.

The `env_assertions` part (τ²-bench telecom's ENV_ASSERTION) runs the env's check tools, so it
needs the env and is judged by `judge_env_assertions` (async, on a fresh read-only episode made
from the final state) and handed over in `Evidence.verdicts`, as the judge's verdict on
`nl_assertions` is. Unlike that one, a task with env assertions whose verdict was not handed over
earns 0 for the part, never a pass: the checks are offline, so a caller that skipped them is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from envforge.server import Environment, Fleet, State, render_result

from .models import ActionCheck, Call, EnvAssertion, RewardPart, Score, Task
from .policy_rules import PolicyRules, Step, policy_violations
from .scoring import Shown, checkpoint_passed, task_outputs_missing
from .statediff import cents_hash, matches_up_to_created_ids, states_match

#: Parts judged from an end state and the agent's messages alone: no trajectory, no judge.
OFFLINE_PARTS: tuple[RewardPart, ...] = (RewardPart.STATE, RewardPart.OUTPUTS, RewardPart.CHECKPOINTS)


@dataclass(frozen=True)
class PartScore:
    """One part's score in [0, 1], why, and (for counted parts) how many of how many were met."""

    value: float
    reason: str
    met: int = 0
    of: int = 0
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class Evidence:
    """What an episode left to judge it by.

    `agent_calls` is None where the calls were not recorded (a replayed action list is scored on
    its end state); `golden_state`, when the caller holds it (self-verification), replaces the
    hash comparison by a direct one that is cheaper, with the same verdict; `finished` is False
    for an episode that ended before its conversation did (a timeout, the turn limit).
    `shown_messages` are what the agent was shown (the user's messages, the tool results): a
    number the agent states beside a required output must come from there or from the task
    (`scoring`'s exact rule), so an episode scored without them is scored strictly.
    """

    final_state: State
    agent_messages: Sequence[str] = ()
    shown_messages: Shown = ()
    keys: Mapping[str, tuple[str, ...]] | None = None
    """Each table's primary-key columns, where the caller has the env: rows the episode created
    then match the golden ones whatever ids their order of creation gave them."""
    agent_calls: Sequence[Call] | None = None
    golden_state: State | None = None
    verdicts: Mapping[RewardPart, PartScore] = field(default_factory=dict)
    finished: bool = True
    policy: PolicyRules | None = None
    """The env's declared policy rules: where given, `policy` joins the task's basis."""
    trajectory: Sequence[Step] | None = None
    """Who said and called what, in order; None where it was not recorded (an action list
    replayed offline), and then `policy` is not judged."""


PartScorer = Callable[[Task, Evidence], PartScore | None]
"""Judges one part of `task`'s reward from the evidence; None when the evidence cannot judge it."""


def score_state(task: Task, evidence: Evidence) -> PartScore:
    """The final state equals the golden one, floats compared to cents, up to the ids of the rows
    the episode created (where `evidence.keys` says which columns are ids)."""
    golden = evidence.golden_state
    if golden is not None:

        def matches(state: State) -> bool:
            return states_match(state, golden)
    else:

        def matches(state: State) -> bool:
            return cents_hash(state) == task.golden_cents_hash

    if matches(evidence.final_state):
        return PartScore(1.0, "final state matches the golden state")
    if evidence.keys is not None and matches_up_to_created_ids(
        evidence.final_state, task.golden_diff, evidence.keys, matches
    ):
        return PartScore(1.0, "final state matches the golden state up to the ids of the rows it created")
    return PartScore(0.0, "final state differs from the golden state")


def score_outputs(task: Task, evidence: Evidence) -> PartScore:
    """All or nothing: every required output communicated under the task's answer rule."""
    missing = task_outputs_missing(task, evidence.agent_messages, evidence.shown_messages)
    total = len(task.required_outputs)
    met = total - len(missing)
    if missing:
        return PartScore(0.0, f"not communicated: {', '.join(missing)}", met, total, tuple(missing))
    return PartScore(1.0, f"{total} required output(s) communicated", met, total)


def score_checkpoints(task: Task, evidence: Evidence) -> PartScore:
    """Partial credit: the fraction of write checkpoints whose rows hold their golden values."""
    total = len(task.checkpoints)
    passed = sum(checkpoint_passed(c, evidence.final_state) for c in task.checkpoints)
    value = 1.0 if total == 0 else passed / total
    return PartScore(value, f"{passed} of {total} checkpoint(s) hold", passed, total)


def actions_matched(checks: Sequence[ActionCheck], calls: Sequence[Call]) -> bool:
    """Every expected action is matched by some agent call: same name, same compared arguments."""
    for check in checks:
        keys = check.compare_args if check.compare_args is not None else list(check.arguments)
        if not any(
            c.name == check.name and all(c.arguments.get(k) == check.arguments.get(k) for k in keys)
            for c in calls
        ):
            return False
    return True


def score_actions(task: Task, evidence: Evidence) -> PartScore | None:
    """τ²'s action matching over the agent's calls; not judged when the calls were not recorded."""
    if evidence.agent_calls is None:
        return None
    if actions_matched(task.action_checks, evidence.agent_calls):
        return PartScore(1.0, "every expected action was called")
    return PartScore(0.0, "an expected action was not called")


def score_policy(task: Task, evidence: Evidence) -> PartScore | None:
    """1 when the trajectory kept every declared rule, else 0; not judged without rules or a
    trajectory."""
    if evidence.policy is None or evidence.trajectory is None:
        return None
    broken = policy_violations(evidence.policy, task, evidence.trajectory)
    if broken:
        return PartScore(0.0, "policy broken: " + "; ".join(broken), 0, 1, tuple(broken))
    return PartScore(1.0, "every declared policy rule kept", 1, 1)


def score_nl_assertions(task: Task, evidence: Evidence) -> PartScore | None:
    """The judge's verdict handed over by its caller; not judged without one."""
    return evidence.verdicts.get(RewardPart.NL_ASSERTIONS)


def score_env_assertions(task: Task, evidence: Evidence) -> PartScore:
    """The verdict of `judge_env_assertions` handed over by the caller; 1 for a task with none,
    and 0 (never a pass) for a task with assertions whose verdict was not handed over."""
    verdict = evidence.verdicts.get(RewardPart.ENV_ASSERTIONS)
    if verdict is not None:
        return verdict
    if not task.env_assertions:
        return PartScore(1.0, "no env assertions")
    return PartScore(0.0, "the env assertions were not run (the env's check tools are needed)")


STATE_FAILURES = frozenset({"refused", "env_error"})
"""How a check tool may fail because of the state it reads (it refused, or crashed on a row an
agent deleted): the assertion is not met. Any other failure (a check that is not one, arguments
it refuses, a check that writes) is the task's, whatever the state: `EnvAssertionError`."""


WRITE_FAILURES = ("(SQL refused:", "a read tool changed the database")
"""An env error of a check that tried to write (`runtime.calls`' wording): the env's bug, not the state's."""


def _wrote(text: str) -> bool:
    return any(marker in text for marker in WRITE_FAILURES)


class EnvAssertionError(ValueError):
    """An env assertion that cannot be judged: it names no check tool of the env, its arguments
    are refused, or the check tried to write. A task's error, never a pass. (A check that refuses
    or crashes on the state it reads is an assertion not met: the state may be an agent's.)"""


def env_assertion_problems(env: Environment, task: Task) -> list[str]:
    """Why `task`'s env assertions cannot run on `env` (no such check tool); empty when they can."""
    checks = env.tools_of("check")
    return [
        f"task {task.id}: env assertion {a.func_name!r} names no check tool of env {env.name!r} "
        f"(its check tools: {', '.join(checks) or 'none'})"
        for a in task.env_assertions
        if a.func_name not in checks
    ]


async def judge_env_assertions(env: Environment, task: Task, final_state: State) -> PartScore:
    """Run each of `task`'s env assertions, a check tool of `env`, on a fresh read-only episode
        made from `final_state`; 1 when every one returns its `assert_value`, else 0 (τ²'s
        ENV_ASSERTION reward is the product of the passes). A fresh episode, so a check sees only
        the final state and changes nothing a later check or the caller reads; read-only, so a check
        that would write is refused. A check that refuses or crashes on `final_state` is not met (an
    agent may leave a state its check cannot read: that is a 0 with its reason, not an error that
    drops the trial). Raises `EnvAssertionError` when an assertion cannot be judged."""
    if not task.env_assertions:
        return PartScore(1.0, "no env assertions")
    problems = env_assertion_problems(env, task)
    if problems:
        raise EnvAssertionError(problems[0])
    failed: list[str] = []
    async with Fleet([env], max_episodes=1) as fleet:
        episode = await fleet.create_episode(env.name, state=final_state)
        episode.read_only = True
        for a in task.env_assertions:
            result = await fleet.call(episode.id, a.func_name, a.arguments, side="check")
            if result.is_error and (result.kind not in STATE_FAILURES or _wrote(result.text)):
                raise EnvAssertionError(
                    f"task {task.id}: env assertion {a.func_name}({_args(a)}) failed to run: {result.text}"
                )
            if result.is_error:  # the check refused or crashed on this state: not met, never a pass
                failed.append(f"{a.func_name}({_args(a)}) failed on the final state: {result.text}")
            elif result.text != render_result(a.assert_value):
                failed.append(_describe(a, result.text))
    total = len(task.env_assertions)
    if failed:
        return PartScore(
            0.0, "env assertion not met: " + "; ".join(failed), total - len(failed), total, tuple(failed)
        )
    return PartScore(1.0, f"{total} env assertion(s) met", total, total)


def _args(a: EnvAssertion) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in a.arguments.items())


def _describe(a: EnvAssertion, got: str) -> str:
    said = f" ({a.message})" if a.message else ""
    return f"{a.func_name}({_args(a)}) gave {got}, expected {render_result(a.assert_value)}{said}"


SCORERS: Mapping[RewardPart, PartScorer] = {
    RewardPart.STATE: score_state,
    RewardPart.OUTPUTS: score_outputs,
    RewardPart.CHECKPOINTS: score_checkpoints,
    RewardPart.ACTIONS: score_actions,
    RewardPart.NL_ASSERTIONS: score_nl_assertions,
    RewardPart.POLICY: score_policy,
    RewardPart.ENV_ASSERTIONS: score_env_assertions,
}


def reward_basis(task: Task, evidence: Evidence) -> list[RewardPart]:
    """The parts `task`'s episode is scored on: its basis, and `policy` where the env declares rules."""
    basis = [RewardPart(p) for p in task.reward_basis]
    if evidence.policy is not None and RewardPart.POLICY not in basis:
        basis.append(RewardPart.POLICY)
    return basis


class Reward(NamedTuple):
    """A composed reward: its value, the judged parts of the basis, and the parts left unjudged."""

    value: float
    parts: dict[RewardPart, PartScore]
    not_judged: list[RewardPart]
    basis: tuple[RewardPart, ...] = ()


def compose_reward(
    task: Task, evidence: Evidence, *, scored: Mapping[RewardPart, PartScore | None] | None = None
) -> Reward:
    """The reward of `task`'s episode: the product of the parts its `reward_basis` names (and
    `policy`, where the evidence carries the env's rules).

    Only the named parts are scored (self-verification asks for rewards many times per task);
    `scored` holds parts the caller has already scored on the same evidence, so none is computed
    twice.
    """
    value = 1.0
    parts: dict[RewardPart, PartScore] = {}
    not_judged: list[RewardPart] = []
    basis = reward_basis(task, evidence)
    for part in basis:
        if scored is not None and part in scored:
            score = scored[part]
        elif part in parts:
            score = parts[part]
        else:
            score = SCORERS[part](task, evidence)
        if score is None:
            not_judged.append(part)
            continue
        parts[part] = score
        value *= score.value
    if not evidence.finished:
        value = 0.0
    return Reward(value, parts, not_judged, tuple(basis))


def score_episode(
    task: Task,
    final_state: State,
    agent_messages: Sequence[str],
    *,
    shown_messages: Shown = (),
    keys: Mapping[str, tuple[str, ...]] | None = None,
    golden_state: State | None = None,
) -> Score:
    """Score one finished episode of `task` from its end state and the agent's messages, with the
    detail a record shows: every offline part is scored (whether or not the basis names it), the
    reward composed from them; `actions` and `nl_assertions` are reported as not judged."""
    evidence = Evidence(final_state, agent_messages, shown_messages, keys, golden_state=golden_state)
    scored = {p: SCORERS[p](task, evidence) for p in OFFLINE_PARTS}
    return detailed_score(task, scored, compose_reward(task, evidence, scored=scored))


def detailed_score(task: Task, scored: Mapping[RewardPart, PartScore | None], reward: Reward) -> Score:
    """The `Score` record of an episode: its `reward`, and the detail of its `scored` offline parts."""
    state, outputs, checkpoints = (scored[p] for p in OFFLINE_PARTS)
    assert state is not None and outputs is not None and checkpoints is not None  # offline parts always judge
    return Score(
        reward=reward.value,
        state_match=state.value == 1.0,
        outputs=1.0 if outputs.of == 0 else outputs.met / outputs.of,
        outputs_missing=list(outputs.missing),
        checkpoints=checkpoints.value,
        checkpoints_passed=checkpoints.met,
        checkpoints_total=checkpoints.of,
        basis=list(reward.basis or task.reward_basis),
        not_judged=reward.not_judged,
        answer_rule=task.answer_rule,
        policy_broken=list(policy.missing) if (policy := reward.parts.get(RewardPart.POLICY)) else [],
    )
