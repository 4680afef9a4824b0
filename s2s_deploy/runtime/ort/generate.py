"""Decoding with ``generate.onnx``: the whole search of a batch in one ONNX Runtime call.

Returns the same ``Hypothesis`` lists as ``search.search`` with ``OrtBackend``, so a caller
can switch engines without other changes. Needs numpy and onnxruntime only (no torch, no onnx).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import GenerateEntry, Manifest, sha256_of
from s2s_deploy.runtime.decoding import SearchConfig, prefixes_of
from s2s_deploy.runtime.options import options_on
from s2s_deploy.runtime.ort.backend import CUDA, create_session
from s2s_deploy.runtime.search import Hypothesis, normalised


def generate_entry(manifest: Manifest) -> GenerateEntry:
    """The manifest's ``graphs.generate`` entry, or a hint to run ``s2s-deploy fuse``."""
    entry = manifest.generate
    if entry is None:
        raise S2SError(f"{manifest.directory} has no generate.onnx: run `s2s-deploy fuse {manifest.directory}`")
    return entry


def generate_feeds(src: np.ndarray, src_len: np.ndarray, config: SearchConfig, beam: bool) -> dict[str, np.ndarray]:
    """The inputs of generate.onnx for one batch and search configuration."""
    feeds = {
        "src": np.ascontiguousarray(src, dtype=np.int64),
        "src_len": np.ascontiguousarray(src_len, dtype=np.int64),
        "max_len": np.array(config.max_len, dtype=np.int64),
        "min_len": np.array(config.min_len, dtype=np.int64),
        "alpha": np.array(config.alpha, dtype=np.float32),
    }
    if beam:
        feeds["beam_size"] = np.array(config.beam_size, dtype=np.int64)
        feeds["n_best"] = np.array(config.n_best, dtype=np.int64)
    return feeds


def option_feeds(config: SearchConfig, unk_id: int) -> dict[str, np.ndarray]:
    """The inputs of a generate.onnx fused with ``--options``; S2SError for an option that only
    the step loop runs (docs/generate.md says why)."""
    prefixes = prefixes_of(config)
    loop_only = {
        "sampling": config.sampling_topk != 1, "repetition_penalty": config.repetition_penalty != 1.0,
        "no_repeat_ngram_size": config.no_repeat_ngram_size > 0,
        "encoder_no_repeat_ngram_size": config.encoder_no_repeat_ngram_size > 0,
        "bad_words_ids of several tokens": any(len(w) > 1 for w in config.bad_words_ids),
        "per-sentence prefixes": len(prefixes) > 1, "begin_suppress_tokens": bool(config.begin_suppress_tokens),
        "timestamps": config.timestamps, "a vmap shortlist": config.vmap is not None,
    }
    asked = [name for name, on in loop_only.items() if on]
    if asked:
        raise S2SError(f"generate.onnx does not carry {asked[0]}: use the step loop (engine 'loop')")
    suppressed = {*config.suppress_tokens, *(w[0] for w in config.bad_words_ids)} | ({unk_id} if config.disable_unk
                                                                                      else set())
    return {
        "suppress_tokens": np.array(sorted(suppressed), dtype=np.int64),
        "prefix": np.array(prefixes[0] if prefixes else (), dtype=np.int64),
        "forced_eos": np.array(config.forced_eos),
        "forced_bos": np.array(config.forced_bos, dtype=np.int64),
    }


def hypotheses(outputs: dict[str, np.ndarray], eos_id: int, config: SearchConfig) -> list[list[Hypothesis]]:
    """generate.onnx outputs -> the n-best ``Hypothesis`` lists ``search()`` returns.

    Scores are recomputed in float64 from the per-token log-probs, exactly as search.py
    does, so they match it to the bit rather than to float32."""
    tokens, lengths, lps = outputs["tokens"], outputs["lengths"], outputs["token_log_probs"]
    results = []
    for row_tokens, row_lengths, row_lps in zip(tokens, lengths, lps, strict=True):
        found = []
        for ids, length, logs in zip(row_tokens, row_lengths, row_lps, strict=True):
            n = int(length)
            if n == 0:
                continue  # an empty slot: fewer hypotheses than beams
            finished = bool(ids[n - 1] == eos_id)
            values = tuple(float(x) for x in logs[:n])
            body = tuple(int(x) for x in ids[: n - 1 if finished else n])
            found.append(Hypothesis(body, values, float(normalised(sum(values), n, config.alpha)), finished))
        results.append(sorted(found, key=lambda h: -h.score)[: config.n_best])
    return results


