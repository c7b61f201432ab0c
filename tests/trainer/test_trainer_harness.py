"""RL collection through the harness: simulated users talk, `score_trial` rewards, lies get masked.

The policy here is a scripted generation backend over an exact, reversible tokenizer, so conversations
are known in advance: a "solver" asks the user for a fact, verifies the customer, replays the task's
golden calls with the user's yes before each write, and reports the required outputs (harness reward
1, retail's declared policy kept); a "lazy" one asks and then says it is done (reward 0). Each
group holds one of each, so the rewards are the scorer's, not constants. With a `ScriptedUser` that
lies about the asked fact, the harness's rule detector must flag every trajectory, and ERPO must
then leave the model exactly where a batch without those trajectories leaves it.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
import typer
from typer.testing import CliRunner

from envforge.cli import trainer_commands
from envforge.harness import EnvTasks, ScriptedUser, confirmation_request, load_env_tasks, request_text
from envforge.server import Fleet, load_env
from envforge.synth import Task, identity_call, load_policy_rules, load_tasks
from envforge.trainer import (
    FleetRolloutEnv,
    Generation,
    HarnessRolloutEnv,
    RolloutConfig,
    Trajectory,
    collect,
    erpo_advantages,
    unbatched_session,
)

from support.paths import REPO
from support.tokenizer import EOS, ChunkTokenizer

RETAIL = REPO / "envs" / "retail_orders"
ID_VALUE = re.compile(r"[A-Z]+-\d+")
# Two tasks whose first fact, the one the scripted agent asks for, is a record id (a liar states
# another id of the same prefix, which the user-error detector must catch).
TASK_IDS = [
    t.id
    for t in load_tasks(RETAIL)
    if t.scenario.known_facts and ID_VALUE.fullmatch(str(t.scenario.known_facts[0].value))
][:2]
SOLVER_ASK = "What is your {fact}?"
LAZY_ASK = "Could you tell me your {fact}?"


def first_fact(task: Task) -> str:
    return task.scenario.known_facts[0].name.replace("_", " ")


class ScriptBackend:
    """Plays a fixed script per task: which one (solver/lazy) alternates per new conversation."""

    def __init__(self, tasks: list[Task], tok: ChunkTokenizer) -> None:
        env = load_env(RETAIL)
        rules = load_policy_rules(env)
        assert rules is not None
        self.rules = rules
        self.schemas = {name: spec.input_schema for name, spec in env.tools.items()}
        self.tok = tok
        self.version = 0
        self.eos_id = EOS
        self.tasks = tasks
        self.started: dict[str, int] = {}

    def _script(self, task: Task, solver: bool) -> list[str]:
        """One line per assistant turn. The solver keeps retail's policy: it verifies the customer
        from what the user knows (`identity_call` on the known facts), and before each write asks
        `confirmation_request(call)`, writing on the turn after the user's yes."""
        ask = (SOLVER_ASK if solver else LAZY_ASK).format(fact=first_fact(task))
        if not solver:
            return [ask, "All done, goodbye."]
        known = {f.name: f.value for f in task.scenario.known_facts}
        identity = identity_call(self.rules, self.schemas, known)
        assert identity is not None, task.id  # synthesis gives the user what verifying takes
        lines = [ask, f"{identity.name} {json.dumps(identity.arguments)}"]
        for c in task.golden_calls:
            if self.rules.needs_confirmation(c.name):
                lines.append(confirmation_request(c))
            lines.append(f"{c.name} {json.dumps(c.arguments)}")
        return [*lines, "All done: " + ", ".join(task.required_outputs) + "."]

    def session(self):
        return unbatched_session()

    async def generate(self, prompt_ids: list[int], *, max_new_tokens: int, seed=None, session=None):
        prompt = self.tok.decode(prompt_ids)
        task = next(t for t in self.tasks if request_text(t) in prompt)
        turn = prompt.count("<|im_start|>assistant") - 1
        if turn == 0:
            n = self.started.get(task.id, 0)
            self.started[task.id] = n + 1
            solver = n % 2 == 0
        else:
            solver = SOLVER_ASK.format(fact=first_fact(task)) in prompt
        script = self._script(task, solver)
        ids = [*self.tok.encode(script[min(turn, len(script) - 1)]), EOS]
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), version=self.version)

    async def sync_weights(self, state_dict: Any, version: int, model: Any = None) -> None:
        self.version = version

    async def aclose(self) -> None:
        return None


def liar(et: EnvTasks):
    """A ScriptedUser stating a wrong id for the first fact (same prefix, another number)."""

    def make(task: Task) -> ScriptedUser:
        fact = task.scenario.known_facts[0]
        prefix, number = str(fact.value).rsplit("-", 1)
        return ScriptedUser(task, lies={fact.name: f"{prefix}-{int(number) + 1}"})

    return make


