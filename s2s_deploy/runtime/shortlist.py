"""A vocabulary shortlist read from CTranslate2's ``vmap`` format: opt-in, never exact.

A vmap file holds one rule a line: a source n-gram (tokens separated by spaces), a tab, then the
target tokens it allows (separated by spaces). The rule whose n-gram is empty (a line that
starts with the tab) lists tokens that are always allowed. As CTranslate2's ``VocabularyMap``
does, a sentence's candidates are the union of the targets of every n-gram of its source tokens
found in the file, the always-allowed ones, and the target's unk, bos and EOS; a target prefix's
ids join them too. Unlike CTranslate2 (which takes the union over the whole batch), the set is
each sentence's own, so a sentence's output does not depend on its batchmates. Each step's
log-probs outside the set become -inf and the rest are normalised again over the set, as the
restricted output layer's softmax normalises over it in CTranslate2.

Tokens are matched as vocabulary entries: a source token outside the source vocabulary can never
match (a rule naming one is kept, inert), and a target token outside the target vocabulary
counts as unk, as CTranslate2 maps it. A vocabulary entry holding a space (a character-level
vocabulary's " ") cannot be written in the format, whose separator is the space: the file writes
it as U+2581 (``▁``, SentencePiece's mark for a space) when the vocabulary has no ``▁`` entry of
its own. Imports numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import write_atomically
from s2s_deploy.format.vocab import Vocabulary

SPACE_MARK = "\u2581"
"""How a vmap file writes a vocabulary entry that is a space (``write_vmap`` and ``read_vmap``)."""


@dataclass(frozen=True)
class Shortlist:
    """Rules by source-id n-gram (the allowed target ids of each), the ids always allowed, and the
    target vocabulary's size."""

    rules: Mapping[tuple[int, ...], tuple[int, ...]]
    always: tuple[int, ...]
    vocab_size: int

    @property
    def longest(self) -> int:
        return max((len(key) for key in self.rules), default=0)

    def allowed(self, source: Sequence[int], prefix: Sequence[int] = ()) -> np.ndarray:
        """One sentence's allowed target ids (sorted): every matching n-gram's, the fixed ones, the prefix's."""
        found = set(self.always) | set(prefix)
        source = list(source)
        for n in range(1, self.longest + 1):
            for start in range(len(source) - n + 1):
                found.update(self.rules.get(tuple(source[start:start + n]), ()))
        return np.array(sorted(found), dtype=np.int64)

    def mask(self, src: np.ndarray, src_len: np.ndarray, prefixes: Sequence[Sequence[int]] = ()) -> np.ndarray:
        """(sentences, V) booleans: each sentence's allowed ids. ``prefixes``: none, or one per sentence."""
        mask = np.zeros((len(src_len), self.vocab_size), dtype=bool)
        for i, n in enumerate(src_len.tolist()):
            mask[i, self.allowed(src[i, :n].tolist(), prefixes[i] if prefixes else ())] = True
        return mask


def restrict(log_probs: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Each row's log-probs over its allowed ids, normalised again over them; -inf elsewhere."""
    out = np.where(allowed, log_probs, np.float32(-np.inf)).astype(np.float32)
    top = out.max(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        mass = np.log(np.exp(out - top).sum(axis=1, keepdims=True))
    return (out - (top + mass)).astype(np.float32)


def _index(vocab: Vocabulary) -> dict[str, int]:
    index = {token: i for i, token in enumerate(vocab.tokens)}
    if SPACE_MARK not in index and " " in index:
        index[SPACE_MARK] = index[" "]
    return index


def read_vmap(path: str | Path, src_vocab: Vocabulary, tgt_vocab: Vocabulary) -> Shortlist:
    """The shortlist of a vmap file, its tokens read through the export's vocabularies."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise S2SError(f"vmap file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise S2SError(f"cannot read the vmap file {path}: {exc}") from None
    sources, targets = _index(src_vocab), _index(tgt_vocab)
    unk = tgt_vocab.unk_id
    rules: dict[tuple[int, ...], tuple[int, ...]] = {}
    always = {i for i in (tgt_vocab.unk_id, tgt_vocab.bos_id, tgt_vocab.eos_id) if i is not None}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise S2SError(f"{path}:{number}: a vmap line is a source n-gram, a tab, then target tokens; "
                           f"this one has no tab")
        key, _, values = line.partition("\t")
        ids = [targets.get(token, unk) for token in values.split(" ") if token]
        allowed = tuple(sorted({i for i in ids if i is not None}))
        if not key:
            always.update(allowed)
            continue
        tokens = key.split(" ")
        if any(token not in sources for token in tokens):
            continue  # never in a source read through this vocabulary
        gram = tuple(sources[token] for token in tokens)
        rules[gram] = tuple(sorted({*rules.get(gram, ()), *allowed}))
    if not rules and len(always) <= 3:
        raise S2SError(f"{path} holds no rule whose source tokens are in this export's source vocabulary")
    return Shortlist(MappingProxyType(rules), tuple(sorted(always)), len(tgt_vocab))


def write_vmap(path: str | Path, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], src_vocab: Vocabulary,
               tgt_vocab: Vocabulary, per_token: int = 20, always: int = 0) -> int:
    """A vmap built from parallel id sequences: for each source token, the ``per_token`` target
    tokens that most often share a sentence pair with it, ranked by how often they do over how
    often the target token occurs at all (so the common ones do not fill every list); ``always``:
    the most frequent target tokens, on the empty n-gram's line. Special ids are left out (a
    reader adds unk, bos and EOS itself). Returns the number of rules written."""
    specials = {i for i in (*src_vocab.special_ids().values(), *tgt_vocab.special_ids().values()) if i is not None}
    together: dict[int, dict[int, int]] = {}
    target_count: dict[int, int] = {}
    for source, target in pairs:
        kept = set(target) - specials
        for t in kept:
            target_count[t] = target_count.get(t, 0) + 1
        for s in set(source) - specials:
            row = together.setdefault(s, {})
            for t in kept:
                row[t] = row.get(t, 0) + 1

    def spelled(vocab: Vocabulary, i: int) -> str:
        token = vocab.tokens[i]
        return SPACE_MARK if token == " " and SPACE_MARK not in vocab.tokens else token

    lines = []
    if always:
        common = sorted(target_count, key=lambda t: (-target_count[t], t))[:always]
        lines.append("\t" + " ".join(spelled(tgt_vocab, t) for t in common))
    for s in sorted(together):
        row = together[s]
        best = sorted(row, key=lambda t: (-row[t] * row[t] / target_count[t], t))[:per_token]
        lines.append(spelled(src_vocab, s) + "\t" + " ".join(spelled(tgt_vocab, t) for t in best))
    bad = [line.split("\t")[0] for line in lines if any(c in line.split("\t")[0] for c in " \n")]
    if bad:
        raise S2SError(f"source token {bad[0]!r} holds a space: the vmap format cannot write it")
    write_atomically(Path(path), ("\n".join(lines) + "\n").encode("utf-8"))  # never half a vmap
    return len(lines) - (1 if always else 0)
