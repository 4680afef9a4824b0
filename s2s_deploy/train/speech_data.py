"""Speech for the bundled speech-translation demo: the en-fr task's English, read aloud by espeak-ng.

Each utterance is synthesised with one of several espeak-ng accents and voice variants, at one
of several speeds and a random pitch, resampled to 16 kHz, and turned into features by the same
front end (``s2s_deploy.frontends.WhisperLogMel``) that the exported model's manifest will name,
so training sees exactly what deployment computes. The test split is read only by accents,
variants and speeds that no training utterance uses; the metadata says which.

On disk: ``metadata.json`` and ``SPLIT-NNNNN.npz`` shards. A shard stores each utterance's
features without the window's trailing padding frames, which all equal one value per utterance
(the clamp at max − 8 of silence), so ``SpeechShard.features`` restores them exactly.
espeak-ng is needed only here, never at run time.

    python -m s2s_deploy.train.speech_data OUT [--train 20000] [--valid 1000] [--test 1000] [--natural 600]
        [--nonspeech 2000 100 600] [--effects 0.3] [--offset 0.3]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import multiprocessing
import random
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import atomic_path, write_atomically
from s2s_deploy.frontends import WhisperLogMel, resample
from s2s_deploy.frontends.optional import optional_module
from s2s_deploy.train.tasks import BUILTIN_TASKS, DEFAULT_TASK, Pair, SplitSizes, load_task, read_tsv

FORMAT = "s2s-deploy speech data 2"
ESPEAK = "espeak-ng"
ESPEAK_RATE = 22050


HELD_OUT_SPLITS = ("test", "natural", "nonspeech")
"""Read only by the held-out voices: ``test`` (the task's own phrasings, today's figure), ``natural``
(natural phrasings, ``train/natural.py``) and ``nonspeech`` (clips whose transcript must be empty)."""
SPLITS = ("valid", "test", "natural", "nonspeech", "train")
"""The order shards are made in: the small scored splits first."""


@dataclass(frozen=True)
class Voices:
    """The espeak-ng accents (``-v``), variants (``+name``) and speeds (``-s``, words per minute) a split draws from."""

    accents: tuple[str, ...]
    variants: tuple[str, ...]
    speeds: tuple[int, ...]


@dataclass(frozen=True)
class SpeechPlan:
    """Who reads each split. ``test`` shares no accent, variant or speed with ``train``; ``valid``
    (new sentences, familiar voices) uses the training voices, so the two together separate
    learning the task from generalising to new speakers."""

    train: Voices = Voices(
        accents=("en-us", "en-gb", "en-gb-x-rp", "en-gb-scotland", "en-gb-x-gbclan", "en-029"),
        variants=(
            "m1", "m2", "m3", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "f5",
            "klatt", "klatt3", "klatt4", "klatt5", "klatt6", "croak", "grandma", "grandpa",
            "adam", "Alex", "Andrea", "Andy", "Annie", "antonio", "aunty", "belinda", "benjamin",
            "boris", "caleb", "david", "Denis", "Diogo", "ed", "edward", "edward2", "Gene", "Gene2", "gustave",
            "Henrique", "Hugo", "iven", "iven2", "iven3", "iven4", "Jacky", "john", "kaukovalta", "Lee", "linda",
            "marcelo", "Mario", "max", "Michael", "michel", "miguel", "Mike", "Mr", "Nguyen",
            "norbert", "pablo", "paul", "pedro", "quincy", "rob", "robert", "sandro", "shelby", "steph",
            "steph2", "steph3", "Storm", "travis", "victor", "zac", "anika",
        ),
        speeds=(130, 135, 150, 160, 170, 175, 195, 200, 210),
    )
    """Every espeak-ng voice variant that reads like a person (no robots, whispers or effects) but the
    three held out, and but Alicia and Marco, who read so slowly that a long date overflows the 8-s
    window: many timbres, so the model cannot lean on one voice's formants."""
    test: Voices = Voices(accents=("en-us-nyc", "en-gb-x-gbcwmd"), variants=("m4", "f4", "klatt2"), speeds=(140, 185))
    pitch_range: tuple[int, int] = (20, 80)
    """espeak-ng's ``-p`` (0-99), drawn uniformly for every split: pitch is varied, not held out."""

    def voices(self, split: str) -> Voices:
        return self.test if split in HELD_OUT_SPLITS else self.train

    def held_out(self) -> dict[str, list[Any]]:
        """What only the test split uses: the metadata's record of the held-out voices and speeds."""
        return {
            name: sorted(set(getattr(self.test, name)) - set(getattr(self.train, name)))
            for name in ("accents", "variants", "speeds")
        }


