"""Pegasus-X (Hugging Face ``PegasusXForConditionalGeneration``, ``model_type`` ``pegasus_x``), from
``transformers``' arithmetic: Pegasus for long inputs, whose encoder attends block-locally and
through a few global tokens.

The decoder is ``s2s_deploy.modeling.parts.EncoderDecoder``'s: pre-norm layers with a final
LayerNorm, embeddings scaled by ``sqrt(d)``, tensor2tensor sinusoidal positions from 0 (every
token, padding included), no biases on the attention projections, the output projection tied to
the shared embedding. So the step contract is the common one: a self-attention K/V cache per
layer and the cross-attention K/V computed by the encoder.

The encoder differs. The source (positions and scale as the decoder's) is padded with zero states
to a whole number of ``block_size`` blocks, every padded or padding position masked with the float
minimum. ``num_global_tokens`` learned states (``encoder.embed_global``) run beside it through
every layer: each layer normalises tokens and globals with their own LayerNorms, then a global
token attends to every global and every (unmasked) token, and a token to every global and the
tokens of its own block. On odd layers (the second, the fourth, ...) with ``stagger_local_blocks``
the blocks are shifted by half a block: half a block of masked zeros on each side of the sequence
before the blocks are cut, removed after. Tokens and globals share the feed-forward and its
LayerNorm. The globals never leave the encoder; the tokens, cut back to the source length, take
the final LayerNorm. A query always sees the globals, so no row of scores is wholly masked.

Module names follow ``transformers`` minus ``model.`` (``encoder.layers.0.self_attn.q_proj``,
``encoder.layers.0.global_self_attn_layer_norm``, ``encoder.embed_global``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from s2s_deploy.architecture.declaration import check_config_value
from s2s_deploy.architecture.encoder_decoder import (
    EncoderDecoderConfig,
    EncoderDecoderPlugin,
    hf_encoder_decoder_config,
)
from s2s_deploy.errors import CheckpointError

LOCAL_ATTENTION = ("num_global_tokens", "block_size", "stagger_local_blocks")
FAMILY = {"positions": "tensor2tensor_from_zero", "layernorm_embedding": False, "normalize_before": True,
          "final_layer_norm": True, "attention_bias": False}


@dataclass(frozen=True)
class PegasusXConfig(EncoderDecoderConfig):
    num_global_tokens: int = 32
    block_size: int = 512
    stagger_local_blocks: bool = True

    def __post_init__(self) -> None:
        if self.stagger_local_blocks and self.block_size % 2:
            # transformers pads half a block (block_size // 2) each side, which for an odd block
            # leaves no whole number of blocks: its own forward fails on such a config
            raise ValueError(f"block_size={self.block_size} must be even with stagger_local_blocks")


class PegasusXPlugin(EncoderDecoderPlugin):
    name = "pegasus_x"
    version = "1.0"
    description = "Hugging Face Pegasus-X: Pegasus whose encoder attends block-locally and through global tokens"
    config_type = PegasusXConfig
    presets: ClassVar[dict[str, PegasusXConfig]] = {
        "tiny": PegasusXConfig(**FAMILY, scale_embedding=True, num_global_tokens=4, block_size=4)}
    default_preset = "tiny"
    hf_model_types = ("pegasus_x",)
    model = "s2s_deploy_plugins.models.pegasus_x:PegasusX"

    def config_from_hf(self, hf: Mapping[str, Any]) -> PegasusXConfig:
        common = hf_encoder_decoder_config(hf, **FAMILY, scale_embedding=bool(hf.get("scale_embedding", True)))
        own = {key: hf.get(key, getattr(PegasusXConfig, key)) for key in LOCAL_ATTENTION}
        for key, value in own.items():
            check_config_value(self.name, key, value, getattr(PegasusXConfig, key))
        try:
            return PegasusXConfig(**asdict(common), **own)
        except ValueError as exc:
            raise CheckpointError(f"{self.name}: config.json {exc}") from exc


PLUGIN = PegasusXPlugin()
