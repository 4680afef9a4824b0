"""The export folder as one typed document: written readable by others, every byte hashed, every
number held against the graphs, and any tampering one line (or, where a key only describes, the
same translation)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s2s_deploy.architecture.registry import get_plugin
from s2s_deploy.cli import main
from s2s_deploy.errors import ManifestError, S2SError
from s2s_deploy.export.exporter import export_model
from s2s_deploy.export.sources import load_source
from s2s_deploy.format.files import sha256_of
from s2s_deploy.format.manifest import MANIFEST_NAME, load_manifest
from s2s_deploy.runtime.translator import Translator
from s2s_deploy.transforms.fuse import GENERATE_FILE, add_to_manifest, fuse_generate
from s2s_deploy.transforms.quantize import quantize_export
from s2s_deploy.web.bundle import ORT_FILES, write_web_bundle


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def one_line(code: int, stderr: str, fragment: str = "") -> str:
    assert code == 1, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr
    assert fragment in lines[0], lines[0]
    return lines[0]


def copy_of(folder: Path, tmp_path: Path, name: str = "copy") -> Path:
    target = tmp_path / name
    shutil.copytree(folder, target)
    return target


def rewrite(folder: Path, edit: Any) -> None:
    raw = json.loads((folder / MANIFEST_NAME).read_text())
    edit(raw)
    (folder / MANIFEST_NAME).write_text(json.dumps(raw))


@pytest.fixture(scope="module")
def transformer(exports) -> Path:
    return exports.get("transformer")[1].directory


@pytest.fixture(scope="module")
def gru(exports) -> Path:
    return exports.get("gru")[1].directory


# --- the typed document -----------------------------------------------------------------------

def test_the_document_round_trips_and_evolves(gru: Path, tmp_path: Path) -> None:
    """Written back unchanged, the document is the JSON on disk; an evolved copy changes only its key."""
    folder = copy_of(gru, tmp_path)
    manifest = load_manifest(folder)
    on_disk = json.loads((folder / MANIFEST_NAME).read_text())
    assert manifest.to_dict() == on_disk
    manifest.write()
    assert json.loads((folder / MANIFEST_NAME).read_text()) == on_disk
    before = manifest.verify()
    assert set(before) == {"encoder.onnx", "decoder.onnx", "checkpoint.safetensors"} and set(before.values()) == {"ok"}
    evolved = manifest.with_validation(note=1.0)
    assert evolved.to_dict()["validation"]["note"] == 1.0 and manifest.to_dict() == on_disk
    assert load_manifest(folder).search == manifest.search and "alpha" in manifest.search


def test_a_format_6_export_keeps_its_length_penalty_key(gru: Path, tmp_path: Path) -> None:
    """Formats 2 to 6 required ``search.length_penalty_alpha``; format 7 requires the option's own name,
    ``alpha``. An older export still loads, decodes with its alpha and keeps its key when evolved; each
    format refuses a search block without its own key."""
    from s2s_deploy.format.schema import FORMAT
    from s2s_deploy.runtime.decoding import resolve

    folder = copy_of(gru, tmp_path)
    raw = json.loads((folder / MANIFEST_NAME).read_text())
    assert raw["format"] == FORMAT == "s2s-deploy-manifest/8" and "length_penalty_alpha" not in raw["search"]
    raw["search"].pop("alpha")
    (folder / MANIFEST_NAME).write_text(json.dumps(raw))
    with pytest.raises(ManifestError, match="key search: 'alpha' is a required property"):
        load_manifest(folder)
    raw |= {"format": "s2s-deploy-manifest/6", "search": {**raw["search"], "length_penalty_alpha": 0.25}}
    (folder / MANIFEST_NAME).write_text(json.dumps(raw))
    old = load_manifest(folder)
    assert resolve(old).alpha == 0.25
    old.with_validation(note=1.0).write()
    assert json.loads((folder / MANIFEST_NAME).read_text())["format"] == "s2s-deploy-manifest/6"
    raw["search"].pop("length_penalty_alpha")
    (folder / MANIFEST_NAME).write_text(json.dumps(raw | {"search": {**raw["search"], "alpha": 0.25}}))
    with pytest.raises(ManifestError, match="key search: 'length_penalty_alpha' is a required property"):
        load_manifest(folder)


def test_specs_have_one_home() -> None:
    """The contract's specs are the manifest's; the attention helpers give the three plugins' layouts."""
    from s2s_deploy.format import specs
    from s2s_deploy.modeling import contract

    assert contract.MemorySpec is specs.MemorySpec and contract.StateSpec is specs.StateSpec
    cache = specs.self_attention_cache(2, 4, 8)
    assert [s.name for s in cache] == ["self_k0", "self_v0", "self_k1", "self_v1"]
    assert cache[0].zeros_shape(3) == (3, 4, 0, 8) and cache[0].zeros_shape(3, past_len=5) == (3, 4, 5, 8)
    assert [m.name for m in specs.cross_attention_memory(2)] == ["cross_k0", "cross_v0", "cross_k1", "cross_v1"]
    for arch in ("transformer", "bart", "t5"):
        plugin = get_plugin(arch)
        config = plugin.preset()
        assert all(s.grow_axis == 2 and s.init == "zeros" for s in plugin.state_specs(config))
        assert plugin.memory_specs(config)[0].name == "src_bias"


