"""Checkpoint averaging: the weighted mean of the parts' weights, their record kept, mismatches refused."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from s2s_deploy.architecture.registry import get_plugin
from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import sha256_of
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.modeling.checkpoint import load_checkpoint, save_checkpoint
from s2s_deploy.train.average import average_checkpoints, main

PLUGIN = get_plugin("transformer")
TINY = PLUGIN.config_type(d_model=16, num_heads=2, ffn_hidden=32, encoder_layers=1, decoder_layers=1,
                          dropout=0.0, max_len=16)
SRC, TGT = Vocabulary.build(["one two", "three"]), Vocabulary.build(["un deux", "trois"])


def _checkpoint(path, seed: int, config=TINY, epoch: int = 1):
    torch.manual_seed(seed)
    model = PLUGIN.build(config, len(SRC), len(TGT))
    return save_checkpoint(path, PLUGIN, config, model, SRC, TGT, {"epoch": epoch, "command": f"seed {seed}"})


def test_the_average_is_the_weighted_mean_and_records_its_parts(tmp_path) -> None:
    a, b, c = (_checkpoint(tmp_path / f"{seed}.safetensors", seed, epoch=seed) for seed in (1, 2, 3))
    out = average_checkpoints([(a, 2.0), (b, 1.0), (c, 1.0)], tmp_path / "avg.safetensors", {"note": "test"})
    parts = [load_checkpoint(p) for p in (a, b, c)]
    mean = load_checkpoint(out)
    assert mean.tensors.keys() == parts[0].tensors.keys()
    for name, tensor in mean.tensors.items():
        expected = (parts[0].tensors[name].double() * 0.5 + parts[1].tensors[name].double() * 0.25
                    + parts[2].tensors[name].double() * 0.25).float()
        assert tensor.dtype == torch.float32 and torch.equal(tensor, expected), name
    assert mean.info["note"] == "test"
    assert [(p["sha256"], p["weight"], p["epoch"]) for p in mean.info["averaged"]] == [
        (sha256_of(a), 0.5, 1), (sha256_of(b), 0.25, 2), (sha256_of(c), 0.25, 3)]
    assert mean.config == parts[0].config and mean.tgt_vocab.tokens == TGT.tokens


def test_a_part_of_another_model_or_a_bad_weight_is_refused_in_one_line(tmp_path, capsys) -> None:
    a = _checkpoint(tmp_path / "a.safetensors", 1)
    wider = _checkpoint(tmp_path / "w.safetensors", 1, dataclasses.replace(TINY, ffn_hidden=64))
    with pytest.raises(S2SError, match="another config"):
        average_checkpoints([(a, 1.0), (wider, 1.0)], tmp_path / "x.safetensors")
    with pytest.raises(S2SError, match="positive"):
        average_checkpoints([(a, 1.0), (a, 0.0)], tmp_path / "x.safetensors")
    with pytest.raises(S2SError, match="finite"):
        average_checkpoints([(a, 1.0), (a, float("inf"))], tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()
    assert main([str(tmp_path / "x.safetensors"), f"{a}:1", f"{wider}:1"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert main([str(tmp_path / "y.safetensors"), str(a), f"{a}:3"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["sha256"] == sha256_of(tmp_path / "y.safetensors")
    assert [p["weight"] for p in load_checkpoint(tmp_path / "y.safetensors").info["averaged"]] == [0.25, 0.75]