async def _collect(
    make_user: Any = None, tok: ChunkTokenizer | None = None
) -> tuple[list[Trajectory], HarnessRolloutEnv, EnvTasks]:
    et = load_env_tasks(RETAIL, TASK_IDS)
    tok = tok or ChunkTokenizer()
    fleet = Fleet([et.env])
    env = HarnessRolloutEnv(fleet, et, make_user=make_user(et) if make_user else None, use_mcp=False)
    try:
        trajs = await collect(
            [env],
            ScriptBackend(et.tasks, tok),
            tok,
            groups=2,
            rollouts_per_task=2,
            rollout_config=RolloutConfig(max_turns=16, max_new_tokens=512, max_seq_len=10**6),
            concurrency=1,
        )
    finally:
        await fleet.aclose()
    return trajs, env, et


async def test_scripted_user_trajectories_carry_harness_rewards() -> None:
    trajs, env, _ = await _collect()
    assert len(trajs) == 4
    assert sorted({t.task_id for t in trajs}) == TASK_IDS
    for t in trajs:
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        assert 0 < sum(t.loss_mask) < len(t.token_ids)
        assert set(t.parts) == {"state", "outputs", "policy"}  # retail declares policy rules
        assert t.user_error is False and t.user_error_reason is None
    for task_id in TASK_IDS:
        group = sorted((t.reward, t.parts["state"], t.parts["policy"]) for t in trajs if t.task_id == task_id)
        assert group == [(0.0, 0.0, 1.0), (1.0, 1.0, 1.0)], group
    # The user answered the question honestly: its reply is in the policy's context.
    solver = next(t for t in trajs if t.reward == 1.0)
    user_said = [m["content"] for m in solver.messages if m["role"] == "user"]
    assert any(v.startswith("My ") for v in user_said)
    assert all(not v.user_error and v.termination == "user_stop" for v in env.verdicts)


async def test_lying_user_is_masked_and_gets_no_loss() -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from envforge.trainer import Learner, LearnerConfig

    tok = ChunkTokenizer()
    lied, env, _ = await _collect(liar, tok)
    assert len(lied) == 4 and all(t.user_error for t in lied)
    assert all(v.user_error_reason and "contradicting the known" in v.user_error_reason for v in env.verdicts)
    # the reason travels on the trajectory itself: the harness detector's string for that episode
    for t in lied:
        said = [m["content"] for m in t.messages if m["role"] == "user"]
        (verdict,) = {  # the verdict also has the user's closing message, which the policy never saw
            v.user_error_reason
            for v in env.verdicts
            if v.task_id == t.task_id and v.user_messages[: len(said)] == said
        }
        assert t.user_error_reason == verdict
        assert t.user_error_reason.startswith("user message ") and "contradicting the known" in verdict
    assert all(sum(t.loss_mask) > 0 for t in lied)  # policy tokens exist; the mask comes from the flag
    honest, _, _ = await _collect(None, tok)

    batch = honest + lied
    adv = erpo_advantages(
        [t.reward for t in batch],
        [t.env for t in batch],
        [t.task_id for t in batch],
        [t.user_error for t in batch],
    )
    assert [a for a, t in zip(adv, batch, strict=True) if t.user_error] == [0.0] * 4
    assert all(abs(a) > 0.5 for a, t in zip(adv, batch, strict=True) if not t.user_error)

    # The update: one honest group (rewards 0 and 1) next to the four masked trajectories, compared
    # with the same honest group alone (two forward passes instead of eight keep this cheap).
    honest = [t for t in honest if t.task_id == TASK_IDS[1]]
    batch = honest + lied
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tok.words),
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32768,
    )
    model = Qwen2ForCausalLM(cfg)
    twin = copy.deepcopy(model)
    lc = LearnerConfig(lr=1e-2)
    with_masked = Learner(model, lc).step(batch)
    without = Learner(twin, lc).step(honest)
    assert with_masked.masked == 4 and with_masked.kept == 2
    assert with_masked.tokens == without.tokens == sum(sum(t.loss_mask) for t in honest)
    for row, t in zip(with_masked.token_advantages, batch, strict=True):
        if t.user_error:
            assert not any(row)
    assert with_masked.loss == pytest.approx(without.loss)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)


