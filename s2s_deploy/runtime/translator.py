"""Text in, text out, from an export folder alone: manifest → tokenise → search → detokenise."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest, load_manifest
from s2s_deploy.format.vocab import UNK, Vocabulary, split
from s2s_deploy.runtime.scoring import Scored
from s2s_deploy.runtime.search import Hypothesis, SearchConfig, SearchEngine, StepLoop


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
    on_batch: Callable[[int], None] | None = None,
    max_batch_tokens: int | None = None,
    prefixes: Sequence[tuple[int, ...]] | None = None,
) -> list[Translation]:
    """Sentences are batched by length for speed and returned in input order. A batch holds at
    most ``batch_size`` sentences and, with ``max_batch_tokens``, at most that many source
    tokens counted as rows x longest (padding included). ``prefixes``: one per text;
    ``on_batch`` hears how many sentences each batch finished (for a progress bar)."""
    check_inputs(texts)
    if prefixes is not None and len(prefixes) != len(texts):
        raise S2SError(f"{len(prefixes)} prefixes for {len(texts)} inputs")
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    results: list[Translation | None] = [None] * len(texts)
    for chunk in _batches(order, texts, src_vocab, batch_size, max_batch_tokens):
        src, src_len = encode_batch([texts[i] for i in chunk], src_vocab, max_source_length)
        chunk_config = config if prefixes is None else replace(config, prefix=tuple(prefixes[i] for i in chunk))
        for index, hyps in zip(chunk, engine.search(src, src_len, chunk_config), strict=True):
            results[index] = _translation(texts[index], hyps, tgt_vocab)
        if on_batch:
            on_batch(len(chunk))
    return [r for r in results if r is not None]


def _batches(order: list[int], texts: Sequence[str], vocab: Vocabulary, batch_size: int,
             max_batch_tokens: int | None) -> list[list[int]]:
    if max_batch_tokens is None:
        return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in order:
        n = len(vocab.encode(texts[index]))
        widest = max(longest, n)
        if current and (len(current) == batch_size or widest * (len(current) + 1) > max_batch_tokens):
            batches.append(current)
            current, widest = [], n
        current.append(index)
        longest = widest
    batches.append(current)
    return batches


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
    if vocab.level not in ("char", "word"):  # a subword tokenizer maps unknown text to its own pieces
        return found
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
MAX_DECODE = 1 << 16  # the step loop keeps (rows, max_len) arrays: a typo must not allocate gigabytes


def default_search_config(manifest: Manifest, beam: int | None = None, n_best: int | None = None,
                          max_len: int | None = None, alpha: float | None = None, **options: object) -> SearchConfig:
    """A SearchConfig from the arguments given (None: not given), then the manifest's ``search``
    defaults (the model's own settings, and the relative length limit its training data measured),
    then SearchConfig's own. Token options take ids or strings: a ``prefix`` string is tokenised, a
    ``suppress_tokens`` string is one vocabulary entry, a ``bad_words_ids`` string is tokenised
    into one sequence."""
    target_lang = options.pop("target_lang", None)
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise S2SError(f"unknown decoding option {unknown[0]!r}; known: {', '.join(OPTION_NAMES)}")
    for name, value in (("beam", beam), ("n-best", n_best), ("max-len", max_len)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise S2SError(f"{name} must be a whole number of at least 1, not {value!r}")
    for name, value in (("alpha", alpha), ("max-len-a", options.get("max_len_a")),
                        ("max-len-b", options.get("max_len_b"))):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value < 0):
            raise S2SError(f"{name} must be a finite number >= 0, not {value!r}")
    limit = manifest.max_target_length
    if max_len is not None and max_len > MAX_DECODE:
        raise S2SError(f"max-len {max_len} is over the {MAX_DECODE} tokens this runtime decodes")
    if max_len is not None and limit is not None and max_len > limit:
        raise S2SError(f"max-len {max_len} exceeds the model's limit of {limit} target tokens (its position table)")
    min_len = options.get("min_len")
    stored = manifest.raw.get("search", {})
    values: dict[str, object] = {name: stored[name] for name in OPTION_NAMES if name in stored}
    values.setdefault("alpha", stored.get("length_penalty_alpha", 0.75))
    values.setdefault("max_len", limit or 256)
    given = {"beam_size": beam, "n_best": n_best, "max_len": max_len, "alpha": alpha, **options}
    values.update({name: value for name, value in given.items() if value is not None})
    if min_len is None and "min_len" in stored:  # the model's own minimum yields to a shorter limit asked for
        values["min_len"] = min(int(stored["min_len"]), int(values["max_len"]))  # type: ignore[call-overload]
    vocab = manifest.tgt_vocab
    if "prefix" in values and not _per_sentence(values["prefix"]):
        values["prefix"] = _ids(vocab, values["prefix"])
    if target_lang is not None:  # the language token is forced first, instead of the model's own default
        asked = () if options.get("prefix") is None or _per_sentence(options["prefix"]) else values["prefix"]
        values["prefix"] = (language_id(vocab, target_lang), *asked)  # type: ignore[misc]
    values["suppress_tokens"] = tuple(_token_id(vocab, t) for t in values.get("suppress_tokens", ()))  # type: ignore[attr-defined]
    values["bad_words_ids"] = tuple(_ids(vocab, w) for w in values.get("bad_words_ids", ()))  # type: ignore[attr-defined]
    if int(values.get("beam_size", 1)) < int(values.get("n_best", 1)):  # type: ignore[call-overload]
        raise S2SError(f"n-best {values['n_best']} cannot exceed the beam size {values['beam_size']}")
    if int(values.get("beam_size", 1)) >= len(vocab):  # type: ignore[call-overload]
        raise S2SError(f"beam {values['beam_size']} must be smaller than the target vocabulary ({len(vocab)} tokens)")
    try:
        config = SearchConfig(**values)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise S2SError(f"decoding options: {exc}") from exc
    if any(not 0 <= i < len(vocab) for i in config.suppress_tokens):
        raise S2SError(f"a suppressed token id is outside the target vocabulary (0..{len(vocab) - 1})")
    return config


def language_id(vocab: Vocabulary, code: object) -> int:
    """The id of the token that names language ``code``: the token itself (``fra_Latn``) or
    fairseq's ``__fr__``, so users give codes, never ids."""
    if not isinstance(code, str):
        raise S2SError(f"a language code is a string, not {code!r}")
    for token in (code, f"__{code}__"):
        if token in vocab.tokens:
            return vocab.tokens.index(token)
    raise S2SError(f"no language token {code!r} (or __{code}__) in the vocabulary")


def _ids(vocab: Vocabulary, value: object) -> tuple[int, ...]:
    if isinstance(value, str):
        return tuple(vocab.encode(value, add_eos=False))
    return tuple(int(i) for i in value)  # type: ignore[attr-defined]


def _token_id(vocab: Vocabulary, token: object) -> int:
    if isinstance(token, str):
        if token not in vocab.tokens:
            raise S2SError(f"{token!r} is not a token of the target vocabulary")
        return vocab.tokens.index(token)
    return int(token)  # type: ignore[call-overload]


class Translator:
    """The embedding API: ``Translator("exported/transformer")(["..."], beam=4)``.

    ``engine="loop"`` runs the search in Python over the step decoder; ``engine="graph"`` makes one
    call per batch to the fused generate.onnx (``s2s-deploy fuse``). ``spin=False`` stops the step
    decoder's idle threads from spin-waiting, for a process that needs its cores between steps (serve)."""

    def __init__(self, export_dir: str | Path, device: str = "auto", threads: int | None = None,
                 engine: str = "loop", spin: bool = True) -> None:
        from s2s_deploy.runtime.ort.backend import OrtBackend

        if engine not in ENGINES:
            raise S2SError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
        self.manifest = load_manifest(export_dir)
        self.unknown: Counter[str] = Counter()  # source tokens outside the vocabulary, over this translator's life
        if engine == "graph":
            from s2s_deploy.runtime.ort.generate import GraphEngine

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

    def search_config(self, beam: int | None = None, n_best: int | None = None, max_len: int | None = None,
                      alpha: float | None = None, **options: object) -> SearchConfig:
        """See ``default_search_config``; a ``source_lang`` is checked here and used by ``__call__``."""
        self.source_vocab(options.pop("source_lang", None))
        return default_search_config(self.manifest, beam, n_best, max_len, alpha, **options)

    def source_vocab(self, source_lang: object = None) -> Vocabulary:
        """The source vocabulary, its framing prefix the token of ``source_lang`` when one is given
        (a multilingual model reads the source language from the sentence's first token)."""
        vocab = self.manifest.src_vocab
        return vocab if source_lang is None else replace(vocab, prefix=(language_id(vocab, source_lang),))

    def __call__(self, texts: Sequence[str], beam: int | None = None, n_best: int | None = None,
                 max_len: int | None = None, alpha: float | None = None, batch_size: int = 32,
                 max_batch_tokens: int | None = None, **options: object) -> list[Translation]:
        """``options``: any SearchConfig field by name (docs/decoding.md). ``prefix`` may be one
        string or id tuple for every sentence, or a list of strings, one per sentence."""
        if isinstance(texts, str):  # one sentence, not one per character
            texts = [texts]
        prefix = options.get("prefix")
        prefixes = None
        source = self.source_vocab(options.pop("source_lang", None))
        if _per_sentence(prefix):
            language = options.get("target_lang")
            first = () if language is None else (language_id(self.manifest.tgt_vocab, language),)
            prefixes = [(*first, *_ids(self.manifest.tgt_vocab, p)) for p in prefix]  # type: ignore[union-attr]
            options = {**options, "prefix": None}
        config = self.search_config(beam, n_best, max_len, alpha, **options)
        manifest = self.manifest
        check_inputs(texts)
        self.unknown.update(unknown_tokens(texts, source))
        return translate(self.engine, texts, source, manifest.tgt_vocab, config, batch_size,
                         manifest.max_source_length, max_batch_tokens=max_batch_tokens, prefixes=prefixes)

    def stream(self, text: str, max_len: int | None = None, **options: object) -> Iterator[str]:
        """Pieces of the translation of one sentence as they are produced (greedy or sampled):
        each is the text the newest token adds, so joining them gives the whole translation."""
        from s2s_deploy.runtime.scoring import stream_tokens

        if not isinstance(self.engine, StepLoop):
            raise S2SError("streaming runs the step loop: use engine='loop'")
        check_inputs([text])
        source = self.source_vocab(options.pop("source_lang", None))
        config = self.search_config(1, 1, max_len, None, **options)
        manifest = self.manifest
        src, src_len = encode_batch([text], source, manifest.max_source_length)
        done: list[int] = []
        shown = ""
        for token, _ in stream_tokens(self.backend, src, src_len, config):
            done.append(token)
            text_now = manifest.tgt_vocab.decode(done)
            if text_now.startswith(shown) and len(text_now) > len(shown):
                yield text_now[len(shown):]
                shown = text_now

    def score(self, sources: Sequence[str], targets: Sequence[str], batch_size: int = 32) -> list[Scored]:
        """Per-token and total log-probs of each target given its source, teacher-forced
        through the step decoder (the closing EOS is the last value)."""
        from s2s_deploy.runtime.scoring import score

        if not isinstance(self.engine, StepLoop):
            raise S2SError("scoring runs the step decoder: use engine='loop'")
        if len(sources) != len(targets):
            raise S2SError(f"{len(sources)} sources but {len(targets)} targets")
        check_inputs(sources)
        manifest = self.manifest
        found: list[Scored] = []
        for start in range(0, len(sources), batch_size):
            src, src_len = encode_batch(sources[start : start + batch_size], manifest.src_vocab,
                                        manifest.max_source_length)
            ids = [manifest.tgt_vocab.encode(t, add_eos=False) for t in targets[start : start + batch_size]]
            found.extend(score(self.backend, src, src_len, ids))
        return found

    def translate_ids(self, ids: Sequence[Sequence[int]], beam: int | None = None, n_best: int | None = None,
                      max_len: int | None = None, alpha: float | None = None, batch_size: int = 32,
                      **options: object) -> list[list[Hypothesis]]:
        """For applications that tokenise themselves: each row is the encoder's input as it stands
        (``manifest.src_vocab.encode(text)`` frames it with the prefix and EOS suffix), and each
        hypothesis's ``tokens`` are target ids without the start token and EOS. ``options``: any
        SearchConfig field by name, as for ``__call__``; defaults come from the manifest."""
        config = self.search_config(beam, n_best, max_len, alpha, **options)
        manifest = self.manifest
        rows = check_ids(ids, len(manifest.src_vocab), manifest.max_source_length)
        return search_ids(self.engine, rows, manifest.src_vocab.pad_id, config, batch_size)


OPTION_NAMES = tuple(f.name for f in fields(SearchConfig))


def _per_sentence(prefix: object) -> bool:
    """A list of strings or of id tuples: one prefix per sentence."""
    return isinstance(prefix, list | tuple) and len(prefix) > 0 and not isinstance(prefix[0], int)
