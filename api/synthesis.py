"""Tasks for an env: synthesize them, check a set of them the way `envforge check` does, and score
a run of one task the way `envforge score` does.

Synthesis already runs every check on each task it ships; checking again matters for tasks that
came from elsewhere (a τ² import, a hand edit, an older synthesizer, a changed env), where a
task that doing nothing passes, or that an adversary games, would reward a policy for nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict

from envforge.server import Environment, Fleet
from envforge.synth import (
    OFFLINE_PARTS,
    SCORERS,
    Call,
    Evidence,
    RewardPart,
    Score,
    SynthConfig,
    SynthContext,
    SynthReport,
    Task,
    ToolGraph,
    adversary_rewards,
    apply_diff,
    build_graph,
    compose_reward,
    detailed_score,
    gamed_by,
    golden_results,
    judge_env_assertions,
    load_graph,
    load_tasks,
    primary_keys,
    score_episode,
    shown_results,
    synthesize,
    verify_task,
)

from .episode_runs import EnvLike, as_environment, run_episode_async


async def synthesize_tasks_async(
    env: EnvLike,
    n: int,
    *,
    seed: int = 0,
    config: SynthConfig | None = None,
    llm_model: str | None = None,
    adversaries: bool = True,
    graph: ToolGraph | None = None,
    completion_kwargs: dict[str, Any] | None = None,
) -> SynthReport:
    """Up to `n` distinct tasks that pass every self-check and that no adversary games.

    The same env, `n`, `seed` and `config` give the same tasks, byte for byte (`envforge synth
    tasks` is this call plus writing `tasks.jsonl`). `llm_model` rewrites each instruction
    through litellm, keeping every fact (`completion_kwargs` go with each call: the API base and
    key of a local server); `adversaries=False` only measures what they cost.
    `graph` is the env's tool graph when the caller built it already (`build_graph`, e.g. to
    write it beside the tasks); without it one is built: the same graph, the same tasks.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1 (got {n})")
    return await synthesize(
        as_environment(env),
        n,
        seed,
        config,
        graph=graph,
        llm_model=llm_model,
        adversaries=adversaries,
        completion_kwargs=completion_kwargs,
    )


def synthesize_tasks(
    env: EnvLike,
    n: int,
    *,
    seed: int = 0,
    config: SynthConfig | None = None,
    llm_model: str | None = None,
    adversaries: bool = True,
    graph: ToolGraph | None = None,
    completion_kwargs: dict[str, Any] | None = None,
) -> SynthReport:
    """`synthesize_tasks_async` from synchronous code."""
    return anyio.run(
        lambda: synthesize_tasks_async(
            env,
            n,
            seed=seed,
            config=config,
            llm_model=llm_model,
            adversaries=adversaries,
            graph=graph,
            completion_kwargs=completion_kwargs,
        )
    )


class TaskCheck(BaseModel):
    """One task's verdict: the self-checks it failed and each adversary's best reward on it."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    failed_checks: list[str]
    adversary_rewards: dict[str, float | None]
    """adversary -> the reward it earned (None where its run is the golden one in disguise)."""
    golden_results: list[str] = []
    """The result text of each golden call, replayed on the task's initial state (realism reads
    which values flow from one call into the next)."""

    @property
    def gamed_by(self) -> list[str]:
        """The adversaries that earned the task's full reward."""
        return gamed_by(self.adversary_rewards)

    @property
    def failures(self) -> list[str]:
        """Every reason the task should not ship: failed checks, then `adversary:NAME`."""
        return [*self.failed_checks, *(f"adversary:{name}" for name in self.gamed_by)]

    @property
    def passed(self) -> bool:
        return not self.failures


