"""One place for decoding options (runtime/decoding.py): the table is the schema, the config and the
CLI; ``resolve`` merges caller, manifest and built-in defaults by docs/manifest.md's rules; and
``serve``, ``translate`` (terminal and file) and ``Translator`` decode an export with the same options."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields, replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from s2s_deploy.cli import main
from s2s_deploy.errors import S2SError
from s2s_deploy.format.decoding import OPTIONS, search_schema
from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.format.schema import SCHEMA
from s2s_deploy.runtime.decoding import DecodingError, SearchConfig, resolve
from s2s_deploy.runtime.translator import Translator


@pytest.fixture(scope="module")
def gru(exports):
    return exports.get("gru")[1]


def with_search(manifest, folder: Path, **search) -> Path:
    """A copy of the export whose manifest sets these ``search`` defaults."""
    shutil.copytree(manifest.directory, folder)
    raw = json.loads((folder / "manifest.json").read_text())
    raw["search"].update(search)
    (folder / "manifest.json").write_text(json.dumps(raw))
    return folder


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_the_table_is_the_config_the_schema_and_the_cli() -> None:
    runtime_only = {"vmap"}  # a shortlist is a file the caller opens, never a manifest option
    assert [(f.name, f.default) for f in fields(SearchConfig) if f.name not in runtime_only] == [
        (o.name, o.default) for o in OPTIONS]
    assert SCHEMA["properties"]["search"]["properties"] == search_schema()
    assert set(search_schema()) == {key for o in OPTIONS for key in o.manifest_keys}
    params = {p.name for p in main.commands["translate"].params}
    assert {o.name for o in OPTIONS if o.cli_flag and not o.timed} <= params
    assert not {o.name for o in OPTIONS if o.timed} & params  # text has no time axis
    assert {o.name for o in OPTIONS if o.cli_flag} <= {p.name for p in main.commands["transcribe"].params}
    assert "early_stopping" not in params  # recorded only: no flag


def test_config_checks_each_value_and_the_rules_between_them() -> None:
    with pytest.raises(DecodingError, match="n_best 3 needs a beam of at least 3"):
        SearchConfig(n_best=3)
    with pytest.raises(DecodingError, match=r"sampling \(sampling_topk 0\) needs beam_size 1"):
        SearchConfig(beam_size=4, sampling_topk=0)
    with pytest.raises(ValueError, match="max_len_a must be a finite number"):
        SearchConfig(max_len_a=float("nan"))
    with pytest.raises(DecodingError, match="beam_size must be a whole number"):
        SearchConfig(beam_size=True)
    assert SearchConfig(sampling_topk=0, seed=0).sampling_topk == 0


def test_resolve_rules(gru, tmp_path: Path) -> None:
    folder = with_search(gru, tmp_path / "gru", beam_size=3, alpha=0.5, length_penalty_alpha=1.0, max_len=12,
                         min_len=6, forced_eos=True)
    manifest = load_manifest(folder)
    config = resolve(manifest)
    assert (config.beam_size, config.alpha, config.max_len, config.min_len, config.forced_eos) == (3, 0.5, 12, 6, True)
    assert resolve(manifest, {"max_len": 4}).min_len == 4  # the manifest's min_len yields to a shorter max_len
    assert resolve(manifest, {"forced_eos": False, "sampling_topk": 0, "beam_size": 1}).forced_eos is False
    with pytest.raises(DecodingError, match=r"min_len 7 exceeds max_len 4"):
        resolve(manifest, {"max_len": 4, "min_len": 7})  # the caller's own min_len does not yield
    plain = resolve(gru)
    assert gru.max_target_length is None and "max_len" not in gru.search
    assert plain.max_len == 256 and plain.alpha == gru.search["alpha"]
    with pytest.raises(DecodingError, match=r"n_best 3 needs a beam of at least 3 \(beam_size is 1\)"):
        resolve(gru, {"n_best": 3})
    with pytest.raises(DecodingError, match="unknown decoding option 'top_k'"):
        resolve(gru, {"top_k": 3})
    raw = json.loads((folder / "manifest.json").read_text())
    raw["limits"]["max_target_length"] = 20
    del raw["search"]["max_len"]
    (folder / "manifest.json").write_text(json.dumps(raw))
    limited = load_manifest(folder)
    assert resolve(limited).max_len == 20  # no search.max_len: the position table's limit
    with pytest.raises(DecodingError, match="max_len 21 exceeds the model's limit of 20"):
        resolve(limited, {"max_len": 21})
    assert resolve(gru, {"max_len_a": 0, "max_len_b": 0}).sentence_limits([5]) is None  # 0 is a value, not "unset"


def test_serve_translate_and_translator_pick_the_same_options(gru, tmp_path: Path) -> None:
    """An export whose manifest sets beam, alpha and lengths: serve (a request naming none),
    translate (terminal and --output) and Translator decode with them alike."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from s2s_deploy.serve.app import ServeConfig, create_app, parse_request

    folder = with_search(gru, tmp_path / "gru", beam_size=3, alpha=0.2, max_len=9, min_len=2)
    texts = list(gru.samples[:3])
    translator = Translator(folder, device="cpu", threads=1)
    config = translator.search_config()
    assert (config.beam_size, config.alpha, config.max_len, config.min_len) == (3, 0.2, 9, 2)
    assert parse_request({"texts": texts}, translator, max_beam=16)[1] == config
    want = [f"{t.score:.4f}\t{t.text}" for t in translator(texts)]
    assert want != [f"{t.score:.4f}\t{t.text}" for t in translator(texts, beam=1, alpha=0.75)]
    with TestClient(create_app(ServeConfig(str(folder), threads=1))) as http:
        served = http.post("/translate", json={"texts": texts}).json()["translations"]
        assert http.get("/metadata").json()["decoding"]["beam_size"] == 3
    assert [f"{t['score']:.4f}\t{t['text']}" for t in served] == want
    terminal = run("translate", str(folder), *texts, "--scores", "--device", "cpu")
    assert terminal.exit_code == 0 and terminal.stdout.splitlines() == want, terminal.output
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    filed = run("translate", str(folder), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt"),
                "--scores", "--device", "cpu", "--quiet")
    assert filed.exit_code == 0 and (tmp_path / "out.txt").read_text().splitlines() == want, filed.output


