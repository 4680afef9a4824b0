"""The shared suite every architecture passes: export, then parity for greedy and beam.

A new architecture adds one row to ARCH_CASES; test_every_plugin_has_a_row fails until it does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from s2s_deploy.architecture.registry import REGISTRY
from s2s_deploy.modeling.torch_backend import torch_backend_for
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.search import SearchConfig, search
from s2s_deploy.runtime.translator import encode_batch
from s2s_deploy.verify.parity import check_parity, forced_step_diff

# (architecture, longest target decoded in these tests)
ARCH_CASES = [
    ("transformer", 40),
    ("gru", 40),
    ("lstm", 40),
    ("bahdanau", 40),
    ("rnnsearch", 40),
    ("convs2s", 40),
    ("marian", 40),
    ("bart", 40),
    ("t5", 40),
]
ARCHS = [pytest.param(arch, max_len, id=arch) for arch, max_len in ARCH_CASES]
HF_FAMILIES = {"mt5", "umt5", "m2m100", "pegasus", "blenderbot", "blenderbot_small", "fsmt", "whisper", "longt5",
               "pegasus_x", "led", "prophetnet", "vision_encoder_decoder", "speech_to_text"}
"""Families exported from tiny Hugging Face folders against ``generate`` in tests/test_hf_families.py
(one export each; Whisper and Speech2Text, which read audio, in tests/test_hf_whisper.py and
tests/test_hf_speech_to_text.py; the vision encoder-decoder,
which reads images, in tests/test_hf_vision.py), not from seeded presets here."""
AUDIO = {"speech"}
"""Encoders of features, exported and transcribing the sample clips in tests/test_speech_source.py."""


def test_every_plugin_has_a_row() -> None:
    """Built-ins only: a third-party plugin installed beside us is its author's to test."""
    registered = {entry.plugin.name for entry in REGISTRY.entries() if entry.builtin}
    assert registered == {arch for arch, _ in ARCH_CASES} | HF_FAMILIES | AUDIO


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_export_writes_a_valid_manifest(exports, arch: str, max_len: int) -> None:
    _, manifest = exports.get(arch)
    assert manifest.plugin == arch
    validation = manifest.to_dict()["validation"]
    assert max(validation["max_abs_diff"].values()) <= validation["atol"]
    decoder_inputs = set(manifest.decoder.inputs)
    assert {"tokens", "reorder"} <= decoder_inputs  # "step" is dropped by exporters when unused
    assert {s.decoder_input for s in manifest.state} <= decoder_inputs
    assert {s.decoder_output for s in manifest.state} <= set(manifest.decoder.outputs)
    assert manifest.samples, "an export stores sample inputs for parity"


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_parity_greedy_and_beam(exports, arch: str, max_len: int) -> None:
    _, manifest = exports.get(arch)
    report = check_parity(manifest, torch_backend_for(manifest), OrtBackend(manifest, device="cpu"),
                          list(manifest.samples), beam_size=4, max_len=max_len)
    assert report.log_probs_ok and report.forward_ok, (report.step, report.forward_step)
    for agreement in report.searches:
        assert agreement.identical == agreement.total, agreement.mismatches[:3]
    assert report.passed


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_mixed_length_batch_equals_one_at_a_time(exports, arch: str, max_len: int) -> None:
    _, manifest = exports.get(arch)
    backend = OrtBackend(manifest, device="cpu")
    sources = sorted(manifest.samples, key=len)[:: max(1, len(manifest.samples) // 5)]
    assert len({len(s) for s in sources}) > 1, "the batch must mix lengths"
    for config in (SearchConfig(1, 1, max_len), SearchConfig(3, 2, max_len)):
        batched = search(backend, *encode_batch(sources, manifest.src_vocab), config)
        for text, hyps in zip(sources, batched, strict=True):
            alone = search(backend, *encode_batch([text], manifest.src_vocab), config)[0]
            assert [h.tokens for h in hyps] == [h.tokens for h in alone]
            np.testing.assert_allclose([h.score for h in hyps], [h.score for h in alone], atol=1e-5)


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_memory_once_per_sentence_decodes_as_memory_repeated_per_beam(exports, arch: str, max_len: int) -> None:
    """Where the decoder takes the memory once per sentence (manifest ``memory_per_sentence``),
    beam search gives what it gives on the memory repeated per beam, as before."""
    _, manifest = exports.get(arch)
    assert manifest.memory_per_sentence == (arch in {"transformer", "marian", "bart", "t5"})
    if not manifest.memory_per_sentence:
        return  # memory repeated per beam either way: nothing to compare
    once = OrtBackend(manifest, device="cpu")
    repeated = OrtBackend(dataclasses.replace(manifest, memory_per_sentence=False), device="cpu")
    src, src_len = encode_batch(list(manifest.samples)[:6], manifest.src_vocab)
    for config in (SearchConfig(4, 2, max_len), SearchConfig(2, 1, max_len)):
        want = search(repeated, src, src_len, config)
        got = search(once, src, src_len, config)
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
        np.testing.assert_allclose([[h.score for h in hyps] for hyps in got],
                                   [[h.score for h in hyps] for hyps in want], atol=1e-5)


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_beam_of_one_is_greedy(exports, arch: str, max_len: int) -> None:
    _, manifest = exports.get(arch)
    backend = OrtBackend(manifest, device="cpu")
    src, src_len = encode_batch(list(manifest.samples), manifest.src_vocab)
    greedy = search(backend, src, src_len, SearchConfig(1, 1, max_len))
    from s2s_deploy.runtime.search import beam_search

    beam = beam_search(backend, src, src_len, SearchConfig(1, 1, max_len))
    assert [g[0].tokens for g in greedy] == [b[0].tokens for b in beam]
    assert [g[0].score for g in greedy] == pytest.approx([b[0].score for b in beam], abs=1e-9)


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_beam_scores_are_length_normalised_log_probs(exports, arch: str, max_len: int) -> None:
    """Each returned score equals log P(own tokens) / L**alpha, recomputed by teacher forcing."""
    _, manifest = exports.get(arch)
    backend = OrtBackend(manifest, device="cpu")
    alpha = 0.75
    src, src_len = encode_batch(list(manifest.samples)[:6], manifest.src_vocab)
    results = search(backend, src, src_len, SearchConfig(4, 4, max_len, alpha))
    for row, hyps in enumerate(results):
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for hyp in hyps:
            target = list(hyp.tokens) + ([backend.eos_id] if hyp.finished else [])
            log_p = _forced_log_prob(backend, src[row : row + 1], src_len[row : row + 1], target)
            assert hyp.score == pytest.approx(log_p / len(target) ** alpha, abs=1e-4)


def _forced_log_prob(backend: OrtBackend, src: np.ndarray, src_len: np.ndarray, target: list[int]) -> float:
    run = backend.start(src, src_len)
    reorder = np.zeros(1, dtype=np.int64)
    previous, total = backend.decoder_start_id, 0.0
    for token in target:
        total += float(run.step(np.array([previous]), reorder)[0, token])
        previous = token
    return total


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_forced_step_diff_is_zero_against_itself(exports, arch: str, max_len: int) -> None:
    """The log-prob comparison would catch a difference: same backend twice gives exactly 0."""
    _, manifest = exports.get(arch)
    backend = OrtBackend(manifest, device="cpu")
    src, src_len = encode_batch(list(manifest.samples)[:3], manifest.src_vocab)
    assert forced_step_diff(backend, backend, src, src_len, [[5, 6, 7]] * 3) == 0.0
    reference = torch_backend_for(manifest)
    assert forced_step_diff(reference, backend, src, src_len, [[5, 6, 7]] * 3) > 0.0


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_a_run_on_reused_buffers_steps_as_a_fresh_backend(exports, arch: str, max_len: int) -> None:
    """An ended run's buffers serve the next run of as many rows: nothing of the old batch leaks."""
    _, manifest = exports.get(arch)
    texts = list(manifest.samples)
    earlier, later = encode_batch(texts[:2], manifest.src_vocab), encode_batch(texts[2:4], manifest.src_vocab)

    def steps(backend: OrtBackend, batch: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
        with backend.start(*batch, expand=2) as run:
            tokens = np.full(4, backend.decoder_start_id, dtype=np.int64)
            reorder = np.array([1, 0, 3, 2], dtype=np.int64)
            seen = []
            for _ in range(4):
                values, ids = run.step_top(tokens, reorder, 3)
                seen += [values.copy(), ids.copy()]
                tokens = ids[:, 0].copy()
        return seen

    backend = OrtBackend(manifest, device="cpu")
    steps(backend, earlier)
    reused, fresh = steps(backend, later), steps(OrtBackend(manifest, device="cpu"), later)
    for got, expected in zip(reused, fresh, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_a_narrow_first_step_decodes_as_a_tiled_one(exports, arch: str, max_len: int) -> None:
    """Beam search feeds its first step one row per sentence; the next step's reorder tiles the
    beams from those rows. Both backends must decode then as if every row had been fed."""
    _, manifest = exports.get(arch)
    src, src_len = encode_batch(list(manifest.samples)[:2], manifest.src_vocab)
    for backend in (OrtBackend(manifest, device="cpu"), torch_backend_for(manifest)):
        start = backend.decoder_start_id
        seen = []
        for first_rows, seed in ((np.arange(2), np.array([0, 0, 0, 1, 1, 1])),
                                 (np.arange(6), np.array([0, 0, 0, 3, 3, 3]))):
            with backend.start(src, src_len, expand=3) as run:
                values, ids = run.step_top(np.full(len(first_rows), start), first_rows, 3)
                values, ids = run.step_top(ids[seed, [0, 1, 2] * 2], seed, 3)  # each sentence's 3 best
                seen.append((values.copy(), ids.copy()))
        (narrow_values, narrow_ids), (tiled_values, tiled_ids) = seen
        np.testing.assert_array_equal(narrow_ids, tiled_ids)
        # fewer rows may change a kernel's summation order: the tolerance of batching sentences
        # together (test_mixed_length_batch_equals_one_at_a_time), plus ~8 ulps of large log-probs
        np.testing.assert_allclose(narrow_values, tiled_values, rtol=1e-6, atol=1e-5)


class _FailsCapture:
    """The real CPU decoder session (which ignores graph ids), except that the first run of its
    ``fail_at``-th graph id fails, as ONNX Runtime's CUDA capture of an op that cannot be captured
    would (it captures a graph id within that id's first run)."""

    def __init__(self, session, fail_at: int) -> None:
        self._session, self._fail_at, self._seen = session, fail_at, set()

    def __getattr__(self, name: str):
        return getattr(self._session, name)

    def run_with_iobinding(self, binding, run_options=None) -> None:
        from onnxruntime.capi.onnxruntime_pybind11_state import Fail

        from s2s_deploy.runtime.ort.step_loop import GRAPH_ID_KEY

        graph_id = int(run_options.get_run_config_entry(GRAPH_ID_KEY)) if run_options is not None else -1
        if graph_id >= 0 and graph_id not in self._seen:
            self._seen.add(graph_id)
            if len(self._seen) == self._fail_at:
                raise Fail("CUDA failure 900: operation not permitted when stream is capturing")
        self._session.run_with_iobinding(binding, run_options)


@pytest.mark.parametrize("fail_at", [2, 0], ids=["capture-fails", "capture-holds"])
@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_a_step_that_fails_to_capture_falls_back_and_decodes_the_same(exports, arch: str, max_len: int,
                                                                       fail_at: int) -> None:
    """A third-party decoder may hold an op that cannot be captured as a CUDA graph, which shows
    only when a step runs. The backend then drops capture, and the batch replays its steps on a
    fresh uncaptured session: the caller gets what a backend that never captured gives. The
    capture bookkeeping runs on CPU here because the CPU session ignores graph ids; with no
    failure (``fail_at`` 0), graph ids kept across batches must decode as fresh backends do."""
    from s2s_deploy.runtime.ort.step_loop import StepLoops

    _, manifest = exports.get(arch)
    texts = sorted(manifest.samples, key=len)
    # first beam 3 on 8 sentences: the failure comes at its third step, after the narrow first step
    batches = [encode_batch(list(batch), manifest.src_vocab)
               for batch in ((texts * 8)[:8], texts[-2:], (texts * 8)[:8])]  # the last reuses the first's graphs
    configs = (SearchConfig(3, 2, max_len), SearchConfig(1, 1, max_len))
    expected = [search(OrtBackend(manifest, device="cpu"), *batch, config) for config in configs for batch in batches]
    backend = OrtBackend(manifest, device="cpu")
    backend.loops = StepLoops(manifest, "cpu", _FailsCapture(backend.decoder, fail_at=fail_at), capture=True,
                              uncaptured=lambda: OrtBackend(manifest, device="cpu").decoder, on_step=backend.count_step)
    got = [search(backend, *batch, config) for config in configs for batch in batches]
    if fail_at:
        assert not backend.cuda_graph and not isinstance(backend.decoder, _FailsCapture)
        assert "failed to capture: CUDA failure 900" in backend.choice.reason
    else:
        assert backend.cuda_graph and isinstance(backend.decoder, _FailsCapture)
    for want_batch, have_batch in zip(expected, got, strict=True):
        for want, have in zip(want_batch, have_batch, strict=True):
            assert [h.tokens for h in have] == [h.tokens for h in want]
            np.testing.assert_allclose([h.score for h in have], [h.score for h in want], atol=1e-6)


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_graph_files_hold_little_beyond_their_weights(exports, arch: str, max_len: int) -> None:
    """fp32 graph files within 5% of their parameter bytes: no duplicated weights, no debug baggage."""
    from s2s_deploy.transforms.inspect import summarise

    _, manifest = exports.get(arch)
    for graph in summarise(manifest):
        assert graph.size_ratio <= 1.05, (graph.role, graph.size_ratio)


@pytest.mark.parametrize("arch", ["transformer", "gru"])
def test_kept_buffers_stay_within_their_bounds_over_many_batch_shapes(exports, monkeypatch, arch: str) -> None:
    """A server's backend sees batches of every size and width for as long as it runs. What its step
    loop keeps per shape (state buffers per row count, memory buffers per memory shape, and the
    bindings and output buffers made on them) must stay within KEPT_ROW_COUNTS and KEPT_MEMORY_SHAPES
    however many shapes come, and nothing kept may point at a row count or memory set already dropped:
    a binding left behind would hold its buffers' memory for the life of the process."""
    from s2s_deploy.runtime.ort import step_loop as fixed_steps

    _, manifest = exports.get(arch)
    monkeypatch.setattr(fixed_steps, "KEPT_MEMORY_SHAPES", 3)
    monkeypatch.setattr(fixed_steps, "KEPT_ROW_COUNTS", 2)
    backend = OrtBackend(manifest, device="cpu")
    texts = sorted(manifest.samples, key=len)
    rng = np.random.default_rng(0)
    shapes = set()
    for _ in range(30):
        batch = [texts[i] for i in rng.integers(0, len(texts), size=int(rng.integers(1, 7)))]
        beam = int(rng.choice([1, 3]))
        src, src_len = encode_batch(batch, manifest.src_vocab)
        shapes.add((src.shape, beam))
        search(backend, src, src_len, SearchConfig(beam, 1, 12))
        [steps] = backend.loops._idle  # one thread: the same step loop, batch after batch
        memory_ids = {memory_id for memory_id, _, _ in steps._memory.values()}
        generations = {kept.generation for kept in steps._rows.values()}
        assert len(steps._rows) <= 2 and len(steps._memory) <= 3
        assert {key[0] for key in steps._memory} <= set(steps._rows)
        assert all(key[0] in steps._rows and key[1] in generations and key[2] in memory_ids
                   for key in steps._graphs)
        assert all(key[2] in memory_ids for kept in steps._rows.values() for key in kept.outputs)
    assert len(shapes) >= 15  # many more shapes than the bounds keep


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_kept_buffers_decode_as_a_fresh_backend(exports, monkeypatch, arch: str, max_len: int) -> None:
    """The step loop (runtime/ort/step_loop.py) keeps every input and output in buffers reused
    across batches, which is what lets CUDA replay steps as captured graphs. One backend decoding
    batch after batch, its state buffers outgrown, memory shapes and row counts dropped on the way, must
    find what a fresh backend finds for each batch alone; beam search's narrow first step included."""
    from s2s_deploy.runtime.ort import step_loop as fixed_steps

    _, manifest = exports.get(arch)
    texts = sorted(manifest.samples, key=len)
    batches = [encode_batch(list(batch), manifest.src_vocab)
               for batch in (texts[:1], texts[-2:], texts[:1], texts[-2:], (texts * 8)[:8])]
    configs = (SearchConfig(1, 1, max_len), SearchConfig(3, 2, max_len))
    expected = [search(OrtBackend(manifest, device="cpu"), *batch, config) for config in configs for batch in batches]
    monkeypatch.setattr(fixed_steps, "FIRST_CAPACITY", 4)
    monkeypatch.setattr(fixed_steps, "KEPT_MEMORY_SHAPES", 2)  # three batch shapes: one is dropped
    monkeypatch.setattr(fixed_steps, "KEPT_ROW_COUNTS", 2)  # six row counts (1, 2, 8; 3, 6, 24 rows)
    shared = OrtBackend(manifest, device="cpu")
    got = [search(shared, *batch, config) for config in configs for batch in batches]
    for want_batch, have_batch in zip(expected, got, strict=True):
        for want, have in zip(want_batch, have_batch, strict=True):
            assert [h.tokens for h in have] == [h.tokens for h in want]
            np.testing.assert_allclose([h.score for h in have], [h.score for h in want], atol=1e-6)
