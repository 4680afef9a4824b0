"""A third-party author's mistakes, each in a ``--plugin FILE``, read as one line naming the plugin
and the mistake, before any ONNX export (issue 35, item 7). The plugin below is written as the
README describes, from scratch: an attention decoder with a KV cache and input feeding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from s2s_deploy.cli import main

TINY = '''
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from s2s_deploy.modeling.contract import ArchitecturePlugin, MemorySpec, Seq2SeqModel, StateSpec, StepOutput


@dataclass(frozen=True)
class TinyConfig:
    hidden: int = 16


class Tiny(Seq2SeqModel):
    def __init__(self, cfg, src_vocab_size, tgt_vocab_size):
        super().__init__()
        self.hidden = cfg.hidden
        self.src_embedding = nn.Embedding(src_vocab_size, cfg.hidden)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, cfg.hidden)
        self.mix = nn.Linear(3 * cfg.hidden, cfg.hidden)
        self.output = nn.Linear(cfg.hidden, tgt_vocab_size)

    def encode(self, src, src_len):
        mask = (torch.arange(src.shape[1])[None, :] < src_len[:, None]).float()
        enc = self.src_embedding(src) * mask[..., None]
        return {"enc": enc, "mask": mask}

    def decode_step(self, tokens, step, memory, state):
        y = self.tgt_embedding(tokens)
        keys = torch.cat([state["keys"], y[:, None, :]], dim=1)
        scores = torch.einsum("bh,bsh->bs", y, memory["enc"]) + (memory["mask"] - 1) * 1e9
        ctx = torch.einsum("bs,bsh->bh", scores.softmax(-1), memory["enc"])
        feed = torch.tanh(self.mix(torch.cat([keys.mean(1), ctx, state["feed"]], -1)))
        return StepOutput(torch.log_softmax(self.output(feed), -1), {"keys": keys, "feed": feed})

    def forward(self, src, src_len, tgt_in):
        memory = self.encode(src, src_len)
        state = {"keys": torch.zeros(src.shape[0], 0, self.hidden), "feed": torch.zeros(src.shape[0], self.hidden)}
        out = []
        for t in range(tgt_in.shape[1]):
            step = self.decode_step(tgt_in[:, t], torch.tensor(t), memory, state)
            out.append(step.log_probs)
            state = step.state
        return torch.stack(out, 1)


class TinyPlugin(ArchitecturePlugin):
    name = "tiny_author"
    version = "0.1"
    description = "a third party's attention decoder"
    config_type = TinyConfig
    presets: ClassVar[dict] = {"small": TinyConfig()}
    exporter = "torchscript"

    def build(self, config, src_vocab_size, tgt_vocab_size):
        return Tiny(config, src_vocab_size, tgt_vocab_size)

    def memory_specs(self, config):
        return (MemorySpec("enc", 0), MemorySpec("mask", 0))

    def state_specs(self, config):
        return (StateSpec("keys", 0, "zeros", ("batch", 0, config.hidden), grow_axis=1),
                StateSpec("feed", 0, "zeros", ("batch", config.hidden)))


PLUGIN = TinyPlugin()
'''

BUILD = "return Tiny(config, src_vocab_size, tgt_vocab_size)"
TINY_CLASS = "class Tiny(Seq2SeqModel):\n"
FEED = 'StateSpec("feed", 0, "zeros", ("batch", config.hidden))'
RETURNED = 'StepOutput(torch.log_softmax(self.output(feed), -1), {"keys": keys, "feed": feed})'
ENCODED = "enc = self.src_embedding(src) * mask[..., None]"
MISTAKES = {  # name: ((text, replacement), ...), what the one line must say
    "missing_state": (((RETURNED, RETURNED.replace(', "feed": feed', "")),),
                      "decode_step() returned no state 'feed' (it returned 'keys')"),
    "zeros_width": (((FEED, FEED.replace("config.hidden", "config.hidden + 1")),),
                    "(fed state keys zeros (3, 0, 16), feed zeros (3, 17)) failed (RuntimeError: mat1 and mat2"),
    "wrong_grow_axis": ((("grow_axis=1", "grow_axis=2"),), "declares grow_axis=2, but its shape ('batch', 0, 16) "
                        "holds 16 there"),
    "no_grow_axis": (((", grow_axis=1)", ")"),), "state 'keys' enters a step as (3, 0, 16) and decode_step() "
                     "returns (3, 1, 16): it grows along axis 1, but its spec declares no grow_axis; likely fix: "
                     "grow_axis=1"),
    "float64": (((BUILD, BUILD + ".double()"),), "encode() returns memory 'enc' as float64, but float32 is declared"),
    "dropout_on": ((("feed = torch.tanh(self.mix(torch.cat([keys.mean(1), ctx, state[\"feed\"]], -1)))",
                     "feed = nn.functional.dropout(torch.tanh(self.mix(torch.cat([keys.mean(1), ctx, "
                     "state[\"feed\"]], -1))), 0.3, training=True)"),),
                   "two identical decode_step() calls disagree by"),
    "encoder_reads_padding": (((ENCODED, "enc = self.src_embedding(src); enc = enc + enc.mean(1, keepdim=True)"),),
                              "encode() reads padding: memory 'enc' of a 5-token sentence differs by"),
    "decoder_reads_padding": ((("ctx = torch.einsum(\"bs,bsh->bh\", scores.softmax(-1), memory[\"enc\"])",
                                "ctx = memory[\"enc\"].mean(1)"),),
                              "decode_step() reads source padding: after the first step of a 5-token sentence, its "
                              "log-probs differ by"),
    "swapped_vocab_sizes": (((BUILD, "return Tiny(config, tgt_vocab_size, src_vocab_size)"),),
                            "(IndexError: index out of range in self); likely fix: a token id beyond an embedding "
                            "table"),
    "output_over_source_vocab": ((("nn.Linear(cfg.hidden, tgt_vocab_size)", "nn.Linear(cfg.hidden, src_vocab_size)"),),
                                 "decode_step() returns log_probs of shape (3, 99), not (3, 41)"),
    "log_probs_keep_time_axis": ((("torch.log_softmax(self.output(feed), -1)",
                                   "torch.log_softmax(self.output(feed), -1)[:, None]"),),
                                 "log_probs of shape (3, 1, 41), not (3, 41)"),
    "tuple_not_step_output": (((RETURNED, RETURNED.replace("StepOutput(", "(")),),
                              "decode_step() returned tuple, not a StepOutput(log_probs, state)"),
    "state_written_in_place": ((("keys = torch.cat(", "state[\"feed\"].add_(1.0); keys = torch.cat("),),
                               "decode_step() changes its input state 'feed' in place"),
    "declared_float16": (((FEED, FEED.replace("))", "), dtype=\"float16\")")),),
                         "as float32, but float16 is declared"),
    "false_memory_per_sentence": (((TINY_CLASS, TINY_CLASS + "    memory_per_sentence = True\n"),),
                                  "memory_per_sentence is claimed, but decode_step() fails on one memory row per 3 "
                                  "rows"),
    "unknown_dtype": (((FEED, FEED.replace("))", "), dtype=\"float99\")")),),
                      "'feed' declares dtype 'float99', which torch does not know"),
}


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def one_line(code: int, stderr: str) -> str:
    assert code == 1, stderr
    lines = stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: ") and "Traceback" not in stderr, stderr
    assert all(not line.startswith("error: ") for line in lines[:-1]), stderr
    return lines[-1]


def plugin_file(tmp_path: Path, name: str = "tiny_author", edits: tuple[tuple[str, str], ...] = ()) -> Path:
    text = TINY
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.py"
    path.write_text(text.replace('name = "tiny_author"', f'name = "{name}"'))
    return path


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_each_mistake_is_one_line_naming_the_plugin_before_onnx(tmp_path: Path, mistake: str) -> None:
    edits, fragment = MISTAKES[mistake]
    path = plugin_file(tmp_path, mistake, edits)
    code, _, err = run("export", "--arch", mistake, "--plugin", str(path), "--out", str(tmp_path / "out"))
    line = one_line(code, err)
    assert line.startswith(f"error: plugin {mistake!r}: "), line
    assert fragment in line, line
    assert "likely fix: " in line
    assert not (tmp_path / "out").exists()


def test_torch_dumps_wait_for_debug(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The TorchScript exporter prints its whole IR from C++ when an operator fails to convert."""
    path = plugin_file(tmp_path, "bessel", ((ENCODED, ENCODED + "; enc = enc + 0 * torch.special.bessel_j0(enc)"),))
    args = ("export", "--arch", "bessel", "--plugin", str(path), "--out", str(tmp_path / "out"))
    line = one_line(*run(*args)[::2])
    assert "torchscript export of the encoder failed (UnsupportedOperatorError" in line
    assert "graph(" not in capfd.readouterr().err + capfd.readouterr().out
    from s2s_deploy.architecture.registry import REGISTRY

    REGISTRY.unregister("bessel")  # the same file again, in this process
    code, _, err = run("--debug", *args)
    assert code == 1 and "Torch IR graph at exception" in err + capfd.readouterr().err


