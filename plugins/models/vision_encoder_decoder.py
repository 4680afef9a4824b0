"""The vision encoder-decoder's torch modules (the declaration, config and weight names are
``plugins/vision_encoder_decoder.py``): a ViT/DeiT image encoder in front of the shared post-norm
decoder of ``s2s_deploy.modeling.parts``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.parts import (
    Attention,
    DecoderLayer,
    EncoderDecoder,
    Stack,
    activation,
    residual,
)
from s2s_deploy_plugins.vision_encoder_decoder import CHANNELS, VisionEncoderDecoderConfig

VIT_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


class PatchEmbeddings(nn.Module):
    """``transformers``' ``patch_embeddings``: one convolution, a patch per stride."""

    def __init__(self, config: VisionEncoderDecoderConfig) -> None:
        super().__init__()
        self.projection = nn.Conv2d(CHANNELS, config.encoder_hidden_size, config.patch_size, config.patch_size)


class Embeddings(nn.Module):
    """The class token (and DeiT's distillation token) before the patches, plus the stored positions."""

    def __init__(self, config: VisionEncoderDecoderConfig) -> None:
        super().__init__()
        width = config.encoder_hidden_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        if config.distillation_token:
            self.distillation_token = nn.Parameter(torch.zeros(1, 1, width))
        self.patch_embeddings = PatchEmbeddings(config)
        self.position_embeddings = nn.Parameter(torch.zeros(1, config.positions, width))
        self.distilled = config.distillation_token

    def forward(self, pixels: Tensor) -> Tensor:
        patches = self.patch_embeddings.projection(pixels).flatten(2).transpose(1, 2)
        batch = patches.shape[0]
        tokens = [self.cls_token.expand(batch, -1, -1)]
        if self.distilled:
            tokens.append(self.distillation_token.expand(batch, -1, -1))
        return torch.cat([*tokens, patches], dim=1) + self.position_embeddings


class Mlp(nn.Module):
    def __init__(self, config: VisionEncoderDecoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.encoder_hidden_size, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, config.encoder_hidden_size)
        self.act = activation(config.encoder_activation)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VitLayer(nn.Module):
    """A pre-norm layer, names as ``transformers`` 5: ``attention.{q,k,v,o}_proj``, ``layernorm_before``,
    ``layernorm_after``, ``mlp.fc1``, ``mlp.fc2``."""

    def __init__(self, config: VisionEncoderDecoderConfig) -> None:
        super().__init__()
        width = config.encoder_hidden_size
        self.attention = Attention(width, config.encoder_attention_heads, names=VIT_PROJECTIONS)
        if not config.qkv_bias:  # the output projection keeps its bias
            for name in VIT_PROJECTIONS[:3]:
                setattr(self.attention, name, nn.Linear(width, width, bias=False))
        self.layernorm_before = nn.LayerNorm(width, eps=config.encoder_layer_norm_eps)
        self.layernorm_after = nn.LayerNorm(width, eps=config.encoder_layer_norm_eps)
        self.mlp = Mlp(config)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        x = residual(True, x, self.layernorm_before, lambda h: self.attention(h, h, bias))
        return residual(True, x, self.layernorm_after, self.mlp)


class VitEncoder(nn.Module):
    """Names as ``transformers``' ``encoder`` (a ``ViTModel`` or ``DeiTModel``; its pooler is never read)."""

    def __init__(self, config: VisionEncoderDecoderConfig) -> None:
        super().__init__()
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(VitLayer(config) for _ in range(config.encoder_layers))
        self.layernorm = nn.LayerNorm(config.encoder_hidden_size, eps=config.encoder_layer_norm_eps)

    def forward(self, pixels: Tensor) -> tuple[Tensor, Tensor]:
        """The last hidden state and the source bias: zeros, as every position is real."""
        x = self.embeddings(pixels)
        bias = torch.zeros_like(x[:, None, None, :, 0])
        for layer in self.layers:
            x = layer(x, bias)
        return self.layernorm(x), bias


class VisionEncoderDecoderModel(EncoderDecoder):
    """``EncoderDecoder``'s decoder, step and training forward behind the image encoder."""

    def __init__(self, config: VisionEncoderDecoderConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        nn.Module.__init__(self)
        cfg = config.layers()
        self.cfg, self.vision = cfg, config
        self.embed_scale = cfg.d_model**0.5 if cfg.scale_embedding else 1.0
        self.encoder = VitEncoder(config)
        if config.projects:
            self.enc_to_dec_proj = nn.Linear(config.encoder_hidden_size, cfg.d_model)
        self.decoder = Stack(cfg, DecoderLayer, cfg.decoder_layers, True, tgt_vocab_size)
        if config.cross_attention_from_encoder:  # keys and values read the encoder's width
            for layer in self.decoder.layers:
                layer.encoder_attn.k_proj = nn.Linear(config.encoder_hidden_size, cfg.d_model)
                layer.encoder_attn.v_proj = nn.Linear(config.encoder_hidden_size, cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, tgt_vocab_size))
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.decoder.embed_tokens.weight

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        """Every image is whole (``src_len`` is 1 per row and not read)."""
        memory, bias = self.encoder(src)
        return (self.enc_to_dec_proj(memory) if self.vision.projects else memory), bias
