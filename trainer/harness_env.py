"""RL episodes played the way the evaluation harness plays them: simulated user, harness scorer, user errors.

`HarnessRolloutEnv` implements the trainer's `RolloutEnv` protocol on top of `envforge.harness`, so a
training reward is the number `envforge eval` would report for the same conversation:

- the user is the harness's (`ScriptedUser` by default, an `LLMUser` for a litellm model string), and
  it opens the conversation with the task's request, answers the policy's messages and ends with the
  control tokens;
- the conversation is also kept as harness `Message`s (assistant tool calls included), so
  `score_trial` computes every reward part it computes for an eval trial (state, outputs,
  checkpoints, actions, and nl_assertions when a judge model is given);
- `detect_user_error` (rules, then the judge when given and the reward is below 1) decides whether the
  simulated user spoiled the trajectory; such a trajectory comes back `user_error=True`, which ERPO
  turns into advantage 0 and no loss tokens. That is the point of the class: without a real user
  signal the ERPO mask is never exercised.

Two deliberate differences from an eval trial, both so the mask cannot be gamed by the policy:
an empty policy message ends the episode as the agent's own stop (in an eval the scripted user
nudges it; a model user might say goodbye, and no stop after a turn that said nothing is ever a
user error, so either way an empty answer keeps its zero reward); and the scripted user gets a
turn budget far above the rollout's, so it never runs out of patience mid-question (which the
rules flag as a user error). A conversation cut by the rollout's turn cap is scored with status
`max_turns` (reward 0), as the harness scores a trial cut by its limit; one the scripted user
gave up on after nudging turns that said nothing (`UserReply.agent_silent`) with status
`no_response` (reward 0), as in an eval. A user model that fails after retries (`InfraError`) is
nobody's measurement: the trajectory is masked with reason `infra_failure: ...`.

In a dual-control env (user tools, τ² telecom) the user acts on its own side of the episode as in
an eval (`UserToolbox`): its calls are kept in the conversation the scorer reads, never shown to
the policy, and the env assertions are judged with the env.

`user_error_rate` makes the scripted user err on purpose in that share of episodes (an
`ErringUser`, drawn per episode from the run's seed): the kind it committed, if any, goes on the
trajectory as `injected_user_error`, beside the detector's verdict, so the mask's precision and
recall during training are measured rather than assumed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from envforge.harness import (
    ControlToken,
    EnvTasks,
    ErringUser,
    FleetUserCaller,
    InfraError,
    LLMConfig,
    LLMUser,
    Message,
    ScriptedUser,
    Termination,
    ToolCall,
    TrialStatus,
    User,
    UserName,
    UserToolbox,
    bind_toolbox,
    detect_user_error,
    draw_user_error,
    score_trial,
    user_tool_specs,
)
from envforge.server import EpisodeClient
from envforge.synth import Task

from .remote_fleet import EpisodeFleet, RemoteFleet, open_episode_client
from .rollout import RewardInfo, ToolOutcome, policy_prompt

UserFactory = Callable[[Task], User]


@dataclass
class EpisodeVerdict:
    """What the harness decided about one episode: kept for audit (`user_errors.jsonl`)."""

    env: str
    task_id: str
    status: TrialStatus
    termination: Termination
    reward: float
    parts: dict[str, float]
    user_error: bool
    user_error_reason: str | None
    user_messages: list[str] = field(default_factory=list)
    injected_user_error: str | None = None
    """The error kind the erring user committed (`user_error_rate`), else None."""


class _HarnessEpisode:
    """One conversation: forwards tool calls to the episode, user turns to the simulated user."""

    def __init__(
        self,
        env: HarnessRolloutEnv,
        task: Task,
        user: User,
        opening: str,
        episode_id: str,
        client: EpisodeClient | None,
    ) -> None:
        self.env, self.task, self.user, self.episode_id, self.client = env, task, user, episode_id, client
        self.messages: list[Message] = [Message(role="user", content=opening, turn=0)]
        self.turn = 0
        self.calls = 0
        self.termination: Termination | None = None
        self.infra_error: str | None = None
        self.silent = False
        if ControlToken.STOP in opening:
            self.termination = Termination.USER_STOP

    def initial_messages(self) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.env.system_prompt()},
            {"role": "user", "content": self.messages[0].content or ""},
        ]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        self.calls += 1
        call = ToolCall(id=f"call_{self.calls}", name=name, arguments=arguments)
        self.messages.append(Message(role="assistant", tool_calls=[call], turn=self.turn))
        if self.client is not None:
            result = await self.client.call_tool(name, arguments)
        else:
            result = await self.env.fleet.call(self.episode_id, name, arguments)
        self.messages.append(
            Message(
                role="tool",
                content=result.text,
                tool_call_id=call.id,
                is_error=result.is_error,
                turn=self.turn,
            )
        )
        return ToolOutcome(result.text, result.is_error)

    async def user_reply(self, assistant_text: str) -> str | None:
        self.messages.append(Message(role="assistant", content=assistant_text, turn=self.turn))
        if self.termination is not None:
            return None
        if not assistant_text.strip():
            self.termination = Termination.AGENT_EMPTY
            return None
        if ControlToken.STOP in assistant_text:
            self.termination = Termination.AGENT_STOP
            return None
        self.turn += 1
        try:
            answer = await self.user.reply(list(self.messages))
        except InfraError as exc:
            self.termination, self.infra_error = Termination.INFRA_FAILURE, f"infra_failure: {exc}"
            return None
        self.messages.append(Message(role="user", content=answer.text, turn=self.turn))
        if answer.agent_silent:  # the user gave up on turns that said nothing: the policy's failure
            self.termination, self.silent = Termination.AGENT_EMPTY, True
            return None
        if answer.stop or answer.transfer:
            self.termination = Termination.USER_STOP if answer.stop else Termination.TRANSFER
            return None
        return answer.text

    async def finish(self, agent_messages: list[str]) -> RewardInfo:
        status = TrialStatus.COMPLETED if self.termination is not None else TrialStatus.MAX_TURNS
        if self.silent:
            status = TrialStatus.NO_RESPONSE
        injected = self.user.committed if isinstance(self.user, ErringUser) else None
        if self.infra_error is not None:
            info = RewardInfo(reward=0.0, user_error=True, user_error_reason=self.infra_error)
        else:
            final = await self.env.fleet.export_state(self.episode_id)
            judge = self.env.judge
            keys = self.env.env_tasks.pks
            rules = self.env.env_tasks.policy_rules
            ts = await score_trial(
                self.task,
                final,
                self.messages,
                status=status,
                judge=judge,
                keys=keys,
                policy=rules,
                env=self.env.env_tasks.env,
            )
            try:
                error, reason, _ = await detect_user_error(
                    self.task, self.messages, judge if ts.score.reward < 1.0 else None
                )
            except InfraError as exc:
                error, reason = True, f"infra_failure: judge: {exc}"
            info = RewardInfo(
                reward=ts.score.reward, parts=ts.parts, user_error=error, user_error_reason=reason
            )
        info.injected_user_error = injected
        self.env.verdicts.append(
            EpisodeVerdict(
                env=self.env.name,
                task_id=self.task.id,
                status=status,
                termination=self.termination or Termination.MAX_TURNS,
                reward=info.reward,
                parts=info.parts,
                user_error=info.user_error,
                user_error_reason=info.user_error_reason,
                user_messages=[
                    m.content or "" for m in self.messages if m.role == "user" and not m.tool_calls
                ],
                injected_user_error=injected,
            )
        )
        return info


class HarnessRolloutEnv:
    """The tasks of one env folder, played against the harness's simulated user and scored by it.

    `user` is `"scripted"` or a litellm model string (`user_llm` overrides its `LLMConfig`, e.g. to
    set `api_base`); `make_user` replaces the user entirely (tests use a lying `ScriptedUser`).
    `judge` enables the nl_assertions part and the LLM user-error judge. `user_error_rate` (with
    the scripted user) makes that share of episodes err on purpose, drawn from `user_error_seed`.
    """

    def __init__(
        self,
        fleet: EpisodeFleet,
        env_tasks: EnvTasks,
        *,
        user: str = UserName.SCRIPTED,
        user_llm: LLMConfig | None = None,
        judge: LLMConfig | None = None,
        make_user: UserFactory | None = None,
        user_max_turns: int = 1000,
        use_mcp: bool = True,
        task_ids: Sequence[str] | None = None,
        user_error_rate: float = 0.0,
        user_error_seed: int = 0,
        name: str | None = None,
    ) -> None:
        if user_error_rate and (user != UserName.SCRIPTED or make_user is not None):
            raise ValueError("--user-error-rate needs the scripted user (--user scripted)")
        self.fleet = fleet
        self.env_tasks = env_tasks
        self.name = name or env_tasks.env.name
        """What ERPO normalises over (`Trajectory.env`): the env's name, or a task set's label when one
        env folder gives a run two sets (`--tasks lookup+steps`: `gym` and `gym/steps`)."""
        wanted = set(task_ids) if task_ids is not None else None
        self.tasks = {t.id: t for t in env_tasks.tasks if wanted is None or t.id in wanted}
        self.user = user
        self.user_llm = user_llm
        self.judge = judge
        self.make_user = make_user
        self.user_max_turns = user_max_turns
        self.use_mcp = use_mcp
        self.verdicts: list[EpisodeVerdict] = []
        self.user_error_rate = user_error_rate
        self.user_error_seed = user_error_seed
        self._played: dict[str, int] = {}

    def task_ids(self) -> list[str]:
        return sorted(self.tasks)

    def tool_names(self) -> list[str]:
        return sorted(self.env_tasks.env.tools)

    def system_prompt(self) -> str:
        """The single-turn episodes' prompt (`policy_prompt`): a run that plays both sets shows the
        policy one way."""
        return policy_prompt(self.env_tasks.env)

    def _user(self, task: Task) -> User:
        if self.make_user is not None:
            return self.make_user(task)
        if self.user == UserName.SCRIPTED:
            n = self._played[task.id] = self._played.get(task.id, -1) + 1  # before any await: in start order
            rate, seed = self.user_error_rate, self.user_error_seed
            draw = draw_user_error(seed, self.name, task.id, n, rate) if rate else None
            if draw is not None:
                return ErringUser(task, draw, max_turns=self.user_max_turns, seed=seed)
            return ScriptedUser(task, max_turns=self.user_max_turns)
        return LLMUser(task, self.user_llm or LLMConfig(model=self.user))

    @asynccontextmanager
    async def episode(self, task_id: str) -> AsyncIterator[_HarnessEpisode]:
        task = self.tasks[task_id]
        user = self._user(task)
        opening = (await user.start()).text
        state = self.env_tasks.initial_state(task) if task.setup else None
        ep = await self.fleet.create_episode(self.env_tasks.env.name, state=state)
        try:
            async with self._user_side(ep.id) as user_side:
                if self.use_mcp:
                    async with open_episode_client(self.fleet, self.env_tasks.env.name, ep.id) as client:
                        yield self._with_user_tools(
                            _HarnessEpisode(self, task, user, opening, ep.id, client), user_side
                        )
                else:
                    yield self._with_user_tools(
                        _HarnessEpisode(self, task, user, opening, ep.id, None), user_side
                    )
        finally:
            await self.fleet.close_episode(ep.id)

    def _user_side(self, episode_id: str) -> AbstractAsyncContextManager[Any]:
        """The episode's user side (dual control), where the env has user tools; else None."""
        if not self.env_tasks.env.tools_of("user"):
            return nullcontext(None)
        if isinstance(self.fleet, RemoteFleet):
            return self.fleet.http.user_client(self.env_tasks.env.name, episode_id)
        return nullcontext(FleetUserCaller(self.fleet.call, episode_id))

    def _with_user_tools(self, episode: _HarnessEpisode, user_side: Any) -> _HarnessEpisode:
        if user_side is not None:
            specs = user_tool_specs(self.env_tasks.env)
            bind_toolbox(episode.user, UserToolbox(specs, user_side, episode.messages))
        return episode
