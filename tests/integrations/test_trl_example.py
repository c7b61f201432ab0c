"""`examples/trl_grpo.py --smoke` runs offline and exits 0 (what CI runs): one real `GRPOTrainer`
step on a tiny local model over two envs, with the tokenizer reading tool calls as envforge does."""

from __future__ import annotations

import os
import subprocess
import sys

from support.paths import REPO

EXAMPLE = REPO / "examples" / "trl_grpo.py"


def test_the_smoke_run_trains_one_step_on_a_tiny_model() -> None:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TRL_EXPERIMENTAL_SILENCE": "1"}
    command = [sys.executable, str(EXAMPLE), "--smoke"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained 1 step(s) on car_rental, gym" in done.stdout
