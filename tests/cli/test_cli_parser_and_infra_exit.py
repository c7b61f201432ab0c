"""Two endings of the real `envforge` entry point a newcomer meets first.

- A parser mistake (an unknown option, a misspelt command, a bad value) is one `error:` line with
  exit 2, like every other mistake, not a boxed panel of several lines.
- A run whose model server keeps failing is not a result: `eval` exits 1 and prints the first
  reasons when its infra failures exceed `--max-infra-failures`, and 0 when they are within it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.fake_llm import FakeOpenAI
from support.serving import run_envforge

BOX = set("╭╮╰╯│─")


def envforge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_envforge(*args, env=env, timeout=240)


def assert_one_error_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, f"expected one line, got:\n{proc.stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert not BOX & set(proc.stderr), "a boxed panel"
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["eval", "envs/gym", "--bogus"], ["--bogus", "envforge eval --help"]),
        (["evl"], ["evl", "eval"]),
        (["eval", "envs/gym", "--trials", "many"], ["--trials", "integer"]),
        (["synth", "tasks"], ["envforge synth tasks --help"]),
    ],
    ids=["unknown-option", "misspelt-command", "bad-value", "missing-argument"],
)
def test_a_parser_mistake_is_one_error_line(args: list[str], needles: list[str]) -> None:
    assert_one_error_line(envforge(*args), *needles)


def test_help_and_version_still_exit_zero() -> None:
    assert envforge("--version").returncode == 0
    shown = envforge("eval", "--help")
    assert shown.returncode == 0 and "--agent" in shown.stdout


@pytest.fixture
def failing_model() -> Iterator[str]:
    """An OpenAI-compatible server whose every completion is a 500: the provider is down."""
    with FakeOpenAI(
        lambda body: (500, {"error": {"message": "provider down", "type": "server_error"}})
    ) as fake:
        yield fake.url


@pytest.mark.parametrize(("allowed", "code"), [(0, 1), (1, 0)])
def test_infra_failures_past_the_limit_fail_the_run(
    failing_model: str, tmp_path: Path, allowed: int, code: int
) -> None:
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    proc = envforge(
        "eval", "envs/gym", "--agent", "openai/fake-agent", "--agent-api-base", failing_model,
        "--user", "scripted", "--tasks", "gym-0-00000", "--out", str(tmp_path / "run"),
        "--max-infra-failures", str(allowed), env=env,
    )  # fmt: skip
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "1 of 1 trial(s) failed for infra reasons" in proc.stdout + proc.stderr
    assert "provider down" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
