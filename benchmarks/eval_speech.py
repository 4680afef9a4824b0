"""The bundled speech model's three targets, on its exports as users run them (ONNX Runtime, CPU).

1. exact match on held-out natural phrasings read by voices no training utterance uses (``natural``);
2. exact match on today's held-out voices, the task's own phrasings (``test``);
3. the share of non-speech clips (silence, noise, tones, chords, DC, clicks) transcribed as nothing
   (``nonspeech``).

Each for the fp32 export and its ``s2s-deploy quantize --int8`` copy, greedy. The held-out sets are
made here with espeak-ng (``--make N``: the first N of each split ``train_speech_gpu.py run`` scores on
the device, the same clips, as the voices, pitches and non-speech seeds are drawn in order), or read
from a dataset folder that has them.

    python benchmarks/train_speech_gpu.py prepare ...        # writes .speechdebs/task-en-fr/{test,natural}.tsv
    python benchmarks/eval_speech.py --make 200 --data /tmp/speech-heldout          # today's checkpoint
    python benchmarks/eval_speech.py --data /tmp/speech-heldout --checkpoint gpu-out/speech.safetensors --long 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"natural": 0.90, "test": 0.90, "nonspeech": 0.95}
NAMES = {"natural": "natural phrasings, unseen voices", "test": "today's held-out voices",
         "nonspeech": "non-speech clips transcribed empty"}


def make_heldout(folder: Path, task: Path, count: int, workers: int) -> None:
    """The first ``count`` utterances of the test, natural and nonspeech splits, synthesised here."""
    from s2s_deploy.train.speech_data import Augment, SpeechDataConfig, make_speech_data

    config = SpeechDataConfig(task=str(task), sizes={"test": count, "natural": count}, shard_size=max(count // 4, 1),
                              augment=Augment(nonspeech={"nonspeech": count}))
    make_speech_data(folder, config, report=lambda line: print(line, flush=True), workers=workers)


def export(checkpoint: Path, work: Path) -> tuple[Path, Path]:
    """fp32 and int8 exports of ``checkpoint`` (kept between runs: export says when it is up to date)."""
    fp32, int8 = work / "fp32", work / "int8"
    cli = [sys.executable, "-m", "s2s_deploy"]
    subprocess.run([*cli, "export", "--arch", "speech", "--checkpoint", str(checkpoint), "--out", str(fp32)],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*cli, "quantize", str(fp32), "--int8", "--out", str(int8), "--force"], check=True,
                   stdout=subprocess.DEVNULL)
    return fp32, int8


def score(export_dir: Path, folder: Path, split: str, limit: int | None, beam: int = 1) -> dict[str, float]:
    """Exact match of ``export_dir`` on ``split`` through ONNX Runtime on the CPU (greedy, or beam ``beam``)."""
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.frontends import WhisperLogMel
    from s2s_deploy.runtime.decoding import plain
    from s2s_deploy.runtime.ort.backend import OrtBackend
    from s2s_deploy.runtime.search import StepLoop
    from s2s_deploy.train.metrics import error_rate, exact_match
    from s2s_deploy.train.speech_data import FeatureSplit, load_metadata

    manifest = load_manifest(export_dir)
    engine = StepLoop(OrtBackend(manifest, device="cpu"))
    features = FeatureSplit(folder, split, WhisperLogMel.from_json(load_metadata(folder)["frontend"]), limit)
    config = plain(beam, manifest.max_target_length or 96)
    started, texts = time.perf_counter(), []
    for start in range(0, len(features), 32):
        src, src_len = features.features(range(start, min(start + 32, len(features))))
        texts += [manifest.tgt_vocab.decode(hyps[0].tokens) for hyps in engine.search(src, src_len, config)]
    row = {"exact_match": exact_match(texts, features.targets), "count": len(texts),
           "seconds": round(time.perf_counter() - started, 1)}
    if split != "nonspeech":
        row["cer"] = error_rate(texts, features.targets, "char")
    row["misses"] = [[ref, hyp] for hyp, ref in zip(texts, features.targets, strict=True) if hyp != ref][:8]
    return row


def long_clips(export_dir: Path, task: Path, trials: int, sentences: int = 20) -> dict[str, dict[str, float]]:
    """``trials`` clips of ``sentences`` held-out sentences (test.tsv) read in turn by held-out voices with
    pauses of 0.3-0.7 s, each transcribed whole with fixed and with pause-cut windows: the share of
    sentences whose target appears intact, and the WER against the targets joined by a space."""
    import random

    import numpy as np

    from s2s_deploy.runtime.transcriber import Transcriber
    from s2s_deploy.train.metrics import error_rate
    from s2s_deploy.train.speech_data import SpeechPlan, Utterance, synthesise
    from s2s_deploy.train.tasks import read_tsv

    pairs = read_tsv(task / "test.tsv")[-trials * sentences:]  # the end of the file: the --make sets use the start
    rng, voices = random.Random(7), SpeechPlan().test
    transcriber = Transcriber(export_dir, device="cpu")
    found: dict[str, list[float]] = {"fixed": [0, 0, 0.0], "pause": [0, 0, 0.0]}
    for trial in range(trials):
        chosen = pairs[trial * sentences:(trial + 1) * sentences]
        parts = []
        for pair in chosen:
            utterance = Utterance(pair.source, pair.target, rng.choice(voices.accents), rng.choice(voices.variants),
                                  rng.choice(voices.speeds), rng.randint(20, 80))
            parts += [synthesise(utterance, 16000), np.zeros(int(16000 * rng.uniform(0.3, 0.7)), np.float32)]
        audio = np.concatenate(parts)
        for cut, tally in found.items():
            text = transcriber(audio, window_cut=cut)[0].text
            tally[0] += sum(f" {pair.target} " in f" {text} " for pair in chosen)
            tally[1] += len(chosen)
            tally[2] += error_rate([text], [" ".join(pair.target for pair in chosen)], "word") / trials
    return {cut: {"sentences_intact": a / b, "wer": wer, "sentences": b} for cut, (a, b, wer) in found.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "plugins" / "checkpoints" / "speech.safetensors")
    parser.add_argument("--data", type=Path, required=True, help="speech dataset folder with the held-out splits")
    parser.add_argument("--make", type=int, default=None, metavar="N",
                        help="first make the held-out splits in --data, N clips each (needs espeak-ng)")
    parser.add_argument("--task", type=Path, default=ROOT / ".speechdebs" / "task-en-fr",
                        help="the folder train_speech_gpu.py prepare wrote (test.tsv, natural.tsv)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/s2s-eval-speech"), help="where the exports go")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N clips of each split")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--beam", type=int, default=1, help="beam size (1: greedy, as the export's default)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--long", type=int, default=0, metavar="TRIALS",
                        help="also read TRIALS long clips (20 held-out sentences with pauses, about 75 s each) with "
                             "fixed and with pause-cut windows (fp32)")
    args = parser.parse_args()
    from s2s_deploy.errors import S2SError

    try:
        if args.make:
            make_heldout(args.data, args.task, args.make, args.workers)
        exports = dict(zip(("fp32", "int8"), export(args.checkpoint, args.work / args.checkpoint.stem), strict=True))
        results: dict[str, dict[str, dict[str, float]]] = {}
        for precision, directory in exports.items():
            results[precision] = {split: score(directory, args.data, split, args.limit, args.beam)
                                 for split in TARGETS}
        long = long_clips(exports["fp32"], args.task, args.long) if args.long else {}
    except S2SError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{args.checkpoint} ({'greedy' if args.beam == 1 else f'beam {args.beam}'}):")
    print("| held-out set | target | fp32 | int8 | clips |")
    print("|---|---|---|---|---|")
    met = True
    for split, target in TARGETS.items():
        figures = [results[p][split]["exact_match"] for p in exports]
        met &= all(f >= target for f in figures)
        print(f"| {NAMES[split]} | ≥ {target:.0%} | " + " | ".join(f"{f:.1%}" for f in figures)
              + f" | {results['fp32'][split]['count']} |")
    for precision in exports:
        for split in TARGETS:
            for ref, hyp in results[precision][split]["misses"][:3]:
                print(f"  {precision} {split}: {ref!r} -> {hyp!r}")
    print("all targets met" if met else "targets not all met")
    for cut, row in long.items():
        print(f"long clips, {cut} windows: {row['sentences_intact']:.1%} of {row['sentences']} sentences intact, "
              f"WER {row['wer']:.1%}")
    if args.json:
        figures = {"checkpoint": str(args.checkpoint), "results": results, "long": long}
        args.json.write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
