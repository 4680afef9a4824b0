"""examples/python/manifest_client.py, written from docs/manifest.md alone, prints what `translate` prints."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[1] / "examples" / "python" / "manifest_client.py"
HARD = ["  日本語 ☃ ", "a", "Hello, World!!", "9", "four hundred and four hundred and four hundred and forty"]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _both(folder: Path, texts: list[str], args: list[str], per: int | None = None) -> None:
    cli = _run([sys.executable, "-m", "s2s_deploy", "translate", str(folder), *texts, *args,
                "--quiet", "--threads", "1"])
    ours = _run([sys.executable, str(CLIENT), str(folder), *texts, *args, "--threads", "1"])
    assert cli.returncode == 0, cli.stderr
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.splitlines() == cli.stdout.splitlines()
    if per is None:
        per = 1 if "--n-best" not in args else int(args[args.index("--n-best") + 1])
    assert len(cli.stdout.splitlines()) == len(texts) * per


def _folder(exports, arch: str) -> tuple[Path, list[str]]:
    exports.get(arch)
    folder = exports.root / arch
    samples = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["samples"]
    return folder, samples[:8] + HARD


SETTINGS = {
    "manifest defaults": [],
    "n-best 4 with scores": ["--beam", "4", "--n-best", "4", "--scores"],
    "lengths": ["--scores", "--beam", "3", "--n-best", "2", "--alpha", "0", "--min-len", "12",
                "--max-len-a", "0.5", "--max-len-b", "3"],
    "repetition and bans": ["--scores", "--beam", "4", "--n-best", "2", "--repetition-penalty", "1.5",
                            "--no-repeat-ngram-size", "2", "--suppress=e", "--bad-words=ui", "--disable-unk"],
    "source n-grams": ["--scores", "--beam", "3", "--encoder-no-repeat-ngram-size", "2"],
    "source tokens": ["--scores", "--encoder-no-repeat-ngram-size", "1"],
    "prefix and forced eos": ["--scores", "--prefix=le", "--forced-eos", "--max-len", "9"],
    "sampling": ["--scores", "--sampling-topk", "0", "--sampling-temperature", "3", "--sampling-topp", "0.9",
                 "--seed", "5"],
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_gru_matches_translate(exports, setting):
    folder, texts = _folder(exports, "gru")
    _both(folder, texts, SETTINGS[setting])


def test_manifest_search_defaults(exports, tmp_path):
    """Options the manifest's search block sets (CLI flags left out), early_stopping and forced_bos included."""
    folder, texts = _folder(exports, "gru")
    for i, extra in enumerate([
        {"beam_size": 4, "n_best": 2, "min_len": 3, "alpha": 0.5, "length_penalty_alpha": 2.0,
         "no_repeat_ngram_size": 3},
        {"beam_size": 4, "n_best": 4, "early_stopping": True},
        {"forced_bos": 20, "suppress_tokens": [21, 22], "bad_words_ids": [[23, 24], [25]], "max_len": 12},
        # forced BOS and EOS on one step: BOS wins; a beam score of exactly 0 prints as 0.0000
        {"forced_bos": 20, "forced_eos": True, "max_len": 1, "beam_size": 2},
    ]):
        copy = tmp_path / f"gru{i}"
        shutil.copytree(folder, copy)
        manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
        manifest["search"].update(extra)
        (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
        _both(copy, texts[:8], ["--scores"], per=extra.get("n_best", 1))


def test_a_format_6_export(exports, tmp_path):
    """An export written before format 7 names the length penalty search.length_penalty_alpha."""
    folder, texts = _folder(exports, "gru")
    copy = tmp_path / "gru6"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    assert "length_penalty_alpha" not in manifest["search"]
    search = {key: value for key, value in manifest["search"].items() if key != "alpha"}
    manifest |= {"format": "s2s-deploy-manifest/6", "search": search | {"length_penalty_alpha": 0.1, "beam_size": 3}}
    (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    _both(copy, texts[:8], ["--scores"])


def test_lstm_matches_translate(exports):
    folder, texts = _folder(exports, "lstm")
    _both(folder, texts, ["--beam", "4", "--n-best", "3", "--scores", "--min-len", "5"])


def test_forced_eos_on_a_min_len_step(exports):
    """docs/manifest.md: a forced EOS (step 5) wins over min_len (step 4) and scores 0, greedy and beam
    (translate once picked another token at -inf, or failed on NaN log-probs with a beam)."""
    folder, texts = _folder(exports, "gru")
    for beam in ("1", "2"):
        _both(folder, texts[:2], ["--scores", "--beam", beam, "--forced-eos", "--max-len", "9", "--min-len", "9"])


def _as_moses(spec: dict, folder: Path, side: str, texts: list[str]) -> None:
    """A char vocabulary rewritten as docs/manifest.md's `moses` level over the same ids: every other
    ordinary letter ends a word (`x</w>`), and four other letters become the two-letter pieces that
    `merges` build from the texts' commonest inner pairs, so the client's Moses steps, BPE and `</w>`
    detokenising all meet the text."""
    import collections

    special = {v for v in spec["special"].values() if v is not None}
    letters = [i for i, t in enumerate(spec["tokens"]) if i not in special and t.isalpha() and t.isascii()]
    tokens = list(spec["tokens"])
    for i in letters[::2]:
        tokens[i] = tokens[i] + "</w>"
    plain = {spec["tokens"][i] for i in letters[1::2]}
    pairs = collections.Counter((w[k], w[k + 1]) for text in texts for w in text.lower().split()
                                for k in range(len(w) - 2) if w[k] in plain and w[k + 1] in plain)
    merges = [list(pair) for pair, _ in pairs.most_common(4)]
    spare = [i for i in letters[1::2] if not any(tokens[i] in pair for pair in merges)]
    for i, (a, b) in zip(spare, merges, strict=False):
        tokens[i] = a + b
    data = json.dumps({"lang": "en", "lower_case": side == "source", "merges": merges}).encode()
    name = f"moses-{side}.json"
    (folder / name).write_bytes(data)
    spec |= {"level": "moses", "tokens": tokens,
             "tokenizer": {"file": name, "sha256": __import__("hashlib").sha256(data).hexdigest()}}


def test_moses_level_and_upper_case_match_translate(exports, tmp_path):
    """docs/manifest.md's format-8 additions, run by the client from the docs alone: the `moses` level
    (Moses normalisation and tokenisation with sacremoses, BPE, `</w>` detokenising) and `upper_case`."""
    pytest.importorskip("sacremoses")
    folder, texts = _folder(exports, "gru")
    copy = tmp_path / "gru-moses"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["format"] == "s2s-deploy-manifest/8"
    mixed = [*texts, "Hello -- \"quoted\" world's end…", "  tabs\tand   spaces  "]
    for side in ("source", "target"):
        _as_moses(manifest["vocab"][side], copy, side, mixed)
    manifest["vocab"]["target"]["upper_case"] = True
    (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    from s2s_deploy.format.manifest import load_manifest

    source = load_manifest(copy).src_vocab
    pieces = {source.tokens[i] for text in mixed for i in source.encode(text)}
    assert any(p.endswith("</w>") for p in pieces) and any(len(p) == 2 for p in pieces)  # both kinds met
    _both(copy, mixed, ["--scores"])
    cli = _run([sys.executable, "-m", "s2s_deploy", "translate", str(copy), *mixed, "--quiet"])
    assert any(c.isupper() for c in cli.stdout) and not any(c.islower() for c in cli.stdout)


def test_an_unknown_level_is_refused_in_one_line(exports, tmp_path):
    """A level this client does not know (a newer format's) is refused in one `error:` line."""
    folder, texts = _folder(exports, "gru")
    copy = tmp_path / "gru-unknown"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    manifest["vocab"]["source"]["level"] = "bytes"
    (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    ours = _run([sys.executable, str(CLIENT), str(copy), texts[0], "--threads", "1"])
    assert ours.returncode == 1 and ours.stdout == ""
    assert ours.stderr.strip().splitlines() == ["error: vocab level 'bytes' is not known"]


NODE_DIR = Path(__file__).resolve().parents[1] / "examples" / "node"


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.skipif(not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir(),
                    reason="run `npm install --ignore-scripts` in examples/node first (.ci/run does)")
def test_node_client_refuses_format_8_vocabularies_in_one_line(exports, tmp_path):
    """examples/node/translate.js (the browser page's search module) reads format 8, and refuses its
    `moses` level and `upper_case`, which it does not run, in one line each (docs/manifest.md)."""
    folder, texts = _folder(exports, "gru")
    plain = subprocess.run(["node", "translate.js", str(folder), texts[0]], cwd=NODE_DIR, capture_output=True,
                           text=True, timeout=120)
    assert plain.returncode == 0 and plain.stdout.strip(), plain.stderr
    for name, change, line in (
            ("moses", lambda v: v["source"].update(level="moses"), "a moses vocabulary needs its tokenizer library"),
            ("upper", lambda v: v["target"].update(upper_case=True), "vocab.target.upper_case is set")):
        copy = tmp_path / name
        shutil.copytree(folder, copy)
        manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
        change(manifest["vocab"])
        (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
        result = subprocess.run(["node", "translate.js", str(copy), texts[0]], cwd=NODE_DIR, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode != 0 and result.stdout == ""
        assert line in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
