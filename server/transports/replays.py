"""Replay a list of tool calls in one fresh episode through the in-process MCP server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ..core.state import State
from ..runtime.fleet import Fleet
from .client import episode_client


class Action(BaseModel):
    """One tool call as written in an ACTIONS.json file."""

    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ReplayResult(BaseModel):
    outputs: list[str]
    errors: list[bool]
    final_state: State
    state_hash: str


def read_actions(path: str | Path) -> list[Action]:
    """Parse ACTIONS.json, a JSON list of {"name", "arguments"}; errors name the file and the entry."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    try:
        return TypeAdapter(list[Action]).validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "/".join(str(p) for p in first["loc"])
        raise ValueError(
            f"{path}: entry {where}: {first['msg']} (expected a list of {{name, arguments}})"
        ) from None


async def replay(
    fleet: Fleet, env_name: str, actions: list[Action], *, state: State | None = None
) -> ReplayResult:
    """Run `actions` in order in a new episode (seed state, or `state`) and export the result."""
    episode = await fleet.create_episode(env_name, state=state)
    outputs: list[str] = []
    errors: list[bool] = []
    try:
        async with episode_client(fleet, env_name, episode.id) as client:
            for action in actions:
                result = await client.call_tool(action.name, action.arguments)
                outputs.append(result.text)
                errors.append(result.is_error)
        final_state, digest = await fleet.export(episode.id)
    finally:
        await fleet.close_episode(episode.id)
    return ReplayResult(outputs=outputs, errors=errors, final_state=final_state, state_hash=digest)
