"""A rollout whose opening leaves no room for one turn is an error, never a silent zero.

τ² telecom's system prompt (policy and tech-support manual) is ~6,500 tokens: under the rollout's
default 4,096-token limit no token was generated, and every episode came back as a zero reward
with nothing to learn from. Attack: a task opening longer than `max_seq_len`; the rollout must
stop naming the task and `--max-seq-len`, and play once the limit leaves room. Raised inside the
collectors' task groups, it reaches the command line as one `error:` line, not as the group.
"""

from __future__ import annotations

from typing import Any

import pytest

from envforge.cli.errors import report_and_exit
from envforge.harness import load_env_tasks
from envforge.server import Fleet
from envforge.trainer import (
    FleetRolloutEnv,
    Generation,
    HarnessRolloutEnv,
    NeedsUser,
    PromptTooLong,
    RolloutConfig,
    run_rollout,
    unbatched_session,
)

from support.paths import DUAL_PHONE_DIR
from support.tokenizer import EOS, ChunkTokenizer


class Done:
    """Says it is done, every turn."""

    def __init__(self, tok: ChunkTokenizer) -> None:
        self.tok, self.version, self.eos_id, self.turns = tok, 0, EOS, 0

    def session(self) -> Any:
        return unbatched_session()

    async def generate(self, prompt_ids: list[int], *, max_new_tokens: int, seed=None, session=None):
        self.turns += 1
        ids = [*self.tok.encode("All done."), EOS]
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), version=self.version)


async def test_an_opening_past_the_limit_is_refused_and_plays_under_a_larger_one() -> None:
    tok = ChunkTokenizer()
    et = load_env_tasks(DUAL_PHONE_DIR)
    async with Fleet([et.env]) as fleet:
        env = HarnessRolloutEnv(fleet, et, use_mcp=False)
        task_id = "dual_phone-data"
        backend = Done(tok)
        with pytest.raises(
            PromptTooLong, match=r"task dual_phone-data of env dual_phone: its opening is \d+ tokens"
        ):
            await run_rollout(
                env, task_id, backend, tok, RolloutConfig(max_turns=2, max_new_tokens=8, max_seq_len=64)
            )
        assert backend.turns == 0
        played = await run_rollout(env, task_id, backend, tok, RolloutConfig(max_turns=2, max_new_tokens=8))
        assert backend.turns == 1 and sum(played.loss_mask) > 0 and played.reward == 0.0


def test_a_task_groups_single_error_is_reported_as_itself(capsys: pytest.CaptureFixture[str]) -> None:
    said = "task t of env e: its opening is 6492 tokens (raise --max-seq-len)"
    with pytest.raises(SystemExit) as exit_:
        report_and_exit(ExceptionGroup("unhandled errors in a TaskGroup", [PromptTooLong(said)]))
    assert exit_.value.code == 1
    assert capsys.readouterr().err.startswith(f"error: PromptTooLong: {said} (run again with --debug")


async def test_single_turn_rollouts_refuse_tasks_whose_user_must_act() -> None:
    """With no user (`--env-kind fleet`) the user's golden calls never happen: a dual-control task
    would score 0 whatever the policy did, so the env is refused, naming the harness instead."""
    et = load_env_tasks(DUAL_PHONE_DIR)
    async with Fleet([et.env]) as fleet:
        with pytest.raises(NeedsUser, match=r"4 of 4 tasks .* act on their own device .*--env-kind harness"):
            FleetRolloutEnv(fleet, "dual_phone", et.tasks)
