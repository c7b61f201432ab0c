"""ERPO on a learnable task set: single-lookup tasks, a learning-rate-0 control that runs the same
pipeline yet keeps the weights bit-identical, no update for a batch without signal, held-out tasks
that training never sees, and `--model local/<name>` errors in one line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import anyio
import pytest
import torch
import typer
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from envforge.cli import trainer_commands
from envforge.server import Fleet, load_env
from envforge.synth import Evidence, compose_reward
from envforge.trainer import (
    FleetRolloutEnv,
    Learner,
    LearnerConfig,
    Trajectory,
    bandit_corpus,
    build_tiny_model,
    lookup_tasks,
    parse_tool_call,
    split_tasks,
)

from support.paths import ENVS
from support.trajectories import on_policy_trajectories


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m"), bandit_corpus(), base_corpus=False, seed=3)


def _trajs(model_dir: Path, rewards: list[tuple[str, float]]) -> list[Trajectory]:
    return on_policy_trajectories(model_dir, rewards)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_batch_without_signal_costs_no_update(model_dir: Path) -> None:
    """Every group all-0 or all-1: the advantages are all 0, so no forward, backward or AdamW step
    runs (AdamW would still bump its step count and moments), and the version stays put so samples
    collected meanwhile are not stale."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    batch = [("t1", 0.0), ("t1", 0.0), ("t2", 1.0), ("t2", 1.0)]
    # with weight decay a zero-gradient AdamW step still shrinks the weights: not a no-op, so it runs
    decayed = Learner(
        AutoModelForCausalLM.from_pretrained(model_dir), LearnerConfig(lr=0.1, weight_decay=0.1), pad_id=0
    )
    assert not decayed.step(_trajs(model_dir, batch)).skipped
    learner = Learner(model, LearnerConfig(lr=0.1), pad_id=0)
    before = _weights(model)
    result = learner.step(_trajs(model_dir, batch))
    assert result.skipped
    assert result.advantages == [0.0] * 4 and result.loss == 0.0
    assert learner.optimizer.state == {}  # no optimizer step was taken
    assert learner.version == 0
    assert _same(before, _weights(model))
    # and a batch with signal is not skipped: the same learner then really updates
    result = learner.step(_trajs(model_dir, [("t1", 0.0), ("t1", 1.0), ("t2", 1.0), ("t2", 0.0)]))
    assert not result.skipped and result.grad_norm > 0 and learner.version == 1
    assert not _same(before, _weights(model))


