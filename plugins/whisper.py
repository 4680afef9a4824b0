"""Hugging Face Whisper (``WhisperForConditionalGeneration``, ``model_type`` ``whisper``), written
from ``transformers``' arithmetic without importing it; transcription (or translation), with
timestamps when the runtime's ``timestamps`` option is on, long-form audio always, and a prompt of
earlier text (``prompt``, after ``<|startofprev|>``: ``hf_prompt_token``).

The encoder reads ``(batch, n_mels, frames)`` log-mel features from the ``whisper_log_mel`` front
end, whose parameters come from the folder's ``preprocessor_config.json``: two convolutions
(kernel 3, strides 1 and 2, exact GELU after each), the stored position table, pre-norm layers and
a final LayerNorm. Its window must be the model's (``2 * max_source_positions`` frames), as
``transformers`` requires. Frames past a clip's length are zeroed before each convolution and
masked in attention, so padding never leaks in; the front end's fixed window makes every clip
full length anyway. The decoder is ``s2s_deploy.modeling.parts``' pre-norm stack with a learned
position table from 0, a self-attention K/V cache per layer, cross K/V computed once by the
encoder and the output projection tied to the token table. Whisper's key projections have no bias.

Decoding follows ``WhisperForConditionalGeneration.generate`` (transformers 5.24): the decoder
prompt ``<|startoftranscript|> [language] [task] <|notimestamps|>`` from ``generation_config.json``
becomes the export's ``decoder_prompt`` (fed, not scored, not counted), ``suppress_tokens`` and
``begin_suppress_tokens`` stay as they are, and the length limits count new tokens as Whisper's
``generate`` does. A language left open becomes the prompt's open slot: the search picks the listed
language token the first step scores best, as ``detect_language`` does; the tokenizer's ``<|xx|>``
tokens are listed as the languages and ``<|transcribe|>`` and ``<|translate|>`` as the tasks, so
``--language`` and ``--task`` take codes. ``timestamp_settings`` gives the runtime's ``timestamps``
option what ``generate(return_timestamps=True)`` reads (the first timestamp id,
``max_initial_timestamp_index``, 0.02 s and 2 frames per index); the rules and the window-by-window
seeking are the runtime's, stated by those numbers alone (docs/decoding.md). The temperature
fallback, no-speech detection and ``condition_on_prev_tokens`` are refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from s2s_deploy.architecture.declaration import HFWeights
from s2s_deploy.architecture.encoder_decoder import EncoderDecoderConfig, EncoderDecoderPlugin
from s2s_deploy.errors import CheckpointError, S2SError
from s2s_deploy.format.decoding import OPEN_SLOT
from s2s_deploy.format.source import FEATURES, FRAMES, SourceSpec
from s2s_deploy.format.specs import MemorySpec, StateSpec
from s2s_deploy.frontends import WhisperLogMel

PREPROCESSOR_FILE = "preprocessor_config.json"
TASKS = ("transcribe", "translate")
TIME_PRECISION = 0.02
"""Seconds per timestamp index: ``generate``'s ``time_precision`` default, which no config file sets."""
GENERATE_MAX_LENGTH = 20
"""``max_length`` when generation_config.json sets none (``generate``'s default)."""
LONG_FORM_SETTINGS = ("logprob_threshold", "no_speech_threshold", "compression_ratio_threshold")
"""generation_config.json settings of Whisper's temperature fallback and no-speech detection."""
WHISPER_ONLY = ("language", "task", "lang_to_id", "task_to_id", "no_timestamps_token_id", "is_multilingual",
                "return_timestamps", "max_initial_timestamp_index", "condition_on_prev_tokens", *LONG_FORM_SETTINGS)
"""generation_config.json keys that only Whisper's generate reads (``GenerationConfig`` defines none of them)."""

TINY_FRONTEND = WhisperLogMel(chunk_length=1)
"""The tiny preset's front end: Whisper's, with a 1 s window."""


