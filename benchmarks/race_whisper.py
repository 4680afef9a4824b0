"""The Whisper race (issue #37): one seeded random Whisper-base-sized model, s2s-deploy against
faster-whisper (CTranslate2) and Optimum + ONNX Runtime, on the same 30-second clips.

``build`` (the peers' interpreter: torch, ``transformers`` < 4.58) writes one Hugging Face folder
that every engine converts: a Whisper-base-sized ``WhisperForConditionalGeneration`` (d 512, 6+6
layers, 8 heads, FFN 2048, 51,865 ids laid out as multilingual Whisper's, 80 mel bins, 1,500
source and 448 target positions) with seeded random weights, saved with safetensors beside a
``WhisperFeatureExtractor``'s ``preprocessor_config.json``, a generation config that forces
``<|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>`` with ``suppress_tokens`` and
``begin_suppress_tokens``, and a word-level ``tokenizer.json`` holding Whisper's special token
strings at their ids (``w<id>`` elsewhere; faster-whisper and the converters read it; nothing is
downloaded). The timestamp ids' embedding rows (tied to the output layer) are zeroed, so no engine
ever picks one and ``generate`` never cuts a segment. Beside it: 8 seeded 30-second clips
(``clips.npy``, 16 kHz: espeak-ng speech over noise, or tones and noise without espeak-ng) and
``reference.json``, the 32 tokens ``transformers`` ``generate`` decodes per clip, greedy and beam 5
(``min_new_tokens = max_new_tokens = 32``), against which every cell counts its agreement.

``race`` (our interpreter) times, per precision (fp32, int8), search (greedy, beam 5) and batch (1,
8), three parts on the same 8 clips per pass: the encoder alone (on each engine's own features,
computed once), the decoder alone (32 generated tokens per clip, on encoder outputs computed once)
and the whole transcription (samples → each engine's own features → encoder → 32 tokens). Each
engine runs in its own worker process with 2 threads (ONNX Runtime intra-op 2, inter-op 1;
CTranslate2 ``intra_threads=2, inter_threads=1``); per cell, after a warm-up pass each, the engines
take turns pass by pass, rotating who goes first, with a rest before each pass, as
``peers_interleaved.py`` does; the cell reports each engine's median seconds per pass with its
range and the median of the per-round ratios (peer / ours).

The engines:
- ``s2s``: our export (``Transcriber``: its numpy front end, the encoder session, the step loop with
  ``min_len = max_len = 32``);
- ``ct2``: CTranslate2 4.x's ``models.Whisper`` as faster-whisper drives it (faster-whisper's
  ``FeatureExtractor``, ``encode``, ``generate`` with its prompt, ``max_length`` 64 (it generates
  ``max_length // 2``: 32), ``suppress_blank``, ``suppress_tokens = [-1, EOS]`` so exactly 32 tokens come out);
- ``fw``: faster-whisper's own pipeline on the same CTranslate2 folder, whole transcriptions only:
  ``WhisperModel.transcribe`` per clip at batch 1, ``BatchedInferencePipeline.transcribe`` over the
  8 clips laid end to end with one ``clip_timestamps`` window each at batch 8 (``language="en"``,
  no VAD, temperature 0 only, no fallback thresholds, ``max_new_tokens=60``, so ``max_length`` 64
  and 32 tokens, the folder's ``suppress_tokens`` and EOS suppressed; ``_Multilingual`` makes it
  prompt with ``<|en|> <|transcribe|>``, which CTranslate2's reading of this folder drops);
- ``optimum``: ``ORTModelForSpeechSeq2Seq`` (optimum-onnx's export, merged decoder) with
  ``generate(min_new_tokens=32, max_new_tokens=32)``; ``transformers``' ``WhisperFeatureExtractor``
  for its features. fp32; int8 too where ``optimum-int8/`` exists (``optimum-cli onnxruntime quantize``).

Commands (the real run; ``--tiny`` builds a d-128, 2+2-layer model of the same vocabulary and window
for a smoke run):

    P=/work/peers-venv/bin/python R=/tmp/wrace/base
    $P benchmarks/race_whisper.py build --out $R
    /work/peers-venv/bin/ct2-transformers-converter --model $R/hf --output_dir $R/ct2-fp32 \\
        --copy_files tokenizer.json preprocessor_config.json --force
    /work/peers-venv/bin/ct2-transformers-converter --model $R/hf --output_dir $R/ct2-int8 \\
        --copy_files tokenizer.json preprocessor_config.json --quantization int8 --force
    /work/peers-venv/bin/optimum-cli export onnx --model $R/hf --task automatic-speech-recognition-with-past $R/optimum
    /work/peers-venv/bin/optimum-cli onnxruntime quantize --onnx_model $R/optimum --avx2 -o $R/optimum-int8
    s2s-deploy export --hf $R/hf --out $R/s2s-fp32 --no-checkpoint
    s2s-deploy quantize $R/s2s-fp32 --int8 --out $R/s2s-int8
    python benchmarks/race_whisper.py race --root $R --peer-python $P --reps 5    # ours: s2s-deploy's venv

``--precisions``, ``--parts``, ``--cells`` and ``--clips`` narrow a run; a peer that fails to load
or to run a cell is reported and left out, and the race goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from peers_interleaved import _cells  # the NLLB/mT5 race's parser of beam x batch cells

SEED = 20261127
CLIPS = 8
RATE = 16000
SECONDS = 30
GEN_LEN = 32
THREADS = 2
PARTS = ("encoder", "decoder", "whole")
METHODS = {"decoder": "decode", "whole": "whole", "long": "long", "short": "short"}
CELLS = ((1, 1), (1, 8), (5, 1), (5, 8))  # (beam, batch)
LONG_WINDOWS = 20  # the longform part's long clip: 20 windows of 30 s, 10 minutes
SHORT_CLIPS = 50  # and its short clips, 2 to 28 s each
LONG_INPUTS = ("long", "short")
LONG_CELLS = ((1, 8), (1, 16), (5, 8), (5, 16))

# Multilingual Whisper's id layout (51,865 ids): 50,257 text ids, then the special tokens.
VOCAB = 51865
EOS, SOT = 50257, 50258
FIRST_LANGUAGE = 50259  # 99 languages: 50259..50357
TRANSLATE, TRANSCRIBE, START_OF_LM, START_OF_PREV, NO_SPEECH, NO_TIMESTAMPS = range(50358, 50364)
TIMESTAMP_BEGIN = 50364  # <|0.00|> .. <|30.00|>: 1,501 ids
PROMPT = (SOT, FIRST_LANGUAGE, TRANSCRIBE, NO_TIMESTAMPS)  # <|en|> is the first language
# CTranslate2 4.8.5's Whisper generates max_length // 2 tokens after the prompt (measured: 36 -> 18,
# 40 -> 20, 448 -> 224, as openai-whisper's sample_len = n_text_ctx // 2), and faster-whisper passes
# max_length = len(prompt) + max_new_tokens: so 64, and max_new_tokens 60, give exactly 32.
CT2_MAX_LENGTH = 2 * GEN_LEN
FW_MAX_NEW_TOKENS = CT2_MAX_LENGTH - len(PROMPT)


def languages() -> list[str]:
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return list(LANGUAGES)[:99]  # Whisper-base's 99 (large-v3 added "yue" last)


def special_tokens() -> dict[int, str]:
    named = {EOS: "<|endoftext|>", SOT: "<|startoftranscript|>", TRANSLATE: "<|translate|>",
             TRANSCRIBE: "<|transcribe|>", START_OF_LM: "<|startoflm|>", START_OF_PREV: "<|startofprev|>",
             NO_SPEECH: "<|nospeech|>", NO_TIMESTAMPS: "<|notimestamps|>"}
    named.update({FIRST_LANGUAGE + i: f"<|{code}|>" for i, code in enumerate(languages())})
    named.update({TIMESTAMP_BEGIN + i: f"<|{i * 0.02:.2f}|>" for i in range(VOCAB - TIMESTAMP_BEGIN)})
    return named


def whisper_config(tiny: bool) -> Any:
    from transformers import WhisperConfig

    rng = np.random.default_rng(SEED)
    # Whisper-base suppresses 82 punctuation and symbol ids and the task and prompt tokens: as many, seeded.
    suppress = sorted({*(int(i) for i in rng.choice(np.arange(1, EOS), 82, replace=False)),
                       TRANSLATE, TRANSCRIBE, START_OF_LM, START_OF_PREV, NO_SPEECH})
    shape = (dict(d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512) if tiny else
             dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                  decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048))
    return WhisperConfig(vocab_size=VOCAB, num_mel_bins=80, max_source_positions=1500, max_target_positions=448,
                         pad_token_id=EOS, bos_token_id=EOS, eos_token_id=EOS, decoder_start_token_id=SOT,
                         suppress_tokens=suppress, begin_suppress_tokens=[220, EOS], **shape)


def write_tokenizer(folder: Path) -> None:
    """One id per word: Whisper's special token strings at their ids, ``w<id>`` elsewhere."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = special_tokens()
    table = {specials.get(i, f"w{i}"): i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(table, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": [specials[i] for i in sorted(specials)
                                                           if i < TIMESTAMP_BEGIN and i != EOS]})
    fast.save_pretrained(folder)