async def check_tasks_async(
    env: EnvLike, tasks: Sequence[Task] | None = None, *, graph: ToolGraph | None = None
) -> list[TaskCheck]:
    """Run the self-checks and the adversarial agents on each task, from its own initial state.

    `tasks` defaults to the env folder's `tasks.jsonl`; `graph` (the tool graph, built when not
    given) is what the adversaries read to choose plausible calls.
    """
    environment = as_environment(env)
    if tasks is None:
        if not (environment.root / "tasks.jsonl").exists():
            raise FileNotFoundError(
                f"{environment.root / 'tasks.jsonl'} does not exist (run `envforge synth tasks` first)"
            )
        tasks = load_tasks(environment.root)
    async with Fleet([environment]) as fleet:
        ctx = SynthContext.create(environment, graph or await build_graph(environment, fleet), fleet)
        try:
            failed = [await verify_task(ctx, task) for task in tasks]
            rewards = [await adversary_rewards(ctx, task) for task in tasks]
            results = [await golden_results(ctx, task) for task in tasks]
        finally:
            ctx.close()
    return [
        TaskCheck(task_id=task.id, failed_checks=f, adversary_rewards=r, golden_results=g)
        for task, f, r, g in zip(tasks, failed, rewards, results, strict=True)
    ]


def check_tasks(
    env: EnvLike, tasks: Sequence[Task] | None = None, *, graph: ToolGraph | None = None
) -> list[TaskCheck]:
    """`check_tasks_async` from synchronous code."""
    return anyio.run(lambda: check_tasks_async(env, tasks, graph=graph))


async def score_calls_async(
    env: EnvLike,
    task: Task,
    calls: Sequence[Call],
    messages: Sequence[str] = (),
    *,
    graph: ToolGraph | None = None,
) -> Score:
    """Replay `calls` in a fresh episode of `task` (from its own initial state) and score the end
    state, with `messages` as what the agent said: the reward an agent that made these calls and
    said these things would earn, minus the policy part, which needs the conversation.

    `graph` defaults to the env folder's `graph.json`, else one is built. A dual-control env (one
    with user tools: τ² telecom) is scored by `_score_dual_calls`."""
    environment = as_environment(env)
    if environment.tools_of("user"):
        return await _score_dual_calls(environment, task, calls, messages)
    async with Fleet([environment]) as fleet:
        graph = graph or load_graph(environment.root) or await build_graph(environment, fleet)
        ctx = SynthContext.create(environment, graph, fleet)
        try:
            database, _, _ = ctx.states.task_initial(task)
            state, shown = await ctx.replayer.run_all(database, list(calls))
            if state is None:
                raise RuntimeError(f"the episode of {task.id} exported no end state")
            results = [(call.name, call.arguments, text) for call, text in zip(calls, shown, strict=True)]
            return score_episode(
                task, state, list(messages), shown_messages=shown_results(task, results), keys=ctx.pks
            )
        finally:
            ctx.close()


async def _score_dual_calls(
    environment: Environment, task: Task, calls: Sequence[Call], messages: Sequence[str]
) -> Score:
    """A dual-control episode of `task` (τ²-bench telecom): `calls` replayed in order from the
    task's initial state (its setup), each on its requestor's side; the env assertions judged on
    the end state; and every call, the user's too, as the trajectory τ²'s action check reads
    (τ² does not compare requestors)."""
    pks = primary_keys(environment.tables)
    start = apply_diff(pks, environment.seed_state(), task.setup) if task.setup else None
    run = await run_episode_async(environment, calls, state=start)
    verdicts = {}
    if task.env_assertions:
        verdicts[RewardPart.ENV_ASSERTIONS] = await judge_env_assertions(environment, task, run.state)
    results = [(c.name, c.arguments, r.text) for c, r in zip(calls, run.results, strict=True)]
    evidence = Evidence(
        run.state,
        list(messages),
        shown_results(task, results),
        pks,
        agent_calls=list(calls),
        verdicts=verdicts,
    )
    scored = {p: SCORERS[p](task, evidence) for p in OFFLINE_PARTS}
    return detailed_score(task, scored, compose_reward(task, evidence, scored=scored))


def score_calls(
    env: EnvLike,
    task: Task,
    calls: Sequence[Call],
    messages: Sequence[str] = (),
    *,
    graph: ToolGraph | None = None,
) -> Score:
    """`score_calls_async` from synchronous code."""
    return anyio.run(lambda: score_calls_async(env, task, calls, messages, graph=graph))
