"""Attacks on the inspect_ai tasks, through inspect's own `eval` and `score`: each gets a clear
error or the confined behaviour, never another sample's state."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

inspect_ai = pytest.importorskip("inspect_ai", reason="inspect_ai is the `inspect` extra")

from inspect_ai import task_with  # noqa: E402
from inspect_ai.log import EvalLog, EvalSample, read_eval_log  # noqa: E402
from inspect_ai.model import (  # noqa: E402
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageTool,
    ModelOutput,
    get_model,
)
from inspect_ai.scorer import Target  # noqa: E402
from inspect_ai.solver import Generate, Solver, TaskState, chain, solver  # noqa: E402
from inspect_ai.tool import ToolCall, ToolError  # noqa: E402
from inspect_ai.util import store  # noqa: E402

from envforge.harness import ControlToken  # noqa: E402
from envforge.integrations.inspect_tasks import (  # noqa: E402
    EpisodeStateError,
    envforge_scorer,
    envforge_task,
    episode_of,
    episode_tools,
)
from envforge.server import load_env  # noqa: E402
from envforge.synth import load_policy_rules, load_tasks  # noqa: E402

from support.confined import check_served_confined, with_file_reading_tool  # noqa: E402
from support.inspect_play import USAGE, agents_model  # noqa: E402
from support.paths import REPO  # noqa: E402

CAR = REPO / "envs" / "car_rental"
TASK = "car_rental-0-00000"
QUIET = "car_rental-0-00006"
"""A task with no required output: its reward is its state and its policy."""
DONE = f"All done. {ControlToken.STOP}"
_IDS = itertools.count()


def call(name: str, parse_error: str | None = None, **arguments: Any) -> ModelOutput:
    tool_call = ToolCall(id=f"call_{next(_IDS)}", function=name, arguments=arguments, parse_error=parse_error)
    message = ChatMessageAssistant(content="", tool_calls=[tool_call], model="mockllm", source="generate")
    out = ModelOutput(
        model="mockllm", choices=[ChatCompletionChoice(message=message, stop_reason="tool_calls")]
    )
    out.usage = USAGE
    return out


def say(text: str) -> ModelOutput:
    out = ModelOutput.from_content("mockllm", text)
    out.usage = USAGE
    return out


Script = Callable[[int, list[ChatMessage]], Awaitable[ModelOutput]]


def scripted(script: Script) -> Any:
    """mockllm whose turns `script(run, conversation)` writes; `run` numbers a sample's runs (its
    epochs) in the order they first ask, and is kept in the sample's store."""
    runs = [0]

    async def respond(input: list[ChatMessage], *_: Any) -> ModelOutput:
        sample = store()
        if sample.get("run") is None:
            sample.set("run", runs[0])
            runs[0] += 1
        return await script(int(sample.get("run")), input)

    return get_model("mockllm/model", custom_outputs=respond)


def turns(input: list[ChatMessage]) -> int:
    return sum(isinstance(m, ChatMessageAssistant) for m in input)


def run(task: Any, model: Any, tmp_path: Path, **kwargs: Any) -> EvalLog:
    (log,) = inspect_ai.eval(task, model=model, log_dir=str(tmp_path), display="none", **kwargs)
    return read_eval_log(log.location)


def tool_results(sample: EvalSample) -> list[ChatMessageTool]:
    return [m for m in sample.messages if isinstance(m, ChatMessageTool)]


def test_a_sample_cannot_reach_another_samples_episode(tmp_path: Path) -> None:
    """Two runs of one task at once: the writer's rent is not in the reader's episode, which reads
    after it; and a call naming an episode is refused by the tool's schema before it runs."""
    rented = anyio.Event()

    async def script(n: int, input: list[ChatMessage]) -> ModelOutput:
        step = turns(input)
        if n == 0:  # the writer
            if step == 0:
                return call("rent_car", customer_id="C-509", car_id="V-621", days=2)
            if step == 1:
                rented.set()
                return call("get_car", car_id="V-621")
            return say(DONE)
        if step == 0:  # the reader, once the writer has rented
            with anyio.fail_after(30):
                await rented.wait()
            return call("get_car", car_id="V-621")
        if step == 1:
            return call("get_car", car_id="V-621", episode_id="anything")
        return say(DONE)

    log = run(envforge_task(CAR, task_ids=[TASK]), scripted(script), tmp_path, epochs=2, max_samples=2)
    assert log.status == "success", log.error
    assert log.samples is not None
    by_run = {int(s.store["run"]): s for s in log.samples}
    writer, reader = tool_results(by_run[0]), tool_results(by_run[1])
    assert writer[0].error is None and "R-" in writer[0].text  # rented
    assert '"available"' not in writer[1].text
    assert reader[0].error is None and '"available"' in reader[0].text  # the rent is not here
    assert reader[1].error is not None and "episode_id" in reader[1].error.message