SENTENCES = ("the quick brown fox jumps over the lazy dog near the river bank",
             "please call stella and ask her to bring these things with her from the store",
             "six spoons of fresh snow peas five thick slabs of blue cheese and maybe a snack for her brother",
             "we also need a small plastic snake and a big toy frog for the kids",
             "she can scoop these things into three red bags and we will go meet her wednesday at the train station",
             "a large language model was trained on many hours of recorded speech",
             "the weather today is cloudy with a chance of rain in the late afternoon",
             "numbers such as forty two and nineteen eighty four appear in the transcript",
             "open the window and let the fresh air into the room before the meeting starts",
             "every engine must decode exactly thirty two tokens from each of these clips")


def speech(text: str, rng: np.random.Generator, scratch: Path) -> np.ndarray | None:
    """espeak-ng's reading of ``text`` at 16 kHz, or None without espeak-ng."""
    import wave

    binary = shutil.which("espeak-ng")
    if binary is None:
        return None
    voice = str(rng.choice(["en", "en-us", "en-gb", "en+f3", "en+m3"]))
    path = scratch / "utterance.wav"
    subprocess.run([binary, "-v", voice, "-s", str(int(rng.integers(130, 190))), "-p", str(int(rng.integers(30, 70))),
                    "-w", str(path), text], check=True, capture_output=True)
    with wave.open(str(path)) as f:
        rate, data = f.getframerate(), np.frombuffer(f.readframes(f.getnframes()), dtype=np.int16)
    samples = data.astype(np.float32) / 32768
    times = np.arange(int(len(samples) * RATE / rate)) / RATE
    return np.interp(times, np.arange(len(samples)) / rate, samples).astype(np.float32)


