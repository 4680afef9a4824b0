"""Tokenisation that needs nothing but the manifest: the runtime and the trainer share it."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
LEVELS = ("char", "word")
_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


@dataclass(frozen=True)
class Vocabulary:
    """Specials sit at ids 0..3 in every vocabulary, so their ids are fixed by the format."""

    tokens: tuple[str, ...]
    level: str = "char"
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"unknown tokenisation level {self.level!r}; known: {', '.join(LEVELS)}")
        if tuple(self.tokens[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {' '.join(SPECIALS)}")
        if len(set(self.tokens)) != len(self.tokens):
            raise ValueError("a vocabulary has duplicate tokens")
        object.__setattr__(self, "_index", {t: i for i, t in enumerate(self.tokens)})

    @classmethod
    def build(cls, texts: Iterable[str], level: str = "char", min_count: int = 1) -> Vocabulary:
        counts = Counter(tok for text in texts for tok in split(text, level))
        kept = sorted(t for t, c in counts.items() if c >= min_count and t not in SPECIALS)
        return cls(SPECIALS + tuple(kept), level)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    @property
    def unk_id(self) -> int:
        return 3

    def encode(self, text: str, add_eos: bool = True) -> list[int]:
        ids = [self._index.get(tok, self.unk_id) for tok in split(text, self.level)]
        return [*ids, self.eos_id] if add_eos else ids

    def decode(self, ids: Iterable[int]) -> str:
        words = []
        for i in ids:
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            words.append(self.tokens[i] if 0 <= i < len(self.tokens) else UNK)
        return ("" if self.level == "char" else " ").join(words)

    def to_dict(self) -> dict:
        return {"level": self.level, "tokens": list(self.tokens)}

    @classmethod
    def from_dict(cls, data: dict) -> Vocabulary:
        return cls(tuple(data["tokens"]), data.get("level", "char"))


def split(text: str, level: str) -> list[str]:
    if level == "char":
        return list(text)
    return _WORD.findall(text)
