"""LLM agents and users over real HTTP: a fake OpenAI-compatible server on 127.0.0.1, faults included."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from envforge.harness import (
    EvalConfig,
    LLMAgent,
    LLMConfig,
    RunDir,
    run_eval,
    summarize,
)
from envforge.synth import Task, load_tasks

from support.fake_llm import FakeOpenAI, agent_script, completion, confirmations, scripted_brain
from support.paths import REPO

RETAIL = REPO / "envs" / "retail_orders"


def llm_config(
    task: Task, url: str, transport: str, *, agent_model: str = "openai/fake-agent", **kw: Any
) -> EvalConfig:
    return EvalConfig(
        agent=agent_model,
        user="openai/fake-user",
        agent_llm=LLMConfig(
            model=agent_model, api_base=url, api_key="x", backoff_s=0.01, transport=transport, **kw
        ),
        user_llm=LLMConfig(
            model="openai/fake-user", api_base=url, api_key="x", temperature=0.5, transport=transport
        ),
        task_ids=[task.id],
    )


@pytest.fixture(params=["http", "litellm"])
def transport(request: pytest.FixtureRequest) -> str:
    """Both routes to an OpenAI-compatible server must behave the same: direct HTTP and litellm."""
    return request.param


def assert_route(fake: FakeOpenAI, transport: str) -> None:
    """The requests really took the route asked for (our own HTTP client, or litellm's)."""
    ours = [ua == "envforge-harness" for ua in fake.user_agents]
    assert ours and set(ours) == {transport == "http"}, fake.user_agents


@pytest.fixture(scope="module")
def task() -> Task:
    return load_tasks(RETAIL)[0]


@pytest.mark.parametrize("agent_model", ["openai/fake-agent", "hosted_vllm/fake-agent"])
async def test_llm_agent_and_llm_user_over_http(
    task: Task, tmp_path: Path, agent_model: str, transport: str
) -> None:
    with FakeOpenAI(scripted_brain(task)) as fake:
        manifest, (rec,) = await run_eval(
            [RETAIL], llm_config(task, fake.url, transport, agent_model=agent_model), tmp_path
        )
    assert_route(fake, transport)
    assert rec.status == "completed" and rec.termination == "user_stop" and rec.reward == 1.0
    assert manifest.agent_api_base == fake.url and manifest.user_temperature == 0.5
    agent_requests = [r for r in fake.requests if r["model"] == "fake-agent"]
    first = agent_requests[0]
    assert first["messages"][0] == {"role": "system", "content": RETAIL.joinpath("policy.md").read_text()}
    assert {t["function"]["name"] for t in first["tools"]} >= {c.name for c in task.golden_calls}
    assert all(r["temperature"] == 0.5 for r in fake.requests if r["model"] == "fake-user")
    assert rec.usage["agent"].calls == len(agent_script(task)) + 1 == len(agent_requests)
    assert rec.usage["agent"].prompt_tokens == 11 * rec.usage["agent"].calls
    user_turns = 2 + confirmations(task)  # the opening, each yes, the stop
    assert rec.usage["user"].completion_tokens == 7 * user_turns and rec.usage["user"].cost_usd == 0.0


async def test_rate_limit_is_retried(task: Task, tmp_path: Path, transport: str) -> None:
    inner = scripted_brain(task)
    calls = {"n": 0}

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body["model"] == "fake-agent":
            calls["n"] += 1
            if calls["n"] == 1:
                return 429, {"error": {"message": "slow down", "type": "rate_limit_error", "code": "429"}}
        return inner(body)

    with FakeOpenAI(brain) as fake:
        _, (rec,) = await run_eval([RETAIL], llm_config(task, fake.url, transport), tmp_path)
    assert_route(fake, transport)
    assert rec.status == "completed" and rec.reward == 1.0
    assert calls["n"] == len(agent_script(task)) + 2  # one extra: the retried 429


async def test_timeout_is_retried(task: Task, tmp_path: Path, transport: str) -> None:
    inner = scripted_brain(task)
    calls = {"n": 0}

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body["model"] == "fake-agent":
            calls["n"] += 1
            if calls["n"] == 1:
                time.sleep(1.5)  # past the agent's 0.5 s timeout: the answer comes too late
        return inner(body)

    with FakeOpenAI(brain) as fake:
        config = llm_config(task, fake.url, transport, timeout_s=0.5)
        _, (rec,) = await run_eval([RETAIL], config, tmp_path)
    assert_route(fake, transport)
    assert rec.status == "completed" and rec.reward == 1.0
    assert calls["n"] == len(agent_script(task)) + 2  # one extra: the call that timed out


async def test_persistent_5xx_is_infra_failure_then_resume_reruns_it(
    task: Task, tmp_path: Path, transport: str
) -> None:
    healthy = scripted_brain(task)
    broken = {"on": True}

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if broken["on"] and body["model"] == "fake-agent":
            return 500, {"error": {"message": "boom", "type": "server_error"}}
        return healthy(body)

    with FakeOpenAI(brain) as fake:
        config = llm_config(task, fake.url, transport, retries=2)
        manifest, (rec,) = await run_eval([RETAIL], config, tmp_path)
        assert len([r for r in fake.requests if r["model"] == "fake-agent"]) == 3  # 1 + 2 retries
        assert rec.status == "infra_failure" and "boom" in (rec.error or "") and rec.score is None
        summary = summarize([rec], manifest.trials)["overall"]
        assert summary["infra_failures"] == 1 and summary["n_trials"] == 0
        broken["on"] = False
        _, (again,) = await run_eval([RETAIL], config, tmp_path, resume=True)
    assert again.status == "completed" and again.reward == 1.0
    assert [r.status for r in RunDir(tmp_path).read_records()] == ["infra_failure", "completed"]


async def test_context_overflow_is_its_own_status(task: Task, tmp_path: Path, transport: str) -> None:
    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body["model"] == "fake-agent":
            error = {
                "message": "This model's maximum context length is 8192 tokens. However, your messages "
                "resulted in 9000 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
            return 400, {"error": error}
        return scripted_brain(task)(body)

    with FakeOpenAI(brain) as fake:
        _, (rec,) = await run_eval([RETAIL], llm_config(task, fake.url, transport), tmp_path)
    assert_route(fake, transport)
    assert rec.status == "context_overflow" and rec.reward == 0.0 and rec.score is not None
    assert len(fake.requests) == 2  # user's opening + one agent call: no retries of an overflow


async def test_llm_agent_with_mock_response() -> None:
    agent = LLMAgent(LLMConfig(model="openai/gpt-4o-mini", mock_response="Hello there."), "Be kind.")
    reply = await agent.respond([], [], None)  # type: ignore[arg-type]
    assert reply.message.content == "Hello there." and not reply.message.tool_calls
    assert reply.usage.calls == 1 and reply.usage.completion_tokens > 0


async def test_nl_assertions_are_judged_over_http_and_counted(task: Task, tmp_path: Path) -> None:
    """A judged run: τ²'s judge contract on the wire, the verdict in the reward, its tokens on the record."""
    env_dir = tmp_path / "env"
    shutil.copytree(RETAIL, env_dir)
    judged = task.model_copy(
        update={
            "nl_assertions": ["The agent confirms the change."],
            "reward_basis": [*task.reward_basis, "nl_assertions"],
        }
    )
    (env_dir / "tasks.jsonl").write_text(judged.model_dump_json() + "\n")
    verdicts = iter([True, False])

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        system, prompt = body["messages"][0]["content"], body["messages"][-1]["content"]
        if "metExpectation" not in system:  # the user-error judge: no error found
            return 200, completion('{"user_error": false, "reason": ""}')
        outcomes = json.loads(prompt.split("expectedOutcomes:\n", 1)[1])
        met = next(verdicts)
        results = [{"expectedOutcome": o, "reasoning": "r", "metExpectation": met} for o in outcomes]
        return 200, completion(json.dumps({"results": results}))

    with FakeOpenAI(brain) as fake:
        judge = LLMConfig(model="openai/fake-judge", api_base=fake.url)
        config = EvalConfig(agent="oracle", user="scripted", judge_llm=judge, trials=2, concurrency=1)
        _, records = await run_eval([env_dir], config, tmp_path / "run")
    assert [r.parts["nl_assertions"] for r in records] == [1.0, 0.0]
    assert [r.reward for r in records] == [1.0, 0.0]
    judge_calls = [r.usage["judge"].calls for r in records]
    assert judge_calls[0] == 1 and judge_calls[1] >= 1  # the failed trial may also ask about user error
    assert all(r.usage["judge"].prompt_tokens == 11 * r.usage["judge"].calls for r in records)


@pytest.mark.parametrize(
    ("ending", "termination"), [("user_transfer", "transfer"), ("agent_stop", "agent_stop")]
)
async def test_transfer_and_agent_stop_end_the_conversation(
    task: Task, tmp_path: Path, ending: str, termination: str
) -> None:
    """Either side may end a trial: the user asks for a human, or the agent says `###STOP###`."""
    inner = scripted_brain(task)

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, payload = inner(body)
        message = payload["choices"][0]["message"]
        # Each ending comes after the agent's report (not at a confirmation request).
        reported = (body["messages"][-1].get("content") or "").startswith("Done:")
        if ending == "user_transfer" and body["model"] == "fake-user" and reported:
            message["content"] = "Please put me through to a person. ###TRANSFER###"
        report = (message.get("content") or "").startswith("Done:")
        if ending == "agent_stop" and body["model"] == "fake-agent" and report:
            message["content"] += " ###STOP###"
        return status, payload

    with FakeOpenAI(brain) as fake:
        _, (rec,) = await run_eval([RETAIL], llm_config(task, fake.url, "http"), tmp_path)
    assert rec.status == "completed" and rec.termination == termination
    assert rec.reward == 1.0  # the golden calls were made before the conversation ended: scored as usual
    users = [m for m in rec.messages if m.role == "user"]
    if termination == "agent_stop":
        assert len(users) == 1 + confirmations(task) and "###STOP###" in (
            rec.messages[-1].content or ""
        )  # the user was not asked again after the report
    else:
        assert "###TRANSFER###" in (users[-1].content or "") and rec.messages[-1].role == "user"
    assert len([r for r in fake.requests if r["model"] == "fake-user"]) == len(users)
