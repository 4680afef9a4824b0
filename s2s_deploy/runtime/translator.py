"""Text in, text out, from an export folder alone: manifest → tokenise → search → detokenise."""

from __future__ import annotations

import math
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
) -> list[Translation]:
    """Sentences are batched by length for speed and returned in input order."""
    check_inputs(texts)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    results: list[Translation | None] = [None] * len(texts)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src, src_len = encode_batch([texts[i] for i in chunk], src_vocab, max_source_length)
        for index, hyps in zip(chunk, engine.search(src, src_len, config), strict=True):
            results[index] = _translation(texts[index], hyps, tgt_vocab)
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


def _translation(source: str, hyps: list[Hypothesis], vocab: Vocabulary) -> Translation:
    texts = tuple((vocab.decode(h.tokens), h.score) for h in hyps)
    return Translation(source, texts[0][0], texts[0][1], texts)


ENGINES = ("loop", "graph")
MAX_DECODE = 1 << 16  # the step loop keeps (rows, max_len) arrays: a typo must not allocate gigabytes


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
        for name, value in (("beam", beam), ("n-best", n_best), ("max-len", max_len or 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise S2SError(f"{name} must be a whole number of at least 1, not {value!r}")
        if n_best > beam:
            raise S2SError(f"n-best {n_best} cannot exceed the beam size {beam}")
        if beam >= len(manifest.tgt_vocab):
            raise S2SError(f"beam {beam} must be smaller than the target vocabulary ({len(manifest.tgt_vocab)} tokens)")
        limit = manifest.max_target_length
        if max_len is not None and max_len > MAX_DECODE:
            raise S2SError(f"max-len {max_len} is over the {MAX_DECODE} tokens this runtime decodes")
        if max_len is not None and limit is not None and max_len > limit:
            raise S2SError(f"max-len {max_len} exceeds the model's limit of {limit} target tokens "
                           "(its position table)")
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
                                  or not math.isfinite(alpha) or alpha < 0):
            raise S2SError(f"alpha must be a finite number >= 0, not {alpha!r}")
        return SearchConfig(
            beam_size=beam, n_best=n_best, max_len=max_len or limit or 256,
            alpha=manifest.raw["search"]["length_penalty_alpha"] if alpha is None else float(alpha),
        )

    def __call__(self, texts: Sequence[str], beam: int = 1, n_best: int = 1, max_len: int | None = None,
                 alpha: float | None = None, batch_size: int = 32) -> list[Translation]:
        if isinstance(texts, str):  # one sentence, not one per character
            texts = [texts]
        config = self.search_config(beam, n_best, max_len, alpha)
        manifest = self.manifest
        return translate(self.engine, texts, manifest.src_vocab, manifest.tgt_vocab, config, batch_size,
                         manifest.max_source_length)
