"""Build a tiny random Qwen2/Llama-style model with a locally built tokenizer, saved as a HF model dir.

No weights can be downloaded here, and tests need a real model + real tokenizer that load through the
same `from_pretrained` path a user's `--model PATH` takes. A word-level tokenizer over a small corpus
keeps the vocabulary (and so the policy's action space) tiny, which is what makes learning tests
finish in seconds on a CPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from .trajectory import IM_END, IM_START

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<unk>", IM_START, IM_END]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
BASE_CORPUS = ["system user assistant tool", '{ } [ ] " : , . ( ) error Error', "true false null"]


def build_tokenizer(corpus: Iterable[str], *, base_corpus: bool = True) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer whose vocabulary is every word/punctuation run of `corpus` (plus chat roles
    and JSON punctuation when `base_corpus`)."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Whitespace()
    words: dict[str, None] = {}
    for text in [*(BASE_CORPUS if base_corpus else []), *corpus]:
        for word, _ in pre.pre_tokenize_str(text):
            words.setdefault(word, None)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    out_dir: str | Path,
    corpus: Iterable[str],
    *,
    arch: Literal["qwen2", "llama"] = "qwen2",
    hidden_size: int = 32,
    layers: int = 1,
    heads: int = 2,
    seed: int = 0,
    base_corpus: bool = True,
) -> Path:
    """Save a randomly initialised tiny causal LM and its tokenizer to `out_dir` and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(corpus, base_corpus=base_corpus)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