def tones(rng: np.random.Generator) -> np.ndarray:
    t = np.arange(int(RATE * rng.uniform(1.5, 4))) / RATE
    f0, f1 = rng.uniform(100, 3000, 2)
    return (0.3 * np.sin(2 * np.pi * (f0 + (f1 - f0) * t / (2 * t[-1])) * t)).astype(np.float32)


def make_clips() -> tuple[np.ndarray, str]:
    """8 seeded clips of exactly 30 s: utterances with pauses between, over low noise."""
    rng = np.random.default_rng(SEED)
    clips = np.zeros((CLIPS, RATE * SECONDS), dtype=np.float32)
    with tempfile.TemporaryDirectory() as scratch:
        kind = "espeak-ng speech" if shutil.which("espeak-ng") else "chirps"
        for row in clips:
            at = int(RATE * rng.uniform(0.2, 1.0))
            while at < len(row):
                piece = speech(str(rng.choice(SENTENCES)), rng, Path(scratch))
                piece = tones(rng) if piece is None else piece
                piece = piece[: len(row) - at]
                row[at: at + len(piece)] += piece * rng.uniform(0.5, 1.0)
                at += len(piece) + int(RATE * rng.uniform(0.2, 1.2))
            row += rng.normal(0, rng.uniform(0.002, 0.01), len(row)).astype(np.float32)
    return np.clip(clips, -1, 1), kind


