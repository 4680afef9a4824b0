"""What a sentence's output owes its batchmates (docs/parity.md, "int8 and the batch").

int8 with per-row activation scales: nothing. Its batches hold one source length, so no sentence
is padded and each row runs the very arithmetic it runs alone. fp32: padding to a longer
batchmate moves scores in the last bits, never the tokens here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.runtime.translator import Translator
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


def alone_and_together(folder: Path) -> tuple[Translator, list[str], list, list]:
    translator = Translator(folder, device="cpu", threads=1)
    texts = [pair.source for pair in generate_pairs("en-fr", SENTENCES, seed=11)]  # dozens of source lengths
    together = translator(texts, beam=4, n_best=4, batch_size=32)
    alone = [translator([text], beam=4, n_best=4)[0] for text in texts]
    return translator, texts, together, alone


def test_int8_per_row_output_does_not_depend_on_batchmates(int8_folder: Path) -> None:
    translator, texts, together, alone = alone_and_together(int8_folder)
    assert together == alone  # every hypothesis, every score, to the bit
    ids = [translator.manifest.src_vocab.encode(text) for text in texts]
    assert translator.translate_ids(ids, beam=4, n_best=4, batch_size=32) == [
        translator.translate_ids([row], beam=4, n_best=4)[0] for row in ids]


def test_fp32_padding_moves_scores_in_the_last_bits_only(exports) -> None:
    _, manifest = exports.get("transformer")
    _, _, together, alone = alone_and_together(load_manifest(manifest.directory).directory)
    assert [[text for text, _ in t.hypotheses] for t in together] == [[text for text, _ in t.hypotheses] for t in alone]
    np.testing.assert_allclose([s for t in together for _, s in t.hypotheses],
                               [s for t in alone for _, s in t.hypotheses], rtol=0, atol=1e-5)
