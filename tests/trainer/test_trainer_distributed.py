"""Data-parallel updates across processes (gloo on CPU): the same weights as one process, on every rank."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from envforge.server import Fleet, load_env
from envforge.trainer import (
    Learner,
    LearnerConfig,
    Trajectory,
    bandit_corpus,
    bandit_tasks,
    build_tiny_model,
    init_from_env,
    shutdown,
    state_checksum,
    write_bandit_env,
)

from support.serving import free_port
from support.trajectories import ROWS, on_policy_rows

CONFIG = LearnerConfig(lr=1e-2, micro_batch=2, weight_decay=0.01)
STEPS = 2  # the second step runs off-policy (ratio != 1), so clipping is exercised too


def _rank_main(rank: int, world: int, port: int, model_dir: str, batch: str, out: str) -> None:
    """One torchrun-like rank: rank 0 steps and releases the others, the others follow."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    dp = init_from_env("cpu")
    assert dp is not None and dp.rank == rank
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    learner = Learner(model, CONFIG, pad_id=0, dp=dp)
    trajs = [Trajectory.model_validate_json(line) for line in Path(batch).read_text().splitlines()]
    if dp.is_leader:
        results = [learner.step(trajs).model_dump(exclude={"token_advantages"}) for _ in range(STEPS)]
        learner.close()
    else:
        results = [{"followed": learner.follow()}]
    torch.save(model.state_dict(), Path(out) / f"rank{rank}.pt")
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(results))
    shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    corpus = ["alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi"]
    return build_tiny_model(tmp_path_factory.mktemp("model"), corpus)


def test_two_ranks_update_exactly_like_one_process(model_dir: Path, tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trajs = on_policy_rows(model, tok, ROWS)  # two envs, one masked trajectory, uneven shards
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(t.model_dump_json() + "\n" for t in trajs))

    single = Learner(model, CONFIG, pad_id=0)
    want = [single.step(trajs) for _ in range(STEPS)]

    mp.start_processes(
        _rank_main,
        args=(2, free_port(), str(model_dir), str(batch), str(tmp_path)),
        nprocs=2,
        start_method="spawn",
    )
    leader = json.loads((tmp_path / "rank0.json").read_text())
    assert json.loads((tmp_path / "rank1.json").read_text()) == [{"followed": STEPS}]
    for got, exp in zip(leader, want, strict=True):
        assert got["tokens"] == exp.tokens and got["kept"] == exp.kept and got["masked"] == exp.masked
        assert got["advantages"] == pytest.approx(exp.advantages)
        assert got["loss"] == pytest.approx(exp.loss, abs=1e-6)
        assert got["grad_norm"] == pytest.approx(exp.grad_norm, rel=1e-5)
        assert got["clip_fraction"] == pytest.approx(exp.clip_fraction)
    assert want[1].ratio_mean != pytest.approx(1.0, abs=1e-6)  # the second step really was off-policy
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    reference = model.state_dict()
    for name, value in reference.items():
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # identical grads -> identical weights
        # Adam turns float noise into steps on parameters whose true gradient is 0 (the key bias, by
        # softmax's shift invariance): ~2e-6 here, against lr-sized steps (1e-2) everywhere else.
        assert torch.allclose(ranks[0][name], value, atol=1e-5), name
    initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert max(float((ranks[0][n] - initial[n]).abs().max()) for n in initial) > 1e-3  # it did train


def test_envforge_train_under_torchrun(tmp_path: Path) -> None:
    """`torchrun --nproc-per-node 2 envforge train ...`: rank 0 trains, rank 1 follows to the same weights."""
    env_dir = write_bandit_env(tmp_path)

    async def tasks() -> None:
        fleet = Fleet([load_env(env_dir)])
        rows = await bandit_tasks(fleet, "bandit", n=3)
        (env_dir / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in rows))
        await fleet.aclose()

    anyio.run(tasks)
    model = build_tiny_model(tmp_path / "model", bandit_corpus(), base_corpus=False)
    out = tmp_path / "run"
    envforge = shutil.which("envforge", path=str(Path(sys.executable).parent))
    assert envforge is not None
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", envforge]
    args += ["train", "--model", str(model), "--envs", str(env_dir), "--env-kind", "fleet"]
    args += ["--max-turns", "1", "--max-new-tokens", "1", "--steps", "3", "--tasks-per-step", "2"]
    args += ["--rollouts-per-task", "3", "--lr", "0.01", "--out", str(out)]
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    ranks = [json.loads((out / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["steps"] for r in ranks] == [3, 3]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    saved = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_3")
    assert state_checksum(saved.state_dict()) == ranks[0]["checksum"]