def longform_audio(clips: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The ``longform`` part's audio, made from ``clips.npy`` with a fixed seed (every worker makes the
    same): a 10-minute clip, 20 of the 30-second clips each turned by a random offset (``np.roll``) and
    laid end to end, and 50 short clips of 2 to 28 s, each a random stretch of a random clip."""
    rng = np.random.default_rng(SEED + 46)
    long = np.concatenate([np.roll(clips[int(rng.integers(len(clips)))], int(rng.integers(RATE * SECONDS)))
                           for _ in range(LONG_WINDOWS)])
    short = []
    for _ in range(SHORT_CLIPS):
        length = int(RATE * rng.uniform(2, 28))
        start = int(rng.integers(RATE * SECONDS - length))
        short.append(np.ascontiguousarray(clips[int(rng.integers(len(clips)))][start: start + length]))
    return long, short


def build(out: Path, tiny: bool) -> None:
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    hf = out / "hf"
    model = WhisperForConditionalGeneration(whisper_config(tiny)).eval()
    with torch.no_grad():  # tied to the output layer: no timestamp id ever wins
        model.get_input_embeddings().weight[TIMESTAMP_BEGIN:] = 0
    generation = model.generation_config
    generation.lang_to_id = {f"<|{code}|>": FIRST_LANGUAGE + i for i, code in enumerate(languages())}
    generation.task_to_id = {"translate": TRANSLATE, "transcribe": TRANSCRIBE}
    generation.no_timestamps_token_id = NO_TIMESTAMPS
    generation.is_multilingual = True
    generation.language, generation.task = "en", "transcribe"
    generation.max_length, generation.num_beams = 448, 1
    generation._from_model_config = False  # as a hub folder's: transformers drops these keys otherwise
    model.save_pretrained(hf, safe_serialization=True)
    extractor = WhisperFeatureExtractor(feature_size=80, sampling_rate=RATE, hop_length=160, chunk_length=SECONDS,
                                        n_fft=400)
    extractor.save_pretrained(hf)
    write_tokenizer(hf)
    clips, kind = make_clips()
    np.save(out / "clips.npy", clips)
    loaded = WhisperForConditionalGeneration.from_pretrained(hf, local_files_only=True).eval()
    features = torch.from_numpy(extractor(list(clips), sampling_rate=RATE, return_tensors="np").input_features)
    reference: dict[str, Any] = {"seed": SEED, "clips": kind, "gen_len": GEN_LEN, "prompt": list(PROMPT)}
    for beam in (1, 5):
        started = time.perf_counter()
        with torch.no_grad():
            rows = loaded.generate(input_features=features, num_beams=beam, do_sample=False,
                                   min_new_tokens=GEN_LEN, max_new_tokens=GEN_LEN)
        reference[str(beam)] = [row[-GEN_LEN:] for row in rows.tolist()]
        print(f"generate beam {beam}: {time.perf_counter() - started:.1f} s; "
              f"first clip {reference[str(beam)][0][:8]}...", flush=True)
    (out / "reference.json").write_text(json.dumps(reference))
    parameters = sum(p.numel() for p in model.parameters())
    print(f"whisper{' (tiny)' if tiny else ''}: {parameters / 1e6:.1f}M parameters in {hf}; {CLIPS} clips of "
          f"{SECONDS} s ({kind}) in {out / 'clips.npy'}; generate's tokens in {out / 'reference.json'}")


# ----------------------------------------------------------------------------- engines (workers)
def chunks(count: int, batch: int) -> list[slice]:
    return [slice(start, min(start + batch, count)) for start in range(0, count, batch)]


class _Cached:
    """An encoder session stand-in that answers with outputs computed before."""

    def __init__(self, outputs: list[np.ndarray]) -> None:
        self.outputs = outputs

    def run(self, _names: Any, _feeds: Any) -> list[np.ndarray]:
        return self.outputs


class Ours:
    def __init__(self, export: Path, clips: np.ndarray) -> None:
        from s2s_deploy.runtime.transcriber import Transcriber, pad_features

        self.pad = pad_features
        self.transcriber = Transcriber(export, device="cpu", threads=THREADS)
        quantization = self.transcriber.manifest.quantization
        self.name = f"s2s-deploy {quantization.kind if quantization else 'fp32'}"
        self.engine = self.transcriber.translator.engine
        self.backend = self.engine.backend
        self.encoder = self.backend.encoder
        self.names = list(self.transcriber.manifest.encoder.outputs)
        self.clips = clips
        self.src, self.src_len = pad_features([self.transcriber.features(c) for c in clips], self.transcriber.source)
        self.encoded: dict[int, list[Any]] = {}  # per batch size, filled by the (untimed) warm-up pass

    def _feeds(self, part: slice) -> dict[str, np.ndarray]:
        return {"src": self.src[part], "src_len": self.src_len[part]}

    def _search(self, src: np.ndarray, src_len: np.ndarray, beam: int) -> list[list[int]]:
        config = self.transcriber.translator.search_config(beam, 1, GEN_LEN, min_len=GEN_LEN)
        return [list(hyps[0].tokens) for hyps in self.engine.search(src, src_len, config)]

    def encode(self, batch: int) -> None:
        for part in chunks(len(self.clips), batch):
            self.encoder.run(self.names, self._feeds(part))

    def decode(self, beam: int, batch: int) -> list[list[int]]:
        found = []
        try:
            if batch not in self.encoded:
                self.encoded[batch] = [self.encoder.run(self.names, self._feeds(part))
                                       for part in chunks(len(self.clips), batch)]
            for part, outputs in zip(chunks(len(self.clips), batch), self.encoded[batch], strict=True):
                self.backend.encoder = _Cached(outputs)
                found += self._search(self.src[part], self.src_len[part], beam)
        finally:
            self.backend.encoder = self.encoder
        return found

    def whole(self, beam: int, batch: int) -> list[list[int]]:
        found = []
        for part in chunks(len(self.clips), batch):
            src, src_len = self.pad([self.transcriber.features(c) for c in self.clips[part]], self.transcriber.source)
            found += self._search(src, src_len, beam)
        return found

    def _batched(self, audio: list[np.ndarray], beam: int, batch: int) -> list[list[int]]:
        """``Transcriber(..., batched=True)``'s work on ``audio``, each window's tokens in order: the front end
        per clip, then every clip's fixed windows decoded together, ``batch`` windows at a time."""
        config = self.transcriber.translator.search_config(beam, 1, GEN_LEN, min_len=GEN_LEN, batched=True)
        features = [self.transcriber.features(a, whole=True) for a in audio]
        return [list(w.best.tokens) for sought in self.transcriber.batched(features, config, batch)
                for w in sought.windows]

    def long(self, beam: int, batch: int) -> list[list[int]]:
        return self._batched([longform_audio(self.clips)[0]], beam, batch)

    def short(self, beam: int, batch: int) -> list[list[int]]:
        return self._batched(longform_audio(self.clips)[1], beam, batch)