def test_a_moved_import_names_the_new_module(tmp_path: Path) -> None:
    edits = (("from s2s_deploy.modeling.contract import", "from s2s_deploy.contract import"),)
    path = plugin_file(tmp_path, "old_layout", edits)
    for command in (("export", "--arch", "old_layout"), ("list",)):
        line = one_line(*run(*command, "--plugin", str(path))[::2])
        assert line.endswith("No module named 's2s_deploy.contract'; it moved: from s2s_deploy.modeling.contract "
                             "import ..."), line


def test_list_fails_when_a_third_party_entry_point_is_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint, entry_points

    import s2s_deploy.architecture.registry as registry

    broken = EntryPoint("broken", "no_such_module_x:PLUGIN", registry.ENTRY_POINT_GROUP)
    real = list(entry_points(group=registry.ENTRY_POINT_GROUP))
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken, *real])
    monkeypatch.setattr(registry, "REGISTRY", registry.Registry())
    code, out, err = run("list")
    assert "transformer" in out
    assert one_line(code, err).startswith("error: 1 plugin entry point(s) disabled: plugin entry point 'broken'")


def test_a_forgotten_plugin_names_the_file_to_pass(tmp_path: Path) -> None:
    from s2s_deploy.architecture.registry import REGISTRY

    path = plugin_file(tmp_path)
    out = tmp_path / "out"
    code, _, err = run("export", "--arch", "tiny_author", "--plugin", str(path), "--out", str(out))
    assert code == 0, err
    assert json.loads((out / "manifest.json").read_text())["plugin"]["origin"] == "file tiny_author.py"
    REGISTRY.unregister("tiny_author")
    line = one_line(*run("parity", str(out))[::2])
    assert line == ("error: architecture 'tiny_author' is not registered here: exported with plugin file "
                    "tiny_author.py: pass --plugin tiny_author.py")
    code, _, err = run("parity", str(out), "--plugin", str(path))
    assert code == 0, err


