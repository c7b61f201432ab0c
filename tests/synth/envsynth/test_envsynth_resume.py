"""A rejected run continued with more repair rounds (`synth env --resume`): the earlier run's
answers are reused for the prompts it was asked, and the model is asked only past them.

With the packaged 1.5B on two cores, eight rounds of the corpus's Slack set take 12 to 23 minutes
and runs of one tree differ, so a path that got far is worth keeping rather than run again.
"""

from __future__ import annotations

from pathlib import Path

from envforge.synth.envsynth import (
    ReplayResponder,
    ResumingResponder,
    SynthesisReport,
    SynthSettings,
    load_doc_set,
    load_recordings,
    rejected_dir,
    synthesize_env,
)

from support.envsynth_asked import Asked
from support.paths import ENVSYNTH_FIXTURES, REPO

CORPUS = REPO / "benchmarks" / "envsynth_corpus"
CAPTURED = ENVSYNTH_FIXTURES / "captured_slack_1.5b_awaited_subscript"


def _path(report: SynthesisReport) -> list[list[tuple[str, int, int]]]:
    return [[(g.name, g.passed_checks, g.checks) for g in r.gates] for r in report.rounds]


async def test_a_rejected_run_continued_repeats_its_rounds_and_asks_only_past_them(tmp_path: Path) -> None:
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    first = await synthesize_env(
        docs,
        tmp_path / "a" / "slack",
        ReplayResponder(load_recordings(CAPTURED)),
        SynthSettings(name="slack", max_rounds=2),
    )
    assert first.status == "rejected"
    recorded = load_recordings(rejected_dir(tmp_path / "a" / "slack") / "rejected_candidate")
    assert recorded and max(int(k.rsplit(":", 1)[1]) for k in recorded) == 2

    live = Asked(CAPTURED)  # the model, as it answered the whole eight-round run
    resumed = await synthesize_env(
        docs,
        tmp_path / "b" / "slack",
        ResumingResponder(recorded, live),
        SynthSettings(name="slack", max_rounds=3),
    )
    whole = await synthesize_env(
        docs, tmp_path / "c" / "slack", Asked(CAPTURED), SynthSettings(name="slack", max_rounds=3)
    )
    assert _path(resumed)[:3] == _path(first)  # its rounds, repeated from the recording
    assert _path(resumed) == _path(whole) and len(resumed.rounds) == 4
    assert live.prompts and all(key.endswith(":3") for key in live.prompts)  # only past them
    assert resumed.reused_answers == len(recorded) and resumed.llm_calls == len(recorded) + len(live.prompts)
    assert resumed.model == live.model
