"""One real trl `GRPOTrainer` step on a tiny model, read back as the advantages trl hands its loss.

trl computes advantages inline in `GRPOTrainer._generate_and_score_completions` (there is no
standalone function to call), so the step runs for real with a reward function that hands out
prepared rewards, and the `advantages` tensor that method returns to the loss is captured. Rewards
are assigned per row by (task, occurrence within the call), so the order in which trl's sampler
shuffles prompts does not matter.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

Key = tuple[str, str, int]
"""(env, task, generation)."""


def trl_advantages(
    tmp_path: Path,
    groups: list[tuple[str, str]],
    rewards: dict[Key, float | None],
    generations: int,
    *,
    scale_rewards: str,
    name: str,
) -> dict[Key, float]:
    """trl's advantage for every (env, task, generation) of `groups`; `rewards[k]` None is a
    reward trl must treat as unscorable (NaN)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from envforge.trainer import build_tiny_model, load_tokenizer

    by_prompt = {f"solve {e} {t}": (e, t) for e, t in groups}
    model_dir = build_tiny_model(tmp_path / f"model_{name}", list(by_prompt))
    seen: list[list[Key]] = []
    captured: list[Any] = []

    def reward_fn(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float | None]:
        count: dict[tuple[str, str], int] = defaultdict(int)
        keys = []
        for p in prompts:
            e, t = by_prompt[p]
            keys.append((e, t, count[(e, t)]))
            count[(e, t)] += 1
        seen.append(keys)
        return [rewards[k] for k in keys]

    class Capturing(GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            out = super()._generate_and_score_completions(inputs)
            captured.append(out["advantages"].detach().cpu().tolist())
            return out

    args = GRPOConfig(
        output_dir=str(tmp_path / f"trl_{name}"),
        per_device_train_batch_size=len(groups) * generations,
        num_generations=generations,
        max_completion_length=2,
        max_steps=1,
        learning_rate=0.0,
        beta=0.0,
        scale_rewards=scale_rewards,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    trainer = Capturing(
        model=AutoModelForCausalLM.from_pretrained(str(model_dir)),
        reward_funcs=reward_fn,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in by_prompt]),
        processing_class=load_tokenizer(model_dir),
    )
    trainer.train()
    assert len(seen) == 1 and len(captured) == 1
    assert sorted(seen[0]) == sorted(rewards)  # every (task, generation) exactly once
    return dict(zip(seen[0], captured[0], strict=True))
