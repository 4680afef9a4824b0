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
from s2s_deploy.runtime.decoding import SearchConfig, resolve, window_options_on
from s2s_deploy.runtime.scoring import Scored
from s2s_deploy.runtime.search import Hypothesis, SearchEngine, StepLoop


@dataclass(frozen=True)
class Translation:
    source: str
    text: str
    score: float
    hypotheses: tuple[tuple[str, float], ...]


WIDTH_STEP = 32
"""Source ids are padded to the next multiple of this, alone or batched (``canonical_width``)."""


def canonical_width(length: int, limit: int | None = None, step: int = WIDTH_STEP) -> int:
    """The width a source of ``length`` ids is padded to, whatever its batchmates: the next
    multiple of ``step``, never past the model's ``limit`` (nor below ``length``). A row's
    arithmetic then depends on its own ids and this width alone, so it is the same in every
    batch: that is what "alone" means (docs/parity.md). ``step`` 1 is exact-length batching."""
    width = -(-length // step) * step
    return width if limit is None or width <= limit else max(limit, length)


@dataclass(frozen=True)
class Widths:
    """How an export's sources are padded and batched: ``canonical``, each to its
    ``canonical_width`` and batched only with sources of that width (every export that promises
    batch-independent output); else to the batch's longest (per-tensor int8, whose one
    activation scale per tensor ties a row to its batchmates anyway)."""

    canonical: bool
    limit: int | None = None
    step: int = WIDTH_STEP

    def of(self, length: int) -> int:
        return canonical_width(length, self.limit, self.step) if self.canonical else length

    def groups(self, order: Sequence[int], lengths: Sequence[int]) -> list[list[int]]:
        """``order`` (indices sorted by length) as the runs a batch may be cut from: one run per
        width when canonical, else the whole order."""
        if not self.canonical:
            return [list(order)]
        return [list(group) for _, group in itertools.groupby(order, key=lambda i: self.of(lengths[i]))]

    def pad(self, ids: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
        """One batch, right-padded with ``pad_id`` to its width, and its lengths."""
        return pad_ids(ids, pad_id, self.of(max(len(seq) for seq in ids)))


def widths(manifest: Manifest) -> Widths:
    """The padding rule of this export (see ``Widths``)."""
    per_tensor = manifest.quantization is not None and manifest.quantization.activations == "per-tensor"
    return Widths(not per_tensor, manifest.max_source_length)


def encode_ids(texts: Sequence[str], vocab: Vocabulary, max_len: int | None = None) -> list[list[int]]:
    """Each text's ids (with EOS), refused over the model's limit. Empty lines are the caller's to skip."""
    ids = [vocab.encode(text) for text in texts]
    for text, seq in zip(texts, ids, strict=True):
        if max_len is not None and len(seq) > max_len:
            raise S2SError(f"input of {len(seq)} tokens exceeds the model's limit of {max_len}: {text[:40]!r}")
    return ids


def encode_batch(texts: Sequence[str], vocab: Vocabulary, max_len: int | None = None,
                 padding: Widths | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids (with EOS) and their lengths: to the longest, or by ``padding``."""
    ids = encode_ids(texts, vocab, max_len)
    return pad_ids(ids, vocab.pad_id) if padding is None else padding.pad(ids, vocab.pad_id)


def pad_ids(ids: Sequence[Sequence[int]], pad_id: int, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows right-padded with ``pad_id`` to ``width`` (default: the longest), and their lengths."""
    lengths = np.array([len(seq) for seq in ids], dtype=np.int64)
    batch = np.full((len(ids), int(lengths.max()) if width is None else width), pad_id, dtype=np.int64)
    for row, seq in enumerate(ids):
        batch[row, : len(seq)] = seq
    return batch, lengths


def batches_of(ids: Sequence[Sequence[int]], padding: Widths, batch_size: int,
               max_batch_tokens: int | None = None) -> list[list[int]]:
    """Indices of ``ids`` cut into batches: sorted by length (ties in input order), within
    ``padding``'s groups, at most ``batch_size`` rows and, with ``max_batch_tokens``, at most that
    many padded source positions (rows x width); a row alone over it still gets a batch."""
    lengths = [len(row) for row in ids]
    order = sorted(range(len(ids)), key=lengths.__getitem__)
    batches: list[list[int]] = []
    for group in padding.groups(order, lengths):
        current: list[int] = []
        for index in group:  # sorted: the newest row is the widest
            width = padding.of(lengths[index])
            if current and (len(current) == batch_size
                            or (max_batch_tokens is not None and width * (len(current) + 1) > max_batch_tokens)):
                batches.append(current)
                current = []
            current.append(index)
        batches.append(current)
    return batches


def search_ids(engine: SearchEngine, ids: Sequence[Sequence[int]], pad_id: int, config: SearchConfig,
               batch_size: int = 32, padding: Widths = Widths(False)) -> list[list[Hypothesis]]:
    """n-best hypotheses per row of source ids, batched by ``padding``, in input order."""
    results: list[list[Hypothesis]] = [[] for _ in ids]
    for chunk in batches_of(ids, padding, batch_size):
        src, src_len = padding.pad([ids[i] for i in chunk], pad_id)
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
    padding: Widths = Widths(False),
) -> list[Translation]:
    """Sentences are batched by length for speed and returned in input order. A batch holds at
    most ``batch_size`` sentences and, with ``max_batch_tokens``, at most that many source
    tokens counted as rows x width (padding included); ``padding`` says how sources are padded
    and which may share a batch (``widths(manifest)``). ``prefixes``: one per text; ``on_batch``
    hears how many sentences each batch finished (for a progress bar)."""
    check_inputs(texts)
    if prefixes is not None and len(prefixes) != len(texts):
        raise S2SError(f"{len(prefixes)} prefixes for {len(texts)} inputs")
    ids = encode_ids(texts, src_vocab, max_source_length)
    results: list[Translation | None] = [None] * len(texts)
    for chunk in batches_of(ids, padding, batch_size, max_batch_tokens):
        src, src_len = padding.pad([ids[i] for i in chunk], src_vocab.pad_id)
        chunk_config = config if prefixes is None else replace(config, prefix=tuple(prefixes[i] for i in chunk))
        for index, hyps in zip(chunk, engine.search(src, src_len, chunk_config), strict=True):
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
        self.padding = widths(self.manifest)
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
        config = resolve(self.manifest, {"beam_size": beam, "n_best": n_best, "max_len": max_len, "alpha": alpha,
                                         **options})
        if window_options_on(config) and not self.manifest.encoder_input.is_features:
            raise S2SError("the temperature fallback and its options (temperature, thresholds, "
                           "condition_on_previous_text, initial_prompt) read audio window by window: use transcribe")
        if config.batched and not self.manifest.encoder_input.is_features:
            raise S2SError("batched reads long audio as independent windows: use transcribe")
        return config

    def config_for(self, config: SearchConfig | None, beam: int | None, n_best: int | None, max_len: int | None,
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
        config = self.config_for(config, beam, n_best, max_len, alpha, options)
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
                         padding=self.padding)

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
        src, src_len = encode_batch([text], manifest.src_vocab, manifest.max_source_length, self.padding)
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
        ids = encode_ids(sources, manifest.src_vocab, manifest.max_source_length)
        found: list[Scored | None] = [None] * len(sources)
        for chunk in batches_of(ids, self.padding, batch_size):
            src, src_len = self.padding.pad([ids[i] for i in chunk], manifest.src_vocab.pad_id)
            gold = [manifest.tgt_vocab.encode(targets[i], add_eos=False) for i in chunk]
            for index, scored in zip(chunk, score(self.backend, src, src_len, gold), strict=True):
                found[index] = scored
        return [scored for scored in found if scored is not None]

    def translate_ids(self, ids: Sequence[Sequence[int]], beam: int | None = None, n_best: int | None = None,
                      max_len: int | None = None, alpha: float | None = None, batch_size: int = 32, *,
                      config: SearchConfig | None = None, **options: object) -> list[list[Hypothesis]]:
        """For applications that tokenise themselves: each row is the encoder's input as it stands
        (``manifest.src_vocab.encode(text)`` frames it with the prefix and EOS suffix), and each
        hypothesis's ``tokens`` are target ids without the start token and EOS. ``options``: any
        SearchConfig field by name, or ``config``, as for ``__call__``; defaults come from the manifest."""
        self._check_text()
        config = self.config_for(config, beam, n_best, max_len, alpha, options)
        manifest = self.manifest
        rows = check_ids(ids, len(manifest.src_vocab), manifest.max_source_length)
        return search_ids(self.engine, rows, manifest.src_vocab.pad_id, config, batch_size, self.padding)