def test_a_score_before_the_episode_ends_or_of_a_log_is_refused_and_a_leaked_tool_too(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    @solver
    def capture() -> Solver:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            seen["state"] = state
            return state

        return solve

    @solver
    def leak() -> Solver:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            episode = episode_of(state)
            assert episode is not None
            seen["tools"] = {t.name: t for t in episode_tools(episode)}
            return state

        return solve

    async def script(n: int, input: list[ChatMessage]) -> ModelOutput:
        if turns(input) == 0:
            try:
                await envforge_scorer()(seen["state"], Target(""))
            except EpisodeStateError as exc:
                seen["early"] = str(exc)
            return call("get_car", car_id="V-621")
        return say(DONE)

    base = envforge_task(CAR, task_ids=[TASK])
    task = task_with(base, solver=chain(capture(), base.solver, leak()))
    log = run(task, scripted(script), tmp_path)
    assert log.status == "success", log.error
    assert "while its agent still plays" in seen["early"]
    assert log.samples is not None
    (score,) = log.samples[0].scores.values()  # type: ignore[union-attr]
    assert score.metadata is not None and "state" in score.metadata["parts"]  # scored after all

    async def leaked() -> str:
        return str(await seen["tools"]["rent_car"].tool(customer_id="C-509", car_id="V-621", days=2))

    with pytest.raises(ToolError, match="has ended: no further tool calls"):
        anyio.run(leaked)
    with pytest.raises(Exception, match="no envforge episode for sample"):
        inspect_ai.score(log, envforge_scorer(), display="none")


def test_malformed_calls_get_a_clear_error_and_change_nothing(tmp_path: Path) -> None:
    """inspect refuses a call that does not fit the tool's schema (its own parse error) before it
    runs; one that fits but that envforge's tool refuses comes back as the call's error."""
    bad: list[ModelOutput] = [
        call("rent_car"),  # no arguments
        call("rent_car", customer_id="C-509", car_id="V-621", days="many"),
        call("rent_car", car="V-621"),
        call("drop_tables"),
        call("rent_car", parse_error="Expecting value: line 1 column 1"),
        call("rent_car", customer_id="C-000", car_id="V-621", days=2),  # fits the schema; envforge refuses
    ]

    async def script(n: int, input: list[ChatMessage]) -> ModelOutput:
        step = turns(input)
        if step < len(bad):
            return bad[step]
        if step == len(bad):
            return call("get_car", car_id="V-621")
        return say(DONE)

    log = run(envforge_task(CAR, task_ids=[TASK]), scripted(script), tmp_path)
    assert log.status == "success", log.error
    assert log.samples is not None
    results = tool_results(log.samples[0])
    assert [r.error is not None for r in results] == [True] * len(bad) + [False]
    assert all(r.error and r.error.message for r in results[: len(bad)])
    assert '"available"' in results[-1].text  # nothing was rented
    (score,) = log.samples[0].scores.values()  # type: ignore[union-attr]
    assert score.value == 0.0 and score.metadata is not None and score.metadata["parts"]["state"] == 0.0


def _oracle_of_get_car(tmp_path: Path, env_dir: Path) -> str:
    async def script(n: int, input: list[ChatMessage]) -> ModelOutput:
        return call("get_car", car_id="V-621") if turns(input) == 0 else say(DONE)

    log = run(envforge_task(env_dir, task_ids=[TASK]), scripted(script), tmp_path)
    assert log.status == "success", log.error
    assert log.samples is not None
    return tool_results(log.samples[0])[0].text


def test_a_confined_env_is_served_confined(tmp_path: Path) -> None:
    """car_rental is model-written and confined: its tools run in the sandboxed worker, so this
    process never imports them; a trusted copy (the same code) is imported in-process."""
    runs = iter(("a", "b"))
    check_served_confined(CAR, tmp_path, lambda env_dir: _oracle_of_get_car(tmp_path / next(runs), env_dir))


def test_a_model_written_payload_is_refused_before_it_runs(tmp_path: Path) -> None:
    payload = with_file_reading_tool(CAR, tmp_path)
    with pytest.raises(Exception, match="open"):
        envforge_task(payload, limit=1)


def test_a_model_that_never_stops_is_cut_by_the_message_limit_and_scores_0(tmp_path: Path) -> None:
    """The oracle's calls (the golden state reached, the policy kept), then calls forever:
    inspect's `message_limit` ends the sample, and envforge scores a conversation cut by its limit
    as a trial cut by its turn limit: 0, though the state is the golden one and the task asks for no
    output."""
    env = load_env(CAR)
    assert not next(t for t in load_tasks(CAR) if t.id == QUIET).required_outputs
    tasks = {t.id: t for t in load_tasks(CAR) if t.id == QUIET}
    model = agents_model(env, tasks, ("oracle",), load_policy_rules(env))
    oracle = run(envforge_task(CAR, task_ids=[QUIET]), model, tmp_path)
    assert oracle.samples is not None and oracle.samples[0].scores is not None
    assert next(iter(oracle.samples[0].scores.values())).value == 1.0
    said = [m for m in oracle.samples[0].messages if isinstance(m, ChatMessageAssistant)]
    calls = [c for m in said for c in m.tool_calls or []]

    async def script(n: int, input: list[ChatMessage]) -> ModelOutput:
        step = turns(input)
        if step < len(calls):
            return call(calls[step].function, **calls[step].arguments)
        return call("get_car", car_id="V-621")

    limit = 2 + 2 * len(calls) + 4
    log = run(envforge_task(CAR, task_ids=[QUIET], message_limit=limit), scripted(script), tmp_path / "cut")
    assert log.status == "success", log.error
    assert log.samples is not None
    sample = log.samples[0]
    assert sample.limit is not None and sample.limit.type == "message"
    (score,) = (sample.scores or {}).values()
    assert score.metadata is not None and score.metadata["parts"]["state"] == 1.0
    assert score.value == 0.0
