#!/usr/bin/env python3
"""A standalone client for s2s-deploy exports, written from docs/manifest.md alone.

It needs numpy and onnxruntime only (plus `sentencepiece` or `tokenizers` for exports whose
vocabulary level needs them), never s2s_deploy, and aims to print exactly what
`s2s-deploy translate DIR TEXT...` prints, with the same decoding options:

    python examples/python/manifest_client.py exported/gru "Wednesday 17 July 4396" --beam 4 --n-best 4 --scores

Every rule below is the document's: its "Running an export", "Search, exactly", "Resolving the options"
and "Decoding options" sections.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

KNOWN_FORMATS = {"s2s-deploy-manifest/2", "s2s-deploy-manifest/3", "s2s-deploy-manifest/4",
                 "s2s-deploy-manifest/5", "s2s-deploy-manifest/6", "s2s-deploy-manifest/7",
                 "s2s-deploy-manifest/8"}
NEG_INF = float("-inf")
HARD_MAX = 65536


class Refused(Exception):
    """A one-line refusal, as the CLI gives."""


# ----------------------------------------------------------------------------- the folder


def _inside(folder: str, name: str) -> str:
    """A file the manifest names: a plain name that resolves inside the folder."""
    if os.path.isabs(name):
        raise Refused(f"{name!r} is not inside the export folder")
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, path]) != root:
        raise Refused(f"{name!r} is not inside the export folder")
    return path


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _verified(folder: str, name: str, sha: str, what: str) -> str:
    path = _inside(folder, name)
    if not os.path.isfile(path):
        raise Refused(f"{what}: {name} is missing")
    if _sha256(path) != sha:
        raise Refused(f"{what}: {name} does not match its sha256")
    return path


# ----------------------------------------------------------------------------- vocabularies

WORD_RE = re.compile(r"\w+|[^\w\s]")


class Moses:
    """The `moses` level's steps, as docs/manifest.md lists them (sacremoses, imported only for this level)."""

    def __init__(self, spec: dict):
        import sacremoses

        self.lang, self.lower_case = spec["lang"], bool(spec.get("lower_case", False))
        self.ranks = {(a, b): rank for rank, (a, b) in enumerate(spec["merges"])}
        self.normalizer = sacremoses.MosesPunctNormalizer(lang=self.lang, pre_replace_unicode_punct=True,
                                                          post_remove_control_chars=True)
        self.tokenizer = sacremoses.MosesTokenizer(lang=self.lang)
        self.detokenizer = sacremoses.MosesDetokenizer(lang=self.lang)

    def pieces(self, text: str) -> list[str]:
        if self.lower_case:
            text = text.lower()
        words = self.tokenizer.tokenize(self.normalizer.normalize(text), aggressive_dash_splits=True,
                                        return_str=False, escape=True)
        return [piece for word in words if word for piece in self.bpe(word)]

    def bpe(self, word: str) -> list[str]:
        parts = [*word[:-1], word[-1] + "</w>"]
        while True:
            ranked = [self.ranks[pair] for pair in itertools.pairwise(parts) if pair in self.ranks]
            if not ranked:
                return parts
            best = min(ranked)
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and self.ranks.get((parts[i], parts[i + 1])) == best:
                    out.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            parts = out

    def text(self, pieces: list[str]) -> str:
        return self.detokenizer.detokenize("".join(p.replace(" ", "").replace("</w>", " ") for p in pieces).split())