class GraphEngine:
    """Runs an export's generate.onnx; ``search(src, src_len, config)`` mirrors ``search.search``."""

    name = "onnxruntime-generate"

    def __init__(self, manifest: Manifest, device: str = "auto", threads: int | None = None,
                 verify_hash: bool = True) -> None:
        entry = generate_entry(manifest)
        path = manifest.directory / entry.file
        if not path.is_file():
            raise S2SError(f"{path} is missing")
        if verify_hash and sha256_of(path) != entry.sha256:
            raise S2SError(f"{path} does not match the sha256 in the manifest (modified or corrupt)")
        self.manifest = manifest
        self.path = Path(path)
        self.beam = entry.beam
        self.options = bool(entry.options)
        self.session = create_session(path, device, threads)
        self.provider = self.session.get_providers()[0]
        self.device = "cuda" if self.provider == CUDA else "cpu"
        self.eos_id = manifest.eos_id
        self.vocab_size = len(manifest.tgt_vocab)
        self.runtime_seconds = 0.0

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "provider": self.provider, "onnxruntime": ort.__version__,
                "search": "beam" if self.beam else "greedy"}

    def search(self, src: np.ndarray, src_len: np.ndarray, config: SearchConfig) -> list[list[Hypothesis]]:
        """n-best hypotheses per sentence, best first; tokens exclude the start token and EOS."""
        if config.speculative:
            raise S2SError(f"speculative decoding runs in the step loop, not in {self.path.name}: use the step engine")
        if config.beam_size > 1 and not self.beam:
            raise S2SError(f"{self.path.name} was fused with --greedy-only; beam size must be 1")
        if config.beam_size >= self.vocab_size:
            raise ValueError(f"beam size {config.beam_size} must be smaller than the vocabulary ({self.vocab_size})")
        limits = config.sentence_limits(src_len)
        if limits is None:
            return self._run(src, src_len, config)
        # The fused Loop takes one max_len per call: sentences of one limit go together, which
        # gives each the search it gets in the step loop (a sentence's search ignores its batchmates).
        results: list[list[Hypothesis]] = [[] for _ in range(src.shape[0])]
        for limit in np.unique(limits).tolist():
            rows = np.nonzero(limits == limit)[0]
            found = self._run(src[rows], src_len[rows], replace(config, max_len=limit, max_len_a=0.0, max_len_b=0))
            for row, hyps in zip(rows.tolist(), found, strict=True):
                results[row] = hyps
        return results

    def _run(self, src: np.ndarray, src_len: np.ndarray, config: SearchConfig) -> list[list[Hypothesis]]:
        started = time.perf_counter()
        feeds = generate_feeds(src, src_len, config, self.beam)
        if config.decoder_prompt or config.prompt:
            raise S2SError(f"{self.path.name} starts from the start token alone, not a prompt or decoder prompt: use "
                           "the step loop (engine 'loop')")
        if config.early_stopping is not False and config.beam_size > 1:
            raise S2SError(f"{self.path.name} stops beam search as early_stopping=false does, not "
                           f"{config.early_stopping!r}: use the step loop (engine 'loop')")
        if self.options:
            feeds.update(option_feeds(config, self.manifest.tgt_vocab.unk_id))
            if "forced_bos" not in {i.name for i in self.session.get_inputs()}:  # fused before it was an input
                if config.forced_bos >= 0:
                    raise S2SError(f"{self.path.name} predates forced_bos: run `s2s-deploy fuse --options` again, "
                                   "or use the step loop (engine 'loop')")
                del feeds["forced_bos"]
        elif options_on(config):
            raise S2SError(f"{self.path.name} carries no decoding options: run `s2s-deploy fuse --options`, "
                           "or use the step loop (engine 'loop')")
        values = self.session.run(None, feeds)
        self.runtime_seconds += time.perf_counter() - started
        names = [o.name for o in self.session.get_outputs()]
        return hypotheses(dict(zip(names, values, strict=True)), self.eos_id, config)