@dataclass(frozen=True)
class Utterance:
    """One clip. Speech (``source`` read by ``accent+variant``) or, with an empty source and target,
    a non-speech clip of kind ``variant`` (``NONSPEECH``). ``effect`` names what is done to speech
    after synthesis (``EFFECTS``; empty: nothing), its parameters and the non-speech clip's drawn
    from ``seed``."""

    source: str
    target: str
    accent: str
    variant: str
    speed: int
    pitch: int
    effect: str = ""
    seed: int = 0
    delay: float = 0.0
    """Seconds of silence before the speech (at most what the window leaves), so the model also hears
    speech that starts into its window, as the windows of a long clip and a recording do."""

    @property
    def voice(self) -> str:
        return f"{self.accent}+{self.variant}"


UTTERANCE_FIELDS = tuple(f.name for f in fields(Utterance))
NONSPEECH_ACCENT = "none"

NONSPEECH = ("silence", "white", "pink", "brown", "hum", "tone", "chord", "plucked", "melody", "dc", "clicks",
             "noise_burst")
"""Clips with nothing to transcribe: digital and near silence, coloured noise from faint to loud, mains
hum, steady tones, chords of harmonic notes, plucked-string chords (Karplus-Strong), note sequences,
a DC offset under faint noise, click trains and bursts of noise."""
EFFECTS = ("gain", "noise", "band8k", "dc", "reverb")
"""What is done to a speech clip after synthesis: a gain of -30 to +12 dB, noise at 5-30 dB SNR, an
8 kHz (telephone) band limit, a DC offset, a short synthetic room echo."""


@dataclass(frozen=True)
class Augment:
    """How much of each split is changed or added: ``speech`` is the share of its speech clips given
    one ``EFFECTS`` entry (held-out splits are read clean, as today's figure is), ``nonspeech`` the
    non-speech clips per split (``{"train": N, "valid": M, "nonspeech": K}``)."""

    speech: float = 0.0
    nonspeech: dict[str, int] = field(default_factory=dict)
    offset: float = 0.0
    """The share of a training split's speech clips that start ``OFFSET_SECONDS`` into the window."""


OFFSET_SECONDS = (0.3, 3.0)
"""The range a delayed clip's leading silence is drawn from (``Utterance.delay``)."""


@dataclass(frozen=True)
class SpeechDataConfig:
    """What a dataset is made from: a rerun with the same config resumes, any other is refused."""

    task: str = DEFAULT_TASK
    sizes: dict[str, int] = field(default_factory=lambda: {"train": 20000, "valid": 1000, "test": 1000})
    seed: int = 0
    shard_size: int = 1000
    frontend: WhisperLogMel = field(default_factory=lambda: WhisperLogMel(chunk_length=8))
    """8 s holds the longest sentence at the slowest speed (7.1 s, a weekday date read at 130 words/min)."""
    plan: SpeechPlan = SpeechPlan()
    augment: Augment = Augment()


def espeak_version() -> str:
    """espeak-ng's version line, or a one-line S2SError saying how to get it."""
    if shutil.which(ESPEAK) is None:
        raise S2SError("making speech data needs espeak-ng, which is not installed: apt-get install espeak-ng")
    return subprocess.run([ESPEAK, "--version"], capture_output=True, text=True, check=True).stdout.strip()


