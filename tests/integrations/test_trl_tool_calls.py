"""trl reads a model's tool calls as envforge's rollout does.

trl finds calls with the tokenizer's `parse_response`; for Qwen2.5's template that reads only
`<tool_call>` tags, while Qwen2.5-Coder-0.5B calls with a bare or ```json-fenced object (the texts
below are its own, sampled on a lookup task). Left alone, trl took every such call for a final
answer: a real `GRPOTrainer` step on the packaged model logged `tools/call_frequency` 0 and earned
0 of 32. The tokenizer is a byte-level BPE built here, so the ids decode back to the exact text as
a real model's tokenizer does (a word-level one puts spaces around punctuation)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from envforge.integrations.trl import read_tool_calls_as_envforge
from envforge.trainer import parse_tool_call

trl = pytest.importorskip("trl", reason="trl comes with the train extra, which make test installs")
from trl.chat_template_utils import add_response_schema, parse_response  # noqa: E402

CALL = '{"name": "get_car", "arguments": {"car_id": "V-601"}}'
CALLS = {
    "bare": CALL + "<|im_end|>",
    "fenced": "```json\n" + CALL.replace(", ", ",\n  ") + "\n```<|im_end|>",
    "tagged": "<tool_call>\n" + CALL + "\n</tool_call><|im_end|>",
    # several calls in one turn: the rollout plays the first, one call a turn
    "several": CALL + '\n{"name": "get_car", "arguments": {"car_id": "V-602"}}<|im_end|>',
}
ANSWERS = {
    "answer": "The daily rate of car V-601 is 4500 cents.<|im_end|>",
    "json, not a call": '{"daily_rate_cents": 4500}<|im_end|>',
}
UNKNOWN_TOOL = '{"name": "fly_car", "arguments": {"car_id": "V-601"}}<|im_end|>'
"""A call the rollout plays too (the env answers it with its unknown-tool error)."""


def get_car(car_id: str) -> str:
    """Look a car up by its id.

    Args:
        car_id: The car's id.
    """
    return car_id


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    texts = [*CALLS.values(), *ANSWERS.values(), UNKNOWN_TOOL]
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=alphabet)
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_tokens(["<tool_call>", "</tool_call>"])  # as Qwen2.5's: added, not special
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    return tok


def _read(tok: Any, text: str) -> dict[str, Any]:
    """What trl's rollout loop reads from a completion (its own `parse_response`, on token ids)."""
    return dict(parse_response(tok, tok(text)["input_ids"], prefix=[], tools=[get_car]))


def test_trls_own_reader_misses_the_calls_a_small_model_writes() -> None:
    stock = add_response_schema(_tokenizer())
    assert _read(stock, CALLS["tagged"]).get("tool_calls")
    assert not _read(stock, CALLS["bare"]).get("tool_calls")
    assert not _read(stock, CALLS["fenced"]).get("tool_calls")


@pytest.mark.parametrize("form", sorted(CALLS))
def test_every_call_form_the_rollout_plays_is_a_call_for_trl(form: str) -> None:
    tok = read_tool_calls_as_envforge(_tokenizer())
    message = _read(tok, CALLS[form])
    assert message["tool_calls"] == [
        {"type": "function", "function": {"name": "get_car", "arguments": {"car_id": "V-601"}}}
    ]
    assert message["content"] == ""


@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_what_the_rollout_takes_for_an_answer_stays_an_answer(kind: str) -> None:
    tok = read_tool_calls_as_envforge(_tokenizer())
    message = _read(tok, ANSWERS[kind])
    assert not message.get("tool_calls")
    assert message["content"] == ANSWERS[kind].removesuffix("<|im_end|>")


def test_trl_and_the_rollout_agree_call_for_call() -> None:
    tok = read_tool_calls_as_envforge(_tokenizer())
    for text in [*CALLS.values(), *ANSWERS.values(), UNKNOWN_TOOL]:
        call = parse_tool_call(text.removesuffix("<|im_end|>"), ["get_car"])
        calls = _read(tok, text).get("tool_calls") or []
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == (
            [(call.name, call.arguments)] if call else []
        ), text


def test_trl_keeps_the_reader_when_it_sets_up_its_parsing() -> None:
    """`GRPOTrainer` installs its own reader when the tokenizer declares none: it must not replace
    envforge's, and a copy (trl deep-copies processing classes in places) keeps it too."""
    tok = read_tool_calls_as_envforge(_tokenizer())
    assert getattr(tok, "response_template", None) is not None  # trl's check for "already set"
    assert _read(copy.deepcopy(tok), CALLS["bare"]).get("tool_calls")
