"""Attack on training (issue #39): a policy that ends every failing episode by saying nothing.

A trajectory the user-error detector flags is masked: advantage 0, no loss. If a stop after the
policy's silence were flagged, a failing policy would learn to fall silent instead of being
penalised. Played through the trainer's real rollout loop and `HarnessRolloutEnv` (real
episodes, the harness's scorer and detector), one group per task: a solver (golden calls, then
"All done."), a refuser (a wrong write, then an apology) and a silent one (the same wrong write,
then a turn with nothing in it), against the scripted user and against a user that says goodbye
to anything (as the model users of the issue did).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from envforge.harness import STOP, Message, UserReply, load_env_tasks, request_text
from envforge.server import Fleet
from envforge.synth import Task
from envforge.trainer import (
    Generation,
    HarnessRolloutEnv,
    RolloutConfig,
    collect,
    erpo_advantages,
    unbatched_session,
)

from support.paths import REPO
from support.tokenizer import EOS, ChunkTokenizer

GYM = REPO / "envs" / "gym"
TASK_IDS = ["gym-0-00000", "gym-0-00004"]  # requests that differ: the backend tells them apart
REFUSER_ID, SILENT_ID = "G-102", "G-103"
SILENCES = {
    "empty": "",
    "punctuation": "...?",
    "cut-off call": '{"name": "freeze_membership", "arguments": {',
}


class ThreeArms:
    """Per task, conversation n plays arm n % 3: solver, refuser, silent."""

    def __init__(self, tasks: list[Task], tok: ChunkTokenizer, silence: str) -> None:
        self.tok, self.tasks, self.silence = tok, tasks, silence
        self.version = 0
        self.eos_id = EOS
        self.started: dict[str, int] = {}

    def _script(self, task: Task, arm: str) -> list[str]:
        if arm == "solver":
            return [*(f"{c.name} {json.dumps(c.arguments)}" for c in task.golden_calls), "All done."]
        wrong = REFUSER_ID if arm == "refuser" else SILENT_ID
        last = "I am sorry, I cannot help with that." if arm == "refuser" else self.silence
        return [f"freeze_membership {json.dumps({'member_id': wrong})}", last]

    def session(self) -> Any:
        return unbatched_session()

    async def generate(
        self, prompt_ids: list[int], *, max_new_tokens: int, seed: Any = None, session: Any = None
    ):
        prompt = self.tok.decode(prompt_ids)
        task = next(t for t in self.tasks if request_text(t) in prompt)
        turn = prompt.count("<|im_start|>assistant") - 1
        if turn == 0:
            n = self.started.get(task.id, 0)
            self.started[task.id] = n + 1
            arm = ("solver", "refuser", "silent")[n % 3]
        else:
            arm = "refuser" if REFUSER_ID in prompt else "silent" if SILENT_ID in prompt else "solver"
        script = self._script(task, arm)
        ids = [*self.tok.encode(script[min(turn, len(script) - 1)]), EOS]
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), version=self.version)

    async def sync_weights(self, state_dict: Any, version: int, model: Any = None) -> None:
        self.version = version

    async def aclose(self) -> None:
        return None


class Leaves:
    """A user that says goodbye to whatever the policy says."""

    def __init__(self, task: Task) -> None:
        self.task = task

    async def start(self) -> UserReply:
        return UserReply(request_text(self.task))

    async def reply(self, messages: list[Message]) -> UserReply:
        return UserReply(f"Thank you. {STOP}")


@pytest.mark.parametrize("user", ["scripted", "leaves"])
@pytest.mark.parametrize("kind", sorted(SILENCES))
async def test_attack_falling_silent_after_a_failure_earns_no_mask_and_no_better_advantage(
    kind: str, user: str
) -> None:
    et = load_env_tasks(GYM, TASK_IDS)
    tok = ChunkTokenizer()
    fleet = Fleet([et.env])
    env = HarnessRolloutEnv(fleet, et, make_user=Leaves if user == "leaves" else None, use_mcp=False)
    try:
        trajs = await collect(
            [env],
            ThreeArms(et.tasks, tok, SILENCES[kind]),
            tok,
            groups=2,
            rollouts_per_task=3,
            rollout_config=RolloutConfig(max_turns=8, max_new_tokens=512, max_seq_len=10**6),
            concurrency=1,
        )
    finally:
        await fleet.aclose()
    assert len(trajs) == 6

    def arm(t: Any) -> str:
        said = " ".join(str(m.get("content")) for m in t.messages if m["role"] == "assistant")
        return "refuser" if REFUSER_ID in said else "silent" if SILENT_ID in said else "solver"

    masked = [t.user_error for t in trajs]
    advantages = erpo_advantages(
        [t.reward for t in trajs], [t.env for t in trajs], [t.task_id for t in trajs], masked
    )
    for task_id in TASK_IDS:
        group = {arm(t): (t, a) for t, a in zip(trajs, advantages, strict=True) if t.task_id == task_id}
        assert set(group) == {"solver", "refuser", "silent"}
        (silent, silent_adv), (refuser, refuser_adv) = group["silent"], group["refuser"]
        assert not silent.user_error, silent.user_error_reason
        assert silent.reward == 0.0 and refuser.reward == 0.0
        assert silent_adv <= refuser_adv < 0 < group["solver"][1]
    if user == "scripted" and kind != "empty":  # the scripted user nudged, then gave up on the policy
        silent_verdicts = [v for v in env.verdicts if any("still there" in u for u in v.user_messages)]
        assert len(silent_verdicts) == 2
        assert all(v.status == "no_response" and v.termination == "agent_empty" for v in silent_verdicts)
