"""Exact speculative greedy against plain greedy, A/B in one process, modes alternated per round.

usage: python benchmarks/speculative.py EXPORT_DIR [--drafts 2,4,6] [--sentences 200] [--rounds 5]
       [--threads 1] [--task en-fr] [--batch-size 1] [--set OPTION=JSON ...] [--speech DIR [--split test]]
       python benchmarks/speculative.py EXPORT_DIR --pass-cost [--drafts 1,2,4,8] [--threads 1]

Sources: the export's built-in task (``--task``, generated with seed 7, the held-out kind of
input the demo models are tested on) or, with ``--task samples``, the export's samples; for a
speech export, ``--speech DIR``: the first ``--sentences`` clips of a speech dataset's split (made
by ``benchmarks/eval_speech.py --make N --data DIR``), read by the dataset's front end.
``--set``: decoding options for both modes (``--set min_len=12 --set no_repeat_ngram_size=4``),
a value read as JSON where it parses, else as a string.
Prints, per mode, generated tokens (EOS counted) per second of process CPU time and of wall
time (medians over the rounds), the ratio to plain greedy, the acceptance (accepted drafts over
drafted ones), tokens per decoder call, sentences redone by plain greedy after a near-tie, the
largest log-prob difference from plain greedy over the tokens, and whether every token equals
plain greedy's. Process CPU time at one thread is the figure to read on a loaded machine.

``--pass-cost``: what one pass of the k-position step costs against one single step at batch 1,
at a past of 20 positions (process CPU time per call, median of 7 runs of 20 calls): the
acceptance a speed-up needs is read from it (a pass of k + 1 positions must yield more tokens
than its cost in single steps).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.runtime.decoding import resolve
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.search import Hypothesis, greedy, speculative_greedy
from s2s_deploy.runtime.speculative import Accepting
from s2s_deploy.runtime.translator import encode_batch
from s2s_deploy.train.tasks import generate_pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir")
    parser.add_argument("--drafts", default="2,4,6")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--task", default="en-fr")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--pass-cost", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=JSON")
    parser.add_argument("--speech", default=None, metavar="DIR")
    parser.add_argument("--split", default="test")
    args = parser.parse_args()
    options = dict(_option(item) for item in args.set)
    manifest = load_manifest(args.export_dir)
    backend = OrtBackend(manifest, device="cpu", threads=args.threads)
    if args.pass_cost:
        pass_cost(backend, manifest, [int(k) for k in args.drafts.split(",")])
        return
    if args.speech:
        batches = speech_batches(Path(args.speech), args.split, args.sentences, args.batch_size)
        args.task = f"speech {args.split}"
    else:
        if args.task == "samples":
            texts = (list(manifest.samples) * args.sentences)[: args.sentences]
        else:
            texts = [pair.source for pair in generate_pairs(args.task, args.sentences, seed=7)]
        batches = [encode_batch(texts[i:i + args.batch_size], manifest.src_vocab, None)
                   for i in range(0, len(texts), args.batch_size)]
    modes = {"greedy": 0, **{f"speculative {k}": int(k) for k in args.drafts.split(",")}}
    print(f"{args.export_dir}: {sum(len(src) for src, _ in batches)} sentences ({args.task}), batch {args.batch_size}, "
          f"{args.threads} thread(s), {args.rounds} rounds, drift bound from export "
          f"{manifest.multi_step_max_abs_diff}, options {options or 'of the export'}")

    def run(drafts: int) -> tuple[float, float, list[Hypothesis], Accepting]:
        config = resolve(manifest, {**options, "speculative": drafts})
        counts = Accepting()
        found: list[Hypothesis] = []
        cpu, wall = time.process_time(), time.perf_counter()
        for src, src_len in batches:
            found += (speculative_greedy(backend, src, src_len, config, counts) if drafts
                      else greedy(backend, src, src_len, config))
        return time.process_time() - cpu, time.perf_counter() - wall, found, counts

    times: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    results: dict[str, tuple[list[Hypothesis], Accepting]] = {}
    for _ in range(args.rounds):
        for mode, drafts in modes.items():
            cpu, wall, found, counts = run(drafts)
            times[mode].append((cpu, wall))
            results[mode] = (found, counts)
    plain = results["greedy"][0]
    tokens = sum(len(h.token_log_probs) for h in plain)
    base = None
    for mode in modes:
        cpu = float(np.median([c for c, _ in times[mode]]))
        wall = float(np.median([w for _, w in times[mode]]))
        base = base or cpu
        found, counts = results[mode]
        same = all(a.tokens == b.tokens for a, b in zip(plain, found, strict=True))
        drift = max((abs(x - y) for a, b in zip(plain, found, strict=True)
                     for x, y in zip(a.token_log_probs, b.token_log_probs, strict=False)), default=0.0)
        extra = (f"  acceptance {counts.rate:.1%} ({counts.accepted}/{counts.drafted}), "
                 f"{counts.tokens / max(counts.calls, 1):.2f} tokens/call, redone {counts.redone}, "
                 f"max |lp diff| {drift:.2e}" if modes[mode] else "")
        print(f"{mode:>15}: {tokens / cpu:8.0f} tok/cpu-s  {tokens / wall:8.0f} tok/s wall  "
              f"x{base / cpu:.2f}  tokens same as greedy: {same}{extra}")


def speech_batches(folder: Path, split: str, count: int, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The first ``count`` clips of a speech dataset's split as features, in batches."""
    from s2s_deploy.frontends import WhisperLogMel
    from s2s_deploy.train.speech_data import FeatureSplit, load_metadata

    features = FeatureSplit(folder, split, WhisperLogMel.from_json(load_metadata(folder)["frontend"]), count)
    return [features.features(range(i, min(i + batch_size, len(features))))
            for i in range(0, len(features), batch_size)]


def _option(item: str) -> tuple[str, object]:
    name, _, value = item.partition("=")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def pass_cost(backend: OrtBackend, manifest: object, drafts: list[int], past: int = 20, calls: int = 20) -> None:
    src, src_len = encode_batch([manifest.samples[0] if manifest.samples else "a"], manifest.src_vocab, None)
    token = np.array([manifest.eos_id + 1], dtype=np.int64)

    def single() -> float:
        with backend.start(src, src_len) as run:
            for _ in range(past):
                run.step_top(token, np.zeros(1, dtype=np.int64), 1)
            cpu = time.process_time()
            for _ in range(calls):
                run.step_top(token, np.zeros(1, dtype=np.int64), 1)
            return (time.process_time() - cpu) / calls

    def multi(positions: int) -> float:
        with backend.start(src, src_len) as run:
            run.steps_top(np.full((1, past), token[0]), 0, 2)
            run.steps_top(np.full((1, positions), token[0]), 0, 2)
            cpu = time.process_time()
            for _ in range(calls):  # each call rolls back all but one of the last call's positions
                run.steps_top(np.full((1, positions), token[0]), positions - 1, 2)
            return (time.process_time() - cpu) / calls

    base = float(np.median([single() for _ in range(7)]))
    print(f"one-position step: {base * 1e3:.3f} ms per call (process CPU, past {past})")
    for k in drafts:
        cost = float(np.median([multi(k + 1) for _ in range(7)]))
        print(f"k-position pass of {k + 1:2d} (last token + {k} drafts): {cost * 1e3:.3f} ms = {cost / base:.2f} steps")


if __name__ == "__main__":
    main()
