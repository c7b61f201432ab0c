"""Before long local-model work the user hears its cost: a first run estimates from its first
trial, and every later run with the same local models estimates before it starts, from the seconds
per trial measured on this machine (remembered in the models' cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from envforge.harness import TrialClock


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_second_local_run_is_estimated_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENVFORGE_CACHE", str(tmp_path))
    clock = Clock()
    first = TrialClock("agent=local", concurrency=1, clock=clock)
    assert (
        first.on_start(total=3, done=0)
        == "estimate: 3 trials of a local model; a figure follows the first trial"
    )
    clock.now += 160
    assert first.on_trial() == "estimate: 2 trials x 160 s per trial (from the first trial): about 6 min more"
    for _ in range(2):
        clock.now += 160
        assert first.on_trial() is None
    first.finish()
    assert (tmp_path / "trial_seconds.json").exists()
    second = TrialClock("agent=local", concurrency=1, clock=clock)
    said = second.on_start(total=40, done=0)
    assert said == "estimate: 40 trials x 160 s per trial (measured here on the last run): about 1 h 47 min"
    assert second.on_trial() is None  # already said before the work began
    other = TrialClock("agent=local/qwen2.5-1.5b", clock=clock)  # another model: not measured yet
    assert "a figure follows the first trial" in str(other.on_start(total=5, done=0))


def test_the_demos_measurement_estimates_the_eval_it_advises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENVFORGE_CACHE", str(tmp_path))
    TrialClock.remember(TrialClock.key_of(["agent=local"], 3), 141.0)  # what `envforge demo` keeps
    advised = TrialClock(TrialClock.key_of(["agent=local"], 3))  # --agent local --max-turns 3
    said = advised.on_start(total=4, done=0)
    assert said == "estimate: 4 trials x 141 s per trial (measured here on the last run): about 10 min"
    longer = TrialClock(TrialClock.key_of(["agent=local"], 30))  # 30 turns: other work, not measured
    assert "a figure follows the first trial" in str(longer.on_start(total=4, done=0))