class Vocab:
    def __init__(self, spec: dict, folder: str, fallback_special: dict | None):
        self.level = spec["level"]
        self.tokens: list[str] = spec["tokens"]
        self.index = {tok: i for i, tok in enumerate(self.tokens)}
        # format 2: <pad> <bos> <eos> <unk> at 0..3, prefix [], suffix [eos], no hidden ids
        special = spec.get("special") or dict(fallback_special or {"pad": 0, "bos": 1, "eos": 2, "unk": 3})
        special.setdefault("decoder_start", special.get("bos"))
        self.special = special
        self.prefix = list(spec.get("prefix", []))
        self.suffix = list(spec.get("suffix", [special["eos"]]))
        self.hidden = set(spec.get("hidden", []))
        self.upper_case = bool(spec.get("upper_case", False))  # format 8
        self._sp = None
        self._hf = None
        self._moses = None
        if self.level == "moses":
            tok = spec["tokenizer"]
            with open(_verified(folder, tok["file"], tok["sha256"], "tokenizer"), encoding="utf-8") as f:
                self._moses = Moses(json.load(f))
        elif self.level in ("sentencepiece", "hf"):
            tok = spec["tokenizer"]
            path = _verified(folder, tok["file"], tok["sha256"], "tokenizer")
            if self.level == "sentencepiece":
                import sentencepiece  # only for this level

                self._sp = sentencepiece.SentencePieceProcessor(model_file=path)
            else:
                import tokenizers  # only for this level

                self._hf = tokenizers.Tokenizer.from_file(path)
        elif self.level not in ("char", "word"):
            raise Refused(f"vocab level {self.level!r} is not known")

    def _lookup(self, piece: str) -> int:
        i = self.index.get(piece)
        if i is None:
            unk = self.special.get("unk")
            if unk is None:
                raise Refused(f"{piece!r} is not in the vocabulary and it has no unk")
            return unk
        return i

    def ids(self, text: str) -> list[int]:
        """The ids *between* prefix and suffix."""
        if self.level == "char":
            return [self._lookup(c) for c in text]
        if self.level == "word":
            return [self._lookup(w) for w in WORD_RE.findall(text)]
        if self.level == "sentencepiece":
            return [self._lookup(p) for p in self._sp.encode(text, out_type=str)]
        if self.level == "moses":
            return [self._lookup(p) for p in self._moses.pieces(text)]
        return list(self._hf.encode(text, add_special_tokens=False).ids)

    def row(self, text: str) -> list[int]:
        return self.prefix + self.ids(text) + self.suffix

    def detokenise(self, ids: list[int]) -> str:
        text = self._detokenise(ids)
        return text.upper() if self.upper_case else text

    def _detokenise(self, ids: list[int]) -> str:
        sp = self.special
        eos = sp["eos"]
        if eos in ids:
            ids = ids[: ids.index(eos)]
        skip = {sp.get("pad"), sp.get("bos"), sp.get("decoder_start")} | self.hidden
        if self.level == "hf":  # hidden ids split the text into runs, each decoded alone
            runs, run = [], []
            for i in ids:
                if i in self.hidden:
                    runs, run = [*runs, run], []
                elif i not in skip:
                    run.append(i)
            return "".join(self._hf.decode(r, skip_special_tokens=True) for r in [*runs, run] if r)
        kept = [i for i in ids if i not in skip]
        if self.level == "char":
            return "".join(self.tokens[i] for i in kept)
        if self.level == "word":
            return " ".join(self.tokens[i] for i in kept)
        if self.level == "moses":
            return self._moses.text([self.tokens[i] for i in kept])
        return self._sp.decode_pieces([self.tokens[i] for i in kept])  # sentencepiece


# ----------------------------------------------------------------------------- the export


