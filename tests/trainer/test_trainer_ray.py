"""Rollout workers as Ray actors, on a real local Ray instance.

Real parts throughout: actors in their own processes building their own fleets (or reaching one over
HTTP), tiny Qwen2 models loaded from a model dir, the bandit envs, the loop's job stream and
consumer. `ray` is imported unconditionally: CI installs the extra, so a missing ray is a failure,
not a skip.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import ray
import torch
import typer
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from envforge.cli import trainer_commands
from envforge.server import Fleet, build_app, load_env
from envforge.trainer import (
    BackendSpec,
    EnvSpec,
    Learner,
    LearnerConfig,
    RayWorkers,
    RolloutConfig,
    RolloutEnv,
    RunOptions,
    SequenceBuilder,
    StepMetrics,
    TrainConfig,
    Trajectory,
    VLLMBackend,
    WorkerSpec,
    bandit_corpus,
    bandit_tasks,
    build_envs,
    build_tiny_model,
    collect,
    job_stream,
    load_tokenizer,
    state_checksum,
    token_logprobs,
    train,
    write_bandit_env,
)

from support.fake_llm import FakeVLLM
from support.serving import ServerThread

ONE_PRESS = RolloutConfig(max_turns=1, max_new_tokens=1)


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    # 4 logical CPUs: the shared pool's two actors and the CLI's one each reserve one
    ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def bandits(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    """Two bandit env dirs with two tasks each (tasks.jsonl), and a tiny model dir."""
    root = tmp_path_factory.mktemp("ray")
    dirs = [write_bandit_env(root, "bandit_a"), write_bandit_env(root, "bandit_b")]

    async def write_tasks() -> None:
        fleet = Fleet([load_env(d) for d in dirs])
        for d in dirs:
            tasks = await bandit_tasks(fleet, d.name, n=2)
            (d / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in tasks))
        await fleet.aclose()

    anyio.run(write_tasks)
    return dirs, build_tiny_model(root / "model", bandit_corpus(), base_corpus=False, seed=0)


@pytest.fixture(scope="module")
def workers(ray_instance, bandits) -> Iterator[RayWorkers]:
    """Two actors on the in-process fleet, shared by the tests below (starting one costs seconds)."""
    dirs, model_dir = bandits
    pool = anyio.run(lambda: RayWorkers.start(spec(dirs, model_dir, use_mcp=False), 2))
    yield pool
    anyio.run(pool.aclose)


async def reset(workers: RayWorkers, model) -> None:
    """Put the learner's fresh weights on the actors as version 0 (a previous test may have trained)."""
    await workers.sync_weights({k: v.detach().clone() for k, v in model.state_dict().items()}, 0)


def spec(dirs: list[Path], model: Path, **env: object) -> WorkerSpec:
    return WorkerSpec(
        backend=BackendSpec(model=str(model), seed=7),
        env=EnvSpec(envs=[str(d) for d in dirs], env_kind="fleet", **env),  # type: ignore[arg-type]
    )


def driver_envs(dirs: list[Path]) -> tuple[Fleet, list[RolloutEnv]]:
    fleet = Fleet([load_env(d) for d in dirs])
    return fleet, build_envs(fleet, dirs, False, env_kind="fleet")


def check_one_press(t: Trajectory, env: RolloutEnv, tok, model) -> None:
    """The sequence is exactly prompt + the sampled token (+ the tool reply); the logprob is its own."""
    (pos,) = [i for i, m in enumerate(t.loss_mask) if m]
    token = t.token_ids[pos]
    word = tok.decode([token], skip_special_tokens=True).strip()
    system, user = t.messages[0], t.messages[1]
    assert system == {"role": "system", "content": env.system_prompt()}  # type: ignore[attr-defined]
    assert user["role"] == "user" and user["content"] == env.tasks[t.task_id].scenario.instruction  # type: ignore[attr-defined]
    b = SequenceBuilder(tok)
    b.add_message("system", system["content"])
    b.add_message("user", user["content"])
    b.open_assistant()
    b.add_generated([token], [t.logprobs[pos]])
    b.close_assistant(token == tok.eos_token_id)
    pressed = word.startswith("press_")
    if pressed:
        assert t.messages[3] == {"role": "tool", "content": "pressed", "is_error": False}
        b.add_message("tool", "pressed")
    assert len(t.messages) == (4 if pressed else 3)
    assert (t.token_ids, t.loss_mask, t.logprobs) == (b.token_ids, b.loss_mask, b.logprobs)
    assert t.reward == (1.0 if word == "press_green" else 0.0)
    # the stored logprob is the initial weights' logprob of that token after that prefix
    ids = torch.tensor([t.token_ids[: pos + 1]])
    with torch.no_grad():
        lp = token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0, pos - 1]
    assert float(lp) == pytest.approx(t.logprobs[pos], abs=1e-4)


