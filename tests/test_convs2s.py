"""ConvS2S: the incremental step must be the teacher-forced forward, padding must not leak."""

from __future__ import annotations

import pytest
import torch

from s2s_deploy.modeling.contract import validate_plugin
from s2s_deploy_plugins.convs2s import PLUGIN, ConvS2SConfig
from s2s_deploy_plugins.models.convs2s import ConvS2S

SRC_VOCAB, TGT_VOCAB = 11, 13


def tiny(kernel_size: int = 3) -> ConvS2SConfig:
    return ConvS2SConfig(emb_dim=16, hid_dim=24, encoder_layers=2, decoder_layers=3,
                         kernel_size=kernel_size, max_positions=32)


def build(cfg: ConvS2SConfig) -> ConvS2S:
    torch.manual_seed(0)
    return PLUGIN.build(cfg, SRC_VOCAB, TGT_VOCAB).eval()


def batch(lengths: list[int], tgt_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(1, SRC_VOCAB, (len(lengths), max(lengths)), generator=generator)
    src_len = torch.tensor(lengths)
    src = src.masked_fill(torch.arange(src.shape[1])[None, :] >= src_len[:, None], 0)
    tgt_in = torch.randint(1, TGT_VOCAB, (len(lengths), tgt_len), generator=generator)
    return src, src_len, tgt_in


def decode_stepwise(
    model: ConvS2S, cfg: ConvS2SConfig, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs ``(B, T, V)`` and attention ``(B, T, layers, S)`` from the step decoder."""
    memory = model.encode(src, src_len)
    (spec,) = PLUGIN.state_specs(cfg)
    shape = tuple(src.shape[0] if d == "batch" else d for d in spec.shape)
    state = {spec.name: torch.zeros(shape)}
    log_probs, attention = [], []
    for t in range(tgt_in.shape[1]):
        out = model.decode_step(tgt_in[:, t], torch.tensor(t), memory, state)
        assert out.state[spec.name].shape == shape  # fixed-size state: constant cost per step
        state = out.state
        log_probs.append(out.log_probs)
        attention.append(out.attention)
    return torch.stack(log_probs, dim=1), torch.stack(attention, dim=1)


def test_plugin_is_valid() -> None:
    validate_plugin(PLUGIN)
    with pytest.raises(ValueError, match="kernel_size"):
        ConvS2SConfig(kernel_size=4)


@pytest.mark.parametrize("kernel_size", [3, 5])
def test_step_decoder_matches_teacher_forcing(kernel_size: int) -> None:
    cfg = tiny(kernel_size)
    model = build(cfg)
    src, src_len, tgt_in = batch([7, 4, 1], tgt_len=3 * kernel_size)
    with torch.no_grad():
        expected = torch.log_softmax(model(src, src_len, tgt_in), dim=-1)
        got, _ = decode_stepwise(model, cfg, src, src_len, tgt_in)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_mixed_length_batch_matches_one_at_a_time() -> None:
    cfg = tiny()
    model = build(cfg)
    src, src_len, tgt_in = batch([8, 5, 2, 1], tgt_len=6)
    with torch.no_grad():
        batched = model(src, src_len, tgt_in)
        memory = model.encode(src, src_len)
        for b, length in enumerate(src_len.tolist()):
            alone_src, alone_len = src[b : b + 1, :length], src_len[b : b + 1]
            torch.testing.assert_close(model(alone_src, alone_len, tgt_in[b : b + 1]), batched[b : b + 1],
                                       atol=1e-5, rtol=0)
            alone = model.encode(alone_src, alone_len)
            for name in ("conved", "combined"):
                torch.testing.assert_close(alone[name][0], memory[name][b, :length], atol=1e-5, rtol=0)


def test_attention_is_a_distribution_over_valid_source_positions() -> None:
    cfg = tiny()
    model = build(cfg)
    src, src_len, tgt_in = batch([6, 3, 1], tgt_len=5)
    with torch.no_grad():
        _, step_attention = decode_stepwise(model, cfg, src, src_len, tgt_in)
        _, forward_attention = model.run_decoder(tgt_in, model.encode(src, src_len))
    assert step_attention.shape == (3, 5, cfg.decoder_layers, src.shape[1])
    torch.testing.assert_close(step_attention, forward_attention.transpose(1, 2), atol=1e-5, rtol=0)
    padding = torch.arange(src.shape[1])[None, :] >= src_len[:, None]
    assert torch.all(step_attention.masked_select(padding[:, None, None, :]) == 0)
    torch.testing.assert_close(step_attention.sum(dim=-1), torch.ones(3, 5, cfg.decoder_layers))
