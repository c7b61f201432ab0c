"""`EnvforgeEnv`: OpenEnv's stock `EnvClient`, typed with envforge's action, observation and state.

    from envforge.integrations.openenv import EnvforgeAction, EnvforgeEnv
    async with EnvforgeEnv(base_url="http://127.0.0.1:8000") as env:
        result = await env.reset(task_id="library-0-00003")
        result.observation.content, result.observation.tools      # the user's request, the tools
        result = await env.step(EnvforgeAction(tool="get_book", arguments={"book_id": "B-1"}))
        result = await env.step(EnvforgeAction(message="Done: B-1 is on hold for you."))
        result.done, result.reward, result.observation.parts       # envforge's verdict at the end
        (await env.state()).reward                                 # the same, kept by the session
    with EnvforgeEnv(base_url=url).sync() as env: ...               # OpenEnv's own sync wrapper

This is how OpenEnv's own environments ship their clients (`class MyEnv(EnvClient[MyAction,
MyObservation, State])`, its `openenv init` template): the transport (one WebSocket session per
client, `/ws`), `sync()`, `from_docker_image` and `from_env` are OpenEnv's, unchanged; this class
only says how an action is sent and how the server's answers are read, with the types the server
itself is declared with (`openenv_models`), so a field the server sends and the client does not
know is an error here, not a silently dropped value.

A malformed action fails before it is sent where the types can tell (an unknown field, a wrong
type: pydantic's ValidationError; something that is not an action: TypeError); the rest (neither
or both of a tool call and a message, a step with no episode open) is the server's one-line
refusal, which OpenEnv's client raises as RuntimeError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .openenv_models import EnvforgeAction, EnvforgeObservation, EnvforgeState


class EnvforgeEnv(EnvClient[EnvforgeAction, EnvforgeObservation, EnvforgeState]):  # type: ignore[misc]
    """A typed OpenEnv client of an envforge OpenEnv server (module docstring)."""

    async def reset(
        self,
        *,
        task_id: str | None = None,
        env: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
    ) -> StepResult[EnvforgeObservation]:
        """A fresh episode of `task_id` (of `env` where ids are shared; `seed` picks one when no
        task is named). `episode_id` is only a label the session's state carries."""
        given = {"task_id": task_id, "env": env, "seed": seed, "episode_id": episode_id}
        result: StepResult[EnvforgeObservation] = await super().reset(
            **{k: v for k, v in given.items() if v is not None}
        )
        return result

    async def step(
        self, action: EnvforgeAction | Mapping[str, Any], **kwargs: Any
    ) -> StepResult[EnvforgeObservation]:
        """One tool call or one message to the user; a mapping is read as an `EnvforgeAction`."""
        result: StepResult[EnvforgeObservation] = await super().step(_action(action), **kwargs)
        return result

    async def state(self) -> EnvforgeState:
        """The session's episode: its task, step count, and its verdict once it is over."""
        state: EnvforgeState = await super().state()
        return state

    def _step_payload(self, action: EnvforgeAction) -> dict[str, Any]:
        payload: dict[str, Any] = action.model_dump(mode="json")
        return payload

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[EnvforgeObservation]:
        # OpenEnv's server sends `done` and `reward` beside the observation, not in it
        done, reward = bool(payload.get("done", False)), payload.get("reward")
        fields = {**payload.get("observation", {}), "done": done, "reward": reward}
        return StepResult(observation=EnvforgeObservation.model_validate(fields), reward=reward, done=done)

    def _parse_state(self, payload: dict[str, Any]) -> EnvforgeState:
        state: EnvforgeState = EnvforgeState.model_validate(payload)
        return state


def _action(action: EnvforgeAction | Mapping[str, Any]) -> EnvforgeAction:
    """`action` as an `EnvforgeAction`: a mapping is validated into one (ValidationError for a field
    it does not declare); anything else is a TypeError, one line."""
    if isinstance(action, EnvforgeAction):
        return action
    if isinstance(action, Mapping):
        valid: EnvforgeAction = EnvforgeAction.model_validate(dict(action))
        return valid
    raise TypeError(
        f"an action is an EnvforgeAction (or a mapping of its fields), not {type(action).__name__}"
    )
