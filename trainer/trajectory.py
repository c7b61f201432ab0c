"""Trajectories as token ids: what the learner trains on and `envforge collect` writes.

The sequence is built by concatenating the token ids of its segments (system, user, tool, and the
policy's generated ids exactly as sampled), never by re-tokenizing the rendered chat: re-tokenizing
can merge or split tokens at segment borders and silently change what the policy actually produced,
which makes the stored logprobs belong to different tokens than the ones trained on.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class TokenizerLike(Protocol):
    """The part of a HF tokenizer the trainer uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...

    def convert_tokens_to_ids(self, token: str) -> int: ...


class Trajectory(BaseModel):
    """One rollout of one task: the full token sequence plus what the loss needs.

    `logprobs[k]` is the sampling logprob of `token_ids[k]` where `loss_mask[k] == 1` (policy tokens),
    0.0 elsewhere. `user_error` trajectories stay in the data (they are counted and logged) but carry
    no loss; `user_error_reason` says why the detector masked it, so a trajectory file (e.g. from
    `envforge collect`) can be audited on its own.
    """

    model_config = ConfigDict(extra="forbid")

    env: str
    task_id: str
    group: int = Field(0, description="which collection group (G rollouts of one task) it came from")
    token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    reward: float = 0.0
    parts: dict[str, float] = Field(default_factory=dict)
    user_error: bool = False
    user_error_reason: str | None = None
    injected_user_error: str | None = Field(
        None, description="the error kind the simulated user was made to commit (--user-error-rate)"
    )
    policy_version: int = Field(description="the oldest weights version that generated any of its tokens")
    messages: list[dict[str, Any]] = Field(default_factory=list, description="the chat, for reading")
    started_at: float = 0.0
    finished_at: float = 0.0

    def policy_tokens(self) -> list[int]:
        return [t for t, m in zip(self.token_ids, self.loss_mask, strict=True) if m]


_CHATML_TOOL = (f"{IM_START}tool\n", f"{IM_END}\n")


def tool_frame(tokenizer: TokenizerLike) -> tuple[str, str]:
    """(before, after) a tool result in a rollout's sequence: ChatML's `tool` turn, whatever the
    tokenizer's own template says. Qwen2.5's template writes a result as a user turn with
    `<tool_response>` inside; framed that way, the packaged Qwen2.5-Coder-0.5B solved 1 of 120
    held-out lookup episodes against 5 of 120 with the `tool` turn (same seed and sampling; with
    the 60 of an earlier pair, 1 of 180 against 7 of 180), and its first training batch 0 of 32
    against 3: the lookup figure ERPO learns from starts from those few successes. Measured with
    `envforge train --tasks lookup --steps 0 --eval-samples 2` on the four lookup envs."""
    del tokenizer  # one frame for every tokenizer, by measurement (above)
    return _CHATML_TOOL


class SequenceBuilder:
    """Accumulates a ChatML conversation as token ids with a parallel loss mask and logprobs.

    Context segments are tokenized on their own (mask 0); generated ids are appended verbatim
    (mask 1) with their sampling logprobs.
    """

    def __init__(self, tokenizer: TokenizerLike) -> None:
        self.tok = tokenizer
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.loss_mask: list[int] = []

    def add_context(self, text: str) -> None:
        ids = self.tok.encode(text, add_special_tokens=False)
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)

    def add_message(self, role: str, content: str) -> None:
        """A whole non-policy message: `<|im_start|>role\\ncontent<|im_end|>\\n`; a tool result in
        `tool_frame`'s turn."""
        if role == "tool":
            before, after = tool_frame(self.tok)
            self.add_context(f"{before}{content}{after}")
            return
        self.add_context(f"{IM_START}{role}\n{content}{IM_END}\n")

    def open_assistant(self) -> None:
        """The assistant header is context: the policy did not choose it."""
        self.add_context(f"{IM_START}assistant\n")

    def add_generated(self, ids: list[int], logprobs: list[float]) -> None:
        if len(ids) != len(logprobs):
            raise ValueError("one logprob per generated token")
        self.token_ids += list(ids)
        self.logprobs += [float(x) for x in logprobs]
        self.loss_mask += [1] * len(ids)

    def close_assistant(self, ended_with_eos: bool) -> None:
        """After a turn: a newline, plus `<|im_end|>` if generation stopped on the length limit."""
        self.add_context("\n" if ended_with_eos else f"{IM_END}\n")
