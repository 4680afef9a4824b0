"""The Transformer of seeds 002/004 (d2l) and exercise 26.5 of seed 000.

Sinusoidal positions, embeddings scaled by sqrt(d), post-norm add & norm, multi-head scaled
dot-product attention. For deployment the encoder also emits every decoder layer's
cross-attention K/V, so the step graph never recomputes them, and the step carries one
stacked self-attention cache per K and V (fewer graph outputs, less per-call overhead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from s2s_deploy.contract import BATCH, ArchitecturePlugin, MemorySpec, Seq2SeqModel, StateSpec, StepOutput


@dataclass(frozen=True)
class TransformerConfig:
    d_model: int = 128
    num_heads: int = 4
    ffn_hidden: int = 512
    encoder_layers: int = 2
    decoder_layers: int = 2
    dropout: float = 0.1
    max_len: int = 256
    tie_output: bool = True


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    position = torch.arange(max_len, dtype=torch.float32)[:, None]
    freq = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position / freq)
    table[:, 1::2] = torch.cos(position / freq)
    return table


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.w_o = nn.Linear(d_model, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.reshape(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.split_heads(self.w_k(x)), self.split_heads(self.w_v(x))

    def attend(self, x_q: Tensor, keys: Tensor, values: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
        """Returns the output ``(B, Tq, d)`` and the weights ``(B, H, Tq, Tk)``."""
        q = self.split_heads(self.w_q(x_q))
        scores = q @ keys.transpose(-1, -2) / math.sqrt(self.head_dim)
        if bias is not None:
            scores = scores + bias
        weights = torch.softmax(scores, dim=-1)
        out = self.dropout(weights) @ values
        batch, _, length, _ = out.shape
        return self.w_o(out.transpose(1, 2).reshape(batch, length, -1)), weights


class AddNorm(nn.Module):
    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.norm(x + self.dropout(y))


class PositionWiseFFN(nn.Module):
    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.dense1 = nn.Linear(d_model, hidden)
        self.dense2 = nn.Linear(hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.dense2(torch.relu(self.dense1(x)))


class EncoderBlock(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.attention = MultiHeadAttention(cfg.d_model, cfg.num_heads, cfg.dropout)
        self.addnorm1 = AddNorm(cfg.d_model, cfg.dropout)
        self.ffn = PositionWiseFFN(cfg.d_model, cfg.ffn_hidden)
        self.addnorm2 = AddNorm(cfg.d_model, cfg.dropout)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        keys, values = self.attention.keys_values(x)
        y = self.addnorm1(x, self.attention.attend(x, keys, values, bias)[0])
        return self.addnorm2(y, self.ffn(y))


class DecoderBlock(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(cfg.d_model, cfg.num_heads, cfg.dropout)
        self.addnorm1 = AddNorm(cfg.d_model, cfg.dropout)
        self.cross_attention = MultiHeadAttention(cfg.d_model, cfg.num_heads, cfg.dropout)
        self.addnorm2 = AddNorm(cfg.d_model, cfg.dropout)
        self.ffn = PositionWiseFFN(cfg.d_model, cfg.ffn_hidden)
        self.addnorm3 = AddNorm(cfg.d_model, cfg.dropout)

    def forward(
        self, x: Tensor, self_kv: tuple[Tensor, Tensor], self_bias: Tensor | None,
        cross_kv: tuple[Tensor, Tensor], cross_bias: Tensor,
    ) -> tuple[Tensor, Tensor]:
        y = self.addnorm1(x, self.self_attention.attend(x, *self_kv, self_bias)[0])
        z, weights = self.cross_attention.attend(y, *cross_kv, cross_bias)
        z = self.addnorm2(y, z)
        return self.addnorm3(z, self.ffn(z)), weights


class Transformer(Seq2SeqModel):
    def __init__(self, cfg: TransformerConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.scale = math.sqrt(cfg.d_model)
        self.src_embedding = nn.Embedding(src_vocab_size, cfg.d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, cfg.d_model)
        self.register_buffer("positions", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder_blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.decoder_layers))
        self.output = nn.Linear(cfg.d_model, tgt_vocab_size)
        nn.init.normal_(self.src_embedding.weight, std=cfg.d_model**-0.5)
        nn.init.normal_(self.tgt_embedding.weight, std=cfg.d_model**-0.5)
        if cfg.tie_output:
            self.output.weight = self.tgt_embedding.weight

    @staticmethod
    def padding_bias(src: Tensor, src_len: Tensor) -> Tensor:
        """``(B, 1, 1, S)``: 0 on real tokens, the float minimum on padding."""
        valid = torch.arange(src.shape[1], device=src.device)[None, :] < src_len[:, None]
        bias = torch.zeros(valid.shape, dtype=torch.float32, device=src.device)
        return bias.masked_fill(~valid, torch.finfo(torch.float32).min)[:, None, None, :]

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        bias = self.padding_bias(src, src_len)
        x = self.dropout(self.src_embedding(src) * self.scale + self.positions[: src.shape[1]])
        for block in self.encoder_blocks:
            x = block(x, bias)
        return x, bias

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        enc, cross_bias = self.run_encoder(src, src_len)
        length = tgt_in.shape[1]
        causal = torch.full((length, length), torch.finfo(torch.float32).min, device=src.device).triu(1)
        x = self.dropout(self.tgt_embedding(tgt_in) * self.scale + self.positions[:length])
        for block in self.decoder_blocks:
            self_kv = block.self_attention.keys_values(x)
            x, _ = block(x, self_kv, causal, block.cross_attention.keys_values(enc), cross_bias)
        return self.output(x)

    def encode(self, src: Tensor, src_len: Tensor) -> dict[str, Tensor]:
        enc, bias = self.run_encoder(src, src_len)
        cross = [block.cross_attention.keys_values(enc) for block in self.decoder_blocks]
        return {
            "src_bias": bias,
            "cross_k": torch.stack([k for k, _ in cross]),
            "cross_v": torch.stack([v for _, v in cross]),
        }

    def decode_step(
        self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor], state: dict[str, Tensor]
    ) -> StepOutput:
        position = self.positions.index_select(0, step.reshape(1))
        x = self.tgt_embedding(tokens)[:, None, :] * self.scale + position
        keys, values, attention = [], [], []
        for i, block in enumerate(self.decoder_blocks):
            new_k, new_v = block.self_attention.keys_values(x)
            k = torch.cat([state["self_k"][i], new_k], dim=2)
            v = torch.cat([state["self_v"][i], new_v], dim=2)
            cross_kv = (memory["cross_k"][i], memory["cross_v"][i])
            x, weights = block(x, (k, v), None, cross_kv, memory["src_bias"])
            keys.append(k)
            values.append(v)
            attention.append(weights[:, :, 0, :])
        log_probs = torch.log_softmax(self.output(x[:, 0, :]), dim=-1)
        new_state = {"self_k": torch.stack(keys), "self_v": torch.stack(values)}
        return StepOutput(log_probs, new_state, torch.stack(attention, dim=1))


class TransformerPlugin(ArchitecturePlugin):
    name = "transformer"
    version = "1.0"
    description = "Transformer (post-norm, sinusoidal positions), cross-attention K/V from the encoder"
    config_type = TransformerConfig
    presets: ClassVar[dict[str, TransformerConfig]] = {
        "small": TransformerConfig(),
        "base": TransformerConfig(
            d_model=512, num_heads=8, ffn_hidden=2048, encoder_layers=6, decoder_layers=6, max_len=512
        ),
    }
    default_preset = "small"
    exporter = "dynamo"
    parity_atol = 1e-4
    has_attention = True

    def build(self, config: TransformerConfig, src_vocab_size: int, tgt_vocab_size: int) -> Transformer:
        return Transformer(config, src_vocab_size, tgt_vocab_size)

    def memory_specs(self, config: TransformerConfig) -> tuple[MemorySpec, ...]:
        return (
            MemorySpec("src_bias", 0, description="(B, 1, 1, S) additive source padding mask"),
            MemorySpec("cross_k", 1, description="(layers, B, heads, S, head_dim) cross-attention keys"),
            MemorySpec("cross_v", 1, description="(layers, B, heads, S, head_dim) cross-attention values"),
        )

    def state_specs(self, config: TransformerConfig) -> tuple[StateSpec, ...]:
        shape = (config.decoder_layers, BATCH, config.num_heads, 0, config.d_model // config.num_heads)
        return tuple(
            StateSpec(name, batch_axis=1, init="zeros", shape=shape, grow_axis=3,
                      description="(layers, B, heads, T, head_dim) self-attention cache")
            for name in ("self_k", "self_v")
        )

    def max_target_length(self, config: TransformerConfig) -> int:
        return config.max_len

    def max_source_length(self, config: TransformerConfig) -> int:
        return config.max_len


PLUGIN = TransformerPlugin()