def test_lr0_runs_the_whole_update_and_leaves_weights_bit_identical(model_dir: Path) -> None:
    """The control must do everything the learning run does (forward, backward, clipping, AdamW
    step on real gradients) except move the weights."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trained = copy.deepcopy(model)
    control = Learner(model, LearnerConfig(lr=0.0), pad_id=0)
    learning = Learner(trained, LearnerConfig(lr=0.05), pad_id=0)
    before = _weights(model)
    batch = _trajs(model_dir, [("t1", 0.0), ("t1", 1.0), ("t2", 1.0), ("t2", 0.0)])
    for step in range(3):
        c, lr = control.step(batch), learning.step(batch)
        assert not c.skipped and c.grad_norm > 0
        if step == 0:  # same weights, same batch: the very same gradient
            assert c.grad_norm == lr.grad_norm and c.loss == lr.loss
    assert control.optimizer.state  # AdamW really stepped
    assert control.version == learning.version == 3
    assert _same(before, _weights(model))
    assert not _same(before, _weights(trained))


async def _lookup(env: str) -> tuple[Fleet, list]:
    fleet = Fleet([load_env(ENVS / env)])
    return fleet, await lookup_tasks(fleet, env)


def test_lookup_tasks_reward_the_looked_up_figure_only() -> None:
    """A lookup task is earned by stating its figure; a guess, or a spray of candidates that contains
    it, earns nothing; flags (0/1 fields) are not tasks; the split is fixed by the task id."""

    async def main() -> None:
        fleet, tasks = await _lookup("car_rental")
        try:
            assert len(tasks) >= 20
            train, held = split_tasks(tasks)
            assert held and train and not {t.id for t in train} & {t.id for t in held}
            assert all(t.golden_calls[0].name == "get_car" for t in tasks)
            assert all(t.required_outputs[0] not in ("0", "1") for t in tasks)
            state = fleet.env("car_rental").seed_state()
            task = tasks[0]
            figure = task.required_outputs[0]
            ep = await fleet.create_episode("car_rental")
            result = await fleet.call(ep.id, task.golden_calls[0].name, task.golden_calls[0].arguments)
            await fleet.close_episode(ep.id)
            assert figure in result.text
            looked = task.golden_calls
            earned = compose_reward(
                task, Evidence(state, [f"The daily rate is {figure} cents."], agent_calls=looked)
            ).value
            spray = " ".join(t.required_outputs[0] for t in tasks[:6])
            sprayed = compose_reward(
                task, Evidence(state, [f"It is one of {spray}."], agent_calls=looked)
            ).value
            guessed = compose_reward(task, Evidence(state, ["It is 1234 cents."], agent_calls=looked)).value
            assert (earned, sprayed, guessed) == (1.0, 0.0, 0.0)
            # the same ids land on the same side whatever else exists
            again = split_tasks(list(reversed(tasks)))
            assert {t.id for t in again[1]} == {t.id for t in held}
        finally:
            await fleet.aclose()

    anyio.run(main)


def test_the_right_figure_said_blind_earns_nothing() -> None:
    """Small counts are guessable ("1 copy available"): a policy must not be paid for a right
    guess, or RL teaches it to guess. Played through the rollout env's episodes: the figure
    without the read, or after a read of another book, earns 0; after the read, 1."""

    async def main() -> None:
        fleet, tasks = await _lookup("library")
        try:
            env = FleetRolloutEnv(fleet, "library", tasks)
            task = next(t for t in tasks if t.required_outputs[0] in ("1", "2", "3"))
            figure, read = task.required_outputs[0], task.golden_calls[0]
            other = next(t.golden_calls[0] for t in tasks if t.golden_calls[0].arguments != read.arguments)
            rewards = []
            for calls in ([], [other], [read]):
                async with env.episode(task.id) as ep:
                    for call in calls:
                        await ep.call_tool(call.name, dict(call.arguments))
                    info = await ep.finish([f"There are {figure}."])
                    rewards.append((info.reward, info.parts))
            assert [r for r, _ in rewards] == [0.0, 0.0, 1.0]
            # the figure was right, unearned; library's policy rules bind no read (policy kept)
            assert rewards[0][1] == {"outputs": 1.0, "actions": 0.0, "policy": 1.0}
        finally:
            await fleet.aclose()

    anyio.run(main)


def test_tool_calls_in_the_forms_small_models_write() -> None:
    tools = ["get_car"]
    want = ("get_car", {"car_id": "V-601"})
    smol = '<tool_call>[{"name": "get_car", "arguments": {"car_id": "V-601"}}]</tool_call>'
    fenced = '```json\n{"name": "get_car", "arguments": {"car_id": "V-601"}}\n```'
    bare = '{"name": "get_car", "arguments": {"car_id": "V-601"}}'
    with_invented_result = bare + '{"daily_rate_cents": 70}'  # Qwen2.5-Coder while training
    python_literal = "{'name': 'get_car', 'arguments': {'car_id': 'V-601'}}"
    for text in (smol, fenced, bare, with_invented_result, python_literal):
        assert tuple(parse_tool_call(text, tools) or ()) == want, text
    assert parse_tool_call("The daily rate is 3500.", tools) is None


def test_compact_tool_lines_keep_every_parameter() -> None:
    fleet = Fleet([load_env(ENVS / "car_rental")])
    prompt = FleetRolloutEnv(fleet, "car_rental", []).system_prompt()
    assert "- get_car(car_id: string): " in prompt
    assert 'list_available_cars(location_id: string, category?: "economy"|"compact"|"suv"|"van")' in prompt
    assert '"title"' not in prompt  # no JSON schema noise


def _app() -> typer.Typer:
    app = typer.Typer()
    trainer_commands.register(app)
    return app


def test_lr0_control_through_envforge_train_on_lookup_tasks(tmp_path: Path, model_dir: Path) -> None:
    """`envforge train --tasks lookup --lr 0`: evaluations at step 0 and after every step are the
    same episodes (same seeds, same weights), the checkpoint equals the starting weights, no
    held-out task is ever played in training, and `--save-trajectories` keeps each evaluation's
    episodes apart from the training ones."""
    out = tmp_path / "run"
    args = ["train", "--model", str(model_dir), "--envs", str(ENVS / "car_rental"), "--tasks", "lookup"]
    args += ["--steps", "2", "--tasks-per-step", "2", "--rollouts-per-task", "2", "--max-turns", "1"]
    args += ["--max-new-tokens", "3", "--lr", "0", "--eval-every", "1", "--eval-samples", "1"]
    args += ["--out", str(out), "--save-trajectories", "--staleness", "0"]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 1, 2]
    fleet, tasks = anyio.run(_lookup, "car_rental")
    anyio.run(fleet.aclose)
    _, held = split_tasks(tasks)
    assert all(e["episodes"] == len(held) for e in evals)
    played = {json.loads(line)["task_id"] for line in (out / "trajectories.jsonl").read_text().splitlines()}
    assert played and not played & {t.id for t in held}
    for e in evals:  # each evaluation's episodes, in eval.jsonl's order: how a 0 came about
        kept = (out / "eval_trajectories" / f"step_{e['step']}.jsonl").read_text().splitlines()
        episodes = [json.loads(line) for line in kept]
        assert [t["task_id"] for t in episodes] == [t.id for t in held]
        assert [t["reward"] for t in episodes] == e["rewards"] and all(t["messages"] for t in episodes)
    ran = json.loads((out / "run.json").read_text())["ran"]
    if ran["updates_applied"]:  # applied at lr 0: the checkpoint holds the starting weights
        start = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
        end = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_2").state_dict()
        assert _same(start, end)
    else:  # every update skipped (no reward variance): unchanged weights are not saved again
        assert not (out / "checkpoints").exists()
    assert (out / "plots" / "held_out_reward.svg").exists() or (
        out / "plots" / "held_out_reward.png"
    ).exists()


def test_unknown_local_model_is_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        _app(), ["train", "--model", "local/nope", "--envs", str(ENVS / "car_rental"), "--out", str(tmp_path)]
    )
    assert res.exit_code != 0
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown local model 'nope'" in lines[0], res.output
    assert ("Traceback" not in res.output and res.exception is None) or isinstance(res.exception, SystemExit)


@pytest.mark.parametrize("command", ["train", "collect"])
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--precision", "float16", "--precision must be float32 or bfloat16"),
        ("--max-batch", "0", "--max-batch must be at least 1"),
    ],
)
def test_a_bad_sampling_option_is_one_line_before_any_model_loads(
    command: str, option: str, value: str, message: str, tmp_path: Path
) -> None:
    args = [command, "--model", "local/qwen2.5-coder-0.5b", "--envs", str(ENVS / "car_rental")]
    res = CliRunner().invoke(_app(), [*args, option, value, "--out", str(tmp_path)])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], res.output
    assert not any(tmp_path.iterdir())  # nothing written, nothing loaded


@pytest.mark.parametrize("most", [2, 16])
def test_max_batch_bounds_what_the_sampler_decodes_together(
    most: int, model_dir: Path, tmp_path: Path
) -> None:
    """Eight episodes in flight (2 groups x 4): `--max-batch 2` decodes them two by two; the
    default lets all eight share a batch (a GPU wants every episode in flight in one)."""
    rows: list[int] = []

    def count(module: torch.nn.Module, _args: object, kwargs: dict, _out: object) -> None:
        if torch.is_inference_mode_enabled() and "input_ids" in kwargs and hasattr(module, "lm_head"):
            rows.append(kwargs["input_ids"].shape[0])

    args = ["collect", "--model", str(model_dir), "--envs", str(ENVS / "car_rental"), "--tasks", "lookup"]
    args += ["--groups", "2", "--rollouts-per-task", "4", "--concurrency", "2", "--max-turns", "1"]
    args += ["--max-new-tokens", "2", "--max-batch", str(most), "--out", str(tmp_path / "run")]
    hook = torch.nn.modules.module.register_module_forward_hook(count, with_kwargs=True)
    try:
        res = CliRunner().invoke(_app(), args)
    finally:
        hook.remove()
    assert res.exit_code == 0, res.output
    assert rows and max(rows) == min(most, 8), rows


def test_an_env_with_no_lookup_task_refuses_lookup_training(tmp_path: Path, model_dir: Path) -> None:
    """Slack's records are text and its every write waits for the user's yes: it has no task a
    rollout with no user plays, and `--tasks lookup` says so in one line before any step."""
    args = ["train", "--model", str(model_dir), "--envs", str(ENVS / "slack"), "--tasks", "lookup"]
    res = CliRunner().invoke(_app(), [*args, "--steps", "1", "--out", str(tmp_path / "run")])
    assert res.exit_code != 0
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "env 'slack' has 0 lookup task(s) to train on" in lines[0], res.output
    assert not (tmp_path / "run" / "trajectories.jsonl").exists()
