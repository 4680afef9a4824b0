"""Text in, text out, from an export folder alone: manifest → tokenise → search → detokenise."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from s2s_deploy.runtime.errors import S2SError
from s2s_deploy.runtime.manifest import Manifest, load_manifest
from s2s_deploy.runtime.search import Hypothesis, SearchConfig, SearchEngine, StepLoop
from s2s_deploy.runtime.vocab import UNK, Vocabulary, split


@dataclass(frozen=True)
class Translation:
    source: str
    text: str
    score: float
    hypotheses: tuple[tuple[str, float], ...]


def encode_batch(texts: Sequence[str], vocab: Vocabulary, max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids (with EOS) and their lengths. Empty lines are the caller's to skip."""
    ids = [vocab.encode(text) for text in texts]
    for text, seq in zip(texts, ids, strict=True):
        if max_len is not None and len(seq) > max_len:
            raise S2SError(f"input of {len(seq)} tokens exceeds the model's limit of {max_len}: {text[:40]!r}")
    lengths = np.array([len(seq) for seq in ids], dtype=np.int64)
    batch = np.full((len(ids), int(lengths.max())), vocab.pad_id, dtype=np.int64)
    for row, seq in enumerate(ids):
        batch[row, : len(seq)] = seq
    return batch, lengths


