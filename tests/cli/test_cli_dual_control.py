"""`envforge eval --solo` from the command line: on a dual-control env the oracle drives both
sides and passes every task of the fixture; on an env without user tools it is one line and exit
2, nothing run. (Oracle with the scripted user: tests/harness/test_dual_control.py.)"""

from __future__ import annotations

import json

from support.paths import DUAL_PHONE_DIR, ENVS
from support.serving import run_envforge


def test_eval_solo(tmp_path):
    out = tmp_path / "solo"
    done = run_envforge("eval", str(DUAL_PHONE_DIR), "--agent=oracle", "--solo", "--json", f"--out={out}")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["overall"]["pass_hat_k"] == [1.0], summary
    assert json.loads((out / "manifest.json").read_text())["solo"] is True
    refused = run_envforge(
        "eval", str(ENVS / "retail_orders"), "--agent", "oracle", "--solo", "--out", str(tmp_path / "r")
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: --solo: retail_orders has no user tools (τ²'s solo mode is for dual-control envs)"
    ]
    assert not (tmp_path / "r" / "trials.jsonl").exists()
