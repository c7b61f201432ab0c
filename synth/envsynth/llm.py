"""Model access for env synthesis: every call goes through `litellm.acompletion`, or a replay of recordings.

A responder answers one prompt of one pipeline stage in one repair round. `LiteLLMResponder` is the
real path (any litellm model, optional `api_base`); `ReplayResponder` returns recorded answers keyed
`"<stage>:<round>"`, so the whole pipeline runs offline and deterministically in tests. The first
line of every system prompt names the stage and round (`envsynth stage=tools round=1 prompt=tools/v1`)
so that a fake OpenAI-compatible server can serve the same recordings over real HTTP.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from .prompts import JSON_SCHEMAS, json_schema

STAGE_LINE = re.compile(r"envsynth stage=(?P<stage>\w+) round=(?P<round>\d+)")
# Stages whose recorded answer carries over to later rounds when none is recorded for that round:
# the probe agents are re-asked every round, but their proposals rarely need to change.
CARRY_OVER_STAGES = frozenset({"tester", "checker"})
RESAMPLE_TEMPERATURE = 0.7
"""The temperature of a resampled answer (`sample` k > 0, seeded with k); every first answer is
greedy (temperature 0), so a run is repeatable, and so is each resample."""


def answer_key(stage: str, round_: int, sample: int = 0) -> str:
    """An answer's recording key: `stage:round`, or `stage~k:round` for the k-th resample."""
    return f"{stage}~{sample}:{round_}" if sample else f"{stage}:{round_}"


class LLMError(RuntimeError):
    """The model could not be asked, or no recording exists for the prompt."""


@dataclass(frozen=True)
class Reply:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    reused: bool = False  # an earlier run's answer (`ResumingResponder`), no model asked


