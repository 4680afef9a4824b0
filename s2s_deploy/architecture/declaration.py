"""The declarative half of the plugin contract: everything generic code may know about an
architecture without building it.

Export, the engine, parity and benchmarks read these specs and nothing else, so a new
architecture is one plugin. If generic code ever needs to branch on an architecture, the
contract is missing a field: add it here instead. Nothing here imports torch, so the registry and
``s2s-deploy list`` read a plugin (name, version, description, presets, exporter) by importing its
declaration alone, as transformers reads a configuration without its modeling module. The model
is named by ``model = "module:Class"`` and imported only by ``build``; the torch half of the
contract (``Seq2SeqModel``, ``StepOutput``) is ``s2s_deploy/modeling/contract.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from s2s_deploy.errors import ContractError, S2SError, UnknownNameError
from s2s_deploy.format.names import TOP_K, TOP_OUTPUTS
from s2s_deploy.format.source import TOKEN_SOURCE, SourceSpec
from s2s_deploy.format.specs import (  # noqa: F401  re-exported: plugins import the specs from the contract
    BATCH,
    MemorySpec,
    StateSpec,
    cross_attention_memory,
    cross_memory_specs,
    layer_name,
    self_attention_cache,
)

EXPORTERS = ("dynamo", "torchscript")
RESERVED_NAMES = frozenset(
    {"src", "src_len", "tokens", "step", "reorder", "log_probs", "attention", TOP_K, *TOP_OUTPUTS}
)
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class SpecialTokens:
    """Names of the special tokens where a vocabulary is built from text (train, seeded random
    weights); a vocabulary from a checkpoint or manifest carries its own special ids."""

    pad: str = "<pad>"
    bos: str = "<bos>"
    eos: str = "<eos>"
    unk: str = "<unk>"
    decoder_start: str = "<bos>"


@dataclass(frozen=True)
class HFWeights:
    """A Hugging Face checkpoint translated by a plugin: its config, and the torch tensors named as
    the plugin's model names them (each tied weight once)."""

    config: Any
    tensors: dict[str, Any]
    src_vocab_size: int
    tgt_vocab_size: int