def test_random_weights_use_different_source_and_target_sizes(tmp_path: Path) -> None:
    from s2s_deploy.architecture.registry import REGISTRY, get_plugin
    from s2s_deploy.export.sources import load_source

    REGISTRY.load_file(plugin_file(tmp_path))
    source = load_source(get_plugin("tiny_author"), None, workdir=tmp_path)
    assert len(source.src_vocab) != len(source.tgt_vocab)
    shared = load_source(get_plugin("t5"), None, preset="tiny", workdir=tmp_path)  # one shared embedding
    assert shared.src_vocab == shared.tgt_vocab


def test_train_reports_a_swapped_vocabulary_in_one_line(tmp_path: Path) -> None:
    path = plugin_file(tmp_path, "swapped", ((BUILD, "return Tiny(config, tgt_vocab_size, src_vocab_size)"),))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("one\tun\ntwo\tdeux\nthree\ttrois\nfour\tquatre\nfive\tcinq\nsix\tsix\n")  # 13 vs 14 tokens
    code, _, err = run("train", "--arch", "swapped", "--plugin", str(path), "--task", str(pairs), "--epochs", "1",
                       "--out", str(tmp_path / "m.safetensors"))
    line = one_line(code, err)
    assert line.startswith("error: plugin 'swapped': forward() and backward() on a training batch failed "
                           "(IndexError: index out of range in self)"), line