def check_voices(plan: SpeechPlan) -> None:
    """espeak-ng falls back to a default voice for a name it does not know, silently; refuse such names here."""
    languages = subprocess.run([ESPEAK, "--voices=en"], capture_output=True, text=True, check=True).stdout
    known_accents = {line.split()[1] for line in languages.splitlines()[1:] if line.split()}
    variant_list = subprocess.run([ESPEAK, "--voices=variant"], capture_output=True, text=True, check=True).stdout
    known_variants = {word[3:] for line in variant_list.splitlines() for word in line.split() if word.startswith("!v/")}
    for voices in (plan.train, plan.test):
        missing = sorted(set(voices.accents) - known_accents) + sorted(set(voices.variants) - known_variants)
        if missing:
            raise S2SError(f"espeak-ng has no voice {', '.join(missing)} here (see espeak-ng --voices)")


def synthesise(utterance: Utterance, sampling_rate: int) -> np.ndarray:
    """One utterance read by espeak-ng, as float32 mono at ``sampling_rate``. The text goes in on stdin,
    so a source that starts with ``-`` is read, not taken as an option."""
    soundfile = optional_module("soundfile", "making speech data")
    command = [ESPEAK, "-v", utterance.voice, "-s", str(utterance.speed), "-p", str(utterance.pitch), "--stdout"]
    result = subprocess.run(command, input=utterance.source.encode(), capture_output=True)
    if result.returncode != 0 or not result.stdout:
        raise S2SError(f"espeak-ng failed on {utterance.source!r}: {result.stderr.decode(errors='replace').strip()}")
    audio, rate = soundfile.read(io.BytesIO(result.stdout), dtype="float32")
    return resample(audio, rate, sampling_rate).astype(np.float32)


