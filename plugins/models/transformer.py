"""The Transformer of seeds 002/004 (d2l) and exercise 26.5 of seed 000.

Sinusoidal positions, embeddings scaled by sqrt(d), post-norm add & norm, multi-head scaled
dot-product attention. ``forward`` (training) is the textbook layout. ``encode`` and
``decode_step`` do the same arithmetic, laid out so the exported step is a short chain of
MatMuls with few shape ops and copies: at the bundled size those, not FLOPs, filled most of
the step (ONNX Runtime now runs 70 kernels per step there instead of 99).

* One tensor per layer for every cache and memory (``self_k0``, ``self_v0``, ``cross_k0``, ...):
  no slicing a layer out of a stack and re-stacking it, so after the generic beam reorder a step
  copies each cache once (the append), not three times. The price is two more graph inputs
  and outputs per layer for the runtime to bind, smaller than what it saves.
* The step's query length is 1 and its hidden state stays ``(B, 1, d)``: every head split or
  merge is a Reshape, and ONNX Runtime still fuses each residual add into its LayerNorm.
* Cross-attention keys are computed once, so the encoder stores them transposed,
  ``(B, heads, head_dim, S)``, and ``q @ k`` needs no Transpose.
* The self-attention key cache is kept ``(B, heads, T, head_dim)`` like the values, growing on
  axis 2: appending on the last axis of a transposed cache is a strided copy, measurably slower,
  while ONNX Runtime folds the ``k`` transpose and the 1/sqrt(head_dim) into one FusedMatMul.
* Weights are used as stored, never derived (q/k/v concatenated, scale folded into q): the
  exporter leaves such expressions as graph nodes, and int8 quantisation skips any MatMul
  whose weight is not an initializer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.contract import Seq2SeqModel, StepOutput
from s2s_deploy.modeling.parts import causal_tail, grouped_queries, layer_name, padding_bias, ungrouped
from s2s_deploy_plugins.transformer import TransformerConfig


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

    def attend(self, x_q: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        """Returns the output ``(B, Tq, d)`` and the weights ``(B, H, Tq, Tk)``."""
        q = self.split_heads(self.w_q(x_q))
        weights = torch.softmax(q @ keys.transpose(-1, -2) / math.sqrt(self.head_dim) + bias, dim=-1)
        out = self.dropout(weights) @ values
        batch, _, length, _ = out.shape
        return self.w_o(out.transpose(1, 2).reshape(batch, length, -1)), weights

    def cross_memory(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys ``(B, H, head_dim, S)``, stored transposed so the step's ``q @ k`` needs no
        Transpose, and values ``(B, H, S, head_dim)``; once per sentence."""
        batch, length, _ = x.shape
        keys = self.w_k(x).reshape(batch, length, self.num_heads, self.head_dim).permute(0, 2, 3, 1)
        return keys, self.split_heads(self.w_v(x))

    def step_self(self, x: Tensor, past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``attend`` (eval mode) for one query ``x`` ``(B, 1, d)`` against the caches
        ``(B, H, T, head_dim)`` plus itself: the output ``(B, 1, d)`` and both caches grown by one.
        With one query position every head split or merge is a Reshape."""
        keys = torch.cat([past_k, self.one_position_heads(self.w_k(x))], dim=2)
        values = torch.cat([past_v, self.one_position_heads(self.w_v(x))], dim=2)
        q = self.one_position_heads(self.w_q(x))
        weights = torch.softmax(q @ keys.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1)
        return self.merge_one_position(weights @ values), keys, values

    def step_cross(self, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        """``attend`` (eval mode) for one query ``x`` ``(B, 1, d)`` against ``cross_memory``:
        the output ``(B, 1, d)`` and the weights ``(B, H, 1, S)``; the memory may hold one row per
        sentence of rows grouped sentence-major (``memory_per_sentence``)."""
        q = grouped_queries(self.w_q(x), keys.shape[0], self.num_heads, self.head_dim)
        weights = torch.softmax(q @ keys / math.sqrt(self.head_dim) + bias, dim=-1)
        return self.merge_one_position(ungrouped(weights @ values)), ungrouped(weights)

    def steps_self(self, x: Tensor, past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``step_self`` for k queries ``(B, k, d)`` at once, each seeing the past and the new
        positions up to its own: the output ``(B, k, d)`` and both caches grown by k."""
        keys = torch.cat([past_k, self.split_heads(self.w_k(x))], dim=2)
        values = torch.cat([past_v, self.split_heads(self.w_v(x))], dim=2)
        q = self.split_heads(self.w_q(x))
        scores = q @ keys.transpose(-1, -2) / math.sqrt(self.head_dim)
        weights = torch.softmax(scores + causal_tail(x.shape[1], keys.shape[2], x.device), dim=-1)
        return self.merge(weights @ values), keys, values

    def steps_cross(self, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> Tensor:
        """``step_cross`` for k queries ``(B, k, d)`` per row (one memory row per row)."""
        q = self.split_heads(self.w_q(x))
        return self.merge(torch.softmax(q @ keys / math.sqrt(self.head_dim) + bias, dim=-1) @ values)

    def merge(self, out: Tensor) -> Tensor:
        """``(B, H, k, head_dim)`` → the output projection of ``(B, k, d)``."""
        batch, _, length, _ = out.shape
        return self.w_o(out.transpose(1, 2).reshape(batch, length, -1))

    def one_position_heads(self, x: Tensor) -> Tensor:
        """``(B, 1, d)`` → ``(B, H, 1, head_dim)``: with one position, ``split_heads`` is a Reshape."""
        return x.reshape(-1, self.num_heads, 1, self.head_dim)

    def merge_one_position(self, out: Tensor) -> Tensor:
        """``(B, H, 1, head_dim)`` → the output projection of ``(B, 1, d)``, again by a Reshape."""
        return self.w_o(out.reshape(-1, 1, self.num_heads * self.head_dim))


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
        self, x: Tensor, self_kv: tuple[Tensor, Tensor], self_bias: Tensor,
        cross_kv: tuple[Tensor, Tensor], cross_bias: Tensor,
    ) -> tuple[Tensor, Tensor]:
        y = self.addnorm1(x, self.self_attention.attend(x, *self_kv, self_bias)[0])
        z, weights = self.cross_attention.attend(y, *cross_kv, cross_bias)
        z = self.addnorm2(y, z)
        return self.addnorm3(z, self.ffn(z)), weights

    def step(
        self, x: Tensor, past_k: Tensor, past_v: Tensor, cross_k: Tensor, cross_v: Tensor, cross_bias: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``forward`` for one position ``(B, 1, d)``: the output, the grown self-attention caches,
        and the cross-attention weights ``(B, H, 1, S)``."""
        attended, keys, values = self.self_attention.step_self(x, past_k, past_v)
        y = self.addnorm1(x, attended)
        z, weights = self.cross_attention.step_cross(y, cross_k, cross_v, cross_bias)
        z = self.addnorm2(y, z)
        return self.addnorm3(z, self.ffn(z)), keys, values, weights

    def steps(
        self, x: Tensor, past_k: Tensor, past_v: Tensor, cross_k: Tensor, cross_v: Tensor, cross_bias: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``step`` for k positions ``(B, k, d)``: the output and the caches grown by k."""
        attended, keys, values = self.self_attention.steps_self(x, past_k, past_v)
        y = self.addnorm1(x, attended)
        z = self.addnorm2(y, self.cross_attention.steps_cross(y, cross_k, cross_v, cross_bias))
        return self.addnorm3(z, self.ffn(z)), keys, values


class Transformer(Seq2SeqModel):
    memory_per_sentence = True
    multi_step = True

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

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        bias = padding_bias(src, src_len)
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
        memory = {"src_bias": bias}
        for i, block in enumerate(self.decoder_blocks):
            memory[layer_name("cross_k", i)], memory[layer_name("cross_v", i)] = block.cross_attention.cross_memory(enc)
        return memory

    def decode_step(
        self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor], state: dict[str, Tensor]
    ) -> StepOutput:
        # The 0-d step picks its position row with one Gather (no Reshape); tokens[:, None] keeps x (B, 1, d).
        x = self.tgt_embedding(tokens[:, None]) * self.scale + nn.functional.embedding(step, self.positions)
        new_state, attention = {}, []
        for i, block in enumerate(self.decoder_blocks):
            k, v = layer_name("self_k", i), layer_name("self_v", i)
            x, new_state[k], new_state[v], weights = block.step(
                x, state[k], state[v], memory[layer_name("cross_k", i)], memory[layer_name("cross_v", i)],
                memory["src_bias"],
            )
            attention.append(weights)
        log_probs = torch.log_softmax(self.output(x[:, 0]), dim=-1)
        return StepOutput(log_probs, new_state, torch.cat(attention, dim=2).transpose(1, 2))

    def decode_steps(
        self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor], state: dict[str, Tensor]
    ) -> StepOutput:
        positions = nn.functional.embedding(step + torch.arange(tokens.shape[1], device=tokens.device), self.positions)
        x = self.tgt_embedding(tokens) * self.scale + positions
        new_state = {}
        for i, block in enumerate(self.decoder_blocks):
            k, v = layer_name("self_k", i), layer_name("self_v", i)
            x, new_state[k], new_state[v] = block.steps(
                x, state[k], state[v], memory[layer_name("cross_k", i)], memory[layer_name("cross_v", i)],
                memory["src_bias"],
            )
        return StepOutput(torch.log_softmax(self.output(x), dim=-1), new_state)