class Export:
    def __init__(self, folder: str, threads: int | None = None):
        path = os.path.join(folder, "manifest.json")
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
        if m.get("format") not in KNOWN_FORMATS:
            raise Refused(f"format {m.get('format')!r} is not one this client reads")
        self.m = m
        self.folder = folder
        kind = (m.get("encoder_input") or {"kind": "tokens"})["kind"]
        if kind != "tokens":
            raise Refused("this client reads text exports only (encoder_input.kind tokens)")
        self.special = m["special_tokens"]
        vocab = m["vocab"]
        self.src_vocab = Vocab(vocab["source"], folder, None)
        self.tgt_vocab = Vocab(vocab["target"], folder, self.special)
        self.V = len(self.tgt_vocab.tokens)
        self.limits = m.get("limits") or {}
        self.search_defaults = m.get("search") or {}
        if self.search_defaults.get("timestamps"):
            raise Refused("search.timestamps is on, which this client does not run (docs/decoding.md, Timestamps)")
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self.graphs = {}
        for role in ("encoder", "decoder"):
            g = m["graphs"][role]
            for name, sha in (g.get("external_data") or {}).items():
                _verified(folder, name, sha, f"graphs.{role}.external_data")
            gpath = _verified(folder, g["file"], g["sha256"], f"graphs.{role}")
            self.graphs[role] = g
            setattr(self, role, ort.InferenceSession(gpath, opts, providers=["CPUExecutionProvider"]))
        self.memory = m["memory"]
        self.memory_per_sentence = bool(m.get("memory_per_sentence", False))
        self.state = m["state"]
        self.dec_inputs = self.graphs["decoder"]["inputs"]
        self.dec_outputs = {o["role"]: o["name"] for o in self.graphs["decoder"]["outputs"]
                            if o["role"] in ("log_probs", "top_log_probs", "top_ids")}

    # -- step 2-4: encode, initial state, beam repeat
    def encode(self, rows: list[list[int]], K: int):
        B = len(rows)
        width = max(len(r) for r in rows)
        pad = self.src_vocab.special["pad"]
        src = np.full((B, width), pad, dtype=np.int64)
        for i, r in enumerate(rows):
            src[i, : len(r)] = r
        src_len = np.array([len(r) for r in rows], dtype=np.int64)
        feeds = {}
        for inp in self.graphs["encoder"]["inputs"]:
            if inp["role"] == "source_tokens":
                feeds[inp["name"]] = src
            elif inp["role"] == "source_lengths":
                feeds[inp["name"]] = src_len
        names = [o["name"] for o in self.graphs["encoder"]["outputs"]]
        out = dict(zip(names, self.encoder.run(names, feeds), strict=True))
        memory = {}
        for spec in self.memory:
            x = out[spec["name"]]
            repeat = K > 1 and not self.memory_per_sentence  # step 4: the decoder groups the rows itself
            memory[spec["name"]] = np.repeat(x, K, axis=spec["batch_axis"]) if repeat else x
        state = {}
        rows_n = B * K
        for spec in self.state:
            if spec["init"] == "encoder":
                x = out["init_" + spec["name"]]
                state[spec["name"]] = np.repeat(x, K, axis=spec["batch_axis"]) if K > 1 else x
            else:
                shape = [rows_n if d == "batch" else d for d in spec["shape"]]
                state[spec["name"]] = np.zeros(shape, dtype=np.dtype(spec["dtype"]))
        return memory, state

    # -- step 5: one decoder step; returns (log_probs or (top_lp, top_ids)), new state
    def step(self, tokens, t, reorder, memory, state, top_k: int | None):
        feeds = {}
        for inp in self.dec_inputs:
            role, name = inp["role"], inp["name"]
            if role == "previous_tokens":
                feeds[name] = tokens
            elif role == "step_index":
                feeds[name] = np.array(t, dtype=np.int64)
            elif role == "beam_reorder":
                feeds[name] = reorder
            elif role == "memory":
                feeds[name] = memory[name]
            elif role == "state_in":
                feeds[name] = state[name[len("past_"):]]
            elif role == "top_k":
                feeds[name] = np.array([top_k or 1], dtype=np.int64)
            else:
                raise Refused(f"decoder input role {role!r} is not known")
        state_names = ["present_" + s["name"] for s in self.state]
        if top_k is None:
            want = [self.dec_outputs["log_probs"]]
        else:
            want = [self.dec_outputs["top_log_probs"], self.dec_outputs["top_ids"]]
        out = self.decoder.run(want + state_names, feeds)
        new_state = {s["name"]: out[len(want) + i] for i, s in enumerate(self.state)}
        return out[: len(want)], new_state


# ----------------------------------------------------------------------------- options