def _noise(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-RMS white, pink (1/f power) or brown (1/f²) noise."""
    white = rng.standard_normal(n)
    if kind == "white":
        return white
    spectrum = np.fft.rfft(white)
    frequency = np.maximum(np.arange(len(spectrum)), 1)
    shaped = np.fft.irfft(spectrum / (np.sqrt(frequency) if kind == "pink" else frequency), n)
    return shaped / max(float(np.sqrt(np.mean(shaped**2))), 1e-12)


def _note(frequency: float, n: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    """A harmonic note: a fundamental and a few overtones of falling strength."""
    t = np.arange(n) / rate
    return sum(rng.uniform(0.2, 1.0) / k * np.sin(2 * np.pi * k * frequency * t + rng.uniform(0, 6.3))
               for k in range(1, int(rng.integers(1, 6)) + 1))


def _plucked(frequency: float, n: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    """A plucked string (Karplus-Strong): a burst of noise through a decaying delay line."""
    period = max(2, int(rate / frequency))
    line = rng.uniform(-1, 1, period)
    out = np.empty(n)
    decay = rng.uniform(0.990, 0.999)
    for start in range(0, n, period):
        count = min(period, n - start)
        out[start:start + count] = line[:count]
        line = decay * 0.5 * (line + np.roll(line, -1))
    return out


def nonspeech(kind: str, seed: int, rate: int, max_seconds: float) -> np.ndarray:
    """One clip of ``kind`` (``NONSPEECH``), 0.5 s to ``max_seconds`` long at a level from faint to loud,
    all drawn from ``seed``: float32 mono at ``rate``."""
    rng = np.random.default_rng(seed)
    n = int(rate * rng.uniform(0.5, max_seconds))
    t = np.arange(n) / rate
    notes = 440.0 * 2 ** ((rng.integers(-24, 16, 4)) / 12)
    if kind == "silence":
        audio = np.zeros(n) if rng.random() < 0.4 else _noise("white", n, rng) * 10 ** rng.uniform(-5, -3.5)
        return audio.astype(np.float32)
    if kind in ("white", "pink", "brown"):
        audio = _noise(kind, n, rng)
    elif kind == "hum":
        base = rng.choice([50.0, 60.0])
        audio = sum(np.sin(2 * np.pi * base * k * t) / k for k in range(1, 6)) + 0.05 * _noise("white", n, rng)
    elif kind == "tone":
        audio = np.sin(2 * np.pi * rng.uniform(80, 4000) * t)
    elif kind == "chord":
        audio = sum(_note(f, n, rate, rng) for f in notes[: rng.integers(2, 5)]) * np.exp(-t * rng.uniform(0, 1.5))
    elif kind == "plucked":
        audio = sum(_plucked(f, n, rate, rng) for f in notes[: rng.integers(1, 5)])
    elif kind == "melody":
        bounds = np.linspace(0, n, int(rng.integers(3, 12)) + 1).astype(int)
        audio = np.concatenate([_note(440.0 * 2 ** (rng.integers(-12, 13) / 12), b - a, rate, rng)
                                * np.exp(-np.arange(b - a) / rate * 3) for a, b in itertools.pairwise(bounds)])
    elif kind == "dc":
        audio = rng.choice([-1, 1]) * rng.uniform(0.05, 0.9) + _noise("white", n, rng) * 10 ** rng.uniform(-4, -2)
        return np.clip(audio, -1, 1).astype(np.float32)
    elif kind == "clicks":
        audio = np.zeros(n)
        audio[rng.integers(0, n, int(rng.integers(1, 40)))] = rng.uniform(-1, 1, 1)
    elif kind == "noise_burst":
        audio = np.zeros(n)
        for _ in range(int(rng.integers(1, 6))):
            start, width = int(rng.integers(0, n)), int(rate * rng.uniform(0.02, 0.4))
            audio[start:start + width] = _noise("white", min(width, n - start), rng)
    else:
        raise S2SError(f"unknown non-speech kind {kind!r}; known: {', '.join(NONSPEECH)}")
    peak = max(float(np.max(np.abs(audio))), 1e-12)
    return (audio / peak * 10 ** rng.uniform(-3, -0.05)).astype(np.float32)


def apply_effect(audio: np.ndarray, effect: str, seed: int, rate: int) -> np.ndarray:
    """``audio`` with ``effect`` (``EFFECTS``) applied, its parameters drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    if effect == "gain":
        out = audio * 10 ** (rng.uniform(-30, 12) / 20)
    elif effect == "noise":
        power = float(np.mean(audio**2)) or 1e-8
        kind = str(rng.choice(["white", "pink", "brown"]))
        out = audio + _noise(kind, len(audio), rng) * np.sqrt(power / 10 ** (rng.uniform(5, 30) / 10))
    elif effect == "band8k":
        out = resample(resample(audio, rate, 8000), 8000, rate)
    elif effect == "dc":
        out = audio + rng.choice([-1, 1]) * rng.uniform(0.05, 0.5)
    elif effect == "reverb":
        length = int(rate * rng.uniform(0.05, 0.3))
        tail = rng.standard_normal(length) * np.exp(-np.arange(length) / (length / 5))
        tail[0] = 1.0
        out = np.convolve(audio, tail / np.abs(tail).sum() * 2)[: len(audio)]
    elif effect:
        raise S2SError(f"unknown effect {effect!r}; known: {', '.join(EFFECTS)}")
    else:
        out = audio
    return np.clip(out, -1, 1).astype(np.float32)


JOIN = " | "
"""Between the sentences of a joined pair (source and target alike): one speaker reads them in turn with
a pause between, and the target is their targets joined by a space, as a long clip's windows are."""


def render(utterance: Utterance, frontend: WhisperLogMel) -> tuple[np.ndarray, Utterance]:
    """The clip ``utterance`` describes, float32 mono at the front end's rate, and the utterance it holds:
    a joined one (``JOIN``) keeps as many of its sentences, in order, as fit the window, pauses of
    0.2-0.8 s between them, its target their targets joined by a space."""
    rate = frontend.sampling_rate
    if utterance.accent == NONSPEECH_ACCENT:
        return nonspeech(utterance.variant, utterance.seed, rate, frontend.n_samples / rate), utterance
    if JOIN not in utterance.source:
        audio, utterance = _delayed(synthesise(utterance, rate), utterance, frontend)
        return apply_effect(audio, utterance.effect, utterance.seed, rate), utterance
    rng = np.random.default_rng(zlib.crc32(utterance.source.encode()))
    sources, targets = utterance.source.split(JOIN), utterance.target.split(JOIN)
    pieces: list[np.ndarray] = []
    kept = 0
    for source in sources:
        audio = synthesise(dataclasses.replace(utterance, source=source), rate)
        gap = np.zeros(int(rate * rng.uniform(0.2, 0.8)) if pieces else 0, dtype=np.float32)
        if kept and sum(map(len, pieces)) + len(gap) + len(audio) > frontend.n_samples:
            break
        pieces += [gap, audio]
        kept += 1
    joined = dataclasses.replace(utterance, source=JOIN.join(sources[:kept]), target=" ".join(targets[:kept]))
    audio, joined = _delayed(np.concatenate(pieces), joined, frontend)
    return apply_effect(audio, utterance.effect, utterance.seed, rate), joined


def _delayed(audio: np.ndarray, utterance: Utterance, frontend: WhisperLogMel) -> tuple[np.ndarray, Utterance]:
    """``audio`` after ``utterance.delay`` seconds of silence, the delay cut to what the window leaves (so
    no speech is pushed out of it), and the utterance with the delay it got."""
    if not utterance.delay:
        return audio, utterance
    rate = frontend.sampling_rate
    lead = min(round(utterance.delay * rate), max(frontend.n_samples - len(audio), 0))
    held = dataclasses.replace(utterance, delay=round(lead / rate, 4))
    return np.concatenate([np.zeros(lead, dtype=np.float32), audio]), held


def plan_split(pairs: Sequence[Pair], split: str, plan: SpeechPlan, seed: int, augment: Augment = Augment()
               ) -> list[Utterance]:
    """One utterance per pair, its voice, speed and pitch drawn from the split's own seeded stream, then
    ``augment.nonspeech[split]`` non-speech clips from a stream of their own (so the speech of a split
    stays the same whatever is added); speech of a training split gets an effect at ``augment.speech`` and
    a leading silence (``Utterance.delay``) at ``augment.offset``, each from a stream of its own."""
    rng = random.Random(f"speech/{split}/{seed}")
    voices = plan.voices(split)
    low, high = plan.pitch_range
    utterances = [
        Utterance(
            pair.source,
            pair.target,
            rng.choice(voices.accents),
            rng.choice(voices.variants),
            rng.choice(voices.speeds),
            rng.randint(low, high),
        )
        for pair in pairs
    ]
    extra = random.Random(f"speech/{split}/{seed}/augment")
    if augment.speech and split not in HELD_OUT_SPLITS:
        utterances = [dataclasses.replace(u, effect=extra.choice(EFFECTS), seed=extra.getrandbits(32))
                      if extra.random() < augment.speech else u for u in utterances]
    if augment.offset and split not in HELD_OUT_SPLITS:
        later = random.Random(f"speech/{split}/{seed}/offset")
        utterances = [dataclasses.replace(u, delay=round(later.uniform(*OFFSET_SECONDS), 2))
                      if later.random() < augment.offset else u for u in utterances]
    count = augment.nonspeech.get(split, 0)
    utterances += [Utterance("", "", NONSPEECH_ACCENT, NONSPEECH[i % len(NONSPEECH)], 0, 0, "", extra.getrandbits(32))
                   for i in range(count)]
    if count and split not in HELD_OUT_SPLITS:  # every shard a mix, so a run cut short still trains on all kinds
        extra.shuffle(utterances)
    return utterances


def trimmed(features: np.ndarray) -> tuple[np.ndarray, float]:
    """(kept frames, floor): the features without their trailing frames that hold only the floor value."""
    floor = float(features.min())
    above = np.flatnonzero((features > floor).any(axis=0))
    kept = int(above[-1]) + 1 if len(above) else 0
    return features[:, :kept], floor


def write_shard(path: Path, utterances: Sequence[Utterance], frontend: WhisperLogMel) -> dict[str, Any]:
    """Synthesise and featurise ``utterances`` into one npz (written beside, then moved into place)."""
    started = time.perf_counter()
    parts, floors, samples, held = [], [], [], []
    for planned in utterances:
        audio, utterance = render(planned, frontend)
        held.append(utterance)
        kept, floor = trimmed(frontend(audio))
        parts.append(kept.T)
        floors.append(floor)
        samples.append(len(audio))
    lengths = np.array([len(part) for part in parts], dtype=np.int64)
    columns = {name: np.array([getattr(u, name) for u in held]) for name in UTTERANCE_FIELDS}
    with atomic_path(path) as staging, open(staging, "wb") as handle:  # a handle: np.savez names no .npz
        np.savez(
            handle,
            features=np.concatenate(parts).astype(np.float32),
            offsets=np.concatenate([[0], np.cumsum(lengths)]),
            floor=np.array(floors, dtype=np.float32),
            samples=np.array(samples, dtype=np.int64),
            **columns,
        )
    truncated = int(sum(n > frontend.n_samples for n in samples))
    return {
        "file": path.name,
        "count": len(utterances),
        "truncated": truncated,
        "audio_seconds": round(sum(samples) / frontend.sampling_rate, 1),
        "seconds": round(time.perf_counter() - started, 1),
    }


class SpeechShard:
    """One shard read back: ``features(i)`` is exactly the front end's output for utterance ``i``."""

    def __init__(self, path: str | Path, frontend: WhisperLogMel) -> None:
        with np.load(path, allow_pickle=False) as data:
            self.arrays = {name: data[name] for name in data.files}
        self.frontend = frontend

    def __len__(self) -> int:
        return len(self.arrays["floor"])

    def features(self, index: int) -> np.ndarray:
        """(n_mels, n_frames) float32, the trimmed padding frames restored."""
        start, end = self.arrays["offsets"][index], self.arrays["offsets"][index + 1]
        full = np.full((self.frontend.n_mels, self.frontend.n_frames), self.arrays["floor"][index], dtype=np.float32)
        full[:, : end - start] = self.arrays["features"][start:end].T
        return full

    def utterance(self, index: int) -> Utterance:
        """Shards of format 1 hold no effect or seed: their defaults."""
        return Utterance(**{name: self.arrays[name][index].item() for name in UTTERANCE_FIELDS if name in self.arrays})


SPEECH_TASK = "speech:"
"""``--task speech:DIR``: a speech dataset folder instead of a text task."""


def load_metadata(out: Path) -> dict[str, Any]:
    with open(out / "metadata.json", encoding="utf-8") as file:
        return json.load(file)


def read_split(out: str | Path, split: str) -> list[SpeechShard]:
    """Every finished shard of ``split`` in a dataset folder, in order."""
    out = Path(out)
    metadata = load_metadata(out)
    frontend = WhisperLogMel.from_json(metadata["frontend"])
    return [SpeechShard(out / shard["file"], frontend) for shard in metadata["splits"][split]["shards"]]


class FeatureSplit:
    """One split of a dataset folder: every utterance's transcript and target, and features on demand."""

    def __init__(self, folder: Path, split: str, frontend: WhisperLogMel, limit: int | None = None) -> None:
        metadata = load_metadata(folder)
        if split not in metadata.get("splits", {}):
            raise S2SError(f"{folder} has no {split} split yet (is the dataset still being made?)")
        self.shards = [SpeechShard(folder / s["file"], frontend) for s in metadata["splits"][split]["shards"]
                       if (folder / s["file"]).is_file()]
        self.index = [(shard, i) for shard in self.shards for i in range(len(shard))][:limit]
        if not self.index:
            raise S2SError(f"{folder}: the {split} split holds no utterances")
        self.sources = [str(shard.arrays["source"][i]) for shard, i in self.index]
        self.targets = [str(shard.arrays["target"][i]) for shard, i in self.index]

    def __len__(self) -> int:
        return len(self.index)

    def features(self, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(src, src_len)`` of the utterances ``rows``: each the front end's whole window."""
        src = np.stack([self.index[r][0].features(self.index[r][1]) for r in rows])
        return src, np.full(len(rows), src.shape[-1], dtype=np.int64)


def dataset_folder(task: str) -> Path | None:
    """The folder of a ``speech:DIR`` task, or None for a text task."""
    if not task.startswith(SPEECH_TASK):
        return None
    folder = Path(task[len(SPEECH_TASK):])
    if not (folder / "metadata.json").is_file():
        raise S2SError(f"{folder} is no speech dataset (no metadata.json): make one with "
                       "python -m s2s_deploy.train.speech_data DIR")
    return folder


def _write_metadata(out: Path, metadata: dict[str, Any]) -> None:
    write_atomically(out / "metadata.json", (json.dumps(metadata, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))


def make_speech_data(
    out: str | Path, config: SpeechDataConfig = SpeechDataConfig(), report: Callable[[str], None] = print,
    workers: int = 1, deadline: float | None = None,
) -> dict[str, Any]:
    """Write the dataset into ``out``, shard by shard (``workers`` processes synthesise shards side by
    side; they are recorded in order); a rerun with the same config resumes after the last finished
    shard. Past ``deadline`` (a ``time.perf_counter()`` value) no further train shard is waited for:
    the scored splits come first and are always whole. Returns the metadata."""
    out = Path(out)
    version = espeak_version()
    check_voices(config.plan)
    sizes = config.sizes
    settings = {
        "format": FORMAT,
        "task": config.task,
        "seed": config.seed,
        "shard_size": config.shard_size,
        "sizes": sizes,
        "frontend": config.frontend.to_json(),
        "plan": asdict(config.plan),
        "augment": {k: v for k, v in asdict(config.augment).items() if k != "offset" or v},  # older folders resume
        "held_out_for_test": config.plan.held_out(),
        "espeak_ng": version,
        "storage": "features float32 (frames, n_mels) per utterance, concatenated; offsets; trailing "
        "frames equal to floor dropped (SpeechShard.features restores them)",
    }
    out.mkdir(parents=True, exist_ok=True)
    metadata = load_metadata(out) if (out / "metadata.json").is_file() else {}
    if metadata and {k: metadata.get(k) for k in settings} != json.loads(json.dumps(settings)):
        raise S2SError(f"{out} holds speech data made with other settings; give another folder")
    metadata = {**settings, "splits": metadata.get("splits", {})}
    jobs = []
    for split in SPLITS:
        if split not in sizes and not config.augment.nonspeech.get(split):
            continue
        utterances = plan_split(split_pairs(config, split), split, config.plan, config.seed, config.augment)
        record = metadata["splits"].setdefault(split, {"count": len(utterances), "shards": []})
        for number, start in enumerate(range(0, len(utterances), config.shard_size)):
            if number < len(record["shards"]) and (out / record["shards"][number]["file"]).is_file():
                continue
            jobs.append((split, number, (out / f"{split}-{number:05d}.npz",
                                         utterances[start : start + config.shard_size], config.frontend)))
    work = [job for *_, job in jobs]
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(multiprocessing.Pool(workers)) if workers > 1 else None
        shards = pool.imap(_write_job, work) if pool else map(_write_job, work)
        for (split, number, _), shard in zip(jobs, shards, strict=True):
            metadata["splits"][split]["shards"][number:] = [shard]
            _write_metadata(out, metadata)
            report(
                f"{split} shard {number}: {shard['count']} utterances in {shard['seconds']} s "
                f"({shard['audio_seconds']} s of audio, {shard['truncated']} cut at the window)"
            )
            if split == "train" and deadline is not None and time.perf_counter() > deadline:
                report(f"synthesis deadline reached: training on {number + 1} of "
                       f"{-(-metadata['splits']['train']['count'] // config.shard_size)} train shards")
                break
    _write_metadata(out, metadata)
    return metadata


def split_pairs(config: SpeechDataConfig, split: str) -> list[Pair]:
    """The pairs a split reads: a task folder's ``SPLIT.tsv`` (``natural.tsv`` too), a built-in task's
    split of ``config.sizes`` (``natural``: ``train/natural.py``'s phrasings); none for ``nonspeech``."""
    count = config.sizes.get(split, 0)
    if split == "nonspeech" or not count:
        return []
    folder = Path(config.task)
    if folder.is_dir():
        return read_tsv(folder / f"{split}.tsv")[:count]
    if split == "natural":
        if config.task not in BUILTIN_TASKS:
            raise S2SError(f"a natural split needs a built-in task or a folder with natural.tsv, not {config.task}")
        from s2s_deploy.train.natural import natural_pairs

        return natural_pairs(config.task, count, config.seed)
    sizes = config.sizes
    task = load_task(config.task, config.seed, SplitSizes(train=sizes["train"], valid=sizes["valid"],
                                                           test=sizes["test"]))
    return list(getattr(task, split))


def _write_job(job: tuple[Path, Sequence[Utterance], WhisperLogMel]) -> dict[str, Any]:
    return write_shard(*job)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m s2s_deploy.train.speech_data", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="dataset folder (created; a rerun resumes)")
    defaults = SpeechDataConfig()
    for split, size in defaults.sizes.items():
        parser.add_argument(f"--{split}", type=int, default=size, help=f"{split} utterances (default {size})")
    parser.add_argument("--natural", type=int, default=0,
                        help="held-out natural phrasings read by the held-out voices (train/natural.py)")
    parser.add_argument("--nonspeech", type=int, nargs=3, default=(0, 0, 0), metavar=("TRAIN", "VALID", "HELD_OUT"),
                        help="non-speech clips (empty transcript) in train, in valid, and held out")
    parser.add_argument("--effects", type=float, default=0.0,
                        help="share of train and valid speech given one effect (gain, noise, 8 kHz band, DC, echo)")
    parser.add_argument("--offset", type=float, default=0.0,
                        help="share of train and valid speech that starts 0.3-3 s into the window")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--workers", type=int, default=1, help="processes synthesising shards side by side")
    parser.add_argument("--shard-size", type=int, default=defaults.shard_size)
    parser.add_argument(
        "--window",
        type=int,
        default=defaults.frontend.chunk_length,
        help="the front end's window in seconds (default %(default)s)",
    )
    args = parser.parse_args(argv)
    sizes = {split: getattr(args, split) for split in defaults.sizes}
    config = SpeechDataConfig(
        sizes={**sizes, "natural": args.natural} if args.natural else sizes,
        augment=Augment(speech=args.effects, nonspeech=dict(zip(("train", "valid", "nonspeech"), args.nonspeech,
                                                                strict=True)), offset=args.offset),
        seed=args.seed,
        shard_size=args.shard_size,
        frontend=WhisperLogMel(chunk_length=args.window),
    )
    try:
        make_speech_data(args.out, config, report=lambda line: print(line, flush=True), workers=max(args.workers, 1))
    except S2SError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
