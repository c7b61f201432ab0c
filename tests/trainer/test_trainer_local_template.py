"""The packaged models train on their own chat template: the context token ids the trainer builds
for a system + user prompt are exactly those of the model's template (rendered and tokenized as the
model was trained).

The tokenizer is the one `envforge train --model local/NAME` uses: read from the packaged GGUF and
saved beside the dequantized weights (here into a temporary folder, without the weights, which take
minutes to dequantize), then loaded the way the trainer loads any model folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envforge.harness import assemble, cache_dir, model_for_spec
from envforge.trainer import SequenceBuilder, load_tokenizer

from support.skips import LOCAL_MODEL_MISSING, local_model_missing


def trainer_tokenizer(name: str, scratch: Path) -> Any:
    """The tokenizer of `local/NAME` as the trainer loads it: the dequantized folder's when it has
    been made, else the same tokenizer saved from the GGUF by the same call."""
    model = model_for_spec(f"local/{name}")
    folder = cache_dir() / "hf" / model.sha256
    if not (folder / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        gguf = assemble(model)
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(scratch))
        folder = scratch
    return load_tokenizer(folder)


@pytest.mark.skipif(local_model_missing(), reason=LOCAL_MODEL_MISSING)
@pytest.mark.parametrize("name", ["smollm2", "qwen2.5-coder-0.5b"])
def test_context_ids_match_the_models_chat_template(name: str, tmp_path: Path) -> None:
    tok = trainer_tokenizer(name, tmp_path)
    messages = [
        {"role": "system", "content": "Policy.\n\nTools:\n- get_car(car_id: string): Get one car."},
        {"role": "user", "content": "What is the daily rate cents of car V-601? Tell me the number."},
    ]
    builder = SequenceBuilder(tok)
    for m in messages:
        builder.add_message(m["role"], m["content"])
    builder.open_assistant()
    want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert builder.token_ids == list(want["input_ids"])


@pytest.mark.skipif(local_model_missing(), reason=LOCAL_MODEL_MISSING)
@pytest.mark.parametrize("name", ["smollm2", "qwen2.5-coder-0.5b"])
def test_a_tool_result_is_a_chatml_tool_turn_whatever_the_template(name: str, tmp_path: Path) -> None:
    """Qwen2.5's template writes a result as a user turn with `<tool_response>`; framed so, the
    packaged 0.5B model solved 1 of 120 held-out lookups against 5 of 120 as a `tool` turn, and
    ERPO's lookup figure learns from those few first successes (`tool_frame`'s docstring). The
    rollout keeps the `tool` turn, for every tokenizer, so the figure's start is not lost again."""
    tok = trainer_tokenizer(name, tmp_path)
    result = '{"car_id": "V-601", "daily_rate_cents": 3500}'
    builder = SequenceBuilder(tok)
    builder.add_message("tool", result)
    want = tok.encode(f"<|im_start|>tool\n{result}<|im_end|>\n", add_special_tokens=False)
    assert builder.token_ids == list(want)
    assert "tool_response" not in tok.decode(builder.token_ids)