DEFAULTS = {
    "beam_size": 1,
    "n_best": 1,
    "alpha": 0.75,
    "min_len": 0,
    "sampling_topk": 1,
    "sampling_topp": 1.0,
    "sampling_temperature": 1.0,
    "seed": 0,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "prefix": None,
    "suppress_tokens": None,
    "disable_unk": False,
    "bad_words_ids": None,
    "forced_eos": False,
    "forced_bos": -1,
    "max_len_a": 0.0,
    "max_len_b": 0,
    "early_stopping": False,
}


@dataclass
class Options:
    beam_size: int
    n_best: int
    max_len: int
    alpha: float
    min_len: int
    sampling_topk: int
    sampling_topp: float
    sampling_temperature: float
    seed: int
    repetition_penalty: float
    no_repeat_ngram_size: int
    encoder_no_repeat_ngram_size: int
    prefix: list[int]
    suppress_tokens: list[int]
    disable_unk: bool
    bad_words_ids: list[list[int]]
    forced_eos: bool
    forced_bos: int
    max_len_a: float
    max_len_b: int
    early_stopping: object = False
    banned: list[int] = field(default_factory=list)

    def uses_log_probs(self) -> bool:
        """Whether a step needs the full log_probs (an option of 'Decoding options' besides min_len)."""
        return (self.repetition_penalty != 1 or self.no_repeat_ngram_size > 0 or bool(self.banned)
                or self.encoder_no_repeat_ngram_size > 0
                or bool(self.bad_words_ids) or bool(self.prefix) or self.forced_eos or self.forced_bos >= 0
                or self.sampling_topk != 1)


def resolve(given: dict, ex: Export) -> Options:
    """'Resolving the options', rules 1-5."""
    search = ex.search_defaults
    limits = ex.limits or {}
    o = {}
    for name, default in DEFAULTS.items():
        if given.get(name) is not None:
            o[name] = given[name]
        elif name in search:
            o[name] = search[name]
        elif name == "alpha" and "length_penalty_alpha" in search:  # formats 2 to 6 required this key
            o[name] = search["length_penalty_alpha"]
        else:
            o[name] = default
    # rule 2: max_len
    max_target = limits.get("max_target_length")
    if given.get("max_len") is not None:
        max_len = given["max_len"]
        if max_target is not None and max_len > max_target:
            raise Refused(f"max_len {max_len} is over the model's limit {max_target}")
    elif "max_len" in search:
        max_len = search["max_len"]
    elif max_target is not None:
        max_len = max_target
    else:
        max_len = 256
    if not 1 <= max_len <= HARD_MAX:
        raise Refused(f"max_len must be in 1..{HARD_MAX}")
    o["max_len"] = max_len
    # rule 3: a manifest min_len yields to a shorter max_len
    if given.get("min_len") is None and "min_len" in search:
        o["min_len"] = min(search["min_len"], max_len)
    # rule 4: token options given as text
    tv = ex.tgt_vocab
    prefix = o["prefix"]
    if isinstance(prefix, str):
        prefix = tv.ids(prefix)
    prefix = list(prefix or [])
    suppress = []
    for s in o["suppress_tokens"] or []:
        if isinstance(s, str):
            if s not in tv.index:
                raise Refused(f"suppress_tokens: {s!r} is not a target token")
            suppress.append(tv.index[s])
        else:
            suppress.append(int(s))
    bad = []
    for s in o["bad_words_ids"] or []:
        bad.append(tv.ids(s) if isinstance(s, str) else [int(i) for i in s])
    flat_bad = [i for seq in bad for i in seq]
    for name, ids in (("prefix", prefix), ("suppress_tokens", suppress), ("bad_words_ids", flat_bad)):
        for i in ids:
            if not 0 <= i < ex.V:
                raise Refused(f"{name}: id {i} is outside the target vocabulary")
    o["prefix"], o["suppress_tokens"], o["bad_words_ids"] = prefix, suppress, bad
    # rule 5 and ranges
    K = o["beam_size"]
    if not 1 <= K <= HARD_MAX:
        raise Refused(f"beam_size must be in 1..{HARD_MAX}")
    if K >= ex.V:
        raise Refused(f"beam_size {K} must be smaller than the target vocabulary ({ex.V})")
    if not 1 <= o["n_best"] <= K:
        raise Refused(f"n_best {o['n_best']} must be in 1..beam_size ({K})")
    if not 0 <= o["min_len"] <= max_len:
        raise Refused(f"min_len {o['min_len']} must be in 0..max_len ({max_len})")
    if o["sampling_topk"] != 1 and K != 1:
        raise Refused("sampling_topk: sampling needs beam_size 1")
    if not 0 <= o["sampling_topk"] <= HARD_MAX:
        raise Refused("sampling_topk out of range")
    if not 0 < o["sampling_topp"] <= 1:
        raise Refused("sampling_topp must be in (0, 1]")
    if not 0 < o["sampling_temperature"] <= 1e6:
        raise Refused("sampling_temperature must be in (0, 1e6]")
    if not 0 < o["repetition_penalty"] <= 1e6:
        raise Refused("repetition_penalty must be in (0, 1e6]")
    if not 0 <= o["no_repeat_ngram_size"] <= HARD_MAX:
        raise Refused("no_repeat_ngram_size out of range")
    if not 0 <= o["encoder_no_repeat_ngram_size"] <= HARD_MAX:
        raise Refused("encoder_no_repeat_ngram_size out of range")
    if not 0 <= o["alpha"] <= 1e6:
        raise Refused("alpha must be in 0..1e6")
    if not 0 <= o["max_len_a"] <= 1e6 or not 0 <= o["max_len_b"] <= HARD_MAX:
        raise Refused("max_len_a/max_len_b out of range")
    if o["seed"] < 0:
        raise Refused("seed must be >= 0")
    if len(prefix) >= max_len:
        raise Refused(f"prefix ({len(prefix)} tokens) must be shorter than max_len ({max_len})")
    if o["forced_bos"] is None:
        o["forced_bos"] = -1
    banned = list(suppress)
    unk = tv.special.get("unk")
    if o["disable_unk"] and unk is not None:
        banned.append(unk)
    o["banned"] = banned
    return Options(**o)


