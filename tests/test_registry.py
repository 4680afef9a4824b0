"""The contract is enforced when a plugin registers, and unknown names list the known ones."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from s2s_deploy.architecture.registry import REGISTRY, Registry
from s2s_deploy.errors import ContractError, S2SError, UnknownNameError
from s2s_deploy.modeling.contract import BATCH, ArchitecturePlugin, MemorySpec, StateSpec, validate_plugin
from s2s_deploy_plugins.transformer import TransformerPlugin


@dataclass(frozen=True)
class TinyConfig:
    width: int = 4


def make_plugin(**overrides: object) -> ArchitecturePlugin:
    """A subclass of the real Transformer plugin with one class attribute or method changed."""
    attrs = {"name": "tiny"} | overrides
    return type("Tiny", (TransformerPlugin,), attrs)()


def test_builtin_plugins_pass_the_contract() -> None:
    for entry in REGISTRY.entries():
        validate_plugin(entry.plugin)
        assert entry.source.startswith("entry point")


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        REGISTRY.get("no-such-arch")
    message = str(info.value)
    assert "no-such-arch" in message
    assert "transformer" in message and "gru" in message


@dataclass
class MutableConfig:
    width: int = 4


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"name": "Bad Name"}, "must match"),
        ({"config_type": MutableConfig, "presets": {"small": MutableConfig()}}, "frozen dataclass"),
        ({"default_preset": "huge"}, "default_preset"),
        ({"presets": {"small": TinyConfig()}}, "is not a TransformerConfig"),
        ({"exporter": "magic"}, "exporter"),
        ({"parity_atol": 0}, "parity_atol"),
        ({"memory_specs": lambda self, c: (MemorySpec("tokens"),)}, "reserved"),
        ({"memory_specs": lambda self, c: (MemorySpec("self_k0"),)}, "unique"),
        ({"state_specs": lambda self, c: (StateSpec("h", 1, "zeros", (2, 3)),)}, "batch"),
        ({"state_specs": lambda self, c: (StateSpec("h", 1, "zeros", (2, BATCH), grow_axis=1),)}, "grow_axis"),
        ({"state_specs": lambda self, c: (StateSpec("h", 1, "later"),)}, "bad state spec"),
        ({"model": None}, "set model = 'module:Class'"),
        ({"model": "no_colon_here"}, "set model = 'module:Class'"),
    ],
)
def test_contract_violations_fail_at_registration(overrides: dict, fragment: str) -> None:
    with pytest.raises(ContractError, match=fragment):
        Registry().register(make_plugin(**overrides), "test")


def test_a_model_that_does_not_import_is_one_line_at_build() -> None:
    config = TransformerPlugin.presets["small"]
    for model in ("s2s_deploy_plugins.models.no_such_module:Transformer", "s2s_deploy_plugins.models.transformer:Nope"):
        plugin = make_plugin(model=model)
        validate_plugin(plugin)
        with pytest.raises(ContractError, match=f"plugin tiny: model '{model}' cannot be imported"):
            plugin.build(config, 10, 10)


def test_registering_imports_no_model() -> None:
    """A declaration names its model; only ``build`` imports it (here a module that cannot exist)."""
    plugin = Registry().register(make_plugin(model="s2s_deploy_plugins.models.never_imported:X"), "test")
    assert plugin.name == "tiny"


def test_not_a_plugin_is_rejected() -> None:
    with pytest.raises(ContractError, match="not an ArchitecturePlugin"):
        Registry().register(object(), "test")


def test_a_name_cannot_be_taken_twice() -> None:
    registry = Registry()
    registry.register(make_plugin(), "first")
    other = type("Other", (TransformerPlugin,), {"name": "tiny", "version": "9"})()
    with pytest.raises(ContractError, match="already registered by first"):
        registry.register(other, "second")


def test_plugin_file_goes_through_the_same_registration(tmp_path: Path) -> None:
    plugin_file = tmp_path / "my_arch.py"
    plugin_file.write_text(
        "from s2s_deploy_plugins.transformer import TransformerPlugin\n"
        "class MyArch(TransformerPlugin):\n"
        "    name = 'myarch'\n"
        "PLUGIN = MyArch()\n"
    )
    registry = Registry()
    assert registry.load_file(plugin_file) == ["myarch"]
    assert registry.get("myarch").name == "myarch"
    assert [e.source for e in registry.entries() if e.plugin.name == "myarch"] == [f"file {plugin_file}"]


def test_a_scoped_registration_is_forgotten_on_leaving(tmp_path: Path) -> None:
    plugin_file = tmp_path / "scoped_arch.py"
    plugin_file.write_text("from s2s_deploy_plugins.transformer import TransformerPlugin\n"
                           "class Scoped(TransformerPlugin):\n    name = 'scoped'\nPLUGIN = Scoped()\n")
    registry = Registry()
    registry.register(make_plugin(), "test")
    with registry.scoped():
        registry.load_file(plugin_file)
        assert "scoped" in {e.plugin.name for e in registry.entries()}
    assert "scoped" not in {e.plugin.name for e in registry.entries()}
    assert make_plugin().name in {e.plugin.name for e in registry.entries()}
    registry.unregister(make_plugin().name)
    assert make_plugin().name not in {e.plugin.name for e in registry.entries()}


def test_plugin_file_errors_are_one_line(tmp_path: Path) -> None:
    registry = Registry()
    with pytest.raises(S2SError, match="not found"):
        registry.load_file(tmp_path / "missing.py")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(S2SError, match="failed to import: boom"):
        registry.load_file(broken)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ContractError, match="defines no PLUGIN"):
        registry.load_file(empty)


def test_config_from_dict_rejects_unknown_fields() -> None:
    plugin = REGISTRY.get("transformer")
    config = plugin.config_from_dict(dataclasses.asdict(plugin.preset()))
    assert config == plugin.preset()
    with pytest.raises(ContractError, match="unknown config fields"):
        plugin.config_from_dict({"d_model": 8, "colour": "red"})




@pytest.mark.parametrize("name", [entry.plugin.name for entry in REGISTRY.entries() if entry.builtin])
def test_every_preset_reads_back_from_its_json(name: str) -> None:
    """A checkpoint stores ``asdict(config)`` as JSON; every plugin's presets read back equal, the
    front ends that Whisper, Speech2Text and TrOCR configs hold as one field included."""
    import json

    plugin = REGISTRY.get(name)
    for preset in plugin.presets.values():
        assert plugin.config_from_dict(json.loads(json.dumps(dataclasses.asdict(preset)))) == preset


@pytest.mark.parametrize(("name", "edit", "message"), [
    ("whisper", {"n_mels": 80}, "unknown config fields n_mels"),
    ("whisper", {"frontend": {"n_mels": "x"}}, "whisper: config frontend.n_mels='x' must be a whole number"),
    ("whisper", {"frontend": {"colour": 1}}, "unknown config fields frontend.colour"),
    ("whisper", {"frontend": 80}, "whisper: config frontend must be an object"),
    ("speech_to_text", {"frontend": {"normalize_means": 1}}, "config frontend.normalize_means=1 must be true or false"),
    ("vision_encoder_decoder", {"frontend": {"resample": 0, "height": 0}}, "frontend.height=0 is out of range"),
])
def test_a_front_end_in_a_config_is_checked_as_the_config_is(name: str, edit: dict, message: str) -> None:
    """The front end's parameters are stated once, in its own dataclass, and a checkpoint's values for
    them are held to the same rules as every other config value; what a checkpoint leaves out of the
    front end is the preset's."""
    plugin = REGISTRY.get(name)
    with pytest.raises(ContractError, match=re.escape(message)):
        plugin.config_from_dict(edit)
    partial = plugin.config_from_dict({"frontend": {"sampling_rate": 8000}} if name != "vision_encoder_decoder"
                                      else {"frontend": {"width": 64}})
    assert partial.frontend == dataclasses.replace(plugin.preset().frontend, **(
        {"sampling_rate": 8000} if name != "vision_encoder_decoder" else {"width": 64}))
