"""`envforge.collect_trajectories` with a tiny real model on the bandit env: what it writes is what
`read_trajectories` gives back, and a request for nothing is refused before any model loads."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import envforge
from envforge.trainer import bandit_corpus, bandit_tasks, build_tiny_model, write_bandit_env


async def _bandit(tmp_path: Path) -> Path:
    env_dir = write_bandit_env(tmp_path)
    async with envforge.Fleet([envforge.load_env(env_dir)]) as fleet:
        tasks = await bandit_tasks(fleet, "bandit", n=3)
    (env_dir / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    return env_dir


def test_an_empty_collection_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    options = envforge.RunOptions(model=tmp_path / "no-model", envs=[tmp_path], out=tmp_path / "out")
    with pytest.raises(ValueError, match="at least 1"):
        envforge.collect_trajectories(options, groups=0)
    assert not (tmp_path / "out").exists()  # refused before the run started


def test_options_that_cannot_run_together_are_refused_naming_each_setting(tmp_path: Path) -> None:
    def options(**fields: object) -> envforge.RunOptions:
        return envforge.RunOptions(model=tmp_path, envs=[tmp_path], out=tmp_path / "out", **fields)

    for fields, names in [
        ({"backend": "vllm"}, ("backend", "vllm_url")),
        ({"ray_address": "ray://h:10001"}, ("ray_address", "ray_workers")),
        ({"eval_every": 2}, ("eval_every", "tasks")),
    ]:
        with pytest.raises(envforge.SettingError) as caught:
            envforge.checked_run_options(options(**fields))
        assert caught.value.names == names
    lookup = envforge.checked_run_options(options(tasks="lookup", eval_every=2))
    assert lookup.env_kind == "fleet"  # a lookup is one question: no simulated user to talk to


def test_erpo_needs_two_tasks_per_env_each_step(tmp_path: Path) -> None:
    with pytest.raises(envforge.SettingError, match="tasks_per_step 3 is too small"):
        envforge.check_tasks_per_step([tmp_path, tmp_path], 3)
    (tmp_path / "tasks.jsonl").write_text('{"id": "only-one"}\n')
    with pytest.raises(ValueError, match="has 1 task"):
        envforge.check_tasks_per_step([tmp_path], 2)


def test_collected_trajectories_read_back_with_their_rewards_and_masks(tmp_path: Path) -> None:
    env_dir = anyio.run(_bandit, tmp_path)
    model = build_tiny_model(tmp_path / "model", bandit_corpus(), base_corpus=False)
    options = envforge.RunOptions(model=model, envs=[env_dir], out=tmp_path / "out", env_kind="fleet")
    groups: list[int] = []
    path = envforge.collect_trajectories(
        options,
        groups=2,
        rollouts_per_task=2,
        rollout_config=envforge.RolloutConfig(max_turns=1, max_new_tokens=1),
        on_group=lambda trajs: groups.append(len(trajs)),
    )
    trajectories = envforge.read_trajectories(path)
    assert path == tmp_path / "out" / "trajectories.jsonl" and groups == [2, 2]
    assert len(trajectories) == 4 and {t.env for t in trajectories} == {"bandit"}
    assert all(sum(t.loss_mask) == 1 and 0.0 <= t.reward <= 1.0 for t in trajectories)