def sentence_limit(n: int, o: Options) -> int:
    if o.max_len_a == 0 and o.max_len_b == 0:
        return o.max_len
    return min(o.max_len, max(o.min_len, 1, math.ceil(float(o.max_len_a) * n + o.max_len_b)))


def process(lp: np.ndarray, hyp: list[int], t: int, limit: int, o: Options, eos: int, src: list[int],
            start: int) -> np.ndarray:
    """'Decoding options' 1-5 on one row's float32 log-probs (``src``: the sentence's source row,
    ``start``: the token fed at step 0)."""
    raw = lp
    x = lp.astype(np.float32, copy=True)
    if o.repetition_penalty != 1 and hyp:
        idx = np.array(sorted(set(hyp)), dtype=np.int64)
        x[idx] = x[idx] * np.float32(o.repetition_penalty)
    N = o.no_repeat_ngram_size
    if N > 0 and len(hyp) >= N - 1:
        tail = hyp[len(hyp) - (N - 1):] if N > 1 else []
        for i in range(len(hyp) - N + 1):
            if hyp[i: i + N - 1] == tail:
                x[hyp[i + N - 1]] = NEG_INF
    N = o.encoder_no_repeat_ngram_size
    fed = [start, *hyp]  # the hypothesis after the token fed at step 0
    if N > 0 and len(fed) >= N - 1:
        tail = fed[len(fed) - (N - 1):] if N > 1 else []
        for i in range(len(src) - N + 1):
            if src[i: i + N - 1] == tail and src[i + N - 1] < len(x):
                x[src[i + N - 1]] = NEG_INF
    for seq in o.bad_words_ids:
        if not seq:
            continue
        head = seq[:-1]
        if not head or (len(hyp) >= len(head) and hyp[len(hyp) - len(head):] == head):
            x[seq[-1]] = NEG_INF
    if o.banned:
        x[o.banned] = NEG_INF
    if t < o.min_len:
        x[eos] = NEG_INF
    if t < len(o.prefix):
        y = np.full_like(x, NEG_INF)
        y[o.prefix[t]] = raw[o.prefix[t]]
        return y
    # Observed, not documented: a forced BOS wins over a forced EOS on the same step (a limit of 1)
    if o.forced_bos >= 0 and not o.prefix and t == 0:
        y = np.full_like(x, NEG_INF)
        y[o.forced_bos] = 0.0
        return y
    if o.forced_eos and t == limit - 1:
        y = np.full_like(x, NEG_INF)
        y[eos] = 0.0
        return y
    return x


