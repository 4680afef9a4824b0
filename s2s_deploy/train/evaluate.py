"""Task accuracy of an export, on PyTorch and ONNX Runtime side by side, greedy and beam."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest
from s2s_deploy.runtime.backend import Backend
from s2s_deploy.runtime.decoding import SearchConfig, plain
from s2s_deploy.runtime.search import StepLoop
from s2s_deploy.runtime.translator import translate, widths
from s2s_deploy.train.metrics import Scores, score
from s2s_deploy.train.speech_data import FeatureSplit, dataset_folder, load_metadata
from s2s_deploy.train.tasks import load_task


@dataclass(frozen=True)
class EvalRow:
    split: str
    backend: str
    mode: str
    scores: Scores
    seconds: float


def task_of(manifest: Manifest, task: str | None) -> tuple[str, int]:
    training = manifest.training
    name = task or training.get("task")
    if not name:
        raise S2SError(f"{manifest.directory} records no training task; pass --task NAME or a TSV file")
    seed = 0 if task else int(training.get("task_seed", 0))
    return name, seed


def evaluate(
    manifest: Manifest, backends: list[Backend], task: str | None = None, split: str = "test",
    beam_size: int = 4, limit: int | None = None, max_len: int | None = None, progress: bool = False,
) -> list[EvalRow]:
    """``progress`` draws a bar per backend and search on stderr, with its rate and time left (the CLI
    always asks for it: a full evaluation runs for minutes); off a terminal it is redrawn every 30 s
    and left in place, so a log shows how far each got and how long it took."""
    from tqdm import tqdm

    name, seed = task_of(manifest, task)
    speech = dataset_folder(name)
    if speech is not None:  # features from a speech dataset folder: its transcripts' task scores the text
        from s2s_deploy.frontends import WhisperLogMel

        metadata = load_metadata(speech)
        features = FeatureSplit(speech, split, WhisperLogMel.from_json(metadata["frontend"]), limit)
        references, tokenize = features.targets, load_task(metadata["task"], int(metadata["seed"])).bleu_tokenize
        count = len(features)
    else:
        pairs = list(getattr(load_task(name, seed), split))[:limit]
        if not pairs:
            raise S2SError(f"the {split} split of {name} is empty")
        sources, references = [p.source for p in pairs], [p.target for p in pairs]
        tokenize = load_task(name, seed).bleu_tokenize
        count = len(sources)
    max_len = max_len or manifest.max_target_length or 256
    rows = []
    for backend in backends:
        for mode, config in (("greedy", plain(1, max_len)),
                             (f"beam{beam_size}", plain(beam_size, max_len))):
            started = time.perf_counter()
            terminal = sys.stderr.isatty()
            with tqdm(total=count, desc=f"{split} {backend.name} {mode}", unit=" sentences", disable=not progress,
                      file=sys.stderr, leave=not terminal, mininterval=0.1 if terminal else 30.0,
                      dynamic_ncols=True) as bar:
                if speech is not None:
                    texts = _transcribe(StepLoop(backend), features, manifest, config, bar.update)
                else:
                    texts = [r.text for r in translate(StepLoop(backend), sources, manifest.src_vocab,
                                                       manifest.tgt_vocab, config, 64, manifest.max_source_length,
                                                       on_batch=bar.update, padding=widths(manifest))]
            elapsed = time.perf_counter() - started
            rows.append(EvalRow(split, backend.name, mode, score(texts, references, tokenize), elapsed))
    return rows


def _transcribe(engine: StepLoop, features: FeatureSplit, manifest: Manifest, config: SearchConfig,
                on_batch: Callable[[int], object], batch_size: int = 64) -> list[str]:
    texts: list[str] = []
    for start in range(0, len(features), batch_size):
        rows = range(start, min(start + batch_size, len(features)))
        src, src_len = features.features(rows)
        texts += [manifest.tgt_vocab.decode(hyps[0].tokens) for hyps in engine.search(src, src_len, config)]
        on_batch(len(rows))
    return texts


def markdown(rows: list[EvalRow]) -> str:
    lines = ["| split | backend | search | BLEU | exact match | d2l BLEU | sentences | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.split} | {r.backend} | {r.mode} | {r.scores.bleu:.2f} | {100 * r.scores.exact_match:.1f}% | "
              f"{r.scores.d2l_bleu:.3f} | {r.scores.count} | {r.seconds:.1f} |" for r in rows]
    return "\n".join(lines)
