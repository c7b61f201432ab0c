"""Attacks on the failure accounting: a model that emits garbage must not look better than one that
answers wrongly, and a slow model server must not be charged to the agent.

Real HTTP throughout: a fake OpenAI-compatible server on 127.0.0.1 (the one `test_harness_llm`
uses), the in-process fleet, and the `envforge` CLI in a subprocess for exit codes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from envforge.harness import EvalConfig, Limits, LLMConfig, run_eval, summarize
from envforge.synth import Task, load_tasks

from support.fake_llm import FakeOpenAI, completion, scripted_brain
from support.paths import REPO

RETAIL = REPO / "envs" / "retail_orders"


@pytest.fixture(scope="module")
def task() -> Task:
    return load_tasks(RETAIL)[0]


def config(task: Task, url: str, transport: str = "auto", **limits: Any) -> EvalConfig:
    llm = LLMConfig(
        model="openai/fake-agent", api_base=url, api_key="x", retries=1, backoff_s=0.01, transport=transport
    )
    return EvalConfig(
        agent="openai/fake-agent",
        user="scripted",
        agent_llm=llm,
        task_ids=[task.id],
        limits=Limits(max_tool_errors=2, **limits),
    )


def call(name: Any, arguments: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    return {"id": "call_1", "type": "function", "function": function}


GARBAGE = {
    "tool_call_without_name": completion(tool_calls=[call(None, "{}")]),
    "unknown_tool": completion(tool_calls=[call("drop_all_tables", "{}")]),
    "arguments_not_json": completion(tool_calls=[call("get_order", "{order_id: ")]),
    "arguments_not_an_object": completion(tool_calls=[call("get_order", "[1, 2]")]),
    "content_not_text": completion(content=[{"type": "image_url", "image_url": {"url": "x"}}]),  # type: ignore[arg-type]
}


@pytest.mark.parametrize(
    ("garbage", "transport"),
    [(g, "auto") for g in sorted(GARBAGE)] + [("content_not_text", "litellm"), ("unknown_tool", "litellm")],
)
async def test_garbage_output_is_the_agents_fault_counted_and_not_rerun(
    task: Task, tmp_path: Path, garbage: str, transport: str
) -> None:
    """Found: garbage was `infra_failure` — out of pass^k and re-run on every resume."""

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, GARBAGE[garbage]

    with FakeOpenAI(brain) as fake:
        manifest, (rec,) = await run_eval([RETAIL], config(task, fake.url, transport), tmp_path)
        assert rec.status in ("malformed_output", "max_errors"), (rec.status, rec.error)
        assert rec.fault == "agent" and rec.reward == 0.0
        overall = summarize([rec], manifest.trials)["overall"]
        assert overall["n_trials"] == 1 and overall["pass_hat_k"] == [0.0] and overall["infra_failures"] == 0
        asked = len(fake.requests)
        _, (again,) = await run_eval([RETAIL], config(task, fake.url, transport), tmp_path, resume=True)
        assert len(fake.requests) == asked, "resume ran the agent's failed trial again"
    assert again == rec
    if garbage != "tool_call_without_name" and garbage != "content_not_text":
        # The agent was told what was wrong, and nothing reached the env as a call.
        tool_texts = [m.content or "" for m in rec.messages if m.role == "tool"]
        assert tool_texts and all(t.startswith("Error:") for t in tool_texts)


async def test_slow_model_server_is_infra_not_agent_timeout_and_resume_reruns_it(
    task: Task, tmp_path: Path
) -> None:
    """Found: a model server slower than the trial's clock was charged to the agent as `timeout`."""
    healthy = scripted_brain(task)
    slow = {"on": True}

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if slow["on"]:
            time.sleep(2.0)
        return healthy(body)

    with FakeOpenAI(brain) as fake:
        cfg = config(task, fake.url, trial_timeout_s=0.8)
        manifest, (rec,) = await run_eval([RETAIL], cfg, tmp_path)
        assert rec.status == "infra_failure", (rec.status, rec.error)
        assert rec.fault == "infra"
        assert "model server" in (rec.error or "")
        assert summarize([rec], manifest.trials)["overall"]["n_trials"] == 0
        slow["on"] = False
        cfg = cfg.model_copy(update={"limits": Limits(max_tool_errors=2, trial_timeout_s=30)})
        with pytest.raises(ValueError, match="limits"):  # the clock is part of what a run measures
            await run_eval([RETAIL], cfg, tmp_path, resume=True)
        _, (again,) = await run_eval(
            [RETAIL], config(task, fake.url, trial_timeout_s=0.8), tmp_path, resume=True
        )
    assert again.status == "completed" and again.reward == 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1", "COLUMNS": "300"}
    return subprocess.run(
        [sys.executable, "-m", "envforge.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_eval_exits_nonzero_with_the_reason_when_every_trial_is_infra(task: Task, tmp_path: Path) -> None:
    """Found: a run whose every trial failed for infra reasons exited 0, the reason only in trials.jsonl.
    An env server that cannot be reached is now refused before any trial, naming its URL."""
    dead = f"http://127.0.0.1:{free_port()}"
    args = ["eval", str(RETAIL), "--agent", "oracle", "--tasks", task.id, "--server", dead, "--json"]
    result = cli(*args, "--out", str(tmp_path / "a"))
    assert result.returncode == 2, result.stderr
    stderr = " ".join(result.stderr.split())
    assert "cannot reach" in stderr and dead in stderr and "Traceback" not in stderr
    assert result.stdout == "" and not (tmp_path / "a" / "trials.jsonl").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--agent", "oracl"], "unknown agent 'oracl' (did you mean 'oracle'?)"),
        (["--agent", "oracle", "--tasks", "nope"], "unknown task id(s) nope"),
    ],
)
def test_eval_fails_fast_on_mistakes_it_can_see(tmp_path: Path, flags: list[str], message: str) -> None:
    """Found: `--agent oracl` ran every trial as an infra failure and exited 0."""
    result = cli("eval", str(RETAIL), *flags, "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert message in " ".join(result.stderr.split()) and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "trials.jsonl").exists()