class CT2:
    """CTranslate2's Whisper as faster-whisper drives it, with exact control of the length."""

    def __init__(self, folder: Path, compute_type: str, clips: np.ndarray) -> None:
        import ctranslate2
        from faster_whisper.audio import pad_or_trim
        from faster_whisper.feature_extractor import FeatureExtractor

        self.ct2 = ctranslate2
        self.name = f"CTranslate2 {compute_type} (faster-whisper's features)"
        self.model = ctranslate2.models.Whisper(str(folder), device="cpu", compute_type=compute_type,
                                                intra_threads=THREADS, inter_threads=1)
        self.extractor = FeatureExtractor(feature_size=self.model.n_mels)
        self.pad_or_trim = pad_or_trim
        self.clips = clips
        self.features = np.stack([self._features(c) for c in clips])
        self.encoded: dict[int, list[Any]] = {}  # per batch size, filled by the (untimed) warm-up pass

    def _features(self, clip: np.ndarray) -> np.ndarray:
        """As ``WhisperModel.transcribe`` cuts its one 30-second window."""
        features = self.extractor(clip)
        return self.pad_or_trim(features[:, : self.extractor.nb_max_frames])

    def _encode(self, features: np.ndarray) -> Any:
        return self.model.encode(self.ct2.StorageView.from_array(np.ascontiguousarray(features)), to_cpu=False)

    def _generate(self, encoded: Any, rows: int, beam: int) -> list[list[int]]:
        results = self.model.generate(encoded, [list(PROMPT)] * rows, beam_size=beam, max_length=CT2_MAX_LENGTH,
                                      suppress_blank=True, suppress_tokens=[-1, EOS])
        return [list(r.sequences_ids[0]) for r in results]

    def encode(self, batch: int) -> None:
        for part in chunks(len(self.clips), batch):
            self._encode(self.features[part])

    def decode(self, beam: int, batch: int) -> list[list[int]]:
        found = []
        if batch not in self.encoded:
            self.encoded[batch] = [self._encode(self.features[part]) for part in chunks(len(self.clips), batch)]
        for part, encoded in zip(chunks(len(self.clips), batch), self.encoded[batch], strict=True):
            found += self._generate(encoded, part.stop - part.start, beam)
        return found

    def whole(self, beam: int, batch: int) -> list[list[int]]:
        found = []
        for part in chunks(len(self.clips), batch):
            features = np.stack([self._features(c) for c in self.clips[part]])
            found += self._generate(self._encode(features), part.stop - part.start, beam)
        return found


class _Multilingual:
    """CTranslate2 4.8.5 reads this folder as English-only (``is_multilingual`` False, though its
    51,865 ids and ``lang_ids`` are multilingual Whisper's), and faster-whisper then prompts with
    ``<|startoftranscript|> <|notimestamps|>`` only; this says multilingual, so it prompts with
    ``<|en|> <|transcribe|>`` as for Whisper-base. Everything else is the model's own."""

    is_multilingual = True

    def __init__(self, model: Any) -> None:
        self._model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class FasterWhisper:
    """faster-whisper's own pipeline (whole transcriptions only)."""

    def __init__(self, folder: Path, compute_type: str, clips: np.ndarray) -> None:
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        self.name = f"faster-whisper {compute_type} (WhisperModel / BatchedInferencePipeline)"
        self.model = WhisperModel(str(folder), device="cpu", compute_type=compute_type, cpu_threads=THREADS,
                                  num_workers=1, local_files_only=True)
        if not self.model.model.is_multilingual:
            self.model.model = _Multilingual(self.model.model)
        # Its -1 means the tokenizer's non-speech symbols (Whisper's own list, which a real folder's
        # suppress_tokens equals); this word-level tokenizer has none, so the folder's list is given.
        suppress = json.loads((folder / "config.json").read_text())["suppress_ids"]
        self.batched = BatchedInferencePipeline(self.model)
        self.clips = clips
        self.options = dict(language="en", task="transcribe", best_of=1, temperature=0.0, without_timestamps=True,
                            compression_ratio_threshold=None, log_prob_threshold=None, no_speech_threshold=None,
                            condition_on_previous_text=False, vad_filter=False, max_new_tokens=FW_MAX_NEW_TOKENS,
                            suppress_tokens=[*suppress, EOS], word_timestamps=False)

    def whole(self, beam: int, batch: int) -> list[list[int]]:
        if batch == 1:
            found = []
            for clip in self.clips:
                segments, _info = self.model.transcribe(clip, beam_size=beam, **self.options)
                found.append([token for segment in segments for token in segment.tokens])
            return found
        found = []
        for part in chunks(len(self.clips), batch):
            audio = np.concatenate(list(self.clips[part]))
            windows = [{"start": i * SECONDS, "end": (i + 1) * SECONDS} for i in range(part.stop - part.start)]
            segments, _info = self.batched.transcribe(audio, beam_size=beam, batch_size=batch, clip_timestamps=windows,
                                                      **{k: v for k, v in self.options.items()
                                                         if k not in ("condition_on_previous_text", "vad_filter")})
            found += [list(segment.tokens) for segment in segments]
        return found

    def _windows(self, audio: np.ndarray, windows: list[dict[str, float]], beam: int, batch: int) -> list[list[int]]:
        segments, _info = self.batched.transcribe(audio, beam_size=beam, batch_size=batch, clip_timestamps=windows,
                                                  vad_filter=False, **{k: v for k, v in self.options.items()
                                                                       if k not in ("condition_on_previous_text",
                                                                                    "vad_filter")})
        return [list(segment.tokens) for segment in segments]

    def long(self, beam: int, batch: int) -> list[list[int]]:
        """The 10-minute clip as its batched pipeline reads long audio without VAD: fixed 30-second
        ``clip_timestamps`` (it refuses audio over 30 s without VAD or clip_timestamps)."""
        audio = longform_audio(self.clips)[0]
        seconds = len(audio) / RATE
        windows = [{"start": float(start), "end": min(start + SECONDS, seconds)} for start in range(0, int(
            np.ceil(seconds)), SECONDS)]
        return self._windows(audio, windows, beam, batch)

    def short(self, beam: int, batch: int) -> list[list[int]]:
        """The 50 short clips: it batches the windows of one call only, so they go laid end to end, one
        ``clip_timestamps`` window per clip (its best case: one call per file would decode one window at a time)."""
        short = longform_audio(self.clips)[1]
        ends = np.cumsum([len(a) for a in short])
        # half a sample later, so that its int(seconds * rate) lands on the very sample
        windows = [{"start": (end - len(a) + 0.5) / RATE, "end": (end + 0.5) / RATE} for a, end in
                   zip(short, ends.tolist(), strict=True)]
        return self._windows(np.concatenate(short), windows, beam, batch)


