"""One episode played call by call, for a script or a notebook that wants to try an env's tools.

An agent reaches an env over MCP; a script that only wants to see what a few calls do, and what
state they leave, needs none of that: it calls the runtime directly through an in-process
`Fleet`, which is the path synthesis and scoring take too, so what it sees is what they see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from envforge.server import Environment, Fleet, State, ToolResult, load_env
from envforge.synth import Call

EnvLike = Environment | str | Path
"""An env given as a loaded `Environment` or as the path of its folder."""


def as_environment(env: EnvLike) -> Environment:
    """The env itself, loaded from its folder when given as a path (errors name file and line)."""
    return env if isinstance(env, Environment) else load_env(env)


@dataclass(frozen=True)
class EpisodeRun:
    """What an episode's calls answered and the state they left, in the canonical form scoring compares."""

    env: str
    results: list[ToolResult]
    state: State
    state_hash: str


async def run_episode_async(env: EnvLike, calls: Sequence[Call], *, state: State | None = None) -> EpisodeRun:
    """Run `calls` in order in one fresh episode (the seed state, or `state`) and export its end state.

    A refused or invalid call does not stop the episode: its result says so (`ToolResult.kind`),
    as an agent would see it, and the calls after it still run. A call whose requestor is the user
    reaches the user's tools only (dual control), as the simulated user's calls do.
    """
    environment = as_environment(env)
    async with Fleet([environment]) as fleet:
        episode = await fleet.create_episode(environment.name, state=state)
        results = [
            await fleet.call(
                episode.id, call.name, call.arguments, side="user" if call.requestor == "user" else "agent"
            )
            for call in calls
        ]
        exported = await fleet.export(episode.id)
    return EpisodeRun(environment.name, results, exported.state, exported.state_hash)


def run_episode(env: EnvLike, calls: Sequence[Call], *, state: State | None = None) -> EpisodeRun:
    """`run_episode_async` from synchronous code (it starts and ends its own event loop)."""
    return anyio.run(lambda: run_episode_async(env, calls, state=state))