class ArchitecturePlugin(ABC):
    """One architecture. Subclass it, set the class attributes, and expose an instance."""

    name: ClassVar[str]
    version: ClassVar[str]
    description: ClassVar[str]
    config_type: ClassVar[type]
    presets: ClassVar[Mapping[str, Any]]
    default_preset: ClassVar[str] = "small"
    exporter: ClassVar[str] = "dynamo"
    parity_atol: ClassVar[float] = 1e-4
    parity_rtol: ClassVar[float] = 1e-5
    """Per-step log-probs agree within ``parity_atol + parity_rtol * |log p|`` where a search can
    act (``verify/tolerance.py``; the margins behind the defaults are in docs/parity.md)."""
    special_tokens: ClassVar[SpecialTokens] = SpecialTokens()
    has_attention: ClassVar[bool] = False
    hf_model_types: ClassVar[tuple[str, ...]] = ()
    """``model_type`` values of Hugging Face ``config.json`` files this plugin loads (``from_hf``)."""
    hf_sentencepiece_files: ClassVar[tuple[str, str, str] | None] = None
    """The family's own tokenizer files in a Hugging Face folder, when it ships SentencePiece models
    rather than a ``tokenizer.json``: (source model, target model, JSON mapping piece to model id)."""
    hf_moses_files: ClassVar[tuple[str, str, str] | None] = None
    """The family's Moses + BPE files (FSMT's): (source vocabulary JSON, target vocabulary JSON, the
    ranked merges), exported as ``moses`` vocabularies where transformers loads the folder's tokenizer
    (its ``src_lang``, ``tgt_lang`` and ``do_lower_case``)."""
    hf_ids_only: ClassVar[dict[str, str]] = {}
    """``model_type`` -> why that family's own tokenizer files are not read (a tokenization that no
    vocabulary level holds, or that transformers can no longer load to check against): such a folder
    exports ids only, and the export says why in its one ``exporting ... from`` line."""
    hf_tokenizer_converter: ClassVar[str | None] = None
    """A class of ``transformers.convert_slow_tokenizer`` that turns the family's tokenizer, where
    transformers runs it in Python, into a ``tokenizer.json`` at export (ProphetNet's WordPiece:
    ``"BertConverter"``). A ``tokenizers``-backed tokenizer needs none."""
    hf_language_codes: ClassVar[str | None] = None
    """A regular expression that the target tokens naming a language match in full, for a family
    told which language to write by a forced first token: the export lists those ids in the
    target vocabulary's ``languages``, so ``target_lang`` takes a code instead of an id. (A family
    told its language by a decoder prompt lists them too: Whisper's ``<|fr|>``, which ``target_lang``
    replaces in the prompt and an open slot chooses among.)"""
    hf_task_codes: ClassVar[str | None] = None
    """Likewise for the target tokens naming a task (Whisper's ``<|translate|>``): listed as the
    target vocabulary's ``tasks``, so the ``task`` option takes a code."""
    hf_hidden_tokens: ClassVar[str | None] = None
    """Likewise for target tokens that are never text (Whisper's timestamps ``<|1.20|>``, which its
    tokenizer's ``decode`` filters out): listed as the target vocabulary's ``hidden``, so ``decode``
    drops them as it drops pad and bos."""
    hf_prompt_token: ClassVar[str | None] = None
    """Likewise for the one target token that opens earlier text fed before the start token
    (Whisper's ``<|startofprev|>``): the export writes its id as the search block's ``prompt_start``,
    so the ``prompt`` option takes text."""
    hf_no_speech_token: ClassVar[str | None] = None
    """Likewise for the one target token whose probability right after the start token says a window
    holds no speech (Whisper's ``<|nospeech|>``, ``<|nocaptions|>`` in older vocabularies): the export
    writes its id as the search block's ``no_speech_token``, so ``no_speech_threshold`` can skip silence."""
    hf_files: ClassVar[tuple[str, ...]] = ()
    """JSON files of a Hugging Face folder that ``from_hf`` reads besides ``config.json`` (a speech
    family's ``preprocessor_config.json``: its front end); each must be there, and is passed as ``files``."""
    hf_step_cache: ClassVar[bool] = False
    """Whether ``parity --reference`` steps transformers' model with its own cache, one token a
    step, as ``generate`` does, instead of rerunning the whole prefix without one: for a family
    whose uncached forward computes other logits than its cached ``generate`` (ProphetNet's)."""

    model: ClassVar[str | None] = None
    """``"module:Class"``: the ``Seq2SeqModel`` (modeling/contract.py), called as
    ``Class(config, src_vocab_size, tgt_vocab_size)``. Imported only by ``build``, so a declaration
    whose module leaves torch to this one lists and registers without torch."""

    def build(self, config: Any, src_vocab_size: int, tgt_vocab_size: int) -> Any:
        """A freshly initialised ``Seq2SeqModel``; weights are loaded into it afterwards. Imports
        ``model``; a one-file plugin whose model sits beside it may override this instead."""
        module, _, attr = str(self.model).partition(":")
        try:
            model = getattr(importlib.import_module(module), attr)
        except (ModuleNotFoundError, AttributeError) as exc:
            missing = f"{exc.name}." if isinstance(exc, ModuleNotFoundError) else ""
            if missing and not f"{module}.".startswith(missing):
                raise  # torch or another dependency of the model: the command names the missing extra
            raise ContractError(f"plugin {self.name}: model {self.model!r} cannot be imported: {exc}") from exc
        return model(config, src_vocab_size, tgt_vocab_size)

    @abstractmethod
    def memory_specs(self, config: Any) -> tuple[MemorySpec, ...]: ...

    @abstractmethod
    def state_specs(self, config: Any) -> tuple[StateSpec, ...]: ...

    def source_spec(self, config: Any) -> SourceSpec:
        """What ``encode`` reads as ``src``: token ids unless the plugin declares float features
        (their shape, dtype and the front end that makes them from audio or an image)."""
        return TOKEN_SOURCE

    def max_target_length(self, config: Any) -> int | None:
        """The longest target the model can decode (e.g. its position table), or None."""
        return None

    def max_source_length(self, config: Any) -> int | None:
        return None

    def from_hf(self, hf_config: Mapping[str, Any], tensors: Mapping[str, Any],
                files: Mapping[str, Mapping[str, Any]] | None = None) -> HFWeights:
        """Map a Hugging Face ``config.json`` and state dict onto this plugin's config and names;
        ``files``: the ``hf_files`` it declares, by name (only passed when it declares some)."""
        raise ContractError(f"plugin {self.name} does not load Hugging Face checkpoints")

    def search_defaults(self, config: Any) -> dict[str, Any]:
        """Decoding defaults an export of this model records in its manifest's ``search`` block (names
        of format/decoding.py's table), under those a checkpoint or Hugging Face folder records."""
        return {}

    def hf_search(self, hf_config: Mapping[str, Any], generation: Mapping[str, Any],
                  defaults: dict[str, Any]) -> dict[str, Any]:
        """The search defaults this family's ``generate`` decodes with. ``defaults`` are what the
        generic ``generate`` would use (export/hf.py ``search_defaults``); a family whose own
        ``generate`` does more (a decoder prompt, its own length rules) returns them changed, or
        refuses in one ``CheckpointError`` line what the runtime cannot reproduce."""
        return defaults

    def hf_alignment_heads(self, hf_config: Mapping[str, Any], generation: Mapping[str, Any]) -> tuple[
            tuple[int, int], ...]:
        """The (decoder layer, head) pairs whose cross-attention follows the audio closely enough to time
        words (``export --hf --word-timestamps``); empty: this family has none, and the option is refused."""
        return ()

    def config_from_dict(self, data: Mapping[str, Any]) -> Any:
        """The config a checkpoint's JSON (``dataclasses.asdict``) holds, every value checked. A field
        whose default is itself a frozen dataclass (a front end's parameters) is read the same way."""
        return _dataclass_from_dict(self.name, "", self.config_type, data)

    def preset(self, name: str | None = None) -> Any:
        name = name or self.default_preset
        if name not in self.presets:
            raise UnknownNameError(f"preset of {self.name}", name, list(self.presets))
        return self.presets[name]


