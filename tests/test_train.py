"""Training lowers the loss, is deterministic and resumable, and checkpoints round-trip or are refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from s2s_deploy.architecture.registry import REGISTRY, get_plugin
from s2s_deploy.cli import main
from s2s_deploy.errors import CheckpointError, S2SError
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.modeling.checkpoint import build_model, load_checkpoint, save_checkpoint
from s2s_deploy.train.metrics import corpus_bleu, d2l_bleu, exact_match, score
from s2s_deploy.train.tasks import SplitSizes, load_task
from s2s_deploy.train.trainer import TrainConfig, encode_pairs, greedy_decode, make_batches, train, train_state_path

PLUGIN = get_plugin("transformer")
TINY = PLUGIN.config_type(d_model=32, num_heads=2, ffn_hidden=64, encoder_layers=1, decoder_layers=1,
                          dropout=0.0, max_len=64)
SPLITS = load_task("en-fr", 0, SplitSizes(train=256, valid=16, test=16, ood=16))
FAST = TrainConfig(epochs=3, batch_size=32, lr=3e-3, warmup_steps=5, threads=2, max_valid=8)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "tiny.safetensors"
    return out, train(PLUGIN, TINY, SPLITS, FAST, out, info={"command": "test"}, progress=False, log=None)


def test_short_run_lowers_the_loss(trained) -> None:
    _, result = trained
    losses = [h.loss for h in result.history]
    assert len(losses) == 3 and losses[-1] < losses[0] * 0.8


def test_checkpoint_records_the_run(trained) -> None:
    out, result = trained
    info = load_checkpoint(out).info
    assert info["task"] == "en-fr" and info["seed"] == 0 and info["epochs"] == 3 and info["command"] == "test"
    assert info["epoch"] == result.best_epoch
    assert info["valid_exact_match"] == result.best.exact_match and info["valid_bleu"] == result.best.bleu
    assert result.test is not None and info["test_exact_match"] == result.test.exact_match
    assert info["test_pairs"] == len(SPLITS.test)
    assert info["ood_pairs"] == len(SPLITS.ood) and 0 <= info["ood_exact_match"] <= 1
    assert info["samples"] == [p.source for p in SPLITS.test]  # an export's parity inputs, no generator needed
    assert info["train_seconds"] > 0 and set(info["search"]) == {"max_len_a", "max_len_b"}


def test_patience_stops_when_valid_stops_improving(tmp_path) -> None:
    """A learning rate too small to change any output: epoch 1 is the best, epoch 2 ends the run."""
    cfg = dataclasses.replace(FAST, epochs=5, lr=1e-12, max_train=64, patience=1)
    result = train(PLUGIN, TINY, SPLITS, cfg, tmp_path / "p.safetensors", progress=False, log=None)
    assert len(result.history) == 2 and result.best_epoch == 1


def test_checkpoint_round_trip_gives_identical_outputs(tmp_path) -> None:
    src_vocab = Vocabulary.build(p.source for p in SPLITS.train)
    tgt_vocab = Vocabulary.build(p.target for p in SPLITS.train)
    torch.manual_seed(1)
    model = PLUGIN.build(TINY, len(src_vocab), len(tgt_vocab)).eval()
    path = save_checkpoint(tmp_path / "m.safetensors", PLUGIN, TINY, model, src_vocab, tgt_vocab)
    loaded = build_model(load_checkpoint(path), PLUGIN)
    src = torch.tensor([src_vocab.encode("March 3, 2021")])
    tgt_in = torch.tensor([[tgt_vocab.bos_id, *tgt_vocab.encode("3 mars 2021", add_eos=False)]])
    with torch.no_grad():
        assert torch.equal(model(src, torch.tensor([src.shape[1]]), tgt_in),
                           loaded(src, torch.tensor([src.shape[1]]), tgt_in))
    sources = [p.source for p in SPLITS.valid]
    assert (greedy_decode(model, PLUGIN, TINY, sources, src_vocab, tgt_vocab, 12)
            == greedy_decode(loaded, PLUGIN, TINY, sources, src_vocab, tgt_vocab, 12))


def test_build_model_refuses_other_architecture_or_config(trained) -> None:
    checkpoint = load_checkpoint(trained[0])
    other = next(e.plugin for e in REGISTRY.entries() if e.plugin.name != PLUGIN.name)
    with pytest.raises(CheckpointError, match="architecture"):
        build_model(checkpoint, other)
    wider = dataclasses.replace(checkpoint, config=dataclasses.replace(TINY, d_model=48))
    with pytest.raises(CheckpointError, match="shape"):
        build_model(wider, PLUGIN)
    deeper = dataclasses.replace(checkpoint, config=dataclasses.replace(TINY, decoder_layers=2))
    with pytest.raises(CheckpointError, match="missing"):
        build_model(deeper, PLUGIN)


def test_resume_continues_exactly(tmp_path) -> None:
    cfg = dataclasses.replace(FAST, epochs=2, max_train=96)
    straight = train(PLUGIN, TINY, SPLITS, cfg, tmp_path / "a.safetensors", progress=False, log=None)
    train(PLUGIN, TINY, SPLITS, dataclasses.replace(cfg, epochs=1), tmp_path / "b.safetensors",
          progress=False, log=None)
    resumed = train(PLUGIN, None, SPLITS, cfg, tmp_path / "b.safetensors", resume=tmp_path / "b.safetensors",
                    progress=False, log=None)
    assert [h.loss for h in resumed.history] == [h.loss for h in straight.history]
    a = load_file(train_state_path(tmp_path / "a.safetensors"))
    b = load_file(train_state_path(tmp_path / "b.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(S2SError, match="already trained for 2 epochs"):
        train(PLUGIN, None, SPLITS, cfg, tmp_path / "b.safetensors", resume=tmp_path / "b.safetensors",
              progress=False, log=None)


def test_batches_cover_every_pair_once_and_group_lengths() -> None:
    src_vocab = Vocabulary.build(p.source for p in SPLITS.train)
    tgt_vocab = Vocabulary.build(p.target for p in SPLITS.train)
    data = encode_pairs(SPLITS.train, src_vocab, tgt_vocab)
    batches = make_batches(data, 32, seed=0)
    assert sorted(i for b in batches for i in b) == list(range(len(SPLITS.train)))
    assert batches == make_batches(data, 32, seed=0) and batches != make_batches(data, 32, seed=1)


@pytest.mark.parametrize("arch", sorted(e.plugin.name for e in REGISTRY.entries()
                                         if not e.plugin.source_spec(e.plugin.preset()).is_features))
def test_greedy_decoder_speaks_only_the_contract(arch: str) -> None:
    """The text trainer's validation decoder (a features model validates with train/speech.py's)."""
    plugin = get_plugin(arch)
    config = plugin.preset()
    vocab = Vocabulary.build(["abc def"])
    torch.manual_seed(0)
    model = plugin.build(config, len(vocab), len(vocab))
    out = greedy_decode(model, plugin, config, ["abc", "de f", "a"], vocab, vocab, max_steps=4)
    assert len(out) == 3 and all(len(o.replace("<unk>", "?")) <= 4 for o in out)


def test_metrics() -> None:
    refs = ["mercredi 3 mars 2021", "vingt et un jours"]
    assert exact_match(refs, refs) == 1.0 and exact_match(["x", refs[1]], refs) == 0.5
    assert corpus_bleu(refs, refs) == pytest.approx(100.0)
    assert d2l_bleu(["a", "b", "c"], ["a", "b", "c"]) == 1.0
    assert d2l_bleu([], ["a"]) == 0.0
    assert d2l_bleu(["a"], ["a", "b"]) == pytest.approx(0.36787944, rel=1e-6)
    zh = score(["2021年3月3日"], ["2021年3月3日星期三"], tokenize="zh")
    assert 0 < zh.bleu < 100 and zh.exact_match == 0.0 and 0 < zh.d2l_bleu < 1


def test_cli_trains_and_reports_errors_in_one_line(tmp_path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli.safetensors"
    result = runner.invoke(main, ["train", "--arch", "transformer", "--epochs", "1", "--max-train", "32",
                                  "--max-valid", "4", "--batch-size", "16", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    command = load_checkpoint(out).info["command"]
    assert command.startswith("s2s-deploy train --arch transformer --task en-fr --preset small --epochs 1")
    result = runner.invoke(main, ["train", "--arch", "transformer", "--task", str(tmp_path / "none.tsv")])
    assert result.exit_code == 1 and "task file not found" in result.output
