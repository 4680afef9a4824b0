"""The thread-exactness check of tests/test_threads.py on CUDA, with CUDA graphs on: one Translator
per export shared by 8 threads, each with its own mix of batch sizes (1-12), beams (1, 2, 4),
decoding options, scoring and streaming, against the same calls made one at a time on it.

    pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu
    s2s-deploy export --arch transformer --out /tmp/tc/transformer   # any exports; fuse one for the graph engine
    s2s-deploy fuse /tmp/tc/transformer
    python benchmarks/threads_cuda.py /tmp/tc/transformer [/tmp/tc/gru ...] [--rounds 2]

Prints one line per export and engine, then one verdict line (exit 1 unless every call agreed and
every loop ran on CUDA with its steps captured).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from s2s_deploy.errors import S2SError
from s2s_deploy.runtime.translator import Translator

THREADS = 8
OPTIONS: tuple[dict[str, object], ...] = (
    {}, {"alpha": 0.0}, {"no_repeat_ngram_size": 2}, {"repetition_penalty": 1.3}, {"min_len": 3},
    {"max_len_a": 1.0, "max_len_b": 2},
)
GREEDY_ONLY: tuple[dict[str, object], ...] = ({"sampling_topk": 5, "seed": 7}, {"sampling_topp": 0.9, "seed": 3})

Call = Callable[[Translator], object]


def plans(samples: list[str], seed: int, calls: int, max_len: int, loop: bool) -> list[list[Call]]:
    """Each thread's own calls; the step loop also gets options, scoring and streaming."""
    rng = random.Random(seed)
    threads = []
    for _ in range(THREADS):
        mine: list[Call] = []
        for _ in range(calls):
            texts = [rng.choice(samples) for _ in range(rng.randint(1, 12))]
            beam, kind = rng.choice((1, 2, 4)), rng.random()
            if loop and kind < 0.12:
                mine.append(lambda t, text=texts[0]: list(t.stream(text, max_len=max_len)))
            elif loop and kind < 0.25:
                mine.append(lambda t, texts=texts: t.score(texts, [text[::-1] for text in texts]))
            else:
                chosen = rng.choice(OPTIONS + (GREEDY_ONLY if beam == 1 else ())) if loop else {}
                n_best = rng.randint(1, beam)
                mine.append(lambda t, texts=texts, beam=beam, n_best=n_best, chosen=chosen:
                            t(texts, beam=beam, n_best=n_best, max_len=max_len, **chosen))
        threads.append(mine)
    return threads


def differing(translator: Translator, threads: list[list[Call]]) -> int:
    """Calls whose answer under threads differs from the same call made alone."""
    expected = [[call(translator) for call in calls] for calls in threads]
    start = threading.Barrier(len(threads))

    def work(calls: list[Call]) -> list[object]:
        start.wait()
        return [call(translator) for call in calls]

    with ThreadPoolExecutor(len(threads)) as pool:
        got = list(pool.map(work, threads))
    return sum(one != other for want, have in zip(expected, got, strict=True)
               for one, other in zip(want, have, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exports", type=Path, nargs="+")
    parser.add_argument("--rounds", type=int, default=2, help="Concurrent rounds per export and engine.")
    parser.add_argument("--calls", type=int, default=5, help="Calls per thread per round.")
    parser.add_argument("--max-len", type=int, default=32)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run of the script.")
    args = parser.parse_args()
    if os.environ.get("S2S_DEPLOY_CUDA_GRAPH", "1") == "0":
        raise SystemExit("error: S2S_DEPLOY_CUDA_GRAPH=0 turns capture off; this check is of CUDA graphs")
    wrong = total = 0
    problems: list[str] = []
    for folder in args.exports:
        try:
            engines = ["loop"] + (["graph"] if (folder / "generate.onnx").is_file() else [])
            for engine in engines:
                translator = Translator(folder, device=args.device, engine=engine)
                samples = list(translator.manifest.samples)
                bad = 0
                for round_number in range(args.rounds):
                    threads = plans(samples, round_number, args.calls, args.max_len, engine == "loop")
                    bad += differing(translator, threads)
                    total += THREADS * args.calls
                wrong += bad
                captured = engine == "graph" or args.device == "cpu" or translator.backend.cuda_graph
                if not captured:
                    problems.append(f"{folder.name}: steps not captured ({translator.backend.choice.reason})")
                print(f"{folder.name} {engine}: {bad} of {THREADS * args.calls * args.rounds} calls differ; "
                      f"{translator.notice}", flush=True)
        except S2SError as exc:
            problems.append(f"{folder}: {exc}")
    verdict = "PASS" if not wrong and not problems and total else "FAIL"
    detail = f"; {'; '.join(problems)}" if problems else ""
    print(f"threads_cuda: {verdict}: {wrong} of {total} calls differ from the same calls made one at a time "
          f"({THREADS} threads, {len(args.exports)} export(s), {args.device}"
          f"{', CUDA graphs on' if args.device == 'cuda' else ''}){detail}")
    sys.exit(verdict != "PASS")


if __name__ == "__main__":
    main()