# --- file modes -------------------------------------------------------------------------------

@pytest.fixture
def umask_022() -> Iterator[None]:
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _unreadable(folder: Path) -> list[str]:
    found = []
    for path in [folder, *folder.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        wanted = 0o055 if path.is_dir() else 0o044
        if mode & wanted != wanted:
            found.append(f"{path.relative_to(folder.parent)} {oct(mode)}")
    return found


def test_every_file_written_is_readable_by_others(tmp_path: Path, umask_022: None) -> None:
    """Export, fuse, quantize and web write 0644 files (0755 folders) under a 022 umask, never
    mkstemp's 0600: a web server running as another user must read them."""
    plugin = get_plugin("gru")
    source = load_source(plugin, None, workdir=tmp_path)
    out = tmp_path / "gru"
    export_model(plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, out,
                 checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples[:4])
    manifest = load_manifest(out)
    add_to_manifest(manifest, fuse_generate(manifest, out / GENERATE_FILE, beam=False), beam=False)
    quantize_export(load_manifest(out), "int8", tmp_path / "gru-int8")
    dist = tmp_path / "dist"
    dist.mkdir()
    for name in ORT_FILES:
        (dist / name).write_bytes(b"// onnxruntime-web stand-in for a copy test\n")
    write_web_bundle(out, dist)
    assert (out / GENERATE_FILE).is_file() and (out / "index.html").is_file()
    assert _unreadable(out) + _unreadable(tmp_path / "gru-int8") == []


# --- every byte checked -----------------------------------------------------------------------

def external(folder: Path, role: str = "encoder") -> tuple[Path, str]:
    """Move a graph's weights to an ONNX external-data file beside it; (graph path, data file name)."""
    path, data = folder / f"{role}.onnx", f"{role}.data"
    onnx.save_model(onnx.load(str(path)), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data, size_threshold=1024)
    return path, data


@pytest.fixture(scope="module")
def whole(gru: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gru export with its encoder's weights as external data and a generate.onnx: every
    kind of listed file but tokenizers (tests/test_subword.py flips those)."""
    folder = copy_of(gru, tmp_path_factory.mktemp("whole"), "gru")
    manifest = load_manifest(folder)
    manifest = load_manifest(add_to_manifest(manifest, fuse_generate(manifest, folder / GENERATE_FILE, beam=False),
                                             beam=False).parent)
    path, data = external(folder)
    manifest.with_graph("encoder", path, {data: sha256_of(folder / data)}).write()
    return folder


def untyped_keys(node: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Keys of ``node`` that ``schema`` gives no type, at every level where the schema lists its keys."""
    if isinstance(node, dict) and ("properties" in schema or isinstance(schema.get("additionalProperties"), dict)):
        extra = schema.get("additionalProperties")
        found = []
        for key, value in node.items():
            sub = schema.get("properties", {}).get(key, extra if isinstance(extra, dict) else None)
            found += [f"{where}.{key}"] if sub is None else untyped_keys(value, sub, f"{where}.{key}")
        return found
    if isinstance(node, list) and isinstance(schema.get("items"), dict):
        return [k for i, value in enumerate(node) for k in untyped_keys(value, schema["items"], f"{where}.{i}")]
    return []


def test_the_schema_types_every_key_the_manifest_writes(whole: Path) -> None:
    """The schema is held to the typed manifest: whatever export, fuse, external weights, quantize and a
    features source write is typed by it, and every top-level key it types is one the manifest writes."""
    from s2s_deploy.format.schema import PROPERTIES, SCHEMA

    manifest = load_manifest(whole)
    quantized = manifest.with_quantization("int8", "per-row", 0.9, 17).to_dict()
    features = {"encoder_input": get_plugin("speech").source_spec(get_plugin("speech").preset()).to_json()}
    for document in (manifest.to_dict(), quantized, features):
        assert untyped_keys(document, SCHEMA) == []
    assert set(PROPERTIES) == set(manifest.to_dict()) | set(quantized)
    assert untyped_keys({"vocab": {"target": {"extra": 1}}}, SCHEMA) == [".vocab.target.extra"]


def test_inspect_verify_reports_every_listed_file(whole: Path) -> None:
    code, out, err = run("inspect", "--verify", str(whole))
    assert code == 0, err
    names = {line.split()[1] for line in out.splitlines()}
    assert names == {"encoder.onnx", "decoder.onnx", "encoder.data", GENERATE_FILE, "checkpoint.safetensors"}


def test_one_changed_byte_in_any_listed_file_is_one_line(whole: Path, tmp_path: Path) -> None:
    files = load_manifest(whole).listed_files()
    assert "encoder.data" in files
    for name in files:
        folder = copy_of(whole, tmp_path, name)
        data = bytearray((folder / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (folder / name).write_bytes(bytes(data))
        one_line(*run("translate", str(folder), "March 3")[::2], name)
        code, out, err = run("inspect", "--verify", str(folder))
        one_line(code, err, f"{name} modified")
        assert f"modified     {name}" in out
        shutil.rmtree(folder)


def test_unhashed_external_data_is_refused(gru: Path, tmp_path: Path) -> None:
    """A graph that reads external data the manifest does not hash cannot pass as whole."""
    folder = copy_of(gru, tmp_path)
    manifest = load_manifest(folder)
    path, _ = external(folder)
    manifest.with_graph("encoder", path).write()  # the graph hashed, not the data it reads
    one_line(*run("translate", str(folder), "a")[::2], "which the manifest does not hash")


# --- the manifest's numbers against the graphs ---------------------------------------------------

def _set(raw: dict, key: str | tuple, value: object) -> None:
    """Set (or with ``KeyError`` delete) the value at a dotted key, or at a tuple of keys and indices."""
    *parents, last = key.split(".") if isinstance(key, str) else key
    node: Any = raw
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is KeyError:
        del node[int(last) if isinstance(node, list) else last]
    else:
        node[int(last) if isinstance(node, list) else last] = value


NUMBER_CASES = [  # issue 35's table, and their neighbours
    ("state.0.dtype", "float99", "key state.0.dtype"),
    ("state.0.dtype", "float16", "key state.0.dtype"),
    ("memory.1.dtype", "int64", "key memory.1.dtype"),
    ("state.0.shape", ["batch", "x", 0, 32], "key state.0.shape"),
    ("state.0.shape", ["batch", 4, 0, 31], "key state.0.shape"),
    ("state.0.shape", ["batch", 4, 3, 32], "key state.0.shape"),
    ("state.0.shape", ["batch", 4, 0], "key state.0.shape"),
    ("state.0.batch_axis", 9, "key state.0.batch_axis"),
    ("state.0.batch_axis", 1, "key state.0.batch_axis"),
    ("memory.0.batch_axis", 9, "key memory.0.batch_axis"),
    ("memory.1.batch_axis", 3, "key memory.1.batch_axis"),
    ("state.0.grow_axis", 1, "key state.0.grow_axis"),
    ("state.0.grow_axis", None, "key state.0.grow_axis"),
    ("limits.max_source_length", 10**6, "key limits.max_source_length"),
    ("limits.max_target_length", None, "key limits.max_target_length"),
    ("search.max_len", 5000, "key search.max_len"),
    ("graphs.decoder.inputs.8.shape", ["batch", 4, "past_len"], "key graphs.decoder.inputs.8.shape"),
    ("graphs.encoder.outputs.0.dtype", "float16", "key graphs.encoder.outputs.0.dtype"),
]


@pytest.mark.parametrize(("key", "value", "fragment"), NUMBER_CASES, ids=[f"{k}={v}" for k, v, _ in NUMBER_CASES])
def test_a_number_the_graphs_contradict_is_one_line(transformer: Path, tmp_path: Path, key: str, value: object,
                                                    fragment: str) -> None:
    folder = copy_of(transformer, tmp_path)
    rewrite(folder, lambda raw: _set(raw, key, value))
    one_line(*run("translate", str(folder), "x" * 300, "--beam", "4")[::2], fragment)


def _leaves(node: Any, path: tuple = ()) -> Iterator[tuple]:
    """The path (keys and indices) of every value in a JSON document, containers included."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, (*path, index))
    yield path


STEERING = ("search", "limits", "vocab", "samples")
"""Keys that steer decoding by design (defaults, length limits, token strings): a valid change may
change the translation. Any other key either describes, or is checked, or the folder is refused."""
VALUES = st.one_of(
    st.sampled_from([KeyError, None, True, 0, 1, 2, 3, 9, -1, 10**6, 2**40, 0.5, "", "batch", "float99", "float16",
                     "int64", "zeros", "encoder", [], ["batch", "x", 0, 32], {}, "0" * 64]),
    st.integers(-5, 300), st.text(max_size=8),
)


@pytest.fixture(scope="module")
def mutable(transformer: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[tuple], list]:
    raw = json.loads((transformer / MANIFEST_NAME).read_text())
    keys = sorted({key for key in _leaves(raw) if key and not (key[0] == "samples" and len(key) > 1)
                   and not (len(key) > 3 and key[0] == "vocab" and key[2] == "tokens")}, key=str)
    baseline = Translator(transformer, device="cpu")(["March 3", "the cat"], beam=2, max_len=12)
    return tmp_path_factory.mktemp("mutated"), raw, keys, baseline


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_any_mutated_key_is_one_line_or_the_same_translation(transformer: Path, mutable, data: st.DataObject) -> None:
    """The manifest is not hashed, so every mutation reaches validation: it must be refused in
    one line, or (where the key only describes) leave the translation exact."""
    work, raw, keys, baseline = mutable
    key = data.draw(st.sampled_from(keys), label="key")  # a path of keys and indices
    value = data.draw(VALUES, label="value")
    folder = work / "export"
    if not folder.exists():
        shutil.copytree(transformer, folder)
    mutated = json.loads(json.dumps(raw))
    _set(mutated, key, value)
    (folder / MANIFEST_NAME).write_text(json.dumps(mutated))
    try:
        got = Translator(folder, device="cpu")(["March 3", "the cat"], beam=2, max_len=12)
    except S2SError as exc:
        assert "\n" not in str(exc) and str(exc), repr(exc)
        return
    if key[0] not in STEERING:
        assert got == baseline, f"{key}={value!r} changed the translation"


# --- parity on incomplete folders -----------------------------------------------------------------

@pytest.mark.parametrize("missing", ["checkpoint", "validation", "samples"])
def test_parity_on_an_incomplete_folder_is_one_line_or_an_answer(gru: Path, tmp_path: Path, missing: str) -> None:
    folder = copy_of(gru, tmp_path)
    rewrite(folder, lambda raw: raw.pop(missing))
    code, out, err = run("parity", str(folder), "--beam", "2", "--max-len", "8")
    if missing == "validation":  # parity never reads it: the tolerance is the plugin's
        assert code == 0 and out.strip().endswith("parity: PASS"), err
    else:
        one_line(code, err, "pass --" + ("checkpoint" if missing == "checkpoint" else "input"))


def test_parity_on_a_modified_checkpoint_is_one_line(gru: Path, tmp_path: Path) -> None:
    folder = copy_of(gru, tmp_path)
    data = bytearray((folder / "checkpoint.safetensors").read_bytes())
    data[-1] ^= 0x01
    (folder / "checkpoint.safetensors").write_bytes(bytes(data))
    one_line(*run("parity", str(folder))[::2], "checkpoint.safetensors")
    (folder / "checkpoint.safetensors").unlink()
    one_line(*run("parity", str(folder))[::2], "checkpoint.safetensors is missing")
    assert sha256_of(gru / "checkpoint.safetensors") == load_manifest(gru).checkpoint.sha256


def test_format_8_keys_are_refused_in_an_older_format(gru: Path, tmp_path: Path) -> None:
    """Format 8 added the ``moses`` level and a vocabulary's ``upper_case``: an export that says format 7
    may hold neither (a format-7 reader would misread it), and format 8 reads ``upper_case``."""
    folder = copy_of(gru, tmp_path)
    raw = json.loads((folder / MANIFEST_NAME).read_text())
    assert raw["format"] == "s2s-deploy-manifest/8"
    upper = {**raw, "vocab": {**raw["vocab"], "target": {**raw["vocab"]["target"], "upper_case": True}}}
    (folder / MANIFEST_NAME).write_text(json.dumps(upper))
    assert load_manifest(folder).tgt_vocab.upper_case
    for changed in (upper, {**raw, "vocab": {**raw["vocab"], "source": {**raw["vocab"]["source"], "level": "moses"}}}):
        (folder / MANIFEST_NAME).write_text(json.dumps({**changed, "format": "s2s-deploy-manifest/7"}))
        with pytest.raises(ManifestError, match="key vocab"):
            load_manifest(folder)
    (folder / MANIFEST_NAME).write_text(json.dumps({**raw, "format": "s2s-deploy-manifest/7"}))
    assert not load_manifest(folder).tgt_vocab.upper_case  # a format-7 export without them still loads
