"""Word timestamps: each decoded window's tokens fed again through the step decoder of an export whose
``attention`` output holds the model's alignment heads (``export --hf DIR --word-timestamps``), and
dynamic time warping over those heads' cross-attention, in numpy.

This is ``generate(return_token_timestamps=True)``'s ``_extract_token_timestamps`` (transformers
5.24): the rows are the attention at each generated token fed as input (the prompt's rows dropped,
the last generated token, never fed, takes the time of the one before), cropped to the encoder
positions of the window's audio (``content_frames // timestamp_frames``, as ``num_frames // 2``),
normalised per head and position over the rows, median-filtered along the positions (width 7,
reflected edges), averaged over the heads; the DTW path's first step into each row is that token's
time, ``time_precision`` seconds per position, plus the window's start. The search's own steps
are not reused: beam search reorders its rows, and one more pass per window (an encoder call and a
step per token) reads exactly the tokens kept, as openai-whisper's ``find_alignment`` does.

A word is a run of text tokens (timestamp, special and hidden ids are not text) whose decoded text
starts with a space or is the first; it runs from its first token's time to the next token's (the
next word's, or the timestamp that follows), the window's last word to its last token's own time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.runtime.align import MEDIAN_WIDTH, dtw, median_filter
from s2s_deploy.runtime.backend import Backend
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.features import Decoded, FeatureReader, Told, Word
from s2s_deploy.runtime.timestamps import Window


def token_times(weights: np.ndarray, positions: int, precision: float) -> np.ndarray:
    """One time per row of ``weights`` ``(heads, rows, source)``: the alignment of ``positions``
    source positions (at most), ``precision`` seconds each."""
    w = weights[..., :positions].astype(np.float32)
    # torch's float32 std (unbiased=False) accumulates in float64 (Welford): so does this one, or a row
    # normalised to 0.99999994 instead of 1 breaks the exact ties of a short output's matrix (two rows:
    # every value is +-1, and the heads' mean is 0 or not) the other way, moving a token by many frames
    mean = w.sum(axis=-2, keepdims=True) / np.float32(w.shape[-2])
    std = w.astype(np.float64).std(axis=-2, keepdims=True).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):  # one row: 0 / 0, NaN as in transformers
        w = (w - mean) / std
    matrix = median_filter(w, MEDIAN_WIDTH).mean(axis=0)
    text, time = dtw(-matrix.astype(np.float64))
    jumps = np.pad(np.diff(text), (1, 0), constant_values=1).astype(bool)
    return time[jumps] * precision


def attention_rows(backend: Backend, src: np.ndarray, src_len: np.ndarray, fed: Sequence[Sequence[int]],
                   skip: Sequence[int]) -> list[np.ndarray]:
    """Each row's ``fed`` tokens stepped through the decoder from its start; the ``attention`` output at
    every step from ``skip`` on: ``(steps, heads, source)`` per row."""
    rows, longest = len(fed), max(len(f) for f in fed)
    tokens = np.full((rows, longest), backend.eos_id, dtype=np.int64)
    for row, sequence in enumerate(fed):
        tokens[row, : len(sequence)] = sequence
    kept: list[list[np.ndarray]] = [[] for _ in fed]
    identity = np.arange(rows, dtype=np.int64)
    with backend.start(src, src_len, keep_attention=True) as run:
        for t in range(longest):
            run.step_top(tokens[:, t].copy(), identity, 1)
            attention = run.attention()
            if attention is None:
                raise S2SError(f"the {backend.name} backend returned no attention weights")
            for row in range(rows):
                if skip[row] <= t < len(fed[row]):
                    kept[row].append(np.array(attention[row], dtype=np.float32))
    return [np.stack(k) if k else np.zeros((0, 0, 0), dtype=np.float32) for k in kept]


def window_times(backend: Backend, features: Sequence[np.ndarray], windows: Sequence[tuple[int, Window]],
                 contents: Sequence[int], config: SearchConfig) -> list[np.ndarray]:
    """Each window's kept tokens' times in seconds from its input's start; ``windows`` pairs an input's
    index in ``features`` with one of its windows; ``contents``: each input's frames of audio."""
    first = features[windows[0][0]]
    width = max(w.width for _, w in windows)
    src = np.zeros((len(windows), *first.shape[:-1], width), dtype=first.dtype)
    for row, (i, w) in enumerate(windows):
        src[row, ..., : w.frames] = features[i][..., w.seek: w.seek + w.frames]
    src_len = np.array([w.width for _, w in windows], dtype=np.int64)
    context = (config.prompt_start, *config.prompt) if config.prompt else ()
    fed, skip = [], []
    for _, w in windows:
        head = (*context, backend.decoder_start_id, *w.best.prompt)
        fed_tokens = w.best.tokens if w.best.finished else w.best.tokens[:-1]  # the last generated is never fed
        fed.append((*head, *fed_tokens))
        skip.append(len(head))
    found = []
    scale = config.time_precision / config.timestamp_frames
    for (i, w), rows in zip(windows, attention_rows(backend, src, src_len, fed, skip), strict=True):
        if not w.kept:
            found.append(np.zeros(0))
            continue
        positions = max(1, (contents[i] - w.seek) // config.timestamp_frames)
        jumps = token_times(rows.transpose(1, 0, 2), positions, config.time_precision) if len(rows) else np.zeros(1)
        times = jumps[np.minimum(np.arange(w.kept), len(jumps) - 1)]
        found.append(times + w.seek * scale)
    return found


def words_of(vocab: Vocabulary, tokens: Sequence[int], times: np.ndarray, text_ids: Sequence[bool]) -> list[Word]:
    """``tokens`` (with their times) as words: runs of text tokens split before one whose decoded text
    starts with a space."""
    words: list[tuple[int, int]] = []
    previous = ""
    for index, is_text in enumerate(text_ids):
        if not is_text:
            continue
        run = [t for t, keep in zip(tokens[: index + 1], text_ids[: index + 1], strict=True) if keep]
        text = vocab.decode(run)
        added = text[len(previous):]
        previous = text
        if not words or words[-1][1] != index or added[:1].isspace():
            words.append((index, index + 1))
        else:
            words[-1] = (words[-1][0], index + 1)
    found = []
    for start, end in words:
        text = vocab.decode([t for t, keep in zip(tokens[start:end], text_ids[start:end], strict=True) if keep])
        closing = times[end] if end < len(tokens) else times[end - 1]
        found.append(Word(float(times[start]), float(closing), text.strip()))
    return found


def decode_words(reader: FeatureReader, features: Sequence[np.ndarray], contents: Sequence[int],
                 config: SearchConfig, labels: Sequence[str],
                 told: Sequence[Told | None] | None = None) -> list[Decoded]:
    """``reader.decode`` with each result's words timed; ``contents``: each input's frames of audio;
    ``told``: as ``reader.decode``'s (segments as windows are decoded; the words come after)."""
    backend = getattr(reader.translator, "backend", None)
    if not reader.manifest.alignment_heads:
        raise S2SError(f"word timestamps: {reader.manifest.directory} has no alignment heads; export it with "
                       "--word-timestamps")
    if backend is None:
        raise S2SError("word timestamps read the step decoder's attention: use engine='loop'")
    read: list[tuple[Window, ...]] = []
    decoded = reader.decode(features, config, labels, read, told)
    if config.hallucination_silence_threshold is not None:  # timed as faster-whisper times them, window by window
        return decoded
    listed = [(i, w) for i, windows in enumerate(read) for w in windows]
    vocab = reader.manifest.tgt_vocab
    hidden = set(vocab.special_ids().values()) | set(vocab.hidden) | set(vocab.languages) | set(vocab.tasks)
    words: list[list[Word]] = [[] for _ in features]
    if listed:
        for (i, w), times in zip(listed, window_times(backend, features, listed, contents, config), strict=True):
            tokens = w.best.tokens[: w.kept]
            text_ids = [t not in hidden and not (config.timestamp_begin >= 1 and t >= config.timestamp_begin)
                        for t in tokens]
            words[i] += words_of(vocab, tokens, times, text_ids)
    return [replace(d, words=tuple(found)) for d, found in zip(decoded, words, strict=True)]