async def test_collection_through_two_actors_is_exact(workers, bandits) -> None:
    dirs, model_dir = bandits
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    await reset(workers, model)
    before = {i["index"]: i["groups"] for i in await workers.info()}
    fleet, envs = driver_envs(dirs)
    try:
        trajs = await collect(
            envs, None, None, groups=6, rollouts_per_task=2, rollout_config=ONE_PRESS, source=workers
        )
        info = await workers.info()
    finally:
        await fleet.aclose()
    stream = job_stream(envs, 0)
    plan = [(e.name, task_id) for e, task_id in (next(stream) for _ in range(6))]
    assert Counter(t.group for t in trajs) == dict.fromkeys(range(6), 2)  # each group once, G=2 each
    by_name = {e.name: e for e in envs}
    for t in trajs:
        assert (t.env, t.task_id) == plan[t.group]
        assert t.policy_version == 0 and t.user_error is False and t.user_error_reason is None
        check_one_press(t, by_name[t.env], tok, model)
    played = [i["groups"] - before[i["index"]] for i in info]
    assert all(n >= 1 for n in played) and sum(played) == 6  # both actors kept busy, nothing replayed


async def test_training_through_actors_keeps_their_weights_on_the_learners(workers, bandits) -> None:
    dirs, model_dir = bandits
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    await reset(workers, model)
    before = {i["index"]: i["groups"] for i in await workers.info()}
    # weight decay moves every weight at every step, so a missed sync cannot hide behind a zero update
    learner = Learner(model, LearnerConfig(lr=0.01, weight_decay=0.1), pad_id=tok.pad_token_id)
    fleet, envs = driver_envs(dirs)
    checksums = [state_checksum(model.state_dict())]
    seen: list[tuple[StepMetrics, list[Trajectory], list[dict]]] = []

    def on_step(m: StepMetrics, trajs: list[Trajectory]) -> None:
        checksums.append(state_checksum(model.state_dict()))
        seen.append((m, trajs, ray.get([a.info.remote() for a in workers.actors])))

    config = TrainConfig(steps=3, tasks_per_step=4, rollouts_per_task=2, staleness=1, rollout=ONE_PRESS)
    try:
        metrics = await train(envs, None, learner, None, config, on_step=on_step, source=workers)
    finally:
        await fleet.aclose()
    assert [m.policy_version for m in metrics] == [1, 2, 3]
    assert len(set(checksums)) == 4  # the learner's weights changed at every step
    for step, (m, trajs, info) in enumerate(seen):
        assert [i["version"] for i in info] == [m.policy_version] * 2
        assert [i["checksum"] for i in info] == [checksums[step + 1]] * 2
        assert len(trajs) == 8 and m.staleness_max <= 1
        assert all(step - t.policy_version <= 1 for t in trajs)  # learner was at `step` when it updated
    assert all(i["groups"] > before[i["index"]] for i in seen[-1][2])  # both actors played


async def test_vllm_workers_learn_the_version_the_driver_pushed(
    ray_instance, bandits, tmp_path: Path
) -> None:
    """vllm actors share the server; the driver's backend pushes the weights, the actors the version."""
    dirs, model_dir = bandits
    tok = load_tokenizer(model_dir)
    press = [tok.convert_tokens_to_ids("press_green"), tok.eos_token_id]
    fake = FakeVLLM([press])
    # weight decay makes every step a real update, so each one pushes a new version
    learner = Learner(
        AutoModelForCausalLM.from_pretrained(model_dir), LearnerConfig(lr=0.01, weight_decay=0.1)
    )
    fleet, envs = driver_envs(dirs)
    backend = BackendSpec(kind="vllm", model=str(model_dir), vllm_model="tiny")
    seen: list[tuple[int, list[int], int, list[Trajectory]]] = []
    with ServerThread(fake.app()) as server:
        driver = VLLMBackend(server.url, model="tiny", eos_id=tok.eos_token_id, sync_dir=tmp_path / "sync")
        worker_spec = spec(dirs, model_dir, use_mcp=False).model_copy(
            update={"backend": backend.model_copy(update={"vllm_url": server.url})}
        )
        workers = await RayWorkers.start(worker_spec, 1, driver_backend=driver)

        def on_step(m: StepMetrics, trajs: list[Trajectory]) -> None:
            pushed = [s["version"] for s in fake.syncs]
            seen.append(
                (m.policy_version, pushed, ray.get(workers.actors[0].info.remote())["version"], trajs)
            )

        config = TrainConfig(
            steps=2,
            tasks_per_step=4,
            rollouts_per_task=2,
            rollout=RolloutConfig(max_turns=1, max_new_tokens=2),
        )
        try:
            await train(envs, None, learner, None, config, on_step=on_step, source=workers)
        finally:
            await workers.aclose()
            await driver.aclose()
            await fleet.aclose()
    assert [(v, pushed, actor) for v, pushed, actor, _ in seen] == [(1, [1], 1), (2, [1, 2], 2)]
    for step, (_, _, _, trajs) in enumerate(seen):
        assert all(t.policy_tokens() == press and t.reward == 1.0 for t in trajs)  # the server sampled
        assert all(step - t.policy_version <= 1 for t in trajs)
    assert fake.requests and all(r["model"] == "tiny" for r in fake.requests)


