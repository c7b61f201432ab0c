"""What an evaluation needs settled before its first trial: which agent, how to reach each model.

`EvalConfig` names its roles (the agent, the simulated user, the judge) as a built-in, a packaged
local model or a litellm model string; a model role also needs its `LLMConfig` (API base,
temperature, transport), and a packaged model its server. These are the rules `envforge eval`
applies to its flags, kept here so that a script building an `EvalConfig` from its own settings
gets the same checks and errors at the same time: before any trial, not as an infrastructure
failure in each of them.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Literal, Protocol, TypeVar

from envforge.harness import (
    BUILTIN_AGENTS,
    EvalConfig,
    LLMConfig,
    LocalModelError,
    LocalServer,
    UserName,
    is_local_spec,
    model_for_spec,
    routable_model,
    running_local_server,
)

Role = Literal["agent", "user", "judge"]
"""A role an evaluation gives a model: the agent under test, the simulated user, the judge."""

LLMTransport = Literal["auto", "http", "litellm"]
"""How a model is called (`LLMConfig.transport`): `auto` calls an OpenAI-compatible server given an
API base directly over HTTP and every other model through litellm."""


def llm_config(
    model: str,
    api_base: str | None = None,
    temperature: float | None = None,
    transport: LLMTransport = "auto",
) -> LLMConfig:
    """How to reach `model`; raises `ValueError` now for a forced `http` transport that cannot apply
    (a model that is not OpenAI-compatible, or one without an API base), instead of mid-run."""
    config = LLMConfig(model=model, api_base=api_base, temperature=temperature, transport=transport)
    config.uses_http()
    return config


def check_agent_name(agent: str) -> None:
    """Raise `ValueError` for an agent that is neither a built-in, a packaged local model nor a model
    string litellm can route: a typo like `oracl` would otherwise make every trial an infra failure."""
    if is_local_spec(agent):
        try:
            model_for_spec(agent)
        except LocalModelError as exc:
            raise ValueError(str(exc)) from exc
        return
    if agent in BUILTIN_AGENTS or "/" in agent or routable_model(agent):
        return
    close = difflib.get_close_matches(agent, BUILTIN_AGENTS, n=1)
    hint = f" (did you mean {str(close[0])!r}?)" if close else ""  # a StrEnum member: its value
    raise ValueError(
        f"unknown agent {agent!r}{hint}: not a built-in ({', '.join(BUILTIN_AGENTS)}) "
        "and not a model string (use provider/model, e.g. openai/gpt-4o)"
    )


def model_roles(config: EvalConfig) -> dict[Role, str]:
    """The roles `config` gives a model (not a built-in agent, not the scripted user), by role."""
    roles: dict[Role, str] = {}
    if config.agent not in BUILTIN_AGENTS:
        roles["agent"] = config.agent
    if config.user != UserName.SCRIPTED:
        roles["user"] = config.user
    if config.judge:
        roles["judge"] = config.judge
    return roles


def with_models(
    config: EvalConfig,
    *,
    api_bases: Mapping[Role, str | None] | None = None,
    temperatures: Mapping[Role, float | None] | None = None,
    transport: LLMTransport = "auto",
    local: Mapping[Role, LLMConfig] | None = None,
) -> EvalConfig:
    """`config` with an `LLMConfig` for each role it gives a model (`model_roles`).

    A role in `local` is reached through its running local server (`local_model_servers`);
    any other from its model string, its API base and its temperature. Raises `ValueError` as
    `llm_config` does."""
    api_bases = api_bases or {}
    temperatures = temperatures or {}
    local = local or {}
    llms: dict[Role, LLMConfig] = {}
    for role, model in model_roles(config).items():
        llms[role] = local.get(role) or llm_config(
            model, api_bases.get(role), temperatures.get(role), transport
        )
    return config.model_copy(
        update={"agent_llm": llms.get("agent"), "user_llm": llms.get("user"), "judge_llm": llms.get("judge")}
    )


R = TypeVar("R", bound=str)


class LocalServerWatch(Protocol):
    """What `local_model_servers` reports about one server while it starts: assembling and
    hash-checking the weights (`progress`, in bytes), each step (`notice`), and the server once it
    answers (`ready`)."""

    def progress(self, done: int, total: int) -> None: ...

    def notice(self, message: str) -> None: ...

    def ready(self, server: LocalServer) -> None: ...


@contextmanager
def local_model_servers(
    specs: Mapping[R, str | None],
    temperatures: Mapping[R, float | None] | None = None,
    *,
    shared: bool = False,
    watch: Callable[[Sequence[R], str], LocalServerWatch] | None = None,
) -> Iterator[dict[R, LLMConfig]]:
    """role -> how to reach its server, for every role whose spec names a packaged local model
    (`local`, `local/NAME`): pass it to `with_models(local=...)`. The servers stop when the block
    ends, normally, on an error or on Ctrl-C.

    Each role gets its own server by default, so the agent's long policy-and-tools prefix stays in
    its server's prompt cache; `shared=True` starts one server per model for the roles naming it
    (less loading and memory, but the roles evict each other's cached prefix). `watch(roles,
    spec)` is called as each server starts and reports on it. Raises `LocalModelError` (an unknown
    model, missing packages, weights that do not match) or `LocalServerError` (the runtime)."""
    temperatures = temperatures or {}
    wanted = {role: spec for role, spec in specs.items() if spec is not None and is_local_spec(spec)}
    models = {role: model_for_spec(spec).name for role, spec in wanted.items()}  # all known before any starts
    groups: dict[str, list[R]] = {}  # server key -> the roles it serves
    for role in wanted:
        groups.setdefault(models[role] if shared else role, []).append(role)
    configs: dict[R, LLMConfig] = {}
    with ExitStack() as servers:
        for roles in groups.values():
            spec = wanted[roles[0]]
            seen = watch(roles, spec) if watch is not None else None
            server = servers.enter_context(
                running_local_server(
                    spec,
                    on_progress=seen.progress if seen is not None else None,
                    on_notice=seen.notice if seen is not None else None,
                )
            )
            for role in roles:
                configs[role] = server.llm_config(temperatures.get(role))
            if seen is not None:
                seen.ready(server)
        yield configs
