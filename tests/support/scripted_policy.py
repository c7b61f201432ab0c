"""A policy that says what a script says, played through the trainer's harness env: conversations
known in advance, so a test can aim at exactly the turn the attack needs.

`say(task, turn)` is the policy's text at its `turn`-th turn of `task`'s episode (the task found
by its opening request in the prompt; None where a user that errs opened otherwise); tokens come
from `ChunkTokenizer`, which decodes exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from envforge.harness import EnvTasks, request_text
from envforge.server import Fleet, load_env
from envforge.synth import Task, load_policy_rules
from envforge.trainer import (
    Generation,
    HarnessRolloutEnv,
    RolloutConfig,
    Trajectory,
    collect,
    unbatched_session,
)

from support.tokenizer import EOS, ChunkTokenizer

Say = Callable[[Task | None, int], str]


class ScriptedPolicy:
    """A generation backend whose every turn is `say(task, turn)`."""

    def __init__(self, tok: ChunkTokenizer, tasks: Sequence[Task], say: Say) -> None:
        self.tok, self.tasks, self.say, self.version, self.eos_id = tok, tasks, say, 0, EOS

    def session(self) -> Any:
        return unbatched_session()

    async def generate(self, prompt_ids: list[int], *, max_new_tokens: int, seed=None, session=None):
        prompt = self.tok.decode(prompt_ids)
        task = next((t for t in self.tasks if request_text(t) in prompt), None)
        ids = [*self.tok.encode(self.say(task, prompt.count("<|im_start|>assistant") - 1)), EOS]
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), version=self.version)

    async def sync_weights(self, state_dict: Any, version: int, model: Any = None) -> None:
        self.version = version

    async def aclose(self) -> None:
        return None


async def play_scripted(
    env_dir: Path,
    tasks: Callable[[Fleet], Any],
    say: Say,
    *,
    groups: int,
    rollouts_per_task: int = 2,
    max_turns: int = 4,
    user_error_rate: float = 0.0,
    seed: int = 0,
) -> list[Trajectory]:
    """`groups` task groups of `env_dir`'s `await tasks(fleet)`, played by `say` with the scripted user."""
    env = load_env(env_dir)
    fleet = Fleet([env])
    try:
        chosen = await tasks(fleet)
        et = EnvTasks(env_dir=env_dir, env=env, tasks=chosen, policy_rules=load_policy_rules(env))
        harness = HarnessRolloutEnv(
            fleet, et, use_mcp=False, user_error_rate=user_error_rate, user_error_seed=seed
        )
        tok = ChunkTokenizer()
        return await collect(
            [harness],
            ScriptedPolicy(tok, chosen, say),
            tok,
            groups=groups,
            rollouts_per_task=rollouts_per_task,
            rollout_config=RolloutConfig(max_turns=max_turns, max_new_tokens=64, max_seq_len=10**6),
            concurrency=1,
        )
    finally:
        await fleet.aclose()
