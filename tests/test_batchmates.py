"""What a sentence's output owes its batchmates (docs/parity.md, "The batch"): nothing, to the bit.

Every source is padded to its canonical width (the next multiple of 32 ids), alone or batched, and
batched only with sources of that width, so each row runs the very arithmetic it runs alone; beam
search's first step runs one row per sentence in a batch of any size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from s2s_deploy.runtime.translator import Translator, canonical_width
from s2s_deploy.transforms.quantize import quantize_export

pytest.importorskip("babel")
from s2s_deploy.train.tasks import generate_pairs

SENTENCES = 80
COPIES = 9
"""Identical copies of one sentence in a batch: past the 8 from which beam search once ran its
first step on one row per sentence (and on K tiled rows below), which moved fp32 scores."""


@pytest.fixture(scope="module")
def int8_folder(exports, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, manifest = exports.get("transformer")
    return quantize_export(manifest, "int8", tmp_path_factory.mktemp("int8") / "int8").directory


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_copies_of_one_sentence_score_as_it_does_alone(exports, int8_folder: Path, precision: str) -> None:
    """No padding here (one length): only the batch's row count differs from the run alone."""
    folder = int8_folder if precision == "int8" else exports.get("transformer")[1].directory
    translator = Translator(folder, device="cpu", threads=1)
    texts = [pair.source for pair in generate_pairs("en-fr", 20, seed=5)]
    for text in texts:
        alone = translator([text], beam=4, n_best=4)[0]
        assert translator([text] * COPIES, beam=4, n_best=4) == [alone] * COPIES, text


def test_canonical_width() -> None:
    assert [canonical_width(n) for n in (1, 31, 32, 33, 64, 65)] == [32, 32, 32, 64, 64, 96]
    assert canonical_width(40, limit=50) == 50  # never past the model's limit
    assert canonical_width(40, limit=64) == 64


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_sentence_decodes_the_same_in_any_batch_and_position(exports, int8_folder: Path, precision: str) -> None:
    folder = int8_folder if precision == "int8" else exports.get("transformer")[1].directory
    translator = Translator(folder, device="cpu", threads=1)
    texts = [pair.source for pair in generate_pairs("en-fr", SENTENCES, seed=11)]
    ids = [translator.manifest.src_vocab.encode(text) for text in texts]
    assert len({len(row) for row in ids}) > 20 and len({translator.padding.of(len(row)) for row in ids}) > 1
    shuffled = np.random.default_rng(0).permutation(SENTENCES)
    for beam, n_best in ((1, 1), (4, 4)):
        alone = [translator([text], beam=beam, n_best=n_best)[0] for text in texts]
        assert translator(texts, beam=beam, n_best=n_best, batch_size=32) == alone  # hypotheses and scores
        other = translator([texts[i] for i in shuffled], beam=beam, n_best=n_best, batch_size=7)
        assert other == [alone[i] for i in shuffled]
        assert translator.translate_ids(ids, beam=beam, n_best=n_best, batch_size=32) == [
            translator.translate_ids([row], beam=beam, n_best=n_best)[0] for row in ids]
