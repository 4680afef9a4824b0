"""Tokenizer parity: the export's own text in and text out against ``transformers``' tokenizer.

``parity --reference`` compares the search over the same ids; the tokenizer decides which ids a
user's text becomes and what text the output ids read as, and is where a deployment silently
loses quality (a normalisation rule, a missing language prefix, a space dropped before
punctuation). This checks, on ``SAMPLE`` (or the user's ``--input`` lines), that the export's
source ids equal ``AutoTokenizer(DIR)(text)["input_ids"]`` exactly, and that its detokenised text
equals ``tokenizer.decode(ids, skip_special_tokens=True)`` on ``generate``'s own outputs and on
seeded random id streams. The first difference of each kind is reported with both sides.
"""

from __future__ import annotations

import random
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from s2s_deploy.export.hf import UNUSED
from s2s_deploy.export.hf_tokenizer import load_auto_tokenizer
from s2s_deploy.format.manifest import Manifest
from s2s_deploy.format.vocab import SUBWORD_LEVELS, Vocabulary

_NFC_NFD = "Ça brûle, Åsa und Ämter; naïve café résumé"
SAMPLE: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! Isn't it a \"nice\" day? (Yes: it's 20 °C.)",
    "Żółć gęślą jaźń; Ærøskøbing; São Paulo, Señor Núñez, Dvořák, İstanbul.",
    "Der Straßenverkehr in Köln ist öffentlich geregelt.",
    _NFC_NFD,
    unicodedata.normalize("NFD", _NFC_NFD),
    "東京は日本の首都です。北京是中国的首都。",
    "서울은 한국의 수도입니다.",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε.",
    "I ❤️ emoji: 👍🏽 👨‍👩‍👧‍👦 🇫🇷 😀!",
    "Numbers: 1,234,567.89 and 1.234.567,89 and 12 345; 3.14159; 10^6; -42; 007.",
    "Dates 2024-03-15, 15/03/2024, times 09:30:00, phone +1 (555) 123-4567.",
    "Visit https://example.com/path?q=1&lang=en#top or mail someone@example.org.",
    "Repeated   spaces    here,  and a trailing space ",
    " leading space and\ttabs\tinside\ta line",
    "a line\nwith a newline and \r\n a carriage return",
    "zero\u200bwidth\u200cnon\u200djoiner and the BOM\ufeffhere",
    "Ligatures ﬁ ﬂ, full-width ＡＢＣ１２３, superscript x² and ½.",
    "Quotes ‘single’ “double” «guillemets» „low“ — dashes – and … ellipsis.",
    "UPPER lower MiXeD CaSe",
    "can't won't I'm you're they've it's don't",
    "end with punctuation . , ; : ! ? ...",
    "a",
    "",
)
"""The built-in multilingual sample: Latin with diacritics, NFC and NFD forms of the same text,
CJK, Hangul, Thai, Arabic, Hebrew, Devanagari, Cyrillic, Greek, emoji (with ZWJ sequences and
skin tones), digits with separators, URLs, repeated spaces, tabs and newlines inside a line,
zero-width characters, compatibility forms, typographic punctuation and English contractions."""

RANDOM_STREAMS = 64
RANDOM_SEED = 0


@dataclass(frozen=True)
class TokenizerMismatch:
    """The first text (or id stream) where the export and transformers disagree."""

    what: str  # "source ids" or "detokenised"
    text: str
    ours: object
    theirs: object

    def line(self) -> str:
        return f"{self.what} differ on {self.text!r}: ours {self.ours!r}, transformers {self.theirs!r}"