class Optimum:
    def __init__(self, folder: Path, clips: np.ndarray) -> None:
        import onnxruntime as ort
        import torch
        from optimum.onnxruntime import ORTModelForSpeechSeq2Seq
        from transformers import WhisperFeatureExtractor
        from transformers.modeling_outputs import BaseModelOutput

        torch.set_num_threads(THREADS)
        self.torch, self.output = torch, BaseModelOutput
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.model = ORTModelForSpeechSeq2Seq.from_pretrained(folder, session_options=options,
                                                              provider="CPUExecutionProvider", use_cache=True)
        self.name = f"Optimum ORTModelForSpeechSeq2Seq generate ({'int8' if 'int8' in folder.name else 'fp32'})"
        self.extractor = WhisperFeatureExtractor.from_pretrained(folder)
        self.clips = clips
        self.features = self._features(clips)
        self.encoded: dict[int, list[Any]] = {}  # per batch size, filled by the (untimed) warm-up pass

    def _features(self, clips: np.ndarray) -> Any:
        found = self.extractor(list(clips), sampling_rate=RATE, return_tensors="np").input_features
        return self.torch.from_numpy(found)

    def _generate(self, beam: int, **inputs: Any) -> list[list[int]]:
        rows = self.model.generate(**inputs, num_beams=beam, do_sample=False, min_new_tokens=GEN_LEN,
                                   max_new_tokens=GEN_LEN)
        return [row[-GEN_LEN:] for row in rows.tolist()]

    def encode(self, batch: int) -> None:
        with self.torch.inference_mode():
            for part in chunks(len(self.clips), batch):
                self.model.encoder(self.features[part], None)

    def decode(self, beam: int, batch: int) -> list[list[int]]:
        found = []
        with self.torch.inference_mode():
            if batch not in self.encoded:
                self.encoded[batch] = [self.model.encoder(self.features[part], None).last_hidden_state
                                       for part in chunks(len(self.clips), batch)]
            for encoded in self.encoded[batch]:
                found += self._generate(beam, encoder_outputs=self.output(last_hidden_state=encoded))
        return found

    def whole(self, beam: int, batch: int) -> list[list[int]]:
        found = []
        with self.torch.inference_mode():
            for part in chunks(len(self.clips), batch):
                found += self._generate(beam, input_features=self._features(self.clips[part]))
        return found


def open_engine(key: str, root: Path, clips: np.ndarray) -> Any:
    """``s2s-fp32``, ``ct2-int8``, ``fw-fp32``, ``optimum-fp32`` ...: the engine and its folder under ``root``."""
    kind, precision = key.rsplit("-", 1)
    compute = {"fp32": "float32", "int8": "int8"}[precision]
    if kind == "s2s":
        return Ours(root / key, clips)
    if kind == "ct2":
        return CT2(root / key, compute, clips)
    if kind == "fw":
        return FasterWhisper(root / f"ct2-{precision}", compute, clips)
    if kind == "optimum":
        return Optimum(root / ("optimum" if precision == "fp32" else "optimum-int8"), clips)
    raise SystemExit(f"error: unknown engine {key}")