MAX_CONFIG_INT = 1 << 24


def _dataclass_from_dict(plugin: str, where: str, kind: Any, data: Any) -> Any:
    """``kind`` (a dataclass type, or a default instance whose values fill what ``data`` leaves out)
    from JSON; lists become tuples, as frozen dataclasses hold them."""
    if not isinstance(data, Mapping):
        raise ContractError(f"{plugin}: config {where.rstrip('.')} must be an object")
    fields = {f.name: f for f in dataclasses.fields(kind)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ContractError(f"{plugin}: unknown config fields {', '.join(where + name for name in unknown)}")
    values = {}
    for name, value in data.items():
        default = getattr(kind, name) if not isinstance(kind, type) else fields[name].default
        if dataclasses.is_dataclass(default):
            values[name] = _dataclass_from_dict(plugin, f"{where}{name}.", default, value)
            continue
        check_config_value(plugin, where + name, value, default)
        values[name] = tuple(value) if isinstance(value, list) else value
    try:
        return dataclasses.replace(kind, **values) if not isinstance(kind, type) else kind(**values)
    except (TypeError, ValueError) as exc:
        raise ContractError(f"{plugin}: invalid config{' ' + where.rstrip('.') if where else ''}: {exc}") from exc


def check_config_value(plugin: str, name: str, value: Any, default: Any) -> None:
    """A config from a checkpoint is untrusted: each value must have its default's type, counts
    at least 1 (0 where the default is 0), floats finite; sizes stay below what a model could hold."""
    where = f"{plugin}: config {name}={value!r:.40}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ContractError(f"{where} must be true or false")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ContractError(f"{where} must be a whole number")
        if not min(default, 1) <= value <= MAX_CONFIG_INT:
            raise ContractError(f"{where} is out of range [{min(default, 1)}, {MAX_CONFIG_INT}]")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ContractError(f"{where} must be a finite number >= 0")
    elif isinstance(default, str) and not isinstance(value, str):
        raise ContractError(f"{where} must be a string")


def validate_plugin(plugin: object) -> None:
    """Fail at registration rather than halfway through an export."""
    if not isinstance(plugin, ArchitecturePlugin):
        raise ContractError(f"{plugin!r} is not an ArchitecturePlugin instance")
    label = getattr(plugin, "name", type(plugin).__name__)
    for attr in ("name", "version", "description", "config_type", "presets"):
        if not hasattr(plugin, attr):
            raise ContractError(f"plugin {label}: missing class attribute {attr!r}")
    if not isinstance(plugin.name, str) or not _NAME.match(plugin.name):
        raise ContractError(f"plugin name {plugin.name!r} must match {_NAME.pattern}")
    config_type = plugin.config_type
    if not dataclasses.is_dataclass(config_type) or not config_type.__dataclass_params__.frozen:
        raise ContractError(f"plugin {label}: config_type must be a frozen dataclass")
    if not plugin.presets or plugin.default_preset not in plugin.presets:
        raise ContractError(f"plugin {label}: default_preset {plugin.default_preset!r} is not a preset")
    for preset_name, config in plugin.presets.items():
        if not isinstance(config, config_type):
            raise ContractError(f"plugin {label}: preset {preset_name!r} is not a {config_type.__name__}")
    if type(plugin).build is ArchitecturePlugin.build and not (
            isinstance(plugin.model, str) and ":" in plugin.model):
        raise ContractError(f"plugin {label}: set model = 'module:Class' (its Seq2SeqModel) or override build()")
    if plugin.exporter not in EXPORTERS:
        raise ContractError(f"plugin {label}: exporter must be one of {', '.join(EXPORTERS)}")
    if not (isinstance(plugin.parity_atol, float) and 0 < plugin.parity_atol < 1):
        raise ContractError(f"plugin {label}: parity_atol must be a float in (0, 1)")
    if not (isinstance(plugin.parity_rtol, float) and 0 <= plugin.parity_rtol < 1):
        raise ContractError(f"plugin {label}: parity_rtol must be a float in [0, 1)")
    for preset_name, config in plugin.presets.items():
        source = plugin.source_spec(config)
        if not isinstance(source, SourceSpec):
            raise ContractError(f"plugin {label} (preset {preset_name}): source_spec() must return a SourceSpec")
        try:
            source.check()
        except S2SError as exc:
            raise ContractError(f"plugin {label} (preset {preset_name}): {exc}") from exc
        _validate_specs(label, preset_name, plugin.memory_specs(config), plugin.state_specs(config))


def _validate_specs(
    label: str, preset: str, memory: tuple[MemorySpec, ...], state: tuple[StateSpec, ...]
) -> None:
    where = f"plugin {label} (preset {preset})"
    names = [m.name for m in memory] + [s.name for s in state]
    for name in names:
        if not _NAME.match(name) or name in RESERVED_NAMES:
            raise ContractError(f"{where}: invalid or reserved tensor name {name!r}")
    if len(set(names)) != len(names):
        raise ContractError(f"{where}: memory and state names must be unique, got {names}")
    if not memory and not state:
        raise ContractError(f"{where}: declares neither memory nor state")
    for m in memory:
        if not isinstance(m, MemorySpec) or m.batch_axis < 0:
            raise ContractError(f"{where}: bad memory spec {m!r}")
    for s in state:
        if not isinstance(s, StateSpec) or s.init not in ("encoder", "zeros") or s.batch_axis < 0:
            raise ContractError(f"{where}: bad state spec {s!r}")
        if s.init == "zeros":
            if s.shape.count(BATCH) != 1 or s.shape.index(BATCH) != s.batch_axis:
                raise ContractError(f"{where}: state {s.name!r} shape needs {BATCH!r} at its batch axis")
            if not all(isinstance(d, int) and d >= 0 for i, d in enumerate(s.shape) if i != s.batch_axis):
                raise ContractError(f"{where}: state {s.name!r} shape must be non-negative ints besides batch")
        if s.grow_axis is not None and (
            s.grow_axis == s.batch_axis or (s.shape and not 0 <= s.grow_axis < len(s.shape))
        ):
            raise ContractError(f"{where}: state {s.name!r} has an invalid grow_axis")