def top_w(x: np.ndarray, W: int):
    """A row's W best, best first, equal values by the lower id (as top_ids)."""
    order = np.argsort(-x, kind="stable")[:W]
    return x[order], order


def sample(x: np.ndarray, o: Options, rng: np.random.Generator) -> int:
    """'Decoding options' 6."""
    order = np.argsort(-x, kind="stable")
    if o.sampling_topk > 0:
        order = order[: o.sampling_topk]
    z = x[order].astype(np.float64) / float(o.sampling_temperature)
    z = z - np.max(z)
    p = np.exp(z)
    p = p / p.sum()
    if o.sampling_topp < 1.0:
        c = np.cumsum(p)
        cut = int(np.searchsorted(c, o.sampling_topp)) + 1
        order, p = order[:cut], p[:cut]
        p = p / p.sum()
    c = np.cumsum(p)
    u = rng.random()
    j = int(np.searchsorted(c, u))
    return int(order[min(j, len(order) - 1)])


# ----------------------------------------------------------------------------- search


@dataclass
class Hyp:
    tokens: list[int]
    score: float
    finished: bool


def score_of(total: float, L: int, alpha: float) -> float:
    return total / math.pow(L, alpha)


def greedy(ex: Export, rows: list[list[int]], o: Options) -> list[list[Hyp]]:
    B = len(rows)
    eos = ex.special["eos"]
    memory, state = ex.encode(rows, 1)
    limits = [sentence_limit(len(r), o) for r in rows]
    tokens = np.full(B, ex.special["decoder_start"], dtype=np.int64)
    reorder = np.arange(B, dtype=np.int64)
    hyps = [[] for _ in range(B)]
    sums = [0.0] * B
    done = [False] * B
    result: list[list[Hyp]] = [[] for _ in range(B)]
    full = o.uses_log_probs()
    rngs = None
    if o.sampling_topk != 1:
        rngs = [np.random.Generator(np.random.PCG64(np.random.SeedSequence([o.seed, *r]))) for r in rows]
    for t in range(max(limits)):
        if full:
            (lp,), state = ex.step(tokens, t, reorder, memory, state, None)
        else:
            W = 2 if t < o.min_len else 1
            (tlp, tid), state = ex.step(tokens, t, reorder, memory, state, min(W, ex.V))
        nxt = tokens.copy()
        for b in range(B):
            if done[b]:
                continue
            if full:
                x = process(lp[b], hyps[b], t, limits[b], o, eos, rows[b], ex.special["decoder_start"])
                tok = sample(x, o, rngs[b]) if rngs is not None else int(np.argmax(x))
                val = x[tok]
            else:
                c = 0
                if t < o.min_len and int(tid[b, 0]) == eos:
                    c = 1
                tok, val = int(tid[b, c]), tlp[b, c]
            sums[b] += float(np.float64(val))
            nxt[b] = tok
            if tok == eos:
                result[b] = [Hyp(hyps[b], score_of(sums[b], t + 1, o.alpha), True)]
                done[b] = True
                continue
            hyps[b] = hyps[b] + [tok]
            if t == limits[b] - 1:
                result[b] = [Hyp(hyps[b], score_of(sums[b], t + 1, o.alpha), False)]
                done[b] = True
        tokens = nxt
        if all(done):
            break
    return result