@dataclass(frozen=True)
class TokenizerReport:
    """Counts of the checked texts and id streams, and the first mismatch of each kind."""

    encoded: int
    encoded_identical: int
    decoded: int
    decoded_identical: int
    mismatches: tuple[TokenizerMismatch, ...]
    skipped: str | None = None  # why nothing was checked

    @property
    def passed(self) -> bool:
        return self.skipped is not None or (self.encoded_identical == self.encoded
                                            and self.decoded_identical == self.decoded)

    def lines(self) -> list[str]:
        """What ``parity`` prints: the counts and verdict, then the first mismatch of each kind."""
        if self.skipped is not None:
            return [f"tokenizer vs transformers: not checked ({self.skipped})"]
        verdict = "ok" if self.passed else "FAIL"
        encoded = f"source ids identical {self.encoded_identical}/{self.encoded}, " if self.encoded else ""
        return [f"tokenizer vs transformers: {encoded}detokenised identical {self.decoded_identical}/"
                f"{self.decoded} {verdict}", *(f"  {m.line()}" for m in self.mismatches)]

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "skipped": self.skipped, "encoded": self.encoded,
                "encoded_identical": self.encoded_identical, "decoded": self.decoded,
                "decoded_identical": self.decoded_identical,
                "mismatches": [{"what": m.what, "text": m.text, "ours": m.ours, "transformers": m.theirs}
                               for m in self.mismatches]}


def check_tokenizer(tokenizer: Any, source: Vocabulary | None, target: Vocabulary, texts: Sequence[str],
                    outputs: Sequence[Sequence[int]], streams: int = RANDOM_STREAMS,
                    seed: int = RANDOM_SEED) -> TokenizerReport:
    """``source`` (None for an encoder that reads features) encodes each of ``texts`` as
    ``tokenizer`` does; ``target`` decodes each of ``outputs`` (``generate``'s tokens) and
    ``streams`` seeded random id streams as ``tokenizer.decode(ids, skip_special_tokens=True)``
    does. A stream stops before EOS (where the runtime stops) and draws from the ids both know
    (not the model's spare rows past the tokenizer's, named ``UNUSED``, nor hidden ids)."""
    if target.level not in SUBWORD_LEVELS:
        return TokenizerReport(0, 0, 0, 0, (), skipped="the export reads and writes ids (no tokenizer files)")
    mismatches: list[TokenizerMismatch] = []
    encoded = same_encoded = 0
    if source is not None and source.level in SUBWORD_LEVELS:
        for text in texts:
            ours = source.encode(text)
            theirs = list(tokenizer(text)["input_ids"])
            encoded += 1
            if ours == theirs:
                same_encoded += 1
            elif not any(m.what == "source ids" for m in mismatches):
                mismatches.append(TokenizerMismatch("source ids", text, ours, theirs))
    rng = random.Random(seed)
    # hidden ids (Whisper's timestamps) are never text: how text is cut around them is the family's own
    # rule, held to its real tokenizer elsewhere (tests/test_hf_whisper_tokenizer.py), not a generic one's
    ordinary = [i for i, token in enumerate(target.tokens)
                if i != target.eos_id and i not in target.hidden and not token.startswith(UNUSED)]
    random_ids = [[rng.choice(ordinary) for _ in range(rng.randint(1, 24))] for _ in range(streams)]
    decoded = same_decoded = 0
    cut = [list(row[: list(row).index(target.eos_id)] if target.eos_id in row else row) for row in outputs]
    for ids in [*cut, *random_ids]:
        ours = target.decode(ids)
        theirs = tokenizer.decode(ids, skip_special_tokens=True)
        decoded += 1
        if ours == theirs:
            same_decoded += 1
        elif not any(m.what == "detokenised" for m in mismatches):
            mismatches.append(TokenizerMismatch("detokenised", repr(ids), ours, theirs))
    return TokenizerReport(encoded, same_encoded, decoded, same_decoded, tuple(mismatches))


def check_reference_tokenizer(directory: str | Path, manifest: Manifest, outputs: Sequence[Sequence[int]],
                              texts: Sequence[str] | None = None) -> TokenizerReport:
    """``check_tokenizer`` against the tokenizer transformers loads from the reference folder:
    the user's ``texts`` (``--input``) or ``SAMPLE`` with the export's stored samples, and
    ``generate``'s ``outputs``. Skipped (with the reason) where the folder holds no tokenizer."""
    failures: list[str] = []
    tokenizer = load_auto_tokenizer(Path(directory), failures)
    if tokenizer is None:
        because = f": {failures[-1]}" if failures else ""
        return TokenizerReport(0, 0, 0, 0, (), skipped=f"transformers loads no tokenizer from {directory}{because}")
    source = None if manifest.encoder_input.is_features else manifest.src_vocab
    checked = list(texts) if texts is not None else [*SAMPLE, *manifest.samples]
    return check_tokenizer(tokenizer, source, manifest.tgt_vocab, checked, outputs)
