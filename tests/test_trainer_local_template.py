"""The packaged models train on their own chat template: the context token ids the trainer builds
for a system + user prompt are exactly those of the model's template (rendered and tokenized as the
model was trained), for the models whose dequantized folder is in the cache."""

from __future__ import annotations

import pytest

from envforge.harness import cache_dir, model_for_spec
from envforge.trainer import SequenceBuilder, load_tokenizer


@pytest.mark.parametrize("name", ["smollm2", "qwen2.5-coder-0.5b"])
def test_context_ids_match_the_models_chat_template(name: str) -> None:
    folder = cache_dir() / "hf" / model_for_spec(f"local/{name}").sha256
    if not (folder / "tokenizer_config.json").is_file():
        pytest.skip(f"local/{name} not dequantized here (envforge train --model local/{name} makes it)")
    tok = load_tokenizer(folder)
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
