"""Whisper's torch modules (the declaration, config and decoding rules are ``plugins/whisper.py``):
the audio encoder (two convolutions, a stored position table, pre-norm layers) in front of the
shared pre-norm decoder of ``s2s_deploy.modeling.parts``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.parts import DecoderLayer, EncoderDecoder, EncoderDecoderConfig, EncoderLayer, Stack, erf_gelu
from s2s_deploy_plugins.whisper import WhisperConfig

MASK = torch.finfo(torch.float32).min


def _zero_past(x: Tensor, lengths: Tensor) -> Tensor:
    """``x`` ``(B, C, T)`` with the frames at or past each row's length set to zero."""
    valid = torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None]
    return x * valid[:, None, :].to(x.dtype)


def _unbiased_keys(attention: nn.Module, d_model: int) -> None:
    """Whisper's key projection has no bias (its query, value and output projections do)."""
    attention.k_proj = nn.Linear(d_model, attention.heads * attention.head_dim, bias=False)


class WhisperEncoder(nn.Module):
    """Names as ``transformers``' ``model.encoder``: conv1, conv2, embed_positions, layers, layer_norm."""

    def __init__(self, config: WhisperConfig, cfg: EncoderDecoderConfig) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(config.n_mels, cfg.d_model, 3, padding=1)
        self.conv2 = nn.Conv1d(cfg.d_model, cfg.d_model, 3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(config.max_source_positions, cfg.d_model)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        for layer in self.layers:
            _unbiased_keys(layer.self_attn, cfg.d_model)
        self.layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        x = erf_gelu(self.conv1(_zero_past(src, src_len)))
        x = erf_gelu(self.conv2(_zero_past(x, src_len)))
        lengths = torch.div(src_len - 1, 2, rounding_mode="floor") + 1
        x = x.transpose(1, 2)
        positions = torch.arange(x.shape[1], device=x.device)[None, :]
        x = x + self.embed_positions(positions)
        valid = positions < lengths[:, None]
        bias = torch.zeros(valid.shape, dtype=torch.float32, device=x.device).masked_fill(~valid, MASK)
        bias = bias[:, None, None, :]
        for layer in self.layers:
            x = layer(x, bias)
        return self.layer_norm(x), bias


class WhisperModel(EncoderDecoder):
    """``EncoderDecoder``'s decoder, step and training forward behind Whisper's audio encoder."""

    def __init__(self, config: WhisperConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        nn.Module.__init__(self)
        cfg = config.layers()
        self.cfg, self.whisper, self.embed_scale = cfg, config, 1.0
        self.encoder = WhisperEncoder(config, cfg)
        self.decoder = Stack(cfg, DecoderLayer, cfg.decoder_layers, True, tgt_vocab_size)
        for layer in self.decoder.layers:
            _unbiased_keys(layer.self_attn, cfg.d_model)
            _unbiased_keys(layer.encoder_attn, cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, tgt_vocab_size))
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.decoder.embed_tokens.weight

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        return self.encoder(src, src_len)
