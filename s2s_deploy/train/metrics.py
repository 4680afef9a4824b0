"""Translation quality: sacrebleu's corpus BLEU (the comparable figure), exact match (what a
deterministic task really asks for) and the seeds' own sentence BLEU (d2l ``bleu``)."""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Scores:
    bleu: float
    exact_match: float
    d2l_bleu: float
    count: int

    def summary(self) -> str:
        return (f"BLEU {self.bleu:.2f}, exact match {self.exact_match:.2%}, "
                f"d2l BLEU {self.d2l_bleu:.3f} (n={self.count})")


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a") -> float:
    """sacrebleu corpus BLEU (0..100) on detokenised text; ``tokenize="zh"`` for Chinese."""
    import sacrebleu  # here, so that training a model on a machine without sacrebleu imports this module

    _check_lengths(hypotheses, references)
    if not hypotheses:
        return 0.0
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=tokenize).score)


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Share (0..1) of hypotheses identical to their reference after stripping outer whitespace."""
    _check_lengths(hypotheses, references)
    if not hypotheses:
        return 0.0
    return sum(h.strip() == r.strip() for h, r in zip(hypotheses, references, strict=True)) / len(hypotheses)


def d2l_bleu(pred_tokens: Sequence[str], label_tokens: Sequence[str], k: int = 2) -> float:
    """The seeds' BLEU: exp(min(0, 1 - len_label/len_pred)) * prod_n p_n ** (1/2**n).

    The seeds divide by zero when the prediction is empty or shorter than ``n``; here an empty
    prediction scores 0 and ``k`` shrinks to the shorter sequence's length.
    """
    len_pred, len_label = len(pred_tokens), len(label_tokens)
    if len_pred == 0 or len_label == 0:
        return float(len_pred == len_label)
    score = math.exp(min(0.0, 1 - len_label / len_pred))
    for n in range(1, min(k, len_pred, len_label) + 1):
        label_subs: collections.Counter[tuple[str, ...]] = collections.Counter(
            tuple(label_tokens[i : i + n]) for i in range(len_label - n + 1)
        )
        matches = 0
        for i in range(len_pred - n + 1):
            gram = tuple(pred_tokens[i : i + n])
            if label_subs[gram] > 0:
                matches += 1
                label_subs[gram] -= 1
        score *= math.pow(matches / (len_pred - n + 1), math.pow(0.5, n))
    return score


def d2l_tokens(text: str, tokenize: str = "13a") -> list[str]:
    """Words split on spaces as the seeds do; characters for Chinese, which has no spaces."""
    return [ch for ch in text if not ch.isspace()] if tokenize == "zh" else text.split()


def mean_d2l_bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a", k: int = 2) -> float:
    _check_lengths(hypotheses, references)
    if not hypotheses:
        return 0.0
    pairs = zip(hypotheses, references, strict=True)
    total = sum(d2l_bleu(d2l_tokens(h, tokenize), d2l_tokens(r, tokenize), k) for h, r in pairs)
    return total / len(hypotheses)


def score(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a") -> Scores:
    return Scores(
        corpus_bleu(hypotheses, references, tokenize),
        exact_match(hypotheses, references),
        mean_d2l_bleu(hypotheses, references, tokenize),
        len(hypotheses),
    )


def _check_lengths(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")


def error_rate(hypotheses: Sequence[str], references: Sequence[str], unit: str = "word") -> float:
    """Word (``unit="word"``) or character error rate: edits (substitutions, insertions, deletions)
    summed over the corpus, divided by the references' total length, as jiwer's WER and CER are."""
    _check_lengths(hypotheses, references)
    edits = length = 0
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        hyp = hypothesis.split() if unit == "word" else list(hypothesis.strip())
        ref = reference.split() if unit == "word" else list(reference.strip())
        edits += _edit_distance(hyp, ref)
        length += len(ref)
    return edits / max(length, 1)


def _edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance, one row at a time (no edit-distance library is a dependency)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]
