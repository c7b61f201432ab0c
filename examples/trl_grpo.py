"""Train on envforge environments with trl's GRPOTrainer (docs/integrations.md).

    python examples/trl_grpo.py --smoke        # offline: a tiny local model, one step, exit 0
    python examples/trl_grpo.py --model PATH --env envs/car_rental --env envs/gym --steps 50

The dataset, the environment factories and the reward come from `envforge.integrations.trl`;
everything else is trl's own. With `--erpo` the reward is ERPO's (env-level scaling), which trl
applies with `scale_rewards="none"`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one step on a tiny local model, offline")
    parser.add_argument("--model", help="a local causal LM folder whose chat template renders tool calls")
    parser.add_argument("--env", action="append", type=Path, help="an env folder (repeatable)")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="tasks per env")
    parser.add_argument("--erpo", action="store_true")
    args = parser.parse_args(argv)
    if not args.smoke and not args.model:
        parser.error("give --model PATH, or --smoke")

    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from envforge.integrations.trl import environments, read_tool_calls_as_envforge

    env_dirs = args.env or [REPO / "envs" / "car_rental", REPO / "envs" / "gym"]
    limit = 2 if args.smoke and args.limit is None else args.limit
    with tempfile.TemporaryDirectory() as tmp, environments(env_dirs, limit=limit, erpo=args.erpo) as envs:
        if args.smoke:
            from envforge.trainer import build_tiny_model

            corpus = [m["content"] for row in envs.dataset for m in row["prompt"]]
            model_dir = str(build_tiny_model(Path(tmp) / "model", corpus))
        else:
            model_dir = args.model
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if args.smoke:  # the tiny model's own template has no tool calls; trl ships Qwen2.5's
            tokenizer.chat_template = (
                Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
            ).read_text()
        config = GRPOConfig(
            output_dir=str(Path(tmp) / "out"),
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=8 if args.smoke else 256,
            max_steps=args.steps,
            beta=0.0,
            scale_rewards="none" if args.erpo else "group",
            use_cpu=args.smoke,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir),
            args=config,
            train_dataset=envs.dataset,
            processing_class=read_tool_calls_as_envforge(tokenizer),
            environment_factory=envs.environment_factory,
            reward_funcs=envs.reward_funcs,
        )
        result = trainer.train()
        print(f"trained {result.global_step} step(s) on {', '.join(envs.environment_factory)}")
        if envs.left_out:
            print(f"left out (need a simulated user): {sum(map(len, envs.left_out.values()))} tasks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