@dataclass(frozen=True)
class WhisperConfig:
    """``config.json``'s sizes and the front end (``preprocessor_config.json``), whose parameters its
    own config states (the tiny preset's window is 1 s)."""

    frontend: WhisperLogMel = TINY_FRONTEND
    d_model: int = 64
    encoder_layers: int = 2
    decoder_layers: int = 2
    encoder_attention_heads: int = 4
    decoder_attention_heads: int = 4
    encoder_ffn_dim: int = 128
    decoder_ffn_dim: int = 128
    max_source_positions: int = 50
    max_target_positions: int = 64
    activation_function: str = "gelu"
    tie_word_embeddings: bool = True

    @property
    def n_mels(self) -> int:
        """The mel bins the first convolution reads."""
        return self.frontend.n_mels

    @property
    def frames(self) -> int:
        """The encoder's window: two frames per encoder position (conv2's stride)."""
        return 2 * self.max_source_positions

    def layers(self) -> EncoderDecoderConfig:
        """The shared parts' config: pre-norm layers, final LayerNorms, a learned target table from 0,
        a target table of its own (the encoder reads features) tied to the output projection."""
        return EncoderDecoderConfig(
            d_model=self.d_model, encoder_layers=self.encoder_layers, decoder_layers=self.decoder_layers,
            encoder_attention_heads=self.encoder_attention_heads, decoder_attention_heads=self.decoder_attention_heads,
            encoder_ffn_dim=self.encoder_ffn_dim, decoder_ffn_dim=self.decoder_ffn_dim,
            max_position_embeddings=self.max_target_positions, activation_function=self.activation_function,
            normalize_before=True, final_layer_norm=True, layernorm_embedding=False, positions="learned_from_zero",
            shared_embeddings=False, tie_word_embeddings=self.tie_word_embeddings)


def _setting(hf: Mapping[str, Any], generation: Mapping[str, Any], key: str) -> Any:
    """generation_config.json first, then config.json (older folders keep generation keys there)."""
    return generation[key] if key in generation else hf.get(key)


def _language_id(language: str, lang_to_id: Mapping[str, int]) -> int:
    """A language code (``en``) or token (``<|en|>``) as generate's ``lang_to_id`` maps it."""
    for token in (language.lower(), f"<|{language.lower()}|>"):
        if token in lang_to_id:
            return int(lang_to_id[token])
    raise CheckpointError(f"generation_config.json: language {language!r} is not in lang_to_id; give a code such "
                          f"as {next(iter(lang_to_id), '<|en|>')!r} without the brackets")


def decoder_prompt(hf: Mapping[str, Any], generation: Mapping[str, Any]) -> tuple[int, ...]:
    """The tokens Whisper's ``generate`` puts after ``<|startoftranscript|>`` for one window without
    timestamps (``_retrieve_init_tokens``): ``forced_decoder_ids`` when neither ``language`` nor
    ``task`` is set, then the language, the task and ``<|notimestamps|>``. Where ``generate`` would
    detect the language from the audio, the prompt holds the open slot (-1) there, and no task
    token unless one is set, as ``generate`` appends none then."""
    language, task = generation.get("language"), generation.get("task")
    prompt: list[int | None] = []
    if language is None and task is None:
        forced = _setting(hf, generation, "forced_decoder_ids") or []
        if forced and forced[0][0] == 1:
            for position, (index, token) in enumerate(forced, start=1):
                if index != position:
                    raise CheckpointError(f"forced_decoder_ids {forced!r} do not follow Whisper's prompt pattern")
                prompt.append(token)
    if isinstance(language, list | tuple):
        raise CheckpointError("generation_config.json names one language per clip; s2s-deploy takes one language")
    lang_to_id, task_to_id = generation.get("lang_to_id"), generation.get("task_to_id")
    language_id = None
    if language is not None:
        if not isinstance(lang_to_id, Mapping):
            raise CheckpointError("generation_config.json sets a language but has no lang_to_id")
        language_id = _language_id(str(language), lang_to_id)
    elif isinstance(lang_to_id, Mapping) and (not prompt or prompt[0] is None):
        language_id = OPEN_SLOT  # generate's detect_language: the search picks it per clip
    if language_id is not None:
        if prompt:
            prompt[0] = language_id
        else:
            prompt.append(language_id)
    if task is not None:
        if task not in TASKS or not isinstance(task_to_id, Mapping) or task not in task_to_id:
            raise CheckpointError(f"generation_config.json: task {task!r} is not one of {', '.join(TASKS)} in "
                                  "its task_to_id")
        prompt.append(int(task_to_id[task]))
    elif language is not None and isinstance(task_to_id, Mapping) and not set(prompt) & set(task_to_id.values()):
        prompt.append(int(task_to_id["transcribe"]))
    no_timestamps = generation.get("no_timestamps_token_id")
    if no_timestamps is not None and (prompt[-1] if prompt else None) != no_timestamps:
        prompt.append(int(no_timestamps))
    return tuple(int(token) for token in prompt if token is not None)


