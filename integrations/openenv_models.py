"""The pydantic types of envforge's OpenEnv environment, shared by its server
(`envforge.integrations.openenv`) and its typed client (`EnvforgeEnv`): one definition, so what
the server sends is what the client parses, field for field.

OpenEnv's bases forbid unknown fields on actions and observations, so a client built from these
types refuses a misspelt field before anything is sent.
"""

from __future__ import annotations

from typing import Any, Literal

from openenv.core.env_server import Action, Observation, State
from pydantic import Field


class EnvforgeAction(Action):  # type: ignore[misc]
    """A tool call (`tool`, `arguments`) or a message to the user (`message`): exactly one."""

    tool: str | None = Field(default=None, description="the tool to call")
    arguments: dict[str, Any] | str = Field(
        default_factory=dict, description="the call's arguments: an object, or its JSON text"
    )
    message: str | None = Field(default=None, description="what the agent says to the user")


class EnvforgeObservation(Observation):  # type: ignore[misc]
    """The user's message (`role="user"`) or a tool's result (`role="tool"`); `reward` and `parts`
    once `done`."""

    role: Literal["user", "tool"] = "user"
    content: str = ""
    tool: str | None = Field(default=None, description="the tool whose result this is")
    is_error: bool = Field(default=False, description="the call failed (envforge's runtime says why)")
    env: str = ""
    task_id: str = ""
    system: str | None = Field(default=None, description="at reset: the env's policy, for the agent")
    tools: list[dict[str, Any]] | None = Field(default=None, description="at reset: the env's tools")
    parts: dict[str, float] = Field(default_factory=dict, description="at the end: the reward's parts")
    user_error: bool = Field(default=False, description="at the end: the simulated user spoiled it")
    status: str | None = Field(default=None, description="at the end: how the episode ended")


class EnvforgeState(State):  # type: ignore[misc]
    """The session's episode: its env and task, whether it is over, and its verdict once it is."""

    env: str | None = None
    task_id: str | None = None
    done: bool = False
    reward: float | None = None
    parts: dict[str, float] = Field(default_factory=dict)
    user_error: bool = False
    status: str | None = None
