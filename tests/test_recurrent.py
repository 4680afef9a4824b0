"""Recurrent plugins: the step decoder must be the teacher-forced forward, padding must not leak,
and the declared batch axes must be the real ones (beam search tiles and gathers along them)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from s2s_deploy.modeling.contract import ArchitecturePlugin, Seq2SeqModel, validate_plugin
from s2s_deploy_plugins.bahdanau import PLUGIN as BAHDANAU
from s2s_deploy_plugins.bahdanau import BahdanauConfig
from s2s_deploy_plugins.gru import PLUGIN as GRU
from s2s_deploy_plugins.gru import GRUConfig
from s2s_deploy_plugins.lstm import PLUGIN as LSTM
from s2s_deploy_plugins.lstm import LSTMConfig
from s2s_deploy_plugins.rnnsearch import PLUGIN as RNNSEARCH
from s2s_deploy_plugins.rnnsearch import RNNSearchConfig

SRC_VOCAB, TGT_VOCAB = 11, 13
# No hidden size equals a source length used below, so a source axis is recognisable by size.
CASES: dict[str, tuple[ArchitecturePlugin, Any]] = {
    "gru": (GRU, GRUConfig(embed_size=8, num_hiddens=16, num_layers=2)),
    "lstm": (LSTM, LSTMConfig(embed_size=8, num_hiddens=16, num_layers=4)),
    "bahdanau": (BAHDANAU, BahdanauConfig(embed_size=8, num_hiddens=16, num_layers=2)),
    "rnnsearch": (RNNSEARCH, RNNSearchConfig(embed_size=8, encoder_hiddens=12, decoder_hiddens=16,
                                             attention_hiddens=10, num_layers=2)),
}
BATCHES = [([5, 2, 7], 7), ([3, 1], 6)]  # (source lengths, padded length): the second pads past the longest


def build(name: str) -> tuple[ArchitecturePlugin, Any, Seq2SeqModel]:
    plugin, cfg = CASES[name]
    torch.manual_seed(0)
    return plugin, cfg, plugin.build(cfg, SRC_VOCAB, TGT_VOCAB).eval()


def batch(lengths: list[int], padded: int, tgt_len: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, SRC_VOCAB, (len(lengths), padded), generator=generator)
    src_len = torch.tensor(lengths)
    src = src.masked_fill(torch.arange(padded)[None, :] >= src_len[:, None], 0)
    tgt_in = torch.randint(4, TGT_VOCAB, (len(lengths), tgt_len), generator=generator)
    return src, src_len, tgt_in


def split(plugin: ArchitecturePlugin, cfg: Any, encoded: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    memory = {m.name: encoded[m.name] for m in plugin.memory_specs(cfg)}
    state = {s.name: encoded[s.name] for s in plugin.state_specs(cfg)}
    assert set(encoded) == set(memory) | set(state)
    return memory, state


def decode_stepwise(
    plugin: ArchitecturePlugin, cfg: Any, model: Seq2SeqModel, src: torch.Tensor, src_len: torch.Tensor,
    tgt_in: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``(B, T, V)`` and attention ``(B, T, 1, S)`` (or None) from the step decoder."""
    memory, state = split(plugin, cfg, model.encode(src, src_len))
    log_probs, attention = [], []
    for t in range(tgt_in.shape[1]):
        out = model.decode_step(tgt_in[:, t], torch.tensor(t), memory, state)
        state = out.state
        log_probs.append(out.log_probs)
        attention.append(out.attention)
    return torch.stack(log_probs, dim=1), (torch.stack(attention, dim=1) if plugin.has_attention else None)


@pytest.mark.parametrize("name", CASES)
def test_plugin_is_valid(name: str) -> None:
    plugin, _, _ = build(name)
    validate_plugin(plugin)


def test_lstm_default_is_four_layers() -> None:
    assert LSTM.preset().num_layers == 4


@pytest.mark.parametrize("lengths,padded", BATCHES)
@pytest.mark.parametrize("name", CASES)
@torch.no_grad()
def test_step_decoder_matches_teacher_forcing(name: str, lengths: list[int], padded: int) -> None:
    plugin, cfg, model = build(name)
    src, src_len, tgt_in = batch(lengths, padded)
    forced = torch.log_softmax(model(src, src_len, tgt_in), dim=-1)
    stepped, _ = decode_stepwise(plugin, cfg, model, src, src_len, tgt_in)
    torch.testing.assert_close(stepped, forced, atol=1e-5, rtol=0)


@pytest.mark.parametrize("lengths,padded", BATCHES)
@pytest.mark.parametrize("name", CASES)
@torch.no_grad()
def test_mixed_length_batch_matches_one_at_a_time(name: str, lengths: list[int], padded: int) -> None:
    plugin, cfg, model = build(name)
    src, src_len, tgt_in = batch(lengths, padded)
    log_probs, attention = decode_stepwise(plugin, cfg, model, src, src_len, tgt_in)
    for i, length in enumerate(lengths):
        alone = (src[i : i + 1, :length], src_len[i : i + 1], tgt_in[i : i + 1])
        alone_log_probs, alone_attention = decode_stepwise(plugin, cfg, model, *alone)
        torch.testing.assert_close(log_probs[i : i + 1], alone_log_probs, atol=1e-5, rtol=0)
        if attention is not None:
            torch.testing.assert_close(attention[i : i + 1, ..., :length], alone_attention, atol=1e-6, rtol=0)
            assert torch.all(attention[i, ..., length:] == 0)


@pytest.mark.parametrize("name", CASES)
@torch.no_grad()
def test_encoder_state_of_padded_sentence_is_its_unpadded_state(name: str) -> None:
    """The final state must be the one at the last real token (for a backward direction: the
    one that started there), and memory on real positions must not see the padding."""
    plugin, cfg, model = build(name)
    src, src_len, _ = batch([2], 9)
    padded = model.encode(src, src_len)
    alone = model.encode(src[:, :2], src_len)
    for spec in plugin.state_specs(cfg):
        torch.testing.assert_close(padded[spec.name], alone[spec.name], atol=1e-6, rtol=0)
    for spec in plugin.memory_specs(cfg):
        tensor = padded[spec.name]
        if tensor.dim() >= 2 and tensor.shape[1] == 9:
            tensor = tensor[:, :2]
        torch.testing.assert_close(tensor, alone[spec.name], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", CASES)
@torch.no_grad()
def test_declared_batch_axes_reorder_beams(name: str) -> None:
    """Gathering memory and state along the declared batch axes must permute the outputs."""
    plugin, cfg, model = build(name)
    src, src_len, tgt_in = batch([5, 2, 7], 7)
    memory, state = split(plugin, cfg, model.encode(src, src_len))
    order = torch.tensor([2, 0, 1])
    gathered_memory = {m.name: memory[m.name].index_select(m.batch_axis, order) for m in plugin.memory_specs(cfg)}
    gathered_state = {s.name: state[s.name].index_select(s.batch_axis, order) for s in plugin.state_specs(cfg)}
    out = model.decode_step(tgt_in[:, 0], torch.tensor(0), memory, state)
    moved = model.decode_step(tgt_in[order, 0], torch.tensor(0), gathered_memory, gathered_state)
    torch.testing.assert_close(moved.log_probs, out.log_probs[order], atol=1e-6, rtol=0)
    for spec in plugin.state_specs(cfg):
        torch.testing.assert_close(moved.state[spec.name], out.state[spec.name].index_select(spec.batch_axis, order),
                                   atol=1e-6, rtol=0)