def beam(ex: Export, rows: list[list[int]], o: Options) -> list[list[Hyp]]:
    B, K, V = len(rows), o.beam_size, ex.V
    eos = ex.special["eos"]
    memory, state = ex.encode(rows, K)
    limits = [sentence_limit(len(r), o) for r in rows]
    R = B * K
    tokens = np.full(R, ex.special["decoder_start"], dtype=np.int64)
    reorder = np.arange(R, dtype=np.int64)
    sums = [[0.0] + [NEG_INF] * (K - 1) for _ in range(B)]
    seqs = [[[] for _ in range(K)] for _ in range(B)]
    active = [True] * B
    finished: list[list[Hyp]] = [[] for _ in range(B)]
    full = o.uses_log_probs()
    for t in range(max(limits)):
        W = min(2 * K, V)
        if t < o.min_len:
            W = min(W + 1, V)
        if full:
            (lp,), state = ex.step(tokens, t, reorder, memory, state, None)
        else:
            (tlp, tid), state = ex.step(tokens, t, reorder, memory, state, W)
            tlp = tlp.copy()
            if t < o.min_len:
                tlp[tid == eos] = NEG_INF
        new_tokens = tokens.copy()
        new_reorder = reorder.copy()
        for b in range(B):
            cand = []
            for j in range(K):
                r_ = b * K + j
                if full:
                    x = process(lp[r_], seqs[b][j], t, limits[b], o, eos, rows[b], ex.special["decoder_start"])
                    vals, ids = top_w(x, W)
                else:
                    vals, ids = tlp[r_], tid[r_]
                for r in range(W):
                    v = vals[r]
                    cand.append((sums[b][j] + float(np.float64(v)), j, int(ids[r])))
            ranked = sorted(cand, key=lambda c: -c[0])[: 2 * K]  # sorted() is stable
            for p in range(K):
                s, j, tok = ranked[p]
                if tok == eos and s > NEG_INF and active[b]:
                    finished[b].append(Hyp(list(seqs[b][j]), score_of(s, t + 1, o.alpha), True))
            live = [c for c in ranked if c[2] != eos or c[0] == NEG_INF][:K]
            old = seqs[b]
            new_seqs = []
            for i, (s, j, tok) in enumerate(live):
                sums[b][i] = s
                new_tokens[b * K + i] = tok
                new_reorder[b * K + i] = b * K + j
                new_seqs.append(old[j] + [tok])
            seqs[b] = new_seqs
            if active[b] and len(finished[b]) >= K:
                if o.early_stopping is True:
                    active[b] = False
                else:
                    kth = sorted((h.score for h in finished[b]), reverse=True)[K - 1]
                    best = max(sums[b])
                    if o.early_stopping == "never" and o.alpha > 0:
                        bound = best / math.pow(limits[b], o.alpha)
                    else:
                        bound = best / math.pow(t + 1, o.alpha)
                    if kth >= bound:
                        active[b] = False
            if active[b] and t == limits[b] - 1:
                for i in range(K):
                    if sums[b][i] > NEG_INF:
                        finished[b].append(Hyp(list(seqs[b][i]), score_of(sums[b][i], t + 1, o.alpha), False))
                active[b] = False
        tokens, reorder = new_tokens, new_reorder
        if not any(active):
            break
    return [sorted(f, key=lambda h: -h.score)[: o.n_best] for f in finished]


def translate_rows(ex: Export, rows: list[list[int]], o: Options) -> list[list[Hyp]]:
    return greedy(ex, rows, o) if o.beam_size == 1 else beam(ex, rows, o)


