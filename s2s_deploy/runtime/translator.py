"""Text in, text out, from an export folder alone: manifest → tokenise → search → detokenise."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from s2s_deploy.runtime.errors import S2SError
from s2s_deploy.runtime.manifest import load_manifest
from s2s_deploy.runtime.search import Hypothesis, SearchConfig, SearchEngine, StepLoop
from s2s_deploy.runtime.vocab import Vocabulary


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
    return pad_ids(ids, vocab.pad_id)


def pad_ids(ids: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows right-padded with ``pad_id``, and their lengths."""
    lengths = np.array([len(seq) for seq in ids], dtype=np.int64)
    batch = np.full((len(ids), int(lengths.max())), pad_id, dtype=np.int64)
    for row, seq in enumerate(ids):
        batch[row, : len(seq)] = seq
    return batch, lengths


def search_ids(engine: SearchEngine, ids: Sequence[Sequence[int]], pad_id: int, config: SearchConfig,
               batch_size: int = 32) -> list[list[Hypothesis]]:
    """n-best hypotheses per row of source ids, batched by length, in input order."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    results: list[list[Hypothesis]] = [[] for _ in ids]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src, src_len = pad_ids([ids[i] for i in chunk], pad_id)
        for index, hyps in zip(chunk, engine.search(src, src_len, config), strict=True):
            results[index] = hyps
    return results


def translate(
    engine: SearchEngine,
    texts: Sequence[str],
    src_vocab: Vocabulary,
    tgt_vocab: Vocabulary,
    config: SearchConfig,
    batch_size: int = 32,
    max_source_length: int | None = None,
) -> list[Translation]:
    """Sentences are batched by length for speed and returned in input order."""
    check_inputs(texts)
    ids = [src_vocab.encode(text) for text in texts]
    for text, seq in zip(texts, ids, strict=True):
        if max_source_length is not None and len(seq) > max_source_length:
            raise S2SError(f"input of {len(seq)} tokens exceeds the model's limit of {max_source_length}: "
                           f"{text[:40]!r}")
    results = search_ids(engine, ids, src_vocab.pad_id, config, batch_size)
    return [_translation(text, hyps, tgt_vocab) for text, hyps in zip(texts, results, strict=True)]


def check_inputs(texts: Sequence[str]) -> None:
    if not texts:
        raise S2SError("no input to translate")
    for number, text in enumerate(texts, 1):
        if not text.strip():
            raise S2SError(f"input {number} is empty")


def check_ids(ids: Sequence[Sequence[int]], vocab_size: int, max_len: int | None = None,
              first_number: int = 1) -> list[list[int]]:
    """Rows of source ids as plain ints, refused unless each is non-empty, in range and within the limit."""
    if not ids:
        raise S2SError("no input to translate")
    rows = []
    for number, row in enumerate(ids, first_number):
        try:
            values = [int(i) for i in row]
        except (TypeError, ValueError) as exc:
            raise S2SError(f"input {number} holds a non-integer id: {exc}") from exc
        if not values:
            raise S2SError(f"input {number} is empty")
        bad = [i for i in values if not 0 <= i < vocab_size]
        if bad:
            raise S2SError(f"input {number} holds id {bad[0]}, outside the source vocabulary of {vocab_size}")
        if max_len is not None and len(values) > max_len:
            raise S2SError(f"input {number} has {len(values)} ids, over the model's limit of {max_len}")
        rows.append(values)
    return rows


def parse_ids(line: str, number: int) -> list[int]:
    """A line of whitespace-separated ids (``translate --ids``)."""
    try:
        return [int(word) for word in line.split()]
    except ValueError:
        raise S2SError(f"input {number} is not whitespace-separated integer ids: {line[:40]!r}") from None


def _translation(source: str, hyps: list[Hypothesis], vocab: Vocabulary) -> Translation:
    texts = tuple((vocab.decode(h.tokens), h.score) for h in hyps)
    return Translation(source, texts[0][0], texts[0][1], texts)


ENGINES = ("loop", "graph")


class Translator:
    """The embedding API: ``Translator("exported/transformer")(["..."], beam=4)``.

    ``engine="loop"`` runs the search in Python over the step decoder; ``engine="graph"`` makes one
    call per batch to the fused generate.onnx (``s2s-deploy fuse``)."""

    def __init__(self, export_dir: str | Path, device: str = "auto", threads: int | None = None,
                 engine: str = "loop") -> None:
        from s2s_deploy.runtime.ort_backend import OrtBackend

        if engine not in ENGINES:
            raise S2SError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
        self.manifest = load_manifest(export_dir)
        if engine == "graph":
            from s2s_deploy.runtime.graph_engine import GraphEngine

            self.engine: SearchEngine = GraphEngine(self.manifest, device=device, threads=threads)
            self.notice = f"onnxruntime: generate.onnx on {self.engine.provider}"
        else:
            self.backend = OrtBackend(self.manifest, device=device, threads=threads)
            self.engine = StepLoop(self.backend)
            self.notice = self.backend.choice.notice()

    def search_config(self, beam: int = 1, n_best: int = 1, max_len: int | None = None,
                      alpha: float | None = None) -> SearchConfig:
        manifest = self.manifest
        if n_best > beam:
            raise S2SError(f"n-best {n_best} cannot exceed the beam size {beam}")
        return SearchConfig(
            beam_size=beam, n_best=n_best, max_len=max_len or manifest.max_target_length or 256,
            alpha=manifest.raw["search"]["length_penalty_alpha"] if alpha is None else alpha,
        )

    def __call__(self, texts: Sequence[str], beam: int = 1, n_best: int = 1, max_len: int | None = None,
                 alpha: float | None = None, batch_size: int = 32) -> list[Translation]:
        config = self.search_config(beam, n_best, max_len, alpha)
        manifest = self.manifest
        return translate(self.engine, texts, manifest.src_vocab, manifest.tgt_vocab, config, batch_size,
                         manifest.max_source_length)

    def translate_ids(self, ids: Sequence[Sequence[int]], beam: int = 1, n_best: int = 1,
                      max_len: int | None = None, alpha: float | None = None,
                      batch_size: int = 32) -> list[list[Hypothesis]]:
        """For applications that tokenise themselves: each row is the encoder's input as it stands
        (``manifest.src_vocab.encode(text)`` frames it with the prefix and EOS suffix), and each
        hypothesis's ``tokens`` are target ids without the start token and EOS."""
        config = self.search_config(beam, n_best, max_len, alpha)
        manifest = self.manifest
        rows = check_ids(ids, len(manifest.src_vocab), manifest.max_source_length)
        return search_ids(self.engine, rows, manifest.src_vocab.pad_id, config, batch_size)