@dataclass
class Usage:
    """Running totals for the synthesis report."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    reused: int = 0
    keys: list[str] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)  # "stage:round" -> the model's text

    def add(self, key: str, reply: Reply) -> None:
        self.answers[key] = reply.text
        self.reused += reply.reused
        self.calls += 1
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        self.cost += reply.cost
        self.keys.append(key)


class Responder(Protocol):
    """Answers one prompt. `sample` 0 asks for the greedy answer; k > 0 for the k-th sampled one
    (`RESAMPLE_TEMPERATURE`, seed k), asked when the greedy answer was unusable as it stood."""

    model: str

    async def complete(
        self, stage: str, round_: int, messages: list[dict[str, str]], *, sample: int = 0
    ) -> Reply: ...


LLM_TIMEOUT_S = 300.0
"""Per model call of env synthesis: an endpoint that stops answering fails the call (one line,
`LLMError`) instead of holding `synth env` and `synth envs` for ever."""


Structured = Literal["llama.cpp", "openai"]
"""How a server takes a JSON schema to constrain an answer to: llama-cpp-python's server (the
packaged local models') reads `{"type": "json_object", "schema": S}` and turns it into a grammar;
OpenAI-style servers (vLLM, hosted) read `{"type": "json_schema", "json_schema": {"schema": S}}`."""


def response_format(
    stage: str, structured: Structured | None, messages: list[dict[str, str]] | None = None
) -> dict[str, Any] | None:
    """The `response_format` that constrains `stage`'s answer to its JSON schema, or None (a stage
    answered in free text, or a server not known to take schemas). llama.cpp gets the schema
    fitted to the prompt (`prompts.json_schema`: one checker verdict per call, a tuple its
    grammar enforces); OpenAI-style servers the general one (strict modes refuse tuples)."""
    schema = JSON_SCHEMAS.get(stage)
    if schema is None or structured is None:
        return None
    if structured == "llama.cpp":
        return {"type": "json_object", "schema": json_schema(stage, messages or [])}
    return {"type": "json_schema", "json_schema": {"name": stage, "schema": schema, "strict": True}}


def provider_key_set(model: str) -> bool:
    """Whether the environment holds an API key for `model`'s provider (`OPENAI_API_KEY` for
    `openai/...`): litellm sends it, to a given API base too."""
    provider = model.split("/", 1)[0].upper().replace("-", "_")
    return bool(os.environ.get(f"{provider}_API_KEY"))


class LiteLLMResponder:
    """Ask a real (or fake OpenAI-compatible) model through litellm.

    The key is `api_key` when given (a local server's own), else the provider's variable from the
    environment, as `eval` takes it; only an API base with neither gets a placeholder, since the
    openai client refuses to send a request without one. `label` is the model as the synthesis
    report names it (`local/<name>` for a packaged model behind an ephemeral server)."""

    def __init__(
        self,
        model: str,
        api_base: str | None = None,
        *,
        api_key: str | None = None,
        label: str | None = None,
        structured: Structured | None = None,
        **kwargs: Any,
    ) -> None:
        self.model = label or model
        self.litellm_model = model
        self.api_base = api_base
        self.api_key = api_key
        self.structured = structured
        self.kwargs = kwargs

    async def complete(
        self, stage: str, round_: int, messages: list[dict[str, str]], *, sample: int = 0
    ) -> Reply:
        import litellm

        kwargs = dict(self.kwargs)
        kwargs.setdefault("timeout", LLM_TIMEOUT_S)
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self.api_key:
            kwargs["api_key"] = self.api_key
        elif self.api_base and not provider_key_set(self.litellm_model):
            kwargs["api_key"] = "not-needed"
        fmt = response_format(stage, self.structured, messages)
        if fmt is not None:
            kwargs["response_format"] = fmt
        if sample:
            kwargs["seed"] = sample
        temperature = RESAMPLE_TEMPERATURE if sample else 0
        try:
            resp = await litellm.acompletion(
                model=self.litellm_model, messages=messages, temperature=temperature, **kwargs
            )
        except Exception as exc:
            key = answer_key(stage, round_, sample)
            raise LLMError(f"{key}: model call failed: {type(exc).__name__}: {exc}") from exc
        text = resp.choices[0].message.content or ""
        usage = getattr(resp, "usage", None)
        try:
            cost = float(litellm.completion_cost(completion_response=resp) or 0.0)
        except Exception:  # unknown models (local, fake) have no price
            cost = 0.0
        return Reply(
            text,
            int(getattr(usage, "prompt_tokens", 0) or 0),
            int(getattr(usage, "completion_tokens", 0) or 0),
            cost,
        )


def load_recordings(path: str | Path) -> dict[str, str]:
    """A recording file: `{"note": ..., "responses": {"stage:round": text | {"file": name}}}`.

    Long answers (code) live next to the JSON in their own files so they stay readable; the files
    never end in `.py`, so nothing treats hand-written stand-ins for model output as project code.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "responses.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for key, value in data["responses"].items():
        if isinstance(value, dict):
            value = (path.parent / value["file"]).read_text(encoding="utf-8")
        out[key] = value
    return out


def lookup(recordings: dict[str, str], stage: str, round_: int) -> str:
    key = f"{stage}:{round_}"
    if key in recordings:
        return recordings[key]
    if stage in CARRY_OVER_STAGES:
        for r in range(round_ - 1, -1, -1):
            if f"{stage}:{r}" in recordings:
                return recordings[f"{stage}:{r}"]
    raise LLMError(f"no recorded response for {key}")


class ReplayResponder:
    """Answer from recordings keyed by stage and round (no network)."""

    def __init__(self, recordings: dict[str, str], model: str = "replay") -> None:
        self.recordings = recordings
        self.model = model

    @classmethod
    def from_path(cls, path: str | Path) -> ReplayResponder:
        return cls(load_recordings(path), model=f"replay:{Path(path).name}")

    async def complete(
        self, stage: str, round_: int, messages: list[dict[str, str]], *, sample: int = 0
    ) -> Reply:
        text = lookup(self.recordings, f"{stage}~{sample}" if sample else stage, round_)
        prompt_chars = sum(len(m["content"]) for m in messages)
        return Reply(text, prompt_chars // 4, len(text) // 4, 0.0)


class ResumingResponder:
    """An earlier run's answers for the prompts it was asked (the same stage, round and sample:
    `answer_key`), `live` for every prompt it never reached. The pipeline asks the same prompts
    given the same answers, so a rejected run continued with more `max_rounds` repeats its rounds
    from the recording and pays the model only for the rounds it had not run: with the packaged
    1.5B on two cores, eight rounds of Slack take 12 to 23 minutes, and runs of one tree differ,
    so a path that got far is worth keeping. A recording from another version of the pipeline
    may answer prompts that version never asked; the gates judge every answer all the same.
    Recorded answers count as `Usage.reused`."""

    def __init__(self, recorded: dict[str, str], live: Responder) -> None:
        self.recorded = recorded
        self.live = live
        self.model = live.model

    async def complete(
        self, stage: str, round_: int, messages: list[dict[str, str]], *, sample: int = 0
    ) -> Reply:
        text = self.recorded.get(answer_key(stage, round_, sample))
        if text is not None:
            return Reply(text, reused=True)
        return await self.live.complete(stage, round_, messages, sample=sample)


_FENCE = re.compile(r"```[A-Za-z0-9_+-]*\n(.*?)```", re.S)


def strip_fences(text: str) -> str:
    """The body of the first fenced block if the answer has one, else the answer as is."""
    m = _FENCE.search(text)
    return (m.group(1) if m else text).strip() + "\n"