async def test_a_ray_actors_masked_episodes_reach_user_errors_as_the_drivers_own_do(tmp_path: Path) -> None:
    """An actor hands its envs' verdicts to the driver pickled, as Ray returns them; a masked
    episode played there must land in `user_errors.jsonl` byte for byte as one played here."""
    import pickle

    from envforge.trainer import BackendSpec, EnvSpec, RolloutWorker, WorkerSpec, write_user_errors

    _, lied, _ = await _collect(liar)
    _, honest, _ = await _collect(None)
    spec = WorkerSpec(backend=BackendSpec(model="unused"), env=EnvSpec(envs=[str(RETAIL)]))
    worker = RolloutWorker(spec.model_dump(mode="json"), 0)
    worker.envs = {"lied": lied, "honest": honest}  # what `setup` builds in the actor
    reported = pickle.loads(pickle.dumps(await worker.verdicts()))
    assert len(reported) == 8
    here, there = tmp_path / "here.jsonl", tmp_path / "there.jsonl"
    assert write_user_errors([lied, honest], here) == write_user_errors([], there, reported) == 4
    assert there.read_bytes() == here.read_bytes()
    assert all(json.loads(line)["user_error"] for line in there.read_text().splitlines())


def test_envforge_collect_writes_harness_trajectories(tmp_path: Path) -> None:
    from envforge.trainer import build_tiny_model

    et = load_env_tasks(RETAIL, TASK_IDS)
    env_dir = tmp_path / "retail_orders"
    env_dir.mkdir()
    for f in RETAIL.iterdir():
        if f.is_file() and f.name != "tasks.jsonl":
            (env_dir / f.name).write_bytes(f.read_bytes())
    (env_dir / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in et.tasks))
    model = build_tiny_model(tmp_path / "model", [request_text(t) for t in et.tasks] + ["?"])
    app = typer.Typer()
    trainer_commands.register(app)
    out = tmp_path / "out"
    args = ["collect", "--model", str(model), "--envs", str(env_dir), "--out", str(out)]
    args += ["--groups", "2", "--rollouts-per-task", "2", "--max-turns", "2", "--max-new-tokens", "4"]
    args += ["--user", "scripted"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {r["task_id"] for r in rows} == set(TASK_IDS)
    for r in rows:
        assert len(r["token_ids"]) == len(r["loss_mask"]) > 0 and 1 <= sum(r["loss_mask"]) <= 8
        assert set(r["parts"]) == {"state", "outputs", "policy"}  # the harness scorer's parts here
        assert r["reward"] == 0.0 and isinstance(r["user_error"], bool)
        assert (r["user_error_reason"] is not None) == r["user_error"]
        assert r["messages"][1]["role"] == "user" and r["messages"][1]["content"].startswith(
            ("I want to", "If the ")
        )
    masked = [json.loads(line) for line in (out / "user_errors.jsonl").read_text().splitlines()]
    assert len(masked) == sum(r["user_error"] for r in rows)

    bad = CliRunner().invoke(app, [*args[:-2], "--env-kind", "bogus"])
    assert bad.exit_code != 0 and "env-kind" in bad.output


def test_llm_user_spec_builds_llm_user() -> None:
    """`--user MODEL --user-api-base URL` reaches the env as an LLMUser with that config."""
    from envforge.harness import LLMUser
    from envforge.trainer import build_envs

    fleet = Fleet([load_env_tasks(RETAIL, TASK_IDS).env])
    (env,) = build_envs(
        fleet, [RETAIL], False, env_kind="harness", user="openai/x", user_api_base="http://h:1/v1"
    )
    assert isinstance(env, HarnessRolloutEnv)
    user = env._user(env.env_tasks.tasks[0])
    assert isinstance(user, LLMUser) and user.cfg.api_base == "http://h:1/v1" and user.cfg.model == "openai/x"
    anyio.run(fleet.aclose)


def test_episodes_with_a_user_show_the_tools_as_single_turn_ones_do() -> None:
    """The policy reads one compact line per tool and the `<tool_call>` form in every episode: once
    the episodes with a user showed each tool's JSON schema and "Call a tool as: name {json
    arguments}", and Qwen2.5-Coder-0.5B copied the schema as the call's arguments
    (`get_book {"book_id": {"description": ..., "type": "string"}}`), so no lookup played with the
    user ever read its book."""
    env = load_env(REPO / "envs" / "library")
    fleet = Fleet([env])
    et = EnvTasks(env_dir=REPO / "envs" / "library", env=env, tasks=[], policy_rules=load_policy_rules(env))
    prompt = HarnessRolloutEnv(fleet, et, use_mcp=False).system_prompt()
    assert prompt == FleetRolloutEnv(fleet, "library", []).system_prompt()
    assert "- get_book(book_id: string): " in prompt and "<tool_call>" in prompt
    assert '"title"' not in prompt and '"description"' not in prompt
