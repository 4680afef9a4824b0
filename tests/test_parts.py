"""The shared encoder-decoder parts (s2s_deploy/modeling/parts.py) against ``transformers``' own tables."""

from __future__ import annotations

import pytest
import torch

from s2s_deploy.architecture.encoder_decoder import EncoderDecoderConfig
from s2s_deploy.modeling.parts import Stack, sinusoids_tensor2tensor, tensor2tensor_frequencies

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(("positions", "dim", "pad"), [(1026, 1024, 1), (70, 64, 1), (40, 7, 0)])
def test_tensor2tensor_rows_equal_the_fairseq_table(positions: int, dim: int, pad: int) -> None:
    """Computed rows against M2M100's stored table (FSMT's is the same): the angles are the
    table's float32 products, the sines one rounding apart at most."""
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    table = M2M100SinusoidalPositionalEmbedding.get_embedding(positions, dim)
    computed = sinusoids_tensor2tensor(torch.arange(positions), tensor2tensor_frequencies(dim), dim)
    assert computed.shape == table.shape
    assert float((computed - table).abs().max()) <= 2 * torch.finfo(torch.float32).eps * positions


def test_tensor2tensor_positions_start_after_the_padding_id_and_padding_takes_the_zero_row() -> None:
    """As ``create_position_ids_from_input_ids``: position i of a real token reads row
    ``pad + 1 + i``; a padding token reads the padding row, which is zero."""
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    cfg = EncoderDecoderConfig(d_model=16, positions="tensor2tensor", pad_token_id=1)
    stack = Stack(cfg, torch.nn.Identity, 0, decoder=False, vocab_size=10)
    tokens = torch.tensor([[5, 6, 7, 1, 1]])
    reference = M2M100SinusoidalPositionalEmbedding(32, 16, padding_idx=1)(tokens)
    ours = stack.positions(torch.arange(5)[None, :], tokens)
    assert torch.allclose(ours, reference, atol=1e-6) and bool((ours[0, 3:] == 0).all())