def timestamp_settings(hf: Mapping[str, Any], generation: Mapping[str, Any]) -> dict[str, Any]:
    """What the runtime's ``timestamps`` option needs, as ``generate(return_timestamps=True)`` reads
    it: the first timestamp id (the one after ``<|notimestamps|>``), ``max_initial_timestamp_index``,
    0.02 s per index and two encoder frames per index (the second convolution's stride). None when
    the vocabulary has no id after ``<|notimestamps|>``."""
    no_timestamps = generation.get("no_timestamps_token_id")
    if no_timestamps is None or int(no_timestamps) + 1 >= int(hf["vocab_size"]):
        return {}
    found = {"timestamp_begin": int(no_timestamps) + 1, "time_precision": TIME_PRECISION, "timestamp_frames": 2}
    initial = generation.get("max_initial_timestamp_index")
    if initial is not None:
        found["max_initial_timestamp"] = int(initial)
    return found


class WhisperPlugin(EncoderDecoderPlugin):
    name = "whisper"
    version = "1.0"
    description = "Hugging Face Whisper: log-mel features, two convolutions, pre-norm Transformer, timestamps"
    config_type = WhisperConfig
    has_attention = False  # the attention pictures label source tokens; this source is frames
    presets: ClassVar[dict[str, WhisperConfig]] = {"tiny": WhisperConfig()}
    default_preset = "tiny"
    hf_model_types = ("whisper",)
    hf_language_codes = r"<\|[a-z]{2,3}\|>"  # every code of transformers' Whisper LANGUAGES: en, haw, yue, ...
    hf_task_codes = r"<\|(transcribe|translate)\|>"
    hf_hidden_tokens = r"<\|\d+\.\d\d\|>"  # timestamps: WhisperTokenizer.decode drops them from text
    hf_prompt_token = r"<\|startofprev\|>"  # get_prompt_ids puts it before the prompt's text
    hf_no_speech_token = r"<\|(nospeech|nocaptions)\|>"  # openai-whisper's tokenizer.no_speech, by either name
    hf_files = (PREPROCESSOR_FILE,)
    model = "s2s_deploy_plugins.models.whisper:WhisperModel"

    def source_spec(self, config: WhisperConfig) -> SourceSpec:
        """``(n_mels, frames)`` log-mel features; padding frames are masked, so their value is moot."""
        return SourceSpec(kind=FEATURES, shape=(config.n_mels, FRAMES), dtype="float32",
                          frontend=config.frontend.to_json())

    def memory_specs(self, config: WhisperConfig) -> tuple[MemorySpec, ...]:  # type: ignore[override]
        return super().memory_specs(config.layers())

    def state_specs(self, config: WhisperConfig) -> tuple[StateSpec, ...]:  # type: ignore[override]
        return super().state_specs(config.layers())

    def max_target_length(self, config: WhisperConfig) -> int | None:
        return config.max_target_positions

    def max_source_length(self, config: WhisperConfig) -> int | None:
        return config.frames

    def from_hf(self, hf: Mapping[str, Any], tensors: Mapping[str, Any],
                files: Mapping[str, Mapping[str, Any]] | None = None) -> HFWeights:
        """``config.json`` and the front end of ``preprocessor_config.json``, which must fill the
        encoder's window exactly; weights under ``transformers``' names minus ``model.``."""
        try:
            frontend = WhisperLogMel.from_preprocessor_config((files or {})[PREPROCESSOR_FILE])
        except (S2SError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{PREPROCESSOR_FILE}: {exc}") from exc
        tie = hf.get("tie_word_embeddings", True) is not False
        config = WhisperConfig(
            frontend=frontend, d_model=int(hf["d_model"]),
            encoder_layers=int(hf["encoder_layers"]), decoder_layers=int(hf["decoder_layers"]),
            encoder_attention_heads=int(hf["encoder_attention_heads"]),
            decoder_attention_heads=int(hf["decoder_attention_heads"]), encoder_ffn_dim=int(hf["encoder_ffn_dim"]),
            decoder_ffn_dim=int(hf["decoder_ffn_dim"]), max_source_positions=int(hf["max_source_positions"]),
            max_target_positions=int(hf["max_target_positions"]),
            activation_function=str(hf.get("activation_function", "gelu")), tie_word_embeddings=tie)
        if int(hf.get("num_mel_bins", config.n_mels)) != config.n_mels:
            raise CheckpointError(f"{PREPROCESSOR_FILE} makes {config.n_mels} mel bins, config.json's num_mel_bins "
                                  f"is {hf['num_mel_bins']}")
        if frontend.n_frames != config.frames:
            raise CheckpointError(f"{PREPROCESSOR_FILE} makes windows of {frontend.n_frames} frames; the encoder "
                                  f"reads exactly {config.frames} (2 x max_source_positions)")
        vocab = int(hf["vocab_size"])
        weights: dict[str, Any] = {}
        for name, tensor in tensors.items():
            key = name.removeprefix("model.")
            if key == "proj_out.weight":
                if tie:
                    continue
                key = "lm_head.weight"
            weights[key] = tensor
        if "final_logits_bias" not in weights:  # a zero bias, made by the tensors' own torch
            weights["final_logits_bias"] = next(iter(tensors.values())).new_zeros((1, vocab))
        return HFWeights(config, weights, vocab, vocab)

    def hf_alignment_heads(self, hf: Mapping[str, Any], generation: Mapping[str, Any]) -> tuple[
            tuple[int, int], ...]:
        """generation_config.json's ``alignment_heads`` (what ``return_token_timestamps`` reads), else every
        head of the last half of the decoder layers, as openai-whisper's default ``alignment_heads``."""
        heads = generation.get("alignment_heads")
        if heads is None:
            layers, per_layer = int(hf["decoder_layers"]), int(hf["decoder_attention_heads"])
            return tuple((layer, head) for layer in range(layers // 2, layers) for head in range(per_layer))
        try:
            found = tuple((int(layer), int(head)) for layer, head in heads)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"generation_config.json: alignment_heads {heads!r} is not a list of [layer, "
                                  "head] pairs") from exc
        if not found:
            raise CheckpointError("generation_config.json: alignment_heads is empty")
        return found

    def hf_search(self, hf: Mapping[str, Any], generation: Mapping[str, Any],
                  defaults: dict[str, Any]) -> dict[str, Any]:
        """Whisper's ``generate``: its decoder prompt, new-token lengths counted after it, no sampling
        (it samples only when given a temperature), and the timestamp settings."""
        if generation.get("return_timestamps"):
            raise CheckpointError("generation_config.json turns timestamps on by default (return_timestamps): "
                                  "remove it to export, and ask for them at run time (transcribe --timestamps)")
        if generation.get("condition_on_prev_tokens"):
            raise CheckpointError("generation_config.json sets condition_on_prev_tokens: earlier text is carried "
                                  "at run time here (transcribe --condition-on-previous-text); remove it to export")
        for key in LONG_FORM_SETTINGS:
            if generation.get(key) is not None:
                raise CheckpointError(f"generation_config.json sets {key}: Whisper's temperature fallback and "
                                      "no-speech skip are run-time options here (transcribe --temperature, "
                                      "--log-prob-threshold, ...; docs/decoding.md); remove it to export")
        if generation.get("_from_model_config"):
            # transformers drops a generation_config.json's keys it does not define (Whisper's lang_to_id,
            # language, no_timestamps_token_id, ...) when the file says it was made from config.json
            generation = {key: value for key, value in generation.items() if key not in WHISPER_ONLY}
        prompt = decoder_prompt(hf, generation)
        fed = 1 + len(prompt)  # the start token and the prompt: generate's decoder_input_ids
        positions = int(hf["max_target_positions"])
        found = {k: v for k, v in defaults.items() if not k.startswith("sampling_")}
        new_tokens = _setting(hf, generation, "max_new_tokens")
        if new_tokens is not None:
            if int(new_tokens) + fed > positions:
                raise CheckpointError(f"generation_config.json: max_new_tokens {new_tokens} and the {fed}-token "
                                      f"prompt exceed max_target_positions {positions}")
            found["max_len"] = int(new_tokens)
        else:  # _set_max_new_tokens_and_length: max_length grows by the prompt, within the table
            max_length = _setting(hf, generation, "max_length") or GENERATE_MAX_LENGTH
            total = min(int(max_length) + min(positions // 2 - 1, fed), positions)
            if total <= fed:
                raise CheckpointError(f"generation_config.json: max_length {max_length} leaves no new token after "
                                      f"the {fed}-token prompt")
            found["max_len"] = total - fed
        if _setting(hf, generation, "min_new_tokens") is None:  # min_length counts the prompt too
            found["min_len"] = max(0, int(_setting(hf, generation, "min_length") or 0) - fed)
        if prompt:
            found["decoder_prompt"] = list(prompt)
        found |= timestamp_settings(hf, generation)
        return found


PLUGIN = WhisperPlugin()