def test_serve_refuses_an_export_whose_default_beam_is_over_max_beam(gru, tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    folder = with_search(gru, tmp_path / "gru", beam_size=4)
    result = run("serve", str(folder), "--max-beam", "2")
    assert result.exit_code == 1 and "beam 4 by default" in result.stderr and "Traceback" not in result.output


def test_cli_keeps_zero_and_false(gru) -> None:
    """``--sampling-topk 0`` samples (it was dropped as equal to False, and decoded greedily)."""
    text, export = gru.samples[0], str(gru.directory)
    greedy = run("translate", export, text, "--device", "cpu")
    sampled = {run("translate", export, text, "--sampling-topk", "0", "--sampling-temperature", "10", "--seed", seed,
                   "--device", "cpu").stdout for seed in ("1", "2")}
    assert greedy.exit_code == 0 and greedy.stdout not in sampled and len(sampled) == 2


@pytest.mark.parametrize(("args", "message"), [
    (["--sampling-topk", "0", "--beam", "4"], "needs beam_size 1, not 4"),
    (["--n-best", "3"], "n_best 3 needs a beam of at least 3"),
    (["--actors", "3"], "--actors needs --ray"),
    (["--stream", "--max-batch-tokens", "9"], "no --max-batch-tokens"),
    (["--alpha", "nan"], "alpha must be a finite number"),
])
def test_cli_refuses_in_one_line(gru, args: list[str], message: str) -> None:
    result = run("translate", str(gru.directory), gru.samples[0], "--device", "cpu", *args)
    assert result.exit_code == 1 and result.stderr.startswith("error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_translator_n_best_without_beam_and_a_bare_string(gru) -> None:
    translator = Translator(gru.directory, device="cpu", threads=1)
    with pytest.raises(S2SError, match="n_best 3 needs a beam"):
        translator([gru.samples[0]], n_best=3)
    with pytest.raises(S2SError, match="n_best 3 needs a beam"):
        translator.translate_ids([gru.src_vocab.encode(gru.samples[0])], n_best=3)
    one = translator(gru.samples[0])  # one sentence, not one per character
    assert len(one) == 1 and one[0].text == translator([gru.samples[0]])[0].text
    config = translator.search_config(beam=2)
    assert translator([gru.samples[0]], config=config) == translator([gru.samples[0]], beam=2)
    with pytest.raises(S2SError, match="not both"):
        translator([gru.samples[0]], beam=2, config=config)
    assert len(translator.score(gru.samples[0], one[0].text)) == 1


def test_score_prints_no_device_notice_on_cpu(gru, tmp_path: Path) -> None:
    (tmp_path / "s.txt").write_text(f"{gru.samples[0]}\n")
    (tmp_path / "t.txt").write_text("x\n")
    result = run("score", str(gru.directory), "--source", str(tmp_path / "s.txt"), "--target", str(tmp_path / "t.txt"),
                 "--device", "cpu")
    assert result.exit_code == 0 and result.stderr == "", result.output


def test_output_takes_every_decoding_option(gru, tmp_path: Path) -> None:
    texts = list(gru.samples[:4])
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    options = ["--no-repeat-ngram-size", "2", "--beam", "2", "--max-len", "10"]
    result = run("translate", str(gru.directory), "--input", str(tmp_path / "in.txt"), "--output",
                 str(tmp_path / "out.txt"), "--device", "cpu", "--quiet", *options)
    assert result.exit_code == 0, result.output
    want = [t.text for t in Translator(gru.directory, device="cpu")(texts, beam=2, max_len=10, no_repeat_ngram_size=2)]
    assert (tmp_path / "out.txt").read_text().splitlines() == want


def test_preset_with_a_bundled_checkpoint_is_honoured_and_said(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from s2s_deploy.architecture.registry import get_plugin
    from s2s_deploy.export.sources import bundled_checkpoint, load_source

    plugin = get_plugin("gru")
    assert bundled_checkpoint(plugin) is not None
    source = load_source(plugin, None, "d2l", tmp_path)
    assert source.config == plugin.preset("d2l") and not source.trained
    assert "preset d2l" in source.description and "--preset asks for them" in source.description


def test_replace_checks_again() -> None:
    with pytest.raises(DecodingError):
        replace(SearchConfig(beam_size=2, n_best=2), beam_size=1)


NODE_DIR = Path(__file__).resolve().parents[1] / "examples" / "node"


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_node_search_module_knows_every_option() -> None:
    """web/search.js's built-in defaults are the table's, so an export's inert settings (a Whisper
    export's timestamp_begin, ...) and the options it runs (timestamps, suppress lists) pass, and an option
    it does not run, turned on, is refused."""
    import subprocess

    script = ("const S = require(process.argv[1]); const m = JSON.parse(process.argv[2]);"
              "try { console.log(JSON.stringify(S.resolve(m))); } catch (e) { console.log('refused: ' + e.message); }")
    module = str(Path(__file__).resolve().parents[1] / "s2s_deploy" / "web" / "search.js")
    defaults = {o.name: list(o.default) if isinstance(o.default, tuple) else o.default for o in OPTIONS}

    def run(search: dict) -> str:
        manifest = json.dumps({"limits": {"max_target_length": 50}, "search": {"length_penalty_alpha": 1, **search}})
        done = subprocess.run(["node", "-e", script, module, manifest], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    resolved = json.loads(run({}))
    assert {k: v for k, v in resolved.items() if k not in ("alpha", "max_len")} == {
        k: v for k, v in defaults.items() if k not in ("alpha", "max_len")}
    assert run({"forced_bos": 5}).startswith("refused: search.forced_bos is set")
    whisper = {"timestamp_begin": 128, "max_initial_timestamp": 10, "time_precision": 0.02, "timestamp_frames": 2}
    assert not run(whisper).startswith("refused")
    assert not run({**whisper, "timestamps": True, "suppress_tokens": [1]}).startswith("refused")  # the page runs them
    assert run({**whisper, "temperature": [0.0, 0.2]}) == (
        "refused: search.temperature is set, which this search module does not run (beam, alpha, length limits, "
        "decoder prompt, suppress lists and timestamps only)")


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.skipif(not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir(),
                    reason="run `npm install --ignore-scripts` in examples/node first (.ci/run does)")
def test_node_search_module_takes_the_same_defaults(gru, tmp_path: Path) -> None:
    """web/search.js (the browser page and the Node example) resolves the manifest's defaults as
    resolve() does, and refuses an export whose defaults turn on an option it does not run."""
    import subprocess

    folder = with_search(gru, tmp_path / "gru", beam_size=3, alpha=0.2, max_len=9)
    texts = list(gru.samples[:3])
    node = subprocess.run(["node", "translate.js", str(folder), *texts], cwd=NODE_DIR, capture_output=True, text=True,
                          timeout=120)
    assert node.returncode == 0, node.stderr
    assert node.stdout.splitlines() == [t.text for t in Translator(folder, device="cpu")(texts)]
    other = with_search(gru, tmp_path / "other", no_repeat_ngram_size=2)
    refused = subprocess.run(["node", "translate.js", str(other), texts[0]], cwd=NODE_DIR, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 1 and "search.no_repeat_ngram_size is set" in refused.stderr


def test_manifest_doc_lists_every_option() -> None:
    """docs/manifest.md's "Resolving the options" table has a row per option of the one table."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "manifest.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Resolving the options"):doc.index("### How `translate` batches")]
    rows = {line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| `")}
    named = {name.strip(" `") for row in rows for name in row.split(",")}
    assert named == {o.name for o in OPTIONS}


@pytest.mark.parametrize(("args", "message"), [
    (["quantize", "nowhere", "--fp16", "--int8-activations", "per-tensor"], "--int8-activations applies to --int8"),
    (["quantize", "nowhere", "--int8", "--limit", "5", "--no-evaluate"], "not with --no-evaluate"),
    (["bench", "nowhere", "--synthetic-dir", "x"], "--synthetic-dir keeps the --synthetic export"),
])
def test_options_that_would_be_ignored_are_refused(args: list[str], message: str) -> None:
    """The sweep: an option whose value another option makes meaningless is one line, not ignored."""
    result = run(*args)
    assert result.exit_code == 1 and message in result.stderr, result.output


@pytest.mark.parametrize(("code", "found"), [
    ("fra_Latn", (3,)),  # exact
    ("fr", (4, 5)),  # wrapped: <|fr|> and __fr__ (ambiguous)
    ("<|fr|>", (4,)),  # exact beats wrapped
    ("en", (6,)),
    ("fra", ()),  # fra_Latn's "_Latn" holds letters: no wrapping
    ("Latn", ()),
    ("de", ()),
    ("", ()),
])
def test_a_code_names_the_token_equal_to_it_or_wrapped_in_it(code: str, found: tuple[int, ...]) -> None:
    """docs/manifest.md's rule, which every client implements alike."""
    from s2s_deploy.format.vocab import Vocabulary

    vocab = Vocabulary(("<pad>", "<bos>", "<eos>", "fra_Latn", "<|fr|>", "__fr__", "<|en|>", "<|translate|>"),
                       "word", languages=(3, 4, 5, 6), tasks=(7,))
    assert vocab.code_ids(code, vocab.languages) == found
    assert vocab.language_id(code) == (found[0] if len(found) == 1 else None)
    assert vocab.task_id("translate") == 7 and vocab.task_id("fr") is None
    assert [vocab.code_of(i) for i in (3, 4, 5, 7)] == ["fra_Latn", "fr", "fr", "translate"]


def test_codes_go_into_the_decoder_prompt(gru, tmp_path: Path) -> None:
    """A language code replaces the prompt's language token or open slot (-1); a task code its task
    token, else it goes right after the language; a prompt with neither refuses a task in one line;
    an open slot needs listed languages."""
    import re

    folder = with_search(gru, tmp_path / "prompted", decoder_prompt=[7, 11, 12])
    raw = json.loads((folder / "manifest.json").read_text())
    tokens = raw["vocab"]["target"]["tokens"]
    raw["vocab"]["target"].update(languages=[7, 9], tasks=[10, 11])
    (folder / "manifest.json").write_text(json.dumps(raw))
    manifest = load_manifest(folder)
    assert resolve(manifest, {"target_lang": tokens[9]}).decoder_prompt == (9, 11, 12)
    assert resolve(manifest, {"target_lang": tokens[9]}).forced_bos == -1
    assert resolve(manifest, {"task": tokens[10]}).decoder_prompt == (7, 10, 12)
    assert resolve(manifest, {"decoder_prompt": [-1, 12], "task": tokens[10]}).decoder_prompt == (-1, 10, 12)
    assert resolve(manifest, {"decoder_prompt": ["-1", tokens[12]], "target_lang": tokens[9]}).decoder_prompt == (9, 12)
    assert resolve(manifest, {"decoder_prompt": [7, 12], "task": tokens[11]}).decoder_prompt == (7, 11, 12)
    with pytest.raises(DecodingError, match=re.escape(f"task {tokens[11]!r}: this export's decoder prompt holds no "
                                                      "task or language token to place it by")):
        resolve(manifest, {"decoder_prompt": [12], "task": tokens[11]})
    with pytest.raises(DecodingError, match=r"decoder_prompt holds -1 .* lists no language tokens"):
        resolve(gru, {"decoder_prompt": [-1]})
    with pytest.raises(DecodingError, match=re.escape("decoder_prompt holds [-2], not target ids")):
        resolve(manifest, {"decoder_prompt": [-2]})


def test_target_lang_is_a_listed_code_made_the_forced_bos(gru, tmp_path: Path) -> None:
    """``target_lang`` (one row of the table) turns a code among the target vocabulary's
    ``languages`` into ``forced_bos``; an unknown code, a vocabulary that lists none and a
    contradicting ``forced_bos`` are each one line."""
    import re

    folder = with_search(gru, tmp_path / "languages")
    raw = json.loads((folder / "manifest.json").read_text())
    tokens = raw["vocab"]["target"]["tokens"]
    raw["vocab"]["target"]["languages"] = [7, 9]
    (folder / "manifest.json").write_text(json.dumps(raw))
    manifest = load_manifest(folder)
    assert manifest.tgt_vocab.languages == (7, 9)
    assert resolve(manifest, {"target_lang": tokens[9]}).forced_bos == 9
    assert resolve(manifest, {}).forced_bos == -1
    assert resolve(manifest, {"target_lang": tokens[7], "forced_bos": 7}).forced_bos == 7
    known = f"unknown target_lang 'xx_Yyyy'; known: {tokens[7]}, {tokens[9]}"
    with pytest.raises(DecodingError, match=re.escape(known)):
        resolve(manifest, {"target_lang": "xx_Yyyy"})
    with pytest.raises(DecodingError, match=re.escape(f"{tokens[9]!r} is id 9, but forced_bos 7 is given too")):
        resolve(manifest, {"target_lang": tokens[9], "forced_bos": 7})
    with pytest.raises(DecodingError, match="this export lists no language codes"):
        resolve(gru, {"target_lang": tokens[9]})
    with pytest.raises(DecodingError, match="target_lang must be a code"):
        resolve(manifest, {"target_lang": 9})
    result = run("translate", str(folder), gru.samples[0], "--device", "cpu", "--target-lang", "xx_Yyyy")
    assert result.exit_code == 1 and result.stderr.startswith("error: unknown target_lang 'xx_Yyyy'; known: ")
    assert len(result.stderr.strip().splitlines()) == 1
    rows = [manifest.src_vocab.encode(text) for text in gru.samples[:3]]
    chosen = Translator(folder, device="cpu", threads=1).translate_ids(rows, beam=2, target_lang=tokens[9])
    assert all(hypotheses[0].tokens[0] == 9 for hypotheses in chosen)