def decode_sorted(ex: Export, rows: list[list[int]], keys: list[int], o: Options,
                  batch_size: int = 32) -> list[list[Hyp]]:
    """'How translate batches': a stable sort by key, batches of batch_size, results in input order."""
    order = sorted(range(len(rows)), key=lambda i: keys[i])
    out: list[list[Hyp]] = [[] for _ in rows]
    for start in range(0, len(order), batch_size):
        idx = order[start: start + batch_size]
        for i, hyps in zip(idx, translate_rows(ex, [rows[i] for i in idx], o), strict=True):
            out[i] = hyps
    return out


def translate(ex: Export, texts: list[str], o: Options, batch_size: int = 32) -> list[list[Hyp]]:
    """Texts sorted by their length in characters."""
    max_src = (ex.limits or {}).get("max_source_length")
    rows = []
    for i, text in enumerate(texts):
        if text == "":
            raise Refused(f"input {i + 1} is empty")
        row = ex.src_vocab.row(text)
        if max_src is not None and len(row) > max_src:
            raise Refused(f"input {i + 1} has {len(row)} source tokens, over the model's limit {max_src}")
        rows.append(row)
    return decode_sorted(ex, rows, [len(t) for t in texts], o, batch_size)


# ----------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir")
    ap.add_argument("texts", nargs="*")
    ap.add_argument("--input")
    ap.add_argument("--ids", action="store_true")
    ap.add_argument("--scores", action="store_true")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--beam", dest="beam_size", type=int)
    ap.add_argument("--n-best", dest="n_best", type=int)
    ap.add_argument("--max-len", dest="max_len", type=int)
    ap.add_argument("--alpha", type=float)
    ap.add_argument("--min-len", dest="min_len", type=int)
    ap.add_argument("--sampling-topk", dest="sampling_topk", type=int)
    ap.add_argument("--sampling-topp", dest="sampling_topp", type=float)
    ap.add_argument("--sampling-temperature", dest="sampling_temperature", type=float)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--repetition-penalty", dest="repetition_penalty", type=float)
    ap.add_argument("--no-repeat-ngram-size", dest="no_repeat_ngram_size", type=int)
    ap.add_argument("--encoder-no-repeat-ngram-size", dest="encoder_no_repeat_ngram_size", type=int)
    ap.add_argument("--prefix")
    ap.add_argument("--suppress", dest="suppress_tokens", action="append")
    ap.add_argument("--disable-unk", dest="disable_unk", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--bad-words", dest="bad_words_ids", action="append")
    ap.add_argument("--forced-eos", dest="forced_eos", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--max-len-a", dest="max_len_a", type=float)
    ap.add_argument("--max-len-b", dest="max_len_b", type=int)
    a = ap.parse_args(argv)
    try:
        ex = Export(a.export_dir, a.threads)
        given = {k: getattr(a, k) for k in DEFAULTS if hasattr(a, k)}
        given["max_len"] = a.max_len
        o = resolve(given, ex)
        texts = list(a.texts)
        if a.input:
            if a.input == "-":
                texts += sys.stdin.read().splitlines()
            else:
                with open(a.input, encoding="utf-8-sig") as f:
                    texts += f.read().splitlines()
        # a blank line of --input gives a blank line (a guess: the document is silent)
        blank = [a.input is not None and t.strip() == "" for t in texts]
        todo = [i for i, b in enumerate(blank) if not b]
        if a.ids:
            rows = [[int(x) for x in texts[i].split()] for i in todo]
            done = decode_sorted(ex, rows, [len(r) for r in rows], o, a.batch_size)
            show = lambda h: " ".join(map(str, h.tokens))  # noqa: E731
        else:
            done = translate(ex, [texts[i] for i in todo], o, a.batch_size)
            show = lambda h: ex.tgt_vocab.detokenise(h.tokens)  # noqa: E731
        results: list[list[Hyp] | None] = [None] * len(texts)
        for i, hyps in zip(todo, done, strict=True):
            results[i] = hyps
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for hyps in results:
        if hyps is None:
            print()
            continue
        for h in hyps:
            line = show(h)
            score = h.score
            print(f"{score:.4f}\t{line}" if a.scores else line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
