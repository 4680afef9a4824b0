"""ProphetNet's torch modules (the declaration and its docstring of the arithmetic are
``plugins/prophetnet.py``): a post-norm encoder with learned positions, and a decoder that runs
its main stream and first predicting stream side by side, as ``generate``'s cached steps do.

The decoder's two streams travel as one ``(B, 2L, d)`` tensor, main positions first: every
layer but the self-attention treats each row alone, and the self-attention is one softmax over
``[main keys, predicting keys]`` with a mask (a main query sees the main keys up to its own; a
predicting query those and its own key). Module names follow ``transformers`` minus
``prophetnet.`` (``decoder.layers.0.self_attn.relative_pos_embeddings``, ...).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.contract import Seq2SeqModel, StepOutput, layer_name
from s2s_deploy.modeling.parts import Attention, activation, padding_bias, residual
from s2s_deploy_plugins.prophetnet import ProphetNetConfig

PROPHETNET_PROJECTIONS = ("query_proj", "key_proj", "value_proj", "out_proj")
MASKED = torch.finfo(torch.float32).min


def prophetnet_bucket(distance: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """``compute_relative_buckets`` (unidirectional) of a distance ``query - key >= 0``, in
    ``transformers``' order of float operations, so the integer table is theirs exactly."""
    max_exact = num_buckets // 2
    is_small = torch.lt(distance, max_exact)
    if_large = max_exact + torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact) * (
        num_buckets - max_exact)
    if_large = torch.min(if_large, torch.ones_like(if_large) * (num_buckets - 1)).int()
    return torch.where(is_small, distance.int(), if_large).long()


class ProphetNetAttention(Attention):
    """ProphetNetAttention: projections with biases, the query divided by ``sqrt(head_dim)``
    before the product (as ``transformers`` does, not the scores after it)."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__(d_model, heads, scaled=False, names=PROPHETNET_PROJECTIONS)

    def project(self, which: int, x: Tensor) -> Tensor:
        out = super().project(which, x)
        return out / (self.head_dim**0.5) if which == 0 else out

    def cross(self, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        """Queries ``(B, L, d)`` against ``cross_memory``: the output and the weights ``(B, H, L, S)``."""
        weights = torch.softmax(self.scores(self.split(self.project(0, x)), keys) + bias, dim=-1)
        return self.merge(weights @ values), weights


class NgramSelfAttention(ProphetNetAttention):
    """ProphetNetNgramSelfAttention for the main and the first predicting stream. The relative
    bias of a query is its own hidden state projected to ``(buckets, heads)``, read at each key's
    bucket; the buckets are an integer table over distances ``0..relative_max_distance`` (every
    farther distance is the last bucket)."""

    def __init__(self, cfg: ProphetNetConfig) -> None:
        super().__init__(cfg.d_model, cfg.decoder_attention_heads)
        self.relative_pos_embeddings = nn.Linear(cfg.d_model, cfg.num_buckets * self.heads)
        self.num_buckets, self.max_distance = cfg.num_buckets, cfg.relative_max_distance
        self.register_buffer("buckets", prophetnet_bucket(torch.arange(cfg.relative_max_distance + 1),
                                                          cfg.num_buckets, cfg.relative_max_distance),
                             persistent=False)

    def forward(self, x: Tensor, past_k: Tensor, past_v: Tensor, distance: Tensor,
                mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x`` ``(B, Q, d)``: queries and new keys (main rows, then predicting rows);
        ``distance``/``mask`` ``(Q, T + Q)``: each query's distance to each key (past keys first)
        and the additive mask. The output and every key and value, past ones included."""
        batch, queries, _ = x.shape
        keys = torch.cat([past_k, self.split(self.project(1, x))], dim=2)
        values = torch.cat([past_v, self.split(self.project(2, x))], dim=2)
        rows = self.relative_pos_embeddings(x).reshape(batch, queries, self.num_buckets, self.heads)
        index = self.buckets[distance.clamp(0, self.max_distance)]
        bias = torch.gather(rows, 2, index[None, :, :, None].expand(batch, -1, -1, self.heads)).permute(0, 3, 1, 2)
        scores = self.scores(self.split(self.project(0, x)), keys.transpose(-1, -2)) + bias + mask
        return self.merge(torch.softmax(scores, dim=-1) @ values), keys, values


class FeedForward(nn.Module):
    def __init__(self, cfg: ProphetNetConfig, ffn_dim: int) -> None:
        super().__init__()
        self.intermediate = nn.Linear(cfg.d_model, ffn_dim)
        self.output = nn.Linear(ffn_dim, cfg.d_model)
        self.act = activation(cfg.activation_function)

    def forward(self, x: Tensor) -> Tensor:
        return self.output(self.act(self.intermediate(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ProphetNetConfig) -> None:
        super().__init__()
        self.self_attn = ProphetNetAttention(cfg.d_model, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.feed_forward = FeedForward(cfg, cfg.encoder_ffn_dim)
        self.feed_forward_layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        x = residual(False, x, self.self_attn_layer_norm, lambda h: self.self_attn(h, h, bias))
        return residual(False, x, self.feed_forward_layer_norm, self.feed_forward)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ProphetNetConfig) -> None:
        super().__init__()
        self.self_attn = NgramSelfAttention(cfg)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.cross_attn = ProphetNetAttention(cfg.d_model, cfg.decoder_attention_heads)
        self.cross_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.feed_forward = FeedForward(cfg, cfg.decoder_ffn_dim)
        self.feed_forward_layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: Tensor, past_k: Tensor, past_v: Tensor, distance: Tensor, mask: Tensor,
                cross_k: Tensor, cross_v: Tensor, src_bias: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        x, keys, values = residual(False, x, self.self_attn_layer_norm,
                                   lambda h: self.self_attn(h, past_k, past_v, distance, mask))
        x, weights = residual(False, x, self.cross_attn_layer_norm,
                              lambda h: self.cross_attn.cross(h, cross_k, cross_v, src_bias))
        return residual(False, x, self.feed_forward_layer_norm, self.feed_forward), keys, values, weights


class Encoder(nn.Module):
    def __init__(self, cfg: ProphetNetConfig) -> None:
        super().__init__()
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.d_model)
        self.embeddings_layer_norm = nn.LayerNorm(cfg.d_model)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))


