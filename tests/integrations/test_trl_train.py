"""One real `GRPOTrainer.train()` step on envforge environments, wired as the docs show: trl makes
the instances from `environment_factory`, resets them with the dataset's rows, exposes their tools
and rewards them with envforge's reward function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envforge.integrations.trl import environments
from envforge.server import load_env

from support.paths import REPO

ENVS = [REPO / "envs" / "car_rental", REPO / "envs" / "gym"]


def _trainer(tmp_path: Path, erpo: bool) -> tuple[Any, Any, list[list[float | None]]]:
    import trl
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from envforge.trainer import build_tiny_model, load_tokenizer

    envs = environments(ENVS, limit=2, erpo=erpo)
    corpus = [m["content"] for row in envs.dataset for m in row["prompt"]]
    model_dir = build_tiny_model(tmp_path / "model", corpus)
    tokenizer = load_tokenizer(model_dir)
    # a template that renders tool calls and results (trl refuses one that cannot)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    seen: list[list[float | None]] = []
    reward = envs.reward_funcs[0]

    def recording(**kwargs: Any) -> list[float | None]:
        out = reward(**kwargs)
        seen.append(out)
        return out

    recording.__name__ = reward.__name__
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=1,
        learning_rate=1e-5,
        beta=0.0,
        scale_rewards="none" if erpo else "group",
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(model_dir)),
        args=args,
        train_dataset=envs.dataset,
        processing_class=tokenizer,
        environment_factory=envs.environment_factory,
        reward_funcs=[recording],
    )
    return trainer, envs, seen


@pytest.mark.parametrize("erpo", [False, True])
def test_one_grpo_step_on_envforge_environments(tmp_path: Path, erpo: bool) -> None:
    trainer, envs, seen = _trainer(tmp_path, erpo)
    with envs:
        # the model sees each env's tools and nothing of the instance's own machinery
        exposed = {name: sorted(t.__name__ for t in tools) for name, tools in trainer._env_tools.items()}
        assert exposed == {d.name: sorted(load_env(d).tools) for d in ENVS}
        out = trainer.train()
    assert out.global_step == 1
    assert len(seen) == 1 and len(seen[0]) == 4
    assert all(r is not None and r == r for r in seen[0])
