"""Speech2Text's torch modules (the declaration and config are ``plugins/speech_to_text.py``): the
convolutional subsampler and pre-norm encoder in front of the shared pre-norm decoder of
``s2s_deploy.modeling.parts``."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.parts import (
    DecoderLayer,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderLayer,
    Stack,
    padding_bias,
    sinusoids_tensor2tensor,
    tensor2tensor_frequencies,
)
from s2s_deploy_plugins.speech_to_text import Speech2TextConfig


def _zero_past(x: Tensor, lengths: Tensor) -> Tensor:
    """``x`` ``(B, C, T)`` with the frames at or past each row's length set to zero."""
    valid = torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None]
    return x * valid[:, None, :].to(x.dtype)


class Conv1dSubsampler(nn.Module):
    """Names as ``transformers``' ``encoder.conv``: ``conv_layers``, each of stride 2 and a GLU over channels."""

    def __init__(self, config: Speech2TextConfig, d_model: int) -> None:
        super().__init__()
        kernels = config.kernels
        self.conv_layers = nn.ModuleList(
            nn.Conv1d(config.num_mel_bins if i == 0 else config.conv_channels // 2,
                      config.conv_channels if i < len(kernels) - 1 else d_model * 2,
                      kernel_size=k, stride=2, padding=k // 2)
            for i, k in enumerate(kernels))

    def forward(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        """``(B, T, bins)`` → ``(B, T', d_model)`` and each row's subsampled length: padding is zeroed
        before every convolution, so no clip reads another's length."""
        x, lengths = src.transpose(1, 2), src_len
        for conv in self.conv_layers:
            x = nn.functional.glu(conv(_zero_past(x, lengths)), dim=1)
            lengths = torch.div(lengths - 1, 2, rounding_mode="floor") + 1
        return x.transpose(1, 2), lengths


class Speech2TextEncoder(nn.Module):
    """Names as ``transformers``' ``model.encoder``: conv, layers, layer_norm."""

    def __init__(self, config: Speech2TextConfig, cfg: EncoderDecoderConfig) -> None:
        super().__init__()
        self.conv = Conv1dSubsampler(config, cfg.d_model)
        self.register_buffer("frequencies", tensor2tensor_frequencies(cfg.d_model), persistent=False)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.layer_norm = nn.LayerNorm(cfg.d_model)
        self.cfg = cfg
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0

    def positions(self, valid: Tensor) -> Tensor:
        """``transformers``' encoder positions: its padding mask (1 on padding) read as token ids
        against the pad id, so with pad id 1 real frames take rows ``pad + 1, pad + 2, ...``."""
        pad = self.cfg.pad_token_id
        counted = ((~valid).long() != pad).long()
        indices = torch.cumsum(counted, dim=1) * counted + pad
        rows = sinusoids_tensor2tensor(indices, self.frequencies, self.cfg.d_model)
        return rows * counted[..., None].to(rows.dtype)

    def forward(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        x, lengths = self.conv(src, src_len)
        positions = torch.arange(x.shape[1], device=x.device)[None, :]
        valid = positions < lengths[:, None]
        x = x * self.embed_scale + self.positions(valid)
        bias = padding_bias(x[..., 0], lengths)
        for layer in self.layers:
            x = layer(x, bias)
        return self.layer_norm(x), bias


class Speech2TextModel(EncoderDecoder):
    """``EncoderDecoder``'s decoder, step and training forward behind Speech2Text's audio encoder."""

    def __init__(self, config: Speech2TextConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        nn.Module.__init__(self)
        cfg = config.layers()
        self.cfg = cfg
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.encoder = Speech2TextEncoder(config, cfg)
        self.decoder = Stack(cfg, DecoderLayer, cfg.decoder_layers, True, tgt_vocab_size)
        self.lm_head = nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, tgt_vocab_size))
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.decoder.embed_tokens.weight

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        return self.encoder(src, src_len)
