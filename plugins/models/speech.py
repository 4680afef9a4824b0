"""A small Whisper-style speech model: log-mel features in, text out (the bundled English speech →
French text demo, trained by ``s2s-deploy train --arch speech --task speech:DIR``).

The encoder reads ``(batch, n_mels, frames)`` Whisper log-mel features (the manifest names the
front end, ``WhisperLogMel`` with this config's window), downsamples them with two strided
convolutions (GELU after each), adds sinusoidal positions and runs pre-norm Transformer layers.
The decoder is ``s2s_deploy.modeling.parts``' pre-norm Transformer with learned positions, a
self-attention KV cache per layer and cross-attention keys and values that the encoder computes
once. Frames past a clip's length are zeroed before and between the convolutions, so a clip
decodes alike alone or padded in a batch.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.parts import (
    DecoderLayer,
    EncoderDecoder,
    EncoderLayer,
    Stack,
    erf_gelu,
    sinusoids_split,
    split_denominators,
)
from s2s_deploy_plugins.speech import SpeechConfig

MASK = torch.finfo(torch.float32).min


def _after_conv(lengths: Tensor, stride: int) -> Tensor:
    """Positions a kernel-3, padding-1 convolution of ``stride`` keeps from ``lengths`` frames."""
    return torch.div(lengths - 1, stride, rounding_mode="floor") + 1


def _masked(x: Tensor, masks: int, width: int, axis: int) -> Tensor:
    """``x`` ``(B, mels, frames)`` with ``masks`` random bands along ``axis`` (1: mels, 2: frames) set to 0."""
    size = x.shape[axis]
    positions = torch.arange(size, device=x.device)[None, :]
    for _ in range(masks):
        widths = torch.randint(0, width + 1, (x.shape[0], 1), device=x.device)
        starts = (torch.rand(x.shape[0], 1, device=x.device) * (size - widths).clamp(min=1)).long()
        band = (positions >= starts) & (positions < starts + widths)
        x = x.masked_fill(band[:, :, None] if axis == 1 else band[:, None, :], 0.0)
    return x


def _warped(x: Tensor, warp: float) -> Tensor:
    """``x`` ``(B, mels, frames)`` with each row's mel axis read at ``bin × factor`` (linear
    interpolation, clamped at the top bin), one factor per row drawn from ``[1 - warp, 1 + warp]``."""
    factors = 1.0 + (torch.rand(x.shape[0], 1, device=x.device) * 2 - 1) * warp
    positions = (torch.arange(x.shape[1], device=x.device)[None, :] * factors).clamp(max=x.shape[1] - 1)
    below = positions.floor().long()
    above = (below + 1).clamp(max=x.shape[1] - 1)
    weight = (positions - below)[:, :, None].to(x.dtype)
    frames = x.shape[2]
    low = x.gather(1, below[:, :, None].expand(-1, -1, frames))
    high = x.gather(1, above[:, :, None].expand(-1, -1, frames))
    return low + (high - low) * weight


def _zero_past(x: Tensor, lengths: Tensor) -> Tensor:
    """``x`` ``(B, C, T)`` with the frames at or past each row's length set to zero."""
    valid = torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None]
    return x * valid[:, None, :].to(x.dtype)


class SpeechModel(EncoderDecoder):
    """``EncoderDecoder``'s decoder, step and training forward, with an audio encoder in front.
    ``src_vocab_size`` is the contract's and unused: the source is features, not tokens."""

    def __init__(self, config: SpeechConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        nn.Module.__init__(self)
        cfg = config.layers()
        self.cfg, self.speech, self.embed_scale = cfg, config, 1.0
        self.conv1 = nn.Conv1d(config.n_mels, cfg.d_model, 3, stride=config.conv1_stride, padding=1)
        self.conv2 = nn.Conv1d(cfg.d_model, cfg.d_model, 3, stride=config.conv2_stride, padding=1)
        self.register_buffer("denominators", split_denominators(cfg.d_model), persistent=False)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.encoder_norm = nn.LayerNorm(cfg.d_model)
        self.decoder = Stack(cfg, DecoderLayer, cfg.decoder_layers, True, tgt_vocab_size)
        self.lm_head = nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, tgt_vocab_size))
        self.lm_head.weight = self.decoder.embed_tokens.weight
        self.dropout = nn.Dropout(config.dropout)
        for module in self.modules():  # Whisper's initialisation: N(0, 0.02), zero biases
            if isinstance(module, nn.Linear | nn.Conv1d | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        config = self.speech
        if self.training:  # VTLP and SpecAugment; the exported graphs are traced in eval mode and never hold them
            if config.warp:
                src = _warped(src, config.warp)
            src = _masked(_masked(src, config.freq_masks, config.freq_mask_width, 1),
                          config.time_masks, config.time_mask_width, 2)
        x = erf_gelu(self.conv1(_zero_past(src, src_len)))
        lengths = _after_conv(src_len, config.conv1_stride)
        x = erf_gelu(self.conv2(_zero_past(x, lengths)))
        lengths = _after_conv(lengths, config.conv2_stride)
        x = x.transpose(1, 2)
        positions = torch.arange(x.shape[1], device=x.device)[None, :]
        x = self.dropout(x + sinusoids_split(positions, self.denominators, self.cfg.d_model))
        valid = positions < lengths[:, None]
        bias = torch.zeros(valid.shape, dtype=torch.float32, device=x.device).masked_fill(~valid, MASK)
        bias = bias[:, None, None, :]
        for layer in self.encoder_layers:
            x = self.dropout(layer(x, bias))
        return self.encoder_norm(x), bias
