"""T5 (Hugging Face ``T5ForConditionalGeneration``), written from ``transformers``' arithmetic
without importing it.

No position embeddings: the first layer of each stack holds a relative position bias
``(buckets, heads)``, shared by every layer of its stack (``relative_bias_every_layer``: one per
layer, as UMT5), added to the unscaled ``q @ k`` scores. The encoder's is bidirectional, the
decoder's causal. Pre-norm layers with T5's RMS LayerNorm (no mean, no bias), a final norm after
each stack, ReLU or gated-GELU feed-forward, and the output rescaled by ``d_model**-0.5`` before
the tied projection (``scale_decoder_outputs``).

The attention, the RMS norm, the relative buckets (an integer table computed once, so graphs
only index it) and the specs are ``s2s_deploy.modeling.parts``'; as there, the encoder computes
every decoder layer's cross-attention K/V and the step decoder carries one K/V cache per layer.

Module names follow ``transformers`` (``encoder.block.0.layer.0.SelfAttention.q``, ...), so a
Hugging Face state dict maps across by name.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.contract import Seq2SeqModel, StepOutput
from s2s_deploy.modeling.parts import (
    Attention,
    RelativeBias,
    RMSNorm,
    causal_bias,
    layer_name,
    padding_bias,
    tanh_gelu,
)
from s2s_deploy_plugins.t5 import T5Config

T5_PROJECTIONS = ("q", "k", "v", "o")


class T5Attention(Attention):
    """T5Attention without its bias logic: no projection biases, no score scaling; the layers
    that own a relative position table keep it here as ``relative_attention_bias``."""

    def __init__(self, cfg: T5Config, relative_bias: bool) -> None:
        super().__init__(cfg.d_model, cfg.num_heads, cfg.d_kv, bias=False, scaled=False, names=T5_PROJECTIONS)
        if relative_bias:
            self.relative_attention_bias = nn.Embedding(cfg.relative_attention_num_buckets, cfg.num_heads)


class DenseReluDense(nn.Module):
    """T5DenseActDense (``wi``, ReLU) or T5DenseGatedActDense (``wi_0``, ``wi_1``, GELU-tanh)."""

    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.gated = cfg.feed_forward_proj.startswith("gated-")
        if self.gated:
            self.wi_0 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
            self.wi_1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        else:
            self.wi = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.wo = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        act = cfg.feed_forward_proj.split("-")[-1]
        self.act = {"relu": torch.relu, "gelu": tanh_gelu, "gelu_new": tanh_gelu, "silu": nn.functional.silu}[act]

    def forward(self, x: Tensor) -> Tensor:
        if self.gated:
            return self.wo(self.act(self.wi_0(x)) * self.wi_1(x))
        return self.wo(self.act(self.wi(x)))


class SelfAttentionLayer(nn.Module):
    def __init__(self, cfg: T5Config, relative_bias: bool) -> None:
        super().__init__()
        self.SelfAttention = T5Attention(cfg, relative_bias)
        self.layer_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)


class CrossAttentionLayer(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.EncDecAttention = T5Attention(cfg, relative_bias=False)
        self.layer_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)


class FFLayer(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.DenseReluDense = DenseReluDense(cfg)
        self.layer_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.DenseReluDense(self.layer_norm(x))


class Block(nn.Module):
    def __init__(self, cfg: T5Config, decoder: bool, relative_bias: bool) -> None:
        super().__init__()
        parts: list[nn.Module] = [SelfAttentionLayer(cfg, relative_bias)]
        if decoder:
            parts.append(CrossAttentionLayer(cfg))
        parts.append(FFLayer(cfg))
        self.layer = nn.ModuleList(parts)

    def forward(self, x: Tensor, self_bias: Tensor, memory: Tensor | None = None,
                cross_bias: Tensor | None = None) -> Tensor:
        attention = self.layer[0]
        h = attention.layer_norm(x)
        x = x + attention.SelfAttention(h, h, self_bias)
        if memory is not None:
            cross = self.layer[1]
            x = x + cross.EncDecAttention(cross.layer_norm(x), memory, cross_bias)
        return self.layer[-1](x)

    def step(self, x: Tensor, past_k: Tensor, past_v: Tensor, self_bias: Tensor, cross_k: Tensor, cross_v: Tensor,
             cross_bias: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        attention, cross = self.layer[0], self.layer[1]
        out, keys, values = attention.SelfAttention.step_self(attention.layer_norm(x), past_k, past_v, self_bias)
        x = x + out
        out, weights = cross.EncDecAttention.step_cross(cross.layer_norm(x), cross_k, cross_v, cross_bias)
        return self.layer[2](x + out), keys, values, weights


class Stack(nn.Module):
    """The blocks, the final norm, and the relative positions' buckets (``parts.RelativeBias``):
    the first block's table serves every block (T5), or each block has its own (UMT5)."""

    def __init__(self, cfg: T5Config, decoder: bool, count: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(Block(cfg, decoder, relative_bias=i == 0 or cfg.relative_bias_every_layer)
                                   for i in range(count))
        self.final_layer_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.relative = RelativeBias(not decoder, cfg.relative_attention_num_buckets,
                                     cfg.relative_attention_max_distance)
        self.every_layer = cfg.relative_bias_every_layer

    def tables(self) -> list[nn.Embedding]:
        """Each block's relative position table (the same one for every block unless each has its own)."""
        first = self.block[0].layer[0].SelfAttention.relative_attention_bias
        if not self.every_layer:
            return [first] * len(self.block)
        return [block.layer[0].SelfAttention.relative_attention_bias for block in self.block]

    def biases(self, make: Any) -> list[Tensor]:
        """``make(table)`` once per distinct table, one result per block."""
        tables = self.tables()
        if not self.every_layer:
            shared = make(tables[0])
            return [shared] * len(tables)
        return [make(table) for table in tables]


class T5(Seq2SeqModel):
    memory_per_sentence = True

    def __init__(self, cfg: T5Config, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        if src_vocab_size != tgt_vocab_size:
            raise ValueError("T5 shares one embedding: source and target vocabularies must match")
        self.cfg = cfg
        self.shared = nn.Embedding(tgt_vocab_size, cfg.d_model)
        self.encoder = Stack(cfg, decoder=False, count=cfg.num_layers)
        self.decoder = Stack(cfg, decoder=True, count=cfg.num_decoder_layers)
        self.lm_head = nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)
        self.output_scale = cfg.d_model**-0.5 if cfg.scale_decoder_outputs else 1.0
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.shared.weight

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        stack, pad = self.encoder, padding_bias(src, src_len)
        biases = stack.biases(lambda table: stack.relative.square(table, src.shape[1], src.device) + pad)
        x = self.shared(src)
        for block, bias in zip(stack.block, biases, strict=True):
            x = block(x, bias)
        return stack.final_layer_norm(x), pad

    def logits(self, x: Tensor) -> Tensor:
        return self.lm_head(self.decoder.final_layer_norm(x) * self.output_scale)

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        memory, pad = self.run_encoder(src, src_len)
        stack, length = self.decoder, tgt_in.shape[1]
        causal = causal_bias(length, src.device)
        biases = stack.biases(lambda table: stack.relative.square(table, length, src.device) + causal)
        x = self.shared(tgt_in)
        for block, bias in zip(stack.block, biases, strict=True):
            x = block(x, bias, memory, pad)
        return self.logits(x)

    def encode(self, src: Tensor, src_len: Tensor) -> dict[str, Tensor]:
        memory, pad = self.run_encoder(src, src_len)
        out = {"src_bias": pad}
        for i, block in enumerate(self.decoder.block):
            out[layer_name("cross_k", i)], out[layer_name("cross_v", i)] = block.layer[1].EncDecAttention.cross_memory(
                memory)
        return out

    def decode_step(self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor],
                    state: dict[str, Tensor]) -> StepOutput:
        stack = self.decoder
        keys_length = state[layer_name("self_k", 0)].shape[2] + 1
        biases = stack.biases(lambda table: stack.relative.step(table, step, keys_length, tokens.device))
        x = self.shared(tokens[:, None])
        new_state, attention = {}, []
        for i, (block, bias) in enumerate(zip(stack.block, biases, strict=True)):
            k, v = layer_name("self_k", i), layer_name("self_v", i)
            x, new_state[k], new_state[v], weights = block.step(
                x, state[k], state[v], bias, memory[layer_name("cross_k", i)], memory[layer_name("cross_v", i)],
                memory["src_bias"])
            attention.append(weights)
        log_probs = torch.log_softmax(self.logits(x[:, 0]), dim=-1)
        return StepOutput(log_probs, new_state, torch.cat(attention, dim=2).transpose(1, 2))
