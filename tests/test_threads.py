"""One Translator shared by threads answers exactly as the same calls made one at a time.

A web app shares one Translator across a thread pool; the step loop keeps buffers and bindings
across calls (runtime/ort/step_loop.py), so each call must hold its own set while it runs.
"""

from __future__ import annotations

import random
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_plugins import ARCH_CASES, _FailsCapture

from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.ort.step_loop import StepLoops
from s2s_deploy.runtime.translator import Translator
from s2s_deploy.transforms.fuse import GENERATE_FILE, add_to_manifest, fuse_generate

THREADS = 8
CALLS = 3
MAX_LEN = 16
OPTIONS: tuple[dict[str, object], ...] = (
    {}, {"alpha": 0.0}, {"no_repeat_ngram_size": 2}, {"repetition_penalty": 1.3}, {"min_len": 3},
    {"max_len_a": 1.0, "max_len_b": 2},
)
GREEDY_ONLY: tuple[dict[str, object], ...] = ({"sampling_topk": 5, "seed": 7}, {"sampling_topp": 0.9, "seed": 3})

Call = Callable[[Translator], object]


def plans(samples: list[str], seed: int, streams: bool = True, options: bool = True) -> list[list[Call]]:
    """Each thread's own calls: batch sizes 1-12, beams 1, 2 and 4, decoding options, scoring and
    streaming mixed in, from a seeded generator so the sequential run makes the same calls."""
    rng = random.Random(seed)
    threads = []
    for _ in range(THREADS):
        calls: list[Call] = []
        for _ in range(CALLS):
            texts = [rng.choice(samples) for _ in range(rng.randint(1, 12))]
            beam = rng.choice((1, 2, 4))
            kind = rng.random()
            if options and streams and kind < 0.12:
                calls.append(lambda t, text=texts[0]: list(t.stream(text, max_len=MAX_LEN)))
            elif options and streams and kind < 0.25:
                calls.append(lambda t, texts=texts: t.score(texts, [text[::-1] for text in texts]))
            else:
                chosen = rng.choice(OPTIONS + (GREEDY_ONLY if beam == 1 else ())) if options else {}
                n_best = rng.randint(1, beam)
                calls.append(lambda t, texts=texts, beam=beam, n_best=n_best, chosen=chosen:
                             t(texts, beam=beam, n_best=n_best, max_len=MAX_LEN, **chosen))
        threads.append(calls)
    return threads


def run_together(translator: Translator, threads: list[list[Call]]) -> list[list[object]]:
    """Every thread's calls, all threads started at once."""
    start = threading.Barrier(len(threads))

    def work(calls: list[Call]) -> list[object]:
        start.wait()
        return [call(translator) for call in calls]

    with ThreadPoolExecutor(len(threads)) as pool:
        return list(pool.map(work, threads))


def assert_same_as_one_at_a_time(translator: Translator, threads: list[list[Call]]) -> None:
    expected = [[call(translator) for call in calls] for calls in threads]
    got = run_together(translator, threads)
    wrong = [(thread, number) for thread, (want, have) in enumerate(zip(expected, got, strict=True))
             for number, (one, other) in enumerate(zip(want, have, strict=True)) if one != other]
    assert not wrong, f"{len(wrong)} of {THREADS * CALLS} calls differ under threads, first (thread, call): {wrong[0]}"


@pytest.mark.parametrize("arch", [arch for arch, _ in ARCH_CASES])
def test_a_translator_shared_by_threads_answers_as_one_at_a_time(exports, arch: str) -> None:
    _, manifest = exports.get(arch)
    translator = Translator(manifest.directory, device="cpu", threads=1)
    assert_same_as_one_at_a_time(translator, plans(list(manifest.samples), seed=len(arch)))


def test_the_fused_graph_shared_by_threads_answers_as_one_at_a_time(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("transformer")
    folder = tmp_path / "fused"
    shutil.copytree(manifest.directory, folder)
    copy = load_manifest(folder)
    add_to_manifest(copy, fuse_generate(copy, folder / GENERATE_FILE), beam=True)
    translator = Translator(folder, device="cpu", threads=1, engine="graph")
    assert_same_as_one_at_a_time(translator, plans(list(manifest.samples), seed=1, options=False))


@pytest.mark.parametrize("fail_at", [0, 6], ids=["capture-holds", "capture-fails"])
@pytest.mark.parametrize("arch", ["transformer", "gru"])
def test_captured_steps_shared_by_threads_answer_as_one_at_a_time(exports, arch: str, fail_at: int) -> None:
    """The CUDA-graph bookkeeping under threads, run on CPU (its session ignores graph ids): graph
    ids from several step loops on one session, the device lock, and a capture that fails while
    other threads decode (they go on uncaptured, and every answer stays exact)."""
    _, manifest = exports.get(arch)
    translator = Translator(manifest.directory, device="cpu", threads=1)
    backend = translator.backend
    threads = plans(list(manifest.samples), seed=5)
    expected = [[call(translator) for call in calls] for calls in threads]
    backend.loops = StepLoops(manifest, "cpu", _FailsCapture(backend.decoder, fail_at=fail_at), capture=True,
                              uncaptured=lambda: OrtBackend(manifest, device="cpu", threads=1).decoder,
                              on_step=backend.count_step)
    got = run_together(translator, threads)
    assert got == expected
    assert backend.cuda_graph == (not fail_at)