class Decoder(nn.Module):
    def __init__(self, cfg: ProphetNetConfig) -> None:
        super().__init__()
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.d_model)
        self.ngram_embeddings = nn.Embedding(cfg.ngram, cfg.d_model)
        self.embeddings_layer_norm = nn.LayerNorm(cfg.d_model)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))


def stream_layout(queries: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
    """Distances and mask ``(2Q, K + Q)`` for main queries at positions ``queries`` (``Q``) over
    main keys at positions ``keys`` (``K``, the queries' among them) then one predicting key per
    query: a main query sees the main keys up to its own at distance ``query - key``; a predicting
    query the same keys at ``query + 1 - key``, and its own key at 0."""
    distance = queries[:, None] - keys[None, :]
    causal = torch.where(distance >= 0, 0.0, MASKED)
    own = torch.where(queries[:, None] == queries[None, :], 0.0, MASKED)
    main = torch.cat([causal, torch.full_like(own, MASKED)], dim=1)
    predict = torch.cat([causal, own], dim=1)
    zeros = torch.zeros_like(own, dtype=distance.dtype)
    distances = torch.cat([torch.cat([distance, zeros], dim=1), torch.cat([distance + 1, zeros], dim=1)])
    return distances, torch.cat([main, predict])


class ProphetNet(Seq2SeqModel):
    def __init__(self, cfg: ProphetNetConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        if src_vocab_size != tgt_vocab_size:
            raise ValueError("ProphetNet shares one word table: source and target vocabularies must match")
        self.cfg = cfg
        self.word_embeddings = nn.Embedding(tgt_vocab_size, cfg.d_model)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.word_embeddings.weight

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        bias = padding_bias(src, src_len)
        encoder = self.encoder
        positions = (torch.arange(src.shape[1], device=src.device) + 1).clamp(max=self.cfg.max_position_embeddings - 1)
        x = encoder.embeddings_layer_norm(self.word_embeddings(src) + encoder.position_embeddings(positions)[None])
        for layer in encoder.layers:
            x = layer(x, bias)
        return x, bias

    def streams(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """``(B, 2L, d)``: the main stream (tokens at rows ``1 + position``) then the first
        predicting stream (``ngram_embeddings[ngram - 1]`` at rows ``2 + position``), normed."""
        decoder = self.decoder
        main = self.word_embeddings(tokens) + decoder.position_embeddings(positions + 1)
        predict = decoder.ngram_embeddings.weight[-1] + decoder.position_embeddings(positions + 2)
        return decoder.embeddings_layer_norm(torch.cat([main, predict.expand_as(main)], dim=1))

    def encode(self, src: Tensor, src_len: Tensor) -> dict[str, Tensor]:
        memory, bias = self.run_encoder(src, src_len)
        out = {"src_bias": bias}
        for i, layer in enumerate(self.decoder.layers):
            out[layer_name("cross_k", i)], out[layer_name("cross_v", i)] = layer.cross_attn.cross_memory(memory)
        return out

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        memory = self.encode(src, src_len)
        length = tgt_in.shape[1]
        positions = torch.arange(length, device=tgt_in.device)
        distance, mask = stream_layout(positions, positions)
        x = self.streams(tgt_in, positions[None, :])
        heads, dim = self.decoder.layers[0].self_attn.heads, self.decoder.layers[0].self_attn.head_dim
        empty = x.new_zeros(x.shape[0], heads, 0, dim)
        for i, layer in enumerate(self.decoder.layers):
            x = layer(x, empty, empty, distance, mask, memory[layer_name("cross_k", i)],
                      memory[layer_name("cross_v", i)], memory["src_bias"])[0]
        return self.lm_head(x[:, length:])

    def decode_step(self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor],
                    state: dict[str, Tensor]) -> StepOutput:
        past = state[layer_name("self_k", 0)].shape[2]
        position = step.reshape(1)  # a runtime may feed the 0-d step as (1,)
        distance, mask = stream_layout(position, torch.arange(past + 1, device=tokens.device))
        x = self.streams(tokens[:, None], position[None])
        new_state, attention = {}, []
        for i, layer in enumerate(self.decoder.layers):
            k, v = layer_name("self_k", i), layer_name("self_v", i)
            x, keys, values, weights = layer(x, state[k], state[v], distance, mask, memory[layer_name("cross_k", i)],
                                             memory[layer_name("cross_v", i)], memory["src_bias"])
            new_state[k], new_state[v] = keys[:, :, :-1], values[:, :, :-1]  # the main stream's: generate's cache
            attention.append(weights[:, :, 1:])  # the predicting stream's, whose logits choose the token
        log_probs = torch.log_softmax(self.lm_head(x[:, 1]), dim=-1)
        return StepOutput(log_probs, new_state, torch.cat(attention, dim=2).transpose(1, 2))
