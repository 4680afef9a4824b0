"""Pegasus-X's torch modules (the declaration and its docstring of the arithmetic are
``plugins/pegasus_x.py``): ``EncoderDecoder`` with the block-local, global-token encoder."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from s2s_deploy.modeling.parts import Attention, EncoderDecoder, activation, padding_bias
from s2s_deploy_plugins.pegasus_x import PegasusXConfig

MASKED = torch.finfo(torch.float32).min  # transformers' value for a masked key, padding and blocks alike


class GlobalLocalAttention(Attention):
    """PegasusXGlobalLocalAttention: one set of bias-free projections for tokens and globals;
    queries scaled before the product, and a token's output the sum of its global and its local
    part, as ``transformers`` computes them."""

    def __init__(self, cfg: PegasusXConfig) -> None:
        super().__init__(cfg.d_model, cfg.encoder_attention_heads, bias=False)
        self.block = cfg.block_size

    def heads_of(self, x: Tensor) -> Tensor:
        """``(B, L, d)`` → ``(B, H, L, head_dim)``."""
        return x.reshape(x.shape[0], -1, self.heads, self.head_dim).transpose(1, 2)

    def attend(self, tokens: Tensor, globals_: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """``tokens`` ``(B, P, d)``, ``P`` a whole number of blocks; ``globals_`` ``(B, G, d)``;
        ``mask`` ``(B, P)``, additive. Returns both outputs, projected."""
        batch, count = tokens.shape[0], globals_.shape[1]
        q = self.heads_of(self.project(0, tokens) * self.scaling)
        k, v = self.heads_of(self.project(1, tokens)), self.heads_of(self.project(2, tokens))
        global_q = self.heads_of(self.project(0, globals_) * self.scaling)
        global_k, global_v = self.heads_of(self.project(1, globals_)), self.heads_of(self.project(2, globals_))

        # globals: every global and every token
        seen = nn.functional.pad(mask, [count, 0])[:, None, None, :]
        weights = torch.softmax(global_q @ torch.cat([global_k, k], dim=2).transpose(-1, -2) + seen, dim=-1)
        global_out = weights @ torch.cat([global_v, v], dim=2)

        # tokens: every global and the tokens of their own block, blocks (B, H, N, block, head_dim)
        def blocked(x: Tensor) -> Tensor:
            return x.reshape(batch, self.heads, -1, self.block, self.head_dim)

        q, k, v = blocked(q), blocked(k), blocked(v)
        global_k, global_v = global_k[:, :, None], global_v[:, :, None]
        seen = nn.functional.pad(mask.reshape(batch, -1, self.block), [count, 0])[:, None, :, None, :]
        scores = torch.cat([q @ global_k.transpose(-1, -2), q @ k.transpose(-1, -2)], dim=-1) + seen
        weights = torch.softmax(scores, dim=-1)
        out = weights[..., :count] @ global_v + weights[..., count:] @ v

        out = out.permute(0, 2, 3, 1, 4).reshape(batch, -1, self.heads * self.head_dim)
        global_out = global_out.transpose(1, 2).reshape(batch, count, self.heads * self.head_dim)
        return self.project(3, out), self.project(3, global_out)


class GlobalLocalLayer(nn.Module):
    """PegasusXEncoderLayer: pre-norm attention (its own LayerNorm for the globals), the blocks
    shifted by half a block when ``stagger``, then one feed-forward for tokens and globals."""

    def __init__(self, cfg: PegasusXConfig, stagger: bool) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = GlobalLocalAttention(cfg)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.global_self_attn_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.fc1 = nn.Linear(d, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.act = activation(cfg.activation_function)
        self.shift = cfg.block_size // 2 if stagger else 0

    def ffn(self, x: Tensor) -> Tensor:
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))

    def forward(self, x: Tensor, globals_: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        h = self.self_attn_layer_norm(x)
        if self.shift:
            h = nn.functional.pad(h, [0, 0, self.shift, self.shift])
            mask = nn.functional.pad(mask, [self.shift, self.shift], value=MASKED)
        out, global_out = self.self_attn.attend(h, self.global_self_attn_layer_norm(globals_), mask)
        if self.shift:
            out = out[:, self.shift : self.shift + x.shape[1]]
        return self.ffn(x + out), self.ffn(globals_ + global_out)


class PegasusX(EncoderDecoder):
    """``EncoderDecoder`` with the global-local encoder layers and ``encoder.embed_global``; the
    decoder, ``encode``'s cross K/V and ``decode_step`` are ``EncoderDecoder``'s."""

    def __init__(self, cfg: PegasusXConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__(cfg, src_vocab_size, tgt_vocab_size)
        self.encoder.embed_global = nn.Embedding(cfg.num_global_tokens, cfg.d_model)
        self.encoder.layers = nn.ModuleList(
            GlobalLocalLayer(cfg, stagger=cfg.stagger_local_blocks and i % 2 == 1) for i in range(cfg.encoder_layers))
        self.block = cfg.block_size

    def run_encoder(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, Tensor]:
        stack, length = self.encoder, src.shape[1]
        positions = stack.positions(torch.arange(length, device=src.device)[None, :], src)
        x = stack.embed(self.table(stack)(src) * self.embed_scale, positions)
        padded = (length + self.block - 1) // self.block * self.block  # a product: exports with L dynamic
        x = nn.functional.pad(x, [0, 0, 0, padded - length])
        valid = torch.arange(padded, device=src.device)[None, :] < src_len[:, None]
        mask = torch.where(valid, 0.0, MASKED)
        globals_ = stack.embed_global.weight[None].expand(src.shape[0], -1, -1)
        for layer in stack.layers:
            x, globals_ = layer(x, globals_, mask)
        return stack.finish(x[:, :length]), padding_bias(src, src_len)
