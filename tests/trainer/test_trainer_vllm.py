"""The vLLM backend against a fake OpenAI-compatible server on 127.0.0.1 speaking vLLM's protocol."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from envforge.server import Fleet, load_env
from envforge.trainer import (
    FleetRolloutEnv,
    RolloutConfig,
    VLLMBackend,
    bandit_corpus,
    bandit_tasks,
    build_tiny_model,
    load_tokenizer,
    write_bandit_env,
)
from envforge.trainer.rollout import rollout

from support.fake_llm import FakeVLLM
from support.serving import ServerThread


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m"), bandit_corpus(), base_corpus=False)


async def test_vllm_rollout_and_weight_sync(tmp_path: Path, model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    green = tok.convert_tokens_to_ids("press_green")
    fake = FakeVLLM([[green, tok.eos_token_id]])
    fleet = Fleet([load_env(write_bandit_env(tmp_path))])
    tasks = await bandit_tasks(fleet, "bandit")
    env = FleetRolloutEnv(fleet, "bandit", tasks)
    with ServerThread(fake.app()) as server:
        backend = VLLMBackend(server.url, model="tiny", eos_id=tok.eos_token_id, sync_dir=tmp_path / "sync")
        try:
            traj = await rollout(env, tasks[0].id, backend, tok, RolloutConfig(max_turns=1, max_new_tokens=4))
            assert traj.policy_tokens() == [green, tok.eos_token_id]
            assert [lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m] == [-0.25, -0.5]
            assert traj.reward == 1.0  # press_green through MCP, scored by compose_reward
            req = fake.requests[0]
            assert req["prompt"] == traj.token_ids[: len(req["prompt"])]
            assert (
                req["max_tokens"] == 4
                and req["logprobs"] == 1
                and req["stop_token_ids"] == [tok.eos_token_id]
            )
            model = AutoModelForCausalLM.from_pretrained(model_dir)
            await backend.sync_weights({}, 1, model)
            assert backend.version == 1
            assert fake.syncs == [{"model_path": str(tmp_path / "sync" / "v1"), "version": 1}]
            assert (tmp_path / "sync" / "v1" / "config.json").exists()
        finally:
            await backend.aclose()


async def test_vllm_rejects_text_tokens(model_dir: Path) -> None:
    from envforge.trainer.backends import _token_id

    with pytest.raises(ValueError, match="token_id"):
        _token_id("press_green")
    assert _token_id("token_id:17") == 17
