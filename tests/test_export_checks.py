"""Export refuses a plugin whose declarations or cached step disagree with its model, with one
line naming the plugin or tensor and the size of the disagreement (docs/parity.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from s2s_deploy.errors import ContractError
from s2s_deploy.export.exporter import export_model
from s2s_deploy.export.sources import load_source
from s2s_deploy.modeling.contract import MemorySpec, StateSpec
from s2s_deploy.verify.checks import ExportAxisError, ExportStepError
from s2s_deploy_plugins.gru import GRUConfig, GRUPlugin
from s2s_deploy_plugins.models.transformer import Transformer
from s2s_deploy_plugins.transformer import TransformerConfig, TransformerPlugin

TINY = TransformerConfig(d_model=32, num_heads=2, ffn_hidden=64, encoder_layers=1, decoder_layers=1, max_len=64)


class FinalNormTransformer(Transformer):
    """A pre-norm-style stack with a final LayerNorm that ``forward`` applies and the inherited
    cached ``decode_step`` forgets: the likeliest hand-written-step bug."""

    def __init__(self, cfg: TransformerConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__(cfg, src_vocab_size, tgt_vocab_size)
        self.final_norm = nn.LayerNorm(cfg.d_model)
        with torch.no_grad():
            self.final_norm.weight.mul_(3.0)

    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        original = self.output
        self.output = nn.Sequential(self.final_norm, original)
        try:
            return super().forward(src, src_len, tgt_in)
        finally:
            self.output = original


class NoFinalNormPlugin(TransformerPlugin):
    name = "nofinalnorm"
    exporter = "torchscript"
    presets = {"small": TINY}  # noqa: RUF012 - the parent declares it a ClassVar

    def build(self, config: TransformerConfig, src_vocab_size: int, tgt_vocab_size: int) -> Transformer:
        return FinalNormTransformer(config, src_vocab_size, tgt_vocab_size)


class WrongMemoryAxisPlugin(GRUPlugin):
    name = "wrongaxis"
    presets = {"small": GRUConfig(embed_size=16, num_hiddens=24, num_layers=2)}  # noqa: RUF012

    def memory_specs(self, config: GRUConfig) -> tuple[MemorySpec, ...]:
        return (replace(super().memory_specs(config)[0], batch_axis=1),)


class WrongStateAxisPlugin(WrongMemoryAxisPlugin):
    name = "wrongstate"

    def memory_specs(self, config: GRUConfig) -> tuple[MemorySpec, ...]:
        return GRUPlugin.memory_specs(self, config)

    def state_specs(self, config: GRUConfig) -> tuple[StateSpec, ...]:
        return (replace(super().state_specs(config)[0], batch_axis=2),)


def export(plugin, tmp_path: Path) -> Path:
    source = load_source(plugin, None, workdir=tmp_path)
    out = tmp_path / "out"
    export_model(plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, out,
                 checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples)
    return out


def test_a_step_that_omits_the_final_layernorm_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ExportStepError) as raised:
        export(NoFinalNormPlugin(), tmp_path)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("plugin nofinalnorm: decode_step differs from the teacher-forced forward by ")
    assert float(message.split(" by ")[1].split()[0]) > 0.01
    assert not (tmp_path / "out").exists()  # nothing moved into place


def test_the_same_model_with_a_matching_step_exports(tmp_path: Path) -> None:
    plugin = NoFinalNormPlugin()
    plugin.build = lambda config, s, t: Transformer(config, s, t)  # forward and step agree again
    out = export(plugin, tmp_path)
    assert (out / "manifest.json").is_file()


@pytest.mark.parametrize(("plugin", "fragment"), [
    (WrongMemoryAxisPlugin(), "memory 'context' has shape (3, 24), whose axis 1 is not the batch (3)"),
    (WrongStateAxisPlugin(), "state 'h' has shape (2, 3, 24), whose axis 2 is not the batch (3)"),
], ids=["memory", "state"])
def test_a_wrong_batch_axis_is_refused_naming_the_tensor(tmp_path: Path, plugin, fragment: str) -> None:
    with pytest.raises((ExportAxisError, ContractError, IndexError, RuntimeError)) as raised:
        export(plugin, tmp_path)
    assert raised.type in (ExportAxisError, ContractError), raised.value
    assert "\n" not in str(raised.value)
    assert fragment in str(raised.value)
    assert not (tmp_path / "out").exists()
