"""Text in, text out, from an export folder alone: manifest → tokenise → search → detokenise."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest, load_manifest
from s2s_deploy.format.vocab import UNK, Vocabulary, split
from s2s_deploy.runtime.decoding import SearchConfig, resolve
from s2s_deploy.runtime.scoring import Scored
from s2s_deploy.runtime.search import Hypothesis, SearchEngine, StepLoop


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


def unpadded(manifest: Manifest) -> bool:
    """Whether this export's batches must hold one source length, so that no sentence is padded:
    int8 with per-row activation scales, or int4 whose ``MatMulNBits`` quantise activations to
    int8 per block of a row (accuracy level 4), which promise that a sentence's output ignores
    its batchmates. Padding moves a row's fp32 sums in the last bits, which can tip an activation
    across an int8 rounding edge; rows of one length run the very same arithmetic alone or
    together (docs/parity.md)."""
    quantization = manifest.quantization
    return quantization is not None and (quantization.activations == "per-row"
                                         or (quantization.kind == "int4" and quantization.accuracy_level == 4))


def length_groups(order: Sequence[int], lengths: Sequence[int], exact: bool) -> list[list[int]]:
    """``order`` (indices sorted by length) as the runs a batch may be cut from: with ``exact``
    one run per length, so no batch pads a sentence (see ``unpadded``); else the whole order."""
    if not exact:
        return [list(order)]
    return [list(group) for _, group in itertools.groupby(order, key=lengths.__getitem__)]


def search_ids(engine: SearchEngine, ids: Sequence[Sequence[int]], pad_id: int, config: SearchConfig,
               batch_size: int = 32, exact: bool = False) -> list[list[Hypothesis]]:
    """n-best hypotheses per row of source ids, batched by length (``exact``: one length per
    batch), in input order."""
    lengths = [len(row) for row in ids]
    order = sorted(range(len(ids)), key=lengths.__getitem__)
    results: list[list[Hypothesis]] = [[] for _ in ids]
    batches = [group[start : start + batch_size] for group in length_groups(order, lengths, exact)
               for start in range(0, len(group), batch_size)]
    for chunk in batches:
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
    exact: bool = False,
) -> list[Translation]:
    """Sentences are batched by length for speed and returned in input order. A batch holds at
    most ``batch_size`` sentences and, with ``max_batch_tokens``, at most that many source
    tokens counted as rows x longest (padding included); with ``exact``, sentences of one source
    length only (``unpadded``). ``prefixes``: one per text; ``on_batch`` hears how many sentences
    each batch finished (for a progress bar)."""
    check_inputs(texts)
    if prefixes is not None and len(prefixes) != len(texts):
        raise S2SError(f"{len(prefixes)} prefixes for {len(texts)} inputs")
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    lengths = [len(src_vocab.encode(text)) for text in texts] if exact else []
    if exact:
        order.sort(key=lengths.__getitem__)
    batches = [chunk for group in length_groups(order, lengths, exact)
               for chunk in _batches(group, texts, src_vocab, batch_size, max_batch_tokens)]
    results: list[Translation | None] = [None] * len(texts)
    for chunk in batches:
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


class Translator:
    """The embedding API: ``Translator("exported/transformer")(["..."], beam=4)``. One instance may
    serve many threads at once: each call answers exactly as it would alone (docs/architecture.md).

    ``engine="loop"`` runs the search in Python over the step decoder; ``engine="graph"`` makes one
    call per batch to the fused generate.onnx (``s2s-deploy fuse``). ``spin=False`` stops the step
    decoder's idle threads from spin-waiting, for a process that needs its cores between steps (serve).
    ``vmap``: a vocabulary shortlist file in CTranslate2's format (runtime/shortlist.py): opt-in,
    never exact; each call's search then ranks only each sentence's allowed target tokens."""

    def __init__(self, export_dir: str | Path, device: str = "auto", threads: int | None = None,
                 engine: str = "loop", spin: bool = True, vmap: str | Path | None = None) -> None:
        from s2s_deploy.runtime.ort.backend import OrtBackend

        if engine not in ENGINES:
            raise S2SError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
        self.manifest = load_manifest(export_dir)
        self.shortlist = None
        if vmap is not None:
            from s2s_deploy.runtime.shortlist import read_vmap

            self._check_text()
            if engine == "graph":
                raise S2SError("a vmap shortlist runs in the step loop: use engine 'loop'")
            self.shortlist = read_vmap(vmap, self.manifest.src_vocab, self.manifest.tgt_vocab)
        self.unknown: Counter[str] = Counter()  # source tokens outside the vocabulary, over this translator's life
        self._unknown_lock = threading.Lock()  # calls from several threads add to it
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
        with self._unknown_lock:
            return unknown_notice(self.unknown, self.manifest.src_vocab.level)

    def _check_text(self) -> None:
        """An encoder of features reads no text: say so in one line rather than fail inside the graph."""
        if self.manifest.encoder_input.is_features:
            from s2s_deploy.frontends.source import use_instead

            source = self.manifest.encoder_input
            raise S2SError(f"{self.manifest.directory} reads {source.frontend['kind']} features, not text: use "
                           f"{use_instead(source)}")

    def search_config(self, beam: int | None = None, n_best: int | None = None, max_len: int | None = None,
                      alpha: float | None = None, **options: object) -> SearchConfig:
        """The options given (None: not given) over this export's defaults: ``decoding.resolve``.
        ``options``: any SearchConfig field by name; token options also take strings."""
        return resolve(self.manifest, {"beam_size": beam, "n_best": n_best, "max_len": max_len, "alpha": alpha,
                                       **options})

    def _config(self, config: SearchConfig | None, beam: int | None, n_best: int | None, max_len: int | None,
                alpha: float | None, options: dict[str, object]) -> SearchConfig:
        """A ready config (from ``search_config``, resolved once by a caller that decodes many
        batches with it), or the options resolved now; never both."""
        if config is None:
            return self._shortlisted(self.search_config(beam, n_best, max_len, alpha, **options))
        if any(value is not None for value in (beam, n_best, max_len, alpha, *options.values())):
            raise S2SError("give decoding options or a ready config, not both")
        return self._shortlisted(config)

    def _shortlisted(self, config: SearchConfig) -> SearchConfig:
        """``config`` with this translator's vmap shortlist, unless it carries one already."""
        return config if self.shortlist is None or config.vmap is not None else replace(config, vmap=self.shortlist)

    def __call__(self, texts: Sequence[str], beam: int | None = None, n_best: int | None = None,
                 max_len: int | None = None, alpha: float | None = None, batch_size: int = 32,
                 max_batch_tokens: int | None = None, *, config: SearchConfig | None = None,
                 **options: object) -> list[Translation]:
        """``texts``: a list of sentences, or one sentence as a bare string (a list of one result).
        ``options``: any SearchConfig field by name (docs/decoding.md), or ``config``, one made by
        ``search_config``. ``prefix`` may be one string or id tuple for every sentence, or a list of
        strings (or id tuples), one per sentence."""
        self._check_text()
        if isinstance(texts, str):  # one sentence, not one per character
            texts = [texts]
        config = self._config(config, beam, n_best, max_len, alpha, options)
        prefixes = None
        if config.prefix and isinstance(config.prefix[0], tuple):  # one per sentence: each batch takes its own
            prefixes, config = config.prefix, replace(config, prefix=())
        manifest = self.manifest
        check_inputs(texts)
        found = unknown_tokens(texts, manifest.src_vocab)
        with self._unknown_lock:
            self.unknown.update(found)
        return translate(self.engine, texts, manifest.src_vocab, manifest.tgt_vocab, config, batch_size,
                         manifest.max_source_length, max_batch_tokens=max_batch_tokens, prefixes=prefixes,
                         exact=unpadded(manifest))

    def stream(self, text: str, max_len: int | None = None, *, config: SearchConfig | None = None,
               **options: object) -> Iterator[str]:
        """Pieces of the translation of one sentence as they are produced (greedy or sampled,
        whatever the export's default beam): each is the text the newest token adds, so joining
        them gives the whole translation."""
        from s2s_deploy.runtime.scoring import stream_tokens

        self._check_text()
        if not isinstance(self.engine, StepLoop):
            raise S2SError("streaming runs the step loop: use engine='loop'")
        check_inputs([text])
        if config is None:
            config = self.search_config(1, 1, max_len, None, **options)
        elif max_len is not None or options:
            raise S2SError("give decoding options or a ready config, not both")
        config = self._shortlisted(config)
        if config.beam_size != 1:
            raise S2SError(f"streaming is greedy or sampling: beam_size 1, not {config.beam_size}")
        manifest = self.manifest
        src, src_len = encode_batch([text], manifest.src_vocab, manifest.max_source_length)
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
        through the step decoder (the closing EOS is the last value). Two bare strings are one pair."""
        from s2s_deploy.runtime.scoring import score

        self._check_text()
        if isinstance(sources, str) and isinstance(targets, str):
            sources, targets = [sources], [targets]
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
                      max_len: int | None = None, alpha: float | None = None, batch_size: int = 32, *,
                      config: SearchConfig | None = None, **options: object) -> list[list[Hypothesis]]:
        """For applications that tokenise themselves: each row is the encoder's input as it stands
        (``manifest.src_vocab.encode(text)`` frames it with the prefix and EOS suffix), and each
        hypothesis's ``tokens`` are target ids without the start token and EOS. ``options``: any
        SearchConfig field by name, or ``config``, as for ``__call__``; defaults come from the manifest."""
        self._check_text()
        config = self._config(config, beam, n_best, max_len, alpha, options)
        manifest = self.manifest
        rows = check_ids(ids, len(manifest.src_vocab), manifest.max_source_length)
        return search_ids(self.engine, rows, manifest.src_vocab.pad_id, config, batch_size, unpadded(manifest))

