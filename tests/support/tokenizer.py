"""An exact, reversible tokenizer for scripted generation backends: no model files, no spaces added."""

from __future__ import annotations

import re

EOS = 0


class ChunkTokenizer:
    """Words, single spaces/newlines and punctuation get ids as first seen (0 is EOS).

    Decoding concatenates, so tool-call JSON survives exactly (a word-level HF tokenizer would put
    spaces inside it), and sequences stay a few times shorter than bytes, which keeps the learner's
    forward passes cheap.
    """

    CHUNK = re.compile(r"\w+|\s|[^\w\s]")

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.words: list[str] = ["<eos>"]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = []
        for piece in self.CHUNK.findall(text):
            if piece not in self.vocab:
                self.vocab[piece] = len(self.words)
                self.words.append(piece)
            ids.append(self.vocab[piece])
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.words[i] for i in ids if i != EOS)

    def convert_tokens_to_ids(self, token: str) -> int:
        return EOS
