"""A responder that answers env synthesis from a real model's captured answers, and keeps every
prompt it was asked (`prompts["<stage>:<round>"]`) for assertions on what the pipeline showed.

A stage the capture has no answer for in a round gets that stage's round-0 answer again (the
capture's model was not asked it: a stage the pipeline now repairs that it did not then); a
per-tool repair (`tool_<name>`) it has no answer for gets an empty one, which the splice refuses;
a resample (`sample` k) is keyed `<stage>~k:<round>`; `overrides` answers chosen keys with given
text, so a test can move a run past a failure it is not about.
"""

from __future__ import annotations

from pathlib import Path

from envforge.synth.envsynth import LLMError, ReplayResponder, Reply, answer_key


class Asked:
    def __init__(self, captured: Path, overrides: dict[str, str] | None = None) -> None:
        self.replay = ReplayResponder.from_path(captured)
        self.overrides = overrides or {}
        self.model = self.replay.model
        self.prompts: dict[str, str] = {}

    async def complete(
        self, stage: str, round_: int, messages: list[dict[str, str]], *, sample: int = 0
    ) -> Reply:
        key = answer_key(stage, round_, sample)
        self.prompts[key] = messages[-1]["content"]
        if key in self.overrides:
            return Reply(self.overrides[key])
        try:
            return await self.replay.complete(stage, round_, messages, sample=sample)
        except LLMError:
            if stage.startswith("tool_"):  # one tool's repair the capture never asked: none
                return Reply("")  # (the splice refuses it and keeps the old function)
            return await self.replay.complete(stage, 0, messages)