def worker(args: argparse.Namespace) -> None:
    """Answer 'part beam batch' lines with the seconds of one pass over the 8 clips (and its tokens)."""
    clips = np.load(args.root / "clips.npy")[: args.clips]
    try:
        system = open_engine(args.engine, args.root, clips)
    except Exception as exc:  # a peer that cannot load: the race goes on without it
        print(json.dumps({"failed": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    print(json.dumps({"ready": system.name}), flush=True)
    for line in sys.stdin:
        part, beam, batch = line.split()
        beam, batch = int(beam), int(batch)
        try:
            started = time.perf_counter()
            outputs = system.encode(batch) if part == "encoder" else getattr(system, METHODS[part])(beam, batch)
            seconds = time.perf_counter() - started
        except Exception as exc:
            print(json.dumps({"failed": f"{type(exc).__name__}: {exc}"}), flush=True)
            continue
        print(json.dumps({"seconds": seconds, "outputs": outputs}), flush=True)


# ----------------------------------------------------------------------------- the race
class _Worker:
    def __init__(self, key: str, command: list[str]) -> None:
        self.key = key
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        answer = self._read()
        self.failed = answer.get("failed")
        self.name = answer.get("ready", key)

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            return {"failed": f"worker exited with {self.process.wait()}"}
        return json.loads(line)

    def run(self, part: str, beam: int, batch: int) -> dict:
        self.process.stdin.write(f"{part} {beam} {batch}\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait()


def engines_for(root: Path, precision: str) -> list[str]:
    keys = [f"s2s-{precision}", f"ct2-{precision}", f"fw-{precision}"]
    if (root / ("optimum" if precision == "fp32" else "optimum-int8")).is_dir():
        keys.append(f"optimum-{precision}")
    return keys


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s [{min(values):.3f}-{max(values):.3f}]"


@contextlib.contextmanager
def _workers(args: argparse.Namespace, script: str, precision: str, keys: list[str], clips: int,
             failures: dict[str, str]) -> Iterator[dict[str, _Worker]]:
    """One worker per engine of ``keys`` (a peer that fails to load is reported and left out; ours must
    load), closed on the way out."""
    workers: dict[str, _Worker] = {}
    try:
        for key in keys:
            python = sys.executable if key.startswith("s2s") else args.peer_python
            worker_ = _Worker(key, [python, script, "worker", "--root", str(args.root.resolve()), "--engine", key,
                                    "--clips", str(clips)])
            if worker_.failed:
                failures[key] = worker_.failed
                print(f"{key}: failed to load: {worker_.failed}", flush=True)
                worker_.close()
            else:
                workers[key] = worker_
        if f"s2s-{precision}" not in workers:
            raise SystemExit(f"error: our {precision} engine did not load: {failures.get(f's2s-{precision}')}")
        yield workers
    finally:
        for worker_ in workers.values():
            worker_.close()


def _interleaved(args: argparse.Namespace, racing: dict[str, _Worker], part: str, beam: int, batch: int,
                 failures: dict[str, str]) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """One cell: a warm-up pass each, then ``args.reps`` rounds, the engines taking turns pass by pass
    and rotating who goes first, a rest before each pass. Each engine's timed seconds and last outputs;
    an engine that fails is reported in ``failures`` and sits out the rest."""
    times: dict[str, list[float]] = {k: [] for k in racing}
    outputs: dict[str, Any] = {}
    for rep in range(-1, args.reps):  # -1: the warm-up pass
        turn = list(racing)[rep % len(racing):] + list(racing)[: rep % len(racing)]
        for key in turn:
            if key in failures:
                continue
            time.sleep(args.gap)
            answer = racing[key].run(part, beam, batch)
            if "failed" in answer:
                failures[key] = f"{part} beam {beam} batch {batch}: {answer['failed']}"
                print(f"{key}: {failures[key]}", flush=True)
                continue
            if rep >= 0:
                times[key].append(answer["seconds"])
            outputs[key] = answer["outputs"]
    return times, outputs


def race(args: argparse.Namespace) -> None:
    reference = json.loads((args.root / "reference.json").read_text())
    script = str(Path(__file__).resolve())
    results: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    if "longform" in args.parts:
        results += race_longform(args, script, failures)
        args.parts = [part for part in args.parts if part != "longform"]
    for precision in args.precisions if args.parts else ():
        with _workers(args, script, precision, engines_for(args.root, precision), args.clips, failures) as workers:
            ours = f"s2s-{precision}"
            for part in args.parts:
                for beam, batch in args.cells:
                    if part == "encoder" and beam != args.cells[0][0]:
                        continue  # the encoder does not search: one cell per batch
                    racing = {k: w for k, w in workers.items()
                              if not (k.startswith("fw") and part != "whole") and k not in failures}
                    if ours not in racing:
                        break
                    times, outputs = _interleaved(args, racing, part, beam, batch, failures)
                    cell = _report(precision, part, beam, batch, times, outputs, workers, reference, ours)
                    if cell:
                        results.append(cell)
    print(json.dumps({"reps": args.reps, "clips": args.clips, "gen_len": GEN_LEN, "threads": THREADS,
                      "failures": failures, "cells": results}))


def race_longform(args: argparse.Namespace, script: str, failures: dict[str, str]) -> list[dict[str, Any]]:
    """The ``longform`` part: the 10-minute clip (``long``) and the 50 short clips (``short``), ours with
    ``batched`` (every window of every clip in shared batches) against faster-whisper's
    ``BatchedInferencePipeline`` (fixed 30-second ``clip_timestamps``), per precision and (beam, batch)
    cell, interleaved pass by pass as the other parts; tokens compared window by window."""
    results = []
    for precision in args.precisions:
        ours = f"s2s-{precision}"
        with _workers(args, script, precision, [ours, f"fw-{precision}"], CLIPS, failures) as workers:
            for part in LONG_INPUTS:
                for beam, batch in args.long_cells:
                    times, outputs = _interleaved(args, workers, part, beam, batch, failures)
                    cell = _report_longform(precision, part, beam, batch, times, outputs, workers, ours)
                    if cell:
                        results.append(cell)
    return results


def _ratios(row: dict[str, Any], values: list[float], ours: list[float]) -> str:
    """Puts the per-round ratios (peer / ours) in ``row``; their words for the cell's line."""
    ratios = [p / o for p, o in zip(values, ours, strict=True)]
    row.update(ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios))
    return f"; peer / ours {row['ratio_median']:.2f}x [{row['ratio_min']:.2f}-{row['ratio_max']:.2f}]"


def _report_longform(precision: str, part: str, beam: int, batch: int, times: dict[str, list[float]],
                     outputs: dict[str, Any], workers: dict[str, _Worker], ours: str) -> dict | None:
    if not times.get(ours):
        return None
    label = f"{precision} longform {part:5s} beam {beam} batch {batch:2d}"
    cell: dict[str, Any] = {"precision": precision, "part": f"longform-{part}", "beam": beam, "batch": batch,
                            "engines": {}}
    mine = outputs[ours]
    for key, values in times.items():
        if not values:
            continue
        row: dict[str, Any] = {"name": workers[key].name, "s": values, "median_s": statistics.median(values),
                               "windows": len(outputs[key])}
        line = f"{label}: {workers[key].name} {spread(values)}, {len(outputs[key])} windows"
        if key != ours and len(values) == len(times[ours]):
            line += _ratios(row, values, times[ours])
            same = sum(a == b for a, b in zip(outputs[key], mine, strict=False))
            row["same_as_ours"] = f"{same}/{len(mine)}"
            line += f"; windows with our tokens {row['same_as_ours']}"
        cell["engines"][key] = row
        print(line, flush=True)
    return cell


def _report(precision: str, part: str, beam: int, batch: int, times: dict[str, list[float]],
            outputs: dict[str, Any], workers: dict[str, _Worker], reference: dict[str, Any], ours: str) -> dict | None:
    if not times.get(ours):
        return None
    expected = reference[str(beam)][: len(outputs[ours])] if outputs.get(ours) else []
    cell: dict[str, Any] = {"precision": precision, "part": part, "beam": beam, "batch": batch, "engines": {}}
    label = f"{precision} {part:7s} " + (f"batch {batch}" if part == "encoder" else f"beam {beam} batch {batch}")
    for key, values in times.items():
        if not values:
            continue
        row: dict[str, Any] = {"name": workers[key].name, "s": values, "median_s": statistics.median(values)}
        line = f"{label}: {workers[key].name} {spread(values)}"
        if key != ours and len(values) == len(times[ours]):
            line += _ratios(row, values, times[ours])
        tokens = outputs.get(key)
        if tokens is not None:
            row["same_as_generate"] = f"{sum(a == b for a, b in zip(tokens, expected, strict=True))}/{len(expected)}"
            row["same_as_ours"] = f"{sum(a == b for a, b in zip(tokens, outputs[ours], strict=True))}/{len(expected)}"
            row["lengths"] = sorted({len(t) for t in tokens})
            line += (f"; same tokens as generate {row['same_as_generate']}, as ours {row['same_as_ours']}"
                     f"; lengths {row['lengths']}")
        cell["engines"][key] = row
        print(line, flush=True)
    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    making = commands.add_parser("build", help="write the model folder, the clips and generate's tokens")
    making.add_argument("--out", type=Path, required=True)
    making.add_argument("--tiny", action="store_true", help="d 128, 2+2 layers (smoke runs)")
    racing = commands.add_parser("race", help="time every engine, interleaved")
    racing.add_argument("--root", type=Path, required=True, help="the build folder, with every engine's conversion")
    racing.add_argument("--peer-python", default=sys.executable, help="the interpreter that has the peers installed")
    racing.add_argument("--reps", type=int, default=5)
    racing.add_argument("--clips", type=int, default=CLIPS,
                        help=f"decode the first N clips per pass (smoke runs: a batch-8 cell then batches N) "
                        f"[default: {CLIPS}]")
    racing.add_argument("--gap", type=float, default=0.3, help="seconds of rest before each pass")
    racing.add_argument("--precisions", type=lambda s: s.split(","), default=["fp32", "int8"])
    racing.add_argument("--parts", type=lambda s: s.split(","), default=list(PARTS),
                        help=f"of {', '.join(PARTS)}, longform [default: {','.join(PARTS)}]")
    racing.add_argument("--cells", type=_cells, default=CELLS, help="beam x batch [default: 1x1,1x8,5x1,5x8]")
    racing.add_argument("--long-cells", type=_cells, default=LONG_CELLS,
                        help="beam x batch of the longform part [default: 1x8,1x16,5x8,5x16]")
    serving = commands.add_parser("worker", help=argparse.SUPPRESS)
    serving.add_argument("--root", type=Path, required=True)
    serving.add_argument("--engine", required=True)
    serving.add_argument("--clips", type=int, default=CLIPS)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    {"build": lambda: build(args.out, args.tiny), "race": lambda: race(args), "worker": lambda: worker(args)}[
        args.command]()


if __name__ == "__main__":
    main()
