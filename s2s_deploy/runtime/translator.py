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
    if not texts:
        raise S2SError("no input to translate")
    for number, text in enumerate(texts, 1):
        if not text.strip():
            raise S2SError(f"input {number} is empty")


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

    def search_config(self, beam: int | None = None, n_best: int = 1, max_len: int | None = None,
                      alpha: float | None = None) -> SearchConfig:
        """Options not given come from the manifest's ``search`` defaults (the model's own, for a
        Hugging Face export), then from the generic ones."""
        manifest = self.manifest
        defaults = manifest.raw.get("search", {})
        beam = beam or int(defaults.get("beam_size", 1))
        if n_best > beam:
            raise S2SError(f"n-best {n_best} cannot exceed the beam size {beam}")
        max_len = max_len or defaults.get("max_len") or manifest.max_target_length or 256
        default_alpha = defaults.get("alpha", defaults.get("length_penalty_alpha", 0.75))
        return SearchConfig(
            beam_size=beam, n_best=n_best, max_len=int(max_len), alpha=default_alpha if alpha is None else alpha,
            min_len=min(int(defaults.get("min_len", 0)), int(max_len)),
        )

    def __call__(self, texts: Sequence[str], beam: int | None = None, n_best: int = 1, max_len: int | None = None,
                 alpha: float | None = None, batch_size: int = 32) -> list[Translation]:
        config = self.search_config(beam, n_best, max_len, alpha)
        manifest = self.manifest
        return translate(self.engine, texts, manifest.src_vocab, manifest.tgt_vocab, config, batch_size,
                         manifest.max_source_length)