def translate(
    engine: SearchEngine,
    texts: Sequence[str],
    src_vocab: Vocabulary,
    tgt_vocab: Vocabulary,
    config: SearchConfig,
    batch_size: int = 32,
    max_source_length: int | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[Translation]:
    """Sentences are batched by length for speed and returned in input order; ``on_batch`` hears
    how many sentences each batch finished (for a progress bar)."""
    check_inputs(texts)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    results: list[Translation | None] = [None] * len(texts)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src, src_len = encode_batch([texts[i] for i in chunk], src_vocab, max_source_length)
        for index, hyps in zip(chunk, engine.search(src, src_len, config), strict=True):
            results[index] = _translation(texts[index], hyps, tgt_vocab)
        if on_batch:
            on_batch(len(chunk))
    return [r for r in results if r is not None]


def check_inputs(texts: Sequence[str]) -> None:
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise S2SError(f"expected a list of sentences, got {type(texts).__name__}")
    if not texts:
        raise S2SError("no input to translate")
    for number, text in enumerate(texts, 1):
        if not isinstance(text, str):
            raise S2SError(f"input {number} is a {type(text).__name__}, not a str: {text!r:.40}")
        if not text.strip():
            raise S2SError(f"input {number} is empty")


def unknown_tokens(texts: Sequence[str], vocab: Vocabulary) -> Counter[str]:
    """Source tokens the vocabulary lacks: each silently becomes <unk>, so the user should hear of it."""
    found: Counter[str] = Counter()
    for text in texts:
        ids = vocab.encode(text, add_eos=False)
        if vocab.unk_id in ids:
            tokens = split(text, vocab.level)
            pairs = zip(tokens, ids, strict=True) if len(tokens) == len(ids) else ((UNK, i) for i in ids)
            found.update(token for token, i in pairs if i == vocab.unk_id and token != UNK)
    return found


def unknown_notice(found: Counter[str], level: str) -> str | None:
    """One line for stderr: how many tokens became <unk>, and which (most frequent first)."""
    if not found:
        return None
    unit = {"char": "characters", "word": "words"}.get(level, "tokens")
    shown = ", ".join(f"{token!r} x{count}" for token, count in found.most_common(10))
    more = f" and {len(found) - 10} more" if len(found) > 10 else ""
    return f"warning: {sum(found.values())} {unit} outside the model's vocabulary became <unk>: {shown}{more}"


def _translation(source: str, hyps: list[Hypothesis], vocab: Vocabulary) -> Translation:
    texts = tuple((vocab.decode(h.tokens), h.score) for h in hyps)
    return Translation(source, texts[0][0], texts[0][1], texts)


ENGINES = ("loop", "graph")


def default_search_config(manifest: Manifest, beam: int = 1, n_best: int = 1, max_len: int | None = None,
                          alpha: float | None = None, max_len_a: float | None = None,
                          max_len_b: int | None = None) -> SearchConfig:
    """A SearchConfig whose unset options come from the export: its length penalty, its position
    table's limit, and the relative length limit its training data measured (a loop guard)."""
    for name, value in (("beam", beam), ("n-best", n_best), ("max-len", max_len or 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise S2SError(f"{name} must be a whole number of at least 1, not {value!r}")
    if n_best > beam:
        raise S2SError(f"n-best {n_best} cannot exceed the beam size {beam}")
    if beam >= len(manifest.tgt_vocab):
        raise S2SError(f"beam {beam} must be smaller than the target vocabulary ({len(manifest.tgt_vocab)} tokens)")
    limit = manifest.max_target_length
    if max_len is not None and limit is not None and max_len > limit:
        raise S2SError(f"max-len {max_len} exceeds the model's limit of {limit} target tokens (its position table)")
    for name, value in (("alpha", alpha), ("max-len-a", max_len_a), ("max-len-b", max_len_b)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value < 0):
            raise S2SError(f"{name} must be a finite number >= 0, not {value!r}")
    defaults = manifest.raw.get("search", {})
    try:
        return SearchConfig(
            beam_size=beam, n_best=n_best, max_len=max_len or limit or 256,
            alpha=float(defaults.get("length_penalty_alpha", 0.75) if alpha is None else alpha),
            max_len_a=float(defaults.get("max_len_a", 0.0) if max_len_a is None else max_len_a),
            max_len_b=int(defaults.get("max_len_b", 0) if max_len_b is None else max_len_b),
        )
    except (TypeError, ValueError) as exc:
        raise S2SError(f"bad search options: {exc}") from exc


class Translator:
    """The embedding API: ``Translator("exported/transformer")(["..."], beam=4)``.

    ``engine="loop"`` runs the search in Python over the step decoder; ``engine="graph"`` makes one
    call per batch to the fused generate.onnx (``s2s-deploy fuse``). ``spin=False`` stops the step
    decoder's idle threads from spin-waiting, for a process that needs its cores between steps (serve)."""

    def __init__(self, export_dir: str | Path, device: str = "auto", threads: int | None = None,
                 engine: str = "loop", spin: bool = True) -> None:
        from s2s_deploy.runtime.ort_backend import OrtBackend

        if engine not in ENGINES:
            raise S2SError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
        self.manifest = load_manifest(export_dir)
        self.unknown: Counter[str] = Counter()  # source tokens outside the vocabulary, over this translator's life
        if engine == "graph":
            from s2s_deploy.runtime.graph_engine import GraphEngine

            self.engine: SearchEngine = GraphEngine(self.manifest, device=device, threads=threads)
            self.provider = self.engine.provider
            self.notice = f"onnxruntime: generate.onnx on {self.provider}"
        else:
            self.backend = OrtBackend(self.manifest, device=device, threads=threads, spin=spin)
            self.engine = StepLoop(self.backend)
            self.provider = self.backend.choice.provider
            self.notice = self.backend.choice.notice()

    def unknown_notice(self) -> str | None:
        return unknown_notice(self.unknown, self.manifest.src_vocab.level)

    def search_config(self, beam: int = 1, n_best: int = 1, max_len: int | None = None,
                      alpha: float | None = None, max_len_a: float | None = None,
                      max_len_b: int | None = None) -> SearchConfig:
        """Options left at None take the export's defaults (its manifest's ``search`` key)."""
        return default_search_config(self.manifest, beam, n_best, max_len, alpha, max_len_a, max_len_b)

    def __call__(self, texts: Sequence[str], beam: int = 1, n_best: int = 1, max_len: int | None = None,
                 alpha: float | None = None, batch_size: int = 32, max_len_a: float | None = None,
                 max_len_b: int | None = None) -> list[Translation]:
        if isinstance(texts, str):  # one sentence, not one per character
            texts = [texts]
        config = self.search_config(beam, n_best, max_len, alpha, max_len_a, max_len_b)
        manifest = self.manifest
        check_inputs(texts)
        self.unknown.update(unknown_tokens(texts, manifest.src_vocab))
        return translate(self.engine, texts, manifest.src_vocab, manifest.tgt_vocab, config, batch_size,
                         manifest.max_source_length)