async def test_actors_sample_in_the_runs_precision(ray_instance, bandits, tmp_path: Path) -> None:
    """`--precision bfloat16` reaches the actors: they sample in bf16 and take float32 syncs as bf16."""
    dirs, model_dir = bandits
    opts = RunOptions(
        model=model_dir, envs=dirs, env_kind="fleet", out=tmp_path, ray_workers=1, precision="bfloat16"
    )
    pool = await RayWorkers.start(WorkerSpec.from_options(opts), 1)
    try:
        assert [i["dtype"] for i in await pool.info()] == ["bfloat16"]
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        await pool.sync_weights(model.state_dict(), 1)
        assert [(i["dtype"], i["version"]) for i in await pool.info()] == [("bfloat16", 1)]
    finally:
        await pool.aclose()


async def test_unplaceable_workers_time_out_instead_of_hanging(ray_instance, bandits) -> None:
    dirs, model_dir = bandits
    with pytest.raises(TimeoutError, match="free CPUs"):
        await RayWorkers.start(spec(dirs, model_dir), 1, cpus_per_worker=64, start_timeout_s=1)


def test_cli_train_and_collect_with_ray_workers(ray_instance, bandits, tmp_path: Path) -> None:
    """`train` on in-process fleets; `collect` on a served fleet (`--fleet-url`): episodes live there."""
    dirs, model_dir = bandits
    app = typer.Typer()
    trainer_commands.register(app)
    common = ["--model", str(model_dir), "--env-kind", "fleet", "--max-turns", "1", "--max-new-tokens", "1"]
    for d in dirs:
        common += ["--envs", str(d)]
    common += ["--ray-workers", "1"]
    out = tmp_path / "train"
    args = ["--steps", "2", "--tasks-per-step", "4", "--rollouts-per-task", "2", "--collectors", "2"]
    res = CliRunner().invoke(
        app, ["train", *common, "--no-mcp", *args, "--out", str(out), "--save-trajectories"]
    )
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2] and all(r["staleness_max"] <= 1 for r in rows)
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 2 * 4 * 2
    assert (out / "checkpoints" / "step_2" / "config.json").exists()
    assert json.loads((out / "run.json").read_text())["options"]["ray_workers"] == 1

    served = Fleet([load_env(d) for d in dirs], ttl_seconds=600)
    cout = tmp_path / "collect"
    with ServerThread(build_app(served)) as server:
        served_args = ["--mcp", "--fleet-url", server.url, "--groups", "3", "--rollouts-per-task", "2"]
        res = CliRunner().invoke(app, ["collect", *common, *served_args, "--out", str(cout)])
        assert res.exit_code == 0, res.output
        assert served.store.created == 6 and len(served.store) == 0  # one episode per rollout, closed
    trajs = [json.loads(line) for line in (cout / "trajectories.jsonl").read_text().splitlines()]
    assert Counter(t["group"] for t in trajs) == {0: 2, 1: 2, 2: 2}
    assert all(sum(t["loss_mask"]) == 1 and t["user_error_reason"] is None for t in trajs)
    tok = load_tokenizer(model_dir)
    for t in trajs:
        word = tok.decode([t["token_ids"][t["loss_mask"].index(1)]], skip_special_tokens=True).strip()
        assert t["reward"] == (1.0 if word == "press_green" else 0.0)
        if word.startswith("press_"):
            assert t["messages"][3]["content"] == "pressed"  # the served tool ran and answered
    assert ray.is_initialized()  # the CLI joined the running instance and left it running

    bad = CliRunner().invoke(app, ["collect", *common[:-2], "--ray-address", "x", "--out", str(cout)])
    assert bad.exit_code == 2 and "--ray-workers" in bad.output
