"""The declaration every BART-style Hugging Face family shares, torch-free: ``EncoderDecoderConfig``
(the layer stack most families are), ``EncoderDecoderPlugin`` (its specs, limits and Hugging Face
weight mapping) and ``hf_encoder_decoder_config``. The model itself, ``EncoderDecoder``, is torch
and lives with the other parts in ``s2s_deploy/modeling/parts.py``; a family is a ``config_from_hf``
mapping plus what is truly its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from s2s_deploy.architecture.declaration import ArchitecturePlugin, HFWeights
from s2s_deploy.errors import CheckpointError
from s2s_deploy.format.specs import MemorySpec, StateSpec, cross_memory_specs, self_attention_cache

PositionKind = Literal["learned", "learned_from_zero", "sinusoidal", "tensor2tensor", "tensor2tensor_from_zero"]


@dataclass(frozen=True)
class EncoderDecoderConfig:
    """The encoder-decoder most families are. ``positions``: ``learned`` (a table read at
    ``index + 2``), ``learned_from_zero`` (read at ``index``), ``sinusoidal`` (``sinusoids_split``,
    from 0), ``tensor2tensor`` (``sinusoids_tensor2tensor`` at ``index + pad_token_id + 1``, a
    padding token taking the zero row), ``tensor2tensor_from_zero`` (the same rows at ``index``,
    padding included). ``layernorm_embedding``: a LayerNorm on the embeddings
    (after positions are added, or in the decoder before when ``decoder_layernorm_tokens``).
    ``normalize_before``: pre-norm layers; ``final_layer_norm``: a LayerNorm after each stack.
    ``shared_embeddings``: one table for both sides (else ``encoder.embed_tokens`` and
    ``decoder.embed_tokens``); ``tie_word_embeddings``: the output projection is the target table.
    ``attention_bias``: the attention projections carry biases."""

    d_model: int = 128
    encoder_layers: int = 2
    decoder_layers: int = 2
    encoder_attention_heads: int = 4
    decoder_attention_heads: int = 4
    encoder_ffn_dim: int = 512
    decoder_ffn_dim: int = 512
    max_position_embeddings: int = 128
    activation_function: str = "gelu"
    scale_embedding: bool = False
    normalize_before: bool = False
    final_layer_norm: bool = False
    layernorm_embedding: bool = True
    positions: PositionKind = "learned"
    tie_word_embeddings: bool = True
    dropout: float = 0.0
    decoder_layernorm_tokens: bool = False
    pad_token_id: int = 0
    shared_embeddings: bool = True
    layer_norm_eps: float = 1e-5
    attention_bias: bool = True


class EncoderDecoderPlugin(ArchitecturePlugin):
    """A family built on ``EncoderDecoder``: subclass it, set the class attributes and write
    ``config_from_hf`` (a ``config.json`` → ``EncoderDecoderConfig`` mapping). ``hf_renames``
    maps a Hugging Face weight name (after ``model.`` is removed) to the plugin's, for the families
    whose names differ."""

    config_type = EncoderDecoderConfig
    model = "s2s_deploy.modeling.parts:EncoderDecoder"
    exporter = "dynamo"
    parity_atol = 1e-3
    """Measured 2026-11-28 on an AVX-512 VNNI Xeon: the tiny random test models of tests/test_hf.py and
    test_hf_families.py (EOS rows leaned on) moved per-step log-probs by up to 4.73e-4 (T5's PyTorch
    step against its own forward) and 3.74e-4 (BART, ONNX Runtime against transformers), where the AVX2
    EPYC stayed under 1e-4 with every token identical: float32 kernels that sum in another order. 1e-3
    keeps a 2x margin over the worst measured and stays 55x below the smallest bug measured (5.5e-2,
    docs/parity.md)."""
    has_attention = True
    hf_renames: ClassVar[Mapping[str, str]] = {}

    def memory_specs(self, config: EncoderDecoderConfig) -> tuple[MemorySpec, ...]:
        return cross_memory_specs(config.decoder_layers)

    def state_specs(self, config: EncoderDecoderConfig) -> tuple[StateSpec, ...]:
        heads = config.decoder_attention_heads
        return self_attention_cache(config.decoder_layers, heads, config.d_model // heads)

    def max_target_length(self, config: EncoderDecoderConfig) -> int | None:
        """A stored or fixed-size table bounds the positions; the tensor2tensor rows are computed
        for any position, as Hugging Face grows that table on demand."""
        return None if config.positions.startswith("tensor2tensor") else config.max_position_embeddings

    def max_source_length(self, config: EncoderDecoderConfig) -> int | None:
        return self.max_target_length(config)

    def config_from_hf(self, hf: Mapping[str, Any]) -> EncoderDecoderConfig:
        raise NotImplementedError

    def vocab_sizes(self, hf: Mapping[str, Any]) -> tuple[int, int]:
        """Source and target vocabulary sizes; one shared ``vocab_size`` unless overridden."""
        if hf.get("decoder_vocab_size") not in (None, hf["vocab_size"]) or hf.get(
                "share_encoder_decoder_embeddings", True) is False:
            raise CheckpointError(f"{self.name}: separate source and target embeddings are not supported")
        return int(hf["vocab_size"]), int(hf["vocab_size"])

    def from_hf(self, hf: Mapping[str, Any], tensors: Mapping[str, Any]) -> HFWeights:
        """Hugging Face names minus ``model.`` (and through ``hf_renames``); the tied copies
        (per-stack ``embed_tokens`` of a shared table, ``lm_head`` when tied) and stored sinusoid
        tables are dropped."""
        config = self.config_from_hf(hf)
        src_size, tgt_size = self.vocab_sizes(hf)
        weights: dict[str, Any] = {}
        for name, tensor in tensors.items():
            key = self.hf_renames.get(name.removeprefix("model."), name.removeprefix("model."))
            if config.shared_embeddings and key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
                weights.setdefault("shared.weight", tensor)
                continue
            if key == "lm_head.weight" and config.tie_word_embeddings:
                weights.setdefault("shared.weight" if config.shared_embeddings else "decoder.embed_tokens.weight",
                                   tensor)
                continue
            if not config.positions.startswith("learned") and key.endswith("embed_positions.weight"):
                continue
            weights[key] = tensor
        if "final_logits_bias" not in weights:  # a zero bias, made by the tensors' own torch
            weights["final_logits_bias"] = next(iter(tensors.values())).new_zeros((1, tgt_size))
        return HFWeights(config, weights, src_size, tgt_size)


def hf_encoder_decoder_config(hf: Mapping[str, Any], **family: Any) -> EncoderDecoderConfig:
    """The ``config.json`` keys every BART-style family writes alike, then the family's own settings."""
    common = dict(
        d_model=hf["d_model"], encoder_layers=hf["encoder_layers"], decoder_layers=hf["decoder_layers"],
        encoder_attention_heads=hf["encoder_attention_heads"], decoder_attention_heads=hf["decoder_attention_heads"],
        encoder_ffn_dim=hf["encoder_ffn_dim"], decoder_ffn_dim=hf["decoder_ffn_dim"],
        max_position_embeddings=hf["max_position_embeddings"],
        activation_function=hf.get("activation_function", "gelu"),
        scale_embedding=bool(hf.get("scale_embedding", False)),
        tie_word_embeddings=hf.get("tie_word_embeddings", True) is not False,
    )
    return EncoderDecoderConfig(**{**common, **family})
