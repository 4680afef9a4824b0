"""One place for decoding options: ``SearchConfig``, made from the option table (format/decoding.py),
checked when it is made, and ``resolve()``, which merges a caller's values, the export's ``search``
defaults and the built-in defaults into it. The CLI, ``Translator``, ``serve``, the file jobs and
Ray all call ``resolve``; docs/manifest.md states its rules. Imports numpy only.

The rules, in order:
1. Each option is the caller's value (None: not given), else the manifest's ``search`` value under
   its name, else under an alias (``alpha``: ``length_penalty_alpha``), else the built-in default.
   The built-in ``max_len`` is ``limits.max_target_length`` (less the prompt's and the decoder prompt's
   tokens), else 256; with a ``prompt``, the export's ``max_len`` yields to that room less the start
   token too, as ``generate`` shrinks ``max_length`` for ``prompt_ids``.
2. A manifest ``min_len`` (never the caller's) yields to a shorter ``max_len``.
3. Token options given as strings become target ids (format/decoding.py says how, per option); a
   code option (``target_lang``, ``task``) becomes the id of the target token it names among the
   vocabulary's list its row names (``languages``, ``tasks``). That id replaces the decoder prompt's
   token of the same list (a language also the open slot, -1); a prompt without one takes it right
   after its token (or open slot) of the row's ``after`` list; else it sets the row's ``sets``
   option (``forced_bos``); else it is refused.
   With ``timestamps`` on, the export must set ``timestamp_begin``, and a decoder prompt ending in the
   id before it (the no-timestamps token) loses that token. A ``prompt`` (text: stripped, tokenised
   after a space) needs the export's ``prompt_start`` and may hold no special, language, task or hidden id;
   so does an ``initial_prompt``, and the two exclude each other.
   A ``preset`` sets its options (``preset_values``) over the export's, under the caller's.
   ``suppress_blank`` adds the tokenised space and EOS to ``begin_suppress_tokens``; a
   ``no_speech_threshold`` needs the export's ``no_speech_token``.
4. Every value is checked against its row, then the rules between options; then against the
   export: a caller's ``max_len`` within the position table, the beam below the vocabulary size,
   every id inside the target vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, make_dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.decoding import BY_NAME, OPEN_SLOT, OPTIONS, Code, Ids, Real, Reals

if TYPE_CHECKING:
    from s2s_deploy.format.manifest import Manifest
    from s2s_deploy.format.vocab import Vocabulary
    from s2s_deploy.runtime.shortlist import Shortlist

NAMES = tuple(option.name for option in OPTIONS)
DEFAULT_MAX_LEN = 256
"""``max_len`` when neither the caller, the manifest nor the model's position table sets one."""


class DecodingError(S2SError, ValueError):
    """An option out of range, or options that contradict each other: one line naming the option.
    ``option``: the one option whose value is refused, named first in the message (a caller that
    spells it otherwise, as ``serve``'s ``beam``, says it its way)."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


_Fields = make_dataclass("_Fields", [(o.name, o.kind.python_type, field(default=o.default)) for o in OPTIONS],
                         frozen=True)
_Fields.__module__ = __name__


@dataclass(frozen=True)
class SearchConfig(_Fields):
    """Every decoding option, by the names of format/decoding.py's table (docs/decoding.md gives
    each one's meaning). ``prefix`` is one tuple of ids for every sentence, or one per sentence.
    With ``max_len_a`` or ``max_len_b`` set, a sentence of ``n`` source tokens (its EOS included)
    stops after ``min(max_len, max(min_len, 1, ceil(max_len_a * n + max_len_b)))`` tokens.

    ``vmap``: a vocabulary shortlist (runtime/shortlist.py), given by ``Translator(..., vmap=FILE)``
    or ``translate --vmap FILE``; not an option of the table, so no manifest or request sets it."""

    vmap: Shortlist | None = None

    def __post_init__(self) -> None:
        check(self)

    def sentence_limits(self, src_len: np.ndarray) -> np.ndarray | None:
        """Each sentence's own maximum length, or None when only ``max_len`` applies."""
        if not (self.max_len_a or self.max_len_b):
            return None
        relative = np.ceil(self.max_len_a * np.asarray(src_len, dtype=np.float64) + self.max_len_b)
        return np.clip(relative, max(self.min_len, 1), self.max_len).astype(np.int64)


def check(config: Any) -> None:
    """DecodingError for a value outside its row's range, or options that contradict each other."""
    for option in OPTIONS:
        problem = option.kind.problem(getattr(config, option.name))
        if problem:
            raise DecodingError(f"{option.name} {problem}", option=option.name)
    if config.n_best > config.beam_size:
        raise DecodingError(f"n_best {config.n_best} needs a beam of at least {config.n_best} "
                            f"(beam_size is {config.beam_size})")
    if config.min_len > config.max_len:
        raise DecodingError(f"min_len {config.min_len} exceeds max_len {config.max_len}")
    if config.sampling_topk != 1 and config.beam_size > 1:
        raise DecodingError(f"sampling (sampling_topk {config.sampling_topk}) needs beam_size 1, "
                            f"not {config.beam_size}")
    if config.timestamps and config.n_best != 1:
        raise DecodingError(f"timestamps give one hypothesis per input: n_best must be 1, not {config.n_best}")
    if any(len(p) >= config.max_len for p in prefixes_of(config)):
        raise DecodingError("a prefix must be shorter than max_len")
    if config.prompt and config.initial_prompt:
        raise DecodingError("give prompt (every window) or initial_prompt (the first window, then carried), not both")
    if config.condition_on_previous_text and config.prompt:
        raise DecodingError("condition_on_previous_text carries earlier text from initial_prompt on: give "
                            "initial_prompt instead of prompt (which feeds every window the same text)")
    if config.condition_on_previous_text and config.prompt_start < 0:
        raise DecodingError("condition_on_previous_text: this export takes no prompt (its search block sets no "
                            "prompt_start), so earlier text cannot be fed")
    if config.batched and (config.condition_on_previous_text or config.initial_prompt):
        raise DecodingError("batched windows are decoded independently, so no earlier text is carried: drop "
                            "condition_on_previous_text and give prompt (fed to every window) for initial_prompt",
                            option="batched")
    if config.no_speech_threshold is not None and config.no_speech_token < 0:
        raise DecodingError("no_speech_threshold: this export names no no-speech token (its search block sets no "
                            "no_speech_token), so no window's no-speech probability is known")
    if config.hallucination_silence_threshold is not None and config.timestamp_begin < 1:
        raise DecodingError("hallucination_silence_threshold: this export has no timestamp tokens (its search block "
                            "sets no timestamp_begin), so no window is timed")


LOG_PROB_THRESHOLD = -1.0
NO_SPEECH_THRESHOLD = 0.6
"""faster-whisper's defaults for ``log_prob_threshold`` and ``no_speech_threshold``: its preset's, and the
lines under which ``transcribe`` calls a text doubtful where the caller set neither."""


def window_options_on(config: Any) -> bool:
    """Whether an option that only window-by-window reading of audio applies is on (the temperature
    fallback, its thresholds, carried text, an initial prompt): runtime/fallback.py's, never text's."""
    return bool(config.temperature or config.condition_on_previous_text or config.initial_prompt
                or config.compression_ratio_threshold is not None or config.log_prob_threshold is not None
                or config.no_speech_threshold is not None or config.hallucination_silence_threshold is not None)


def preset_values(name: str, values: Mapping[str, Any], vocab: Vocabulary) -> dict[str, Any]:
    """The options a ``preset`` sets, from the values it lands on (the export's): ``faster-whisper``
    is faster-whisper 1.2.1's ``WhisperModel.transcribe`` defaults (docs/decoding.md says which, and
    why): beam 5, best of 5, length penalty 1, the temperatures 0, 0.2, ..., 1 with thresholds 2.4
    (compression), -1 (log-prob) and 0.6 (no speech, where the export names a no-speech token),
    earlier text carried until a window ends above 0.5, blanks suppressed first, timestamps with the
    first one at most 1 s, and its ``suppress_tokens=[-1]``: the export's list plus the task tokens,
    the start token, the prompt start and the no-speech token. With ``batched``, it is
    ``BatchedInferencePipeline.transcribe``'s defaults instead: beam 5, length penalty 1, blanks
    suppressed first and the same ``suppress_tokens``; no fallback (it decodes at its first temperature,
    0), no carried text, no timestamps (``without_timestamps=True``)."""
    if not name:
        return {}
    found: dict[str, Any] = {"beam_size": 5, "n_best": 1, "alpha": 1.0, "suppress_blank": True}
    if not values["batched"]:
        found |= {"best_of": 5, "temperature": (0.0, 0.2, 0.4, 0.6, 0.8, 1.0), "compression_ratio_threshold": 2.4,
                  "log_prob_threshold": LOG_PROB_THRESHOLD, "prompt_reset_on_temperature": 0.5}
        if values["prompt_start"] >= 0:
            found["condition_on_previous_text"] = True
        if values["no_speech_token"] >= 0:
            found["no_speech_threshold"] = NO_SPEECH_THRESHOLD
        if values["timestamp_begin"] >= 1:
            found["timestamps"] = True
            found["max_initial_timestamp"] = round(1.0 / values["time_precision"])
    specials = {*vocab.tasks, vocab.decoder_start_id, values["prompt_start"], values["no_speech_token"]}
    found["suppress_tokens"] = tuple(sorted({*values["suppress_tokens"], *(i for i in specials
                                                                           if i is not None and i >= 0)}))
    return found


def prefixes_of(config: Any) -> tuple[tuple[int, ...], ...]:
    """The per-sentence prefixes, or one shared prefix as a 1-tuple (empty when none)."""
    prefix = config.prefix
    if not prefix:
        return ()
    return tuple(tuple(p) for p in prefix) if isinstance(prefix[0], tuple) else (tuple(prefix),)


def manifest_defaults(manifest: Manifest) -> dict[str, Any]:
    """The export's own decoding defaults, by option name: the one reader of the manifest's
    ``search`` block (the schema has typed it). A name beats its alias; lists become tuples."""
    stored = manifest.search
    found = {}
    for option in OPTIONS:
        key = next((key for key in option.manifest_keys if key in stored), None)
        if key is not None:
            found[option.name] = _tupled(stored[key])
    return found


def resolve(manifest: Manifest, given: Mapping[str, Any] | None = None) -> SearchConfig:
    """The SearchConfig a search runs with: ``given`` (option names; None: not given) over the
    manifest's defaults over the built-in ones, checked once (the module's docstring has the rules)."""
    given = {name: value for name, value in (given or {}).items() if value is not None}
    unknown = sorted(set(given) - set(NAMES))
    if unknown:
        raise DecodingError(f"unknown decoding option {unknown[0]!r}; known: {', '.join(NAMES)}")
    vocab = manifest.tgt_vocab
    given = {name: _as_ids(vocab, kind, _tupled(value)) if isinstance(kind := BY_NAME[name].kind, Ids)
             else _as_reals(value) if isinstance(kind, Reals) else _tupled(value) for name, value in given.items()}
    for name, value in given.items():  # the caller's values first, so an error names what they gave
        problem = BY_NAME[name].kind.problem(value)
        if problem:
            raise DecodingError(f"{name} {problem}", option=name)
    limit = manifest.max_target_length
    stored = manifest_defaults(manifest)
    values = {o.name: o.default for o in OPTIONS} | {"max_len": limit or DEFAULT_MAX_LEN} | stored
    preset = given.get("preset", values["preset"])
    values |= preset_values(preset, values | {"batched": given.get("batched", values["batched"])}, vocab) | given
    for option in OPTIONS:
        if isinstance(option.kind, Code) and values[option.name]:
            _place(option, values[option.name], vocab, values, given)
    if values["timestamps"]:
        _timestamped(values, len(vocab))
    if OPEN_SLOT in values["decoder_prompt"] and not vocab.languages:
        raise DecodingError(f"decoder_prompt holds {OPEN_SLOT} (the language the model scores best), but this "
                            "export lists no language tokens")
    if values["prompt"]:
        _prompted(values, vocab, "prompt")
    if values["initial_prompt"]:
        _prompted(values, vocab, "initial_prompt")
    if values["suppress_blank"]:  # as openai-whisper's SuppressBlank: the space and EOS, first token only
        blank = {*vocab.encode(" ", add_eos=False), vocab.eos_id}
        values["begin_suppress_tokens"] = tuple(sorted({*values["begin_suppress_tokens"], *blank}))
    context = 1 + len(values["prompt"]) if values["prompt"] else 0
    prompt = context + len(values["decoder_prompt"])
    if prompt and limit is not None:  # the prompts take decoder positions too
        if "max_len" in given or ("max_len" in stored and not context):
            if values["max_len"] + prompt > limit:
                raise DecodingError(f"max_len {values['max_len']} and the {prompt} prompt tokens fed before the "
                                    f"first generated one exceed the model's limit of {limit} target positions")
        else:  # a default yields: to the limit less the prompts, and with a caller's prompt the start token too,
            room = limit - prompt - (1 if context else 0)  # as generate shrinks max_length to fit prompt_ids
            if room < 1:
                raise DecodingError(f"the {prompt} prompt tokens fed before the first generated one leave no room "
                                    f"in the model's {limit} target positions")
            values["max_len"] = min(values["max_len"], room)
    if "min_len" in stored and "min_len" not in given:
        values["min_len"] = min(stored["min_len"], values["max_len"])
    values = {name: float(value) if isinstance(BY_NAME[name].kind, Real) and value is not None else value
              for name, value in values.items()}
    if "max_len" in given and limit is not None and given["max_len"] > limit:
        raise DecodingError(f"max_len {given['max_len']} exceeds the model's limit of {limit} target tokens "
                            "(its position table)", option="max_len")
    if values["beam_size"] >= len(vocab):
        raise DecodingError(f"beam_size {values['beam_size']} must be smaller than the target vocabulary "
                            f"({len(vocab)} tokens)", option="beam_size")
    if values["encoder_no_repeat_ngram_size"] and manifest.encoder_input.is_features:
        raise DecodingError("encoder_no_repeat_ngram_size bans n-grams of the source's token ids, and this export's "
                            "encoder reads features", option="encoder_no_repeat_ngram_size")
    if values["speculative"]:
        _speculative(manifest, values)
    config = SearchConfig(**values)
    for option in OPTIONS:
        if isinstance(option.kind, Ids):
            _check_in_vocabulary(option.name, getattr(config, option.name), len(vocab))
    return config


def not_greedy(beam_size: int, sampling_topk: int) -> str | None:
    """Why ``speculative`` cannot apply to this search, in one line; None for greedy. Shared by
    ``resolve`` and the search's own ``refusal`` (runtime/speculative.py)."""
    if beam_size != 1:
        return "speculative decoding is greedy only: beam search stays one position a step (--beam 1)"
    if sampling_topk != 1:
        return "speculative decoding is greedy only, not sampling"
    return None


def _speculative(manifest: Manifest, values: Mapping[str, Any]) -> None:
    """Refuse ``speculative`` in one line where it cannot apply; the search refuses the options it
    cannot combine with (runtime/speculative.py's ``refusal``)."""
    problem = not_greedy(values["beam_size"], values["sampling_topk"])
    if problem is not None:
        raise DecodingError(problem, option="speculative")
    if manifest.decoder_multi is None:
        dropped = f" ({manifest.quantization.kind} copies drop it)" if manifest.quantization is not None else ""
        raise DecodingError(f"{manifest.directory} has no k-position decoder step (decoder_multi.onnx){dropped}: "
                            "speculative decoding needs an fp32 export made with `export --multi-step`",
                            option="speculative")


def plain(beam_size: int = 1, max_len: int = 256, n_best: int = 1, **options: Any) -> SearchConfig:
    """A search at the option table's defaults, not an export's: what verification, evaluation and
    benchmarks run when they compare models rather than folders' settings."""
    return SearchConfig(beam_size=beam_size, n_best=n_best, max_len=max_len, **options)


def with_timestamps(config: SearchConfig, size: int) -> SearchConfig:
    """``config`` with ``timestamps`` on by rule 3 (a closing no-timestamps token dropped): how an input
    longer than the encoder's window is read, as ``generate`` turns timestamps on for long-form input."""
    values = {name: getattr(config, name) for name in NAMES} | {"timestamps": True}
    _timestamped(values, size)
    return SearchConfig(**values)


def _as_ids(vocab: Vocabulary, kind: Ids, value: Any) -> Any:
    """A caller's token option as ids: strings per ``kind.strings``, lists as tuples."""
    if kind.strings == "text":
        if isinstance(value, str) and kind.continues:
            return tuple(vocab.encode(" " + value.strip(), add_eos=False)) if value.strip() else ()
        if isinstance(value, str):
            return tuple(vocab.encode(value, add_eos=False))
        if kind.per_sentence and isinstance(value, list | tuple) and value and not _is_int(value[0]):
            return tuple(_as_ids(vocab, Ids("text"), one) for one in value)
        return _tupled(value)
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        return value  # refused by the kind: one token or text is not a list of them
    if kind.strings == "token":
        return tuple(_token_id(vocab, token, kind.open_slot) if isinstance(token, str) else token for token in value)
    return tuple(_as_ids(vocab, Ids("text"), words) for words in value)


def _coded(option: Any, code: str, vocab: Vocabulary) -> int:
    """The id ``code`` names among the target vocabulary's list the row names (``Vocabulary.code_ids``);
    an unknown or ambiguous code is one line naming a few known ones."""
    listed = getattr(vocab, option.kind.among)
    found = vocab.code_ids(code, listed)
    if len(found) == 1:
        return found[0]
    if not listed:
        raise DecodingError(f"{option.name} {code!r}: this export lists no {option.kind.among[:-1]} codes among its "
                            "target tokens")
    if found:
        raise DecodingError(f"{option.name} {code!r} names {', '.join(vocab.tokens[i] for i in found)}: give one "
                            "in full")
    known = [vocab.code_of(i) for i in listed]
    shown = ", ".join(known[:6]) + (f", ... ({len(known)} in all)" if len(known) > 6 else "")
    raise DecodingError(f"unknown {option.name} {code!r}; known: {shown}")


def _place(option: Any, code: str, vocab: Vocabulary, values: dict[str, Any], given: Mapping[str, Any]) -> None:
    """Put the id ``code`` names where its row says (rule 3): into ``values``' decoder prompt, else
    its ``sets`` option."""
    kind, found = option.kind, _coded(option, code, vocab)
    prompt = list(values["decoder_prompt"])

    def slots(among: str) -> list[int]:
        listed = set(getattr(vocab, among))
        return [i for i, token in enumerate(prompt) if token in listed or (among == "languages" and token == OPEN_SLOT)]

    own, anchor = slots(kind.among), slots(kind.after) if kind.after else []
    if own:
        prompt[own[0]] = found
    elif anchor:
        prompt.insert(anchor[0] + 1, found)
    elif kind.sets is not None:
        other = given.get(kind.sets)
        if other is not None and other != found:
            raise DecodingError(f"{option.name} {code!r} is id {found}, but {kind.sets} {other} is given too: "
                                "give one")
        values[kind.sets] = found
        return
    else:
        names = kind.among[:-1] + (f" or {kind.after[:-1]}" if kind.after else "")
        raise DecodingError(f"{option.name} {code!r}: this export's decoder prompt holds no {names} token to "
                            "place it by")
    values["decoder_prompt"] = tuple(prompt)


def _prompted(values: dict[str, Any], vocab: Vocabulary, name: str) -> None:
    """Rule 3: a prompt (``name``: ``prompt`` or ``initial_prompt``) needs the export's ``prompt_start``,
    and holds text: none of the target vocabulary's special, language, task or hidden ids
    (``get_prompt_ids`` refuses special tokens)."""
    start = values["prompt_start"]
    if start < 0:
        raise DecodingError(f"{name}: this export takes no prompt (its search block sets no prompt_start)")
    if start >= len(vocab):
        raise DecodingError(f"prompt_start {start} is outside the target vocabulary (0..{len(vocab) - 1})")
    reserved = {start, *vocab.special_ids().values(), *vocab.languages, *vocab.tasks, *vocab.hidden}
    found = next((i for i in values[name] if i in reserved), None)
    if found is not None:
        raise DecodingError(f"{name} holds {vocab.tokens[found]!r} (id {found}), which is not text")


def _timestamped(values: dict[str, Any], size: int) -> None:
    """Rule 3: timestamps need the export's first timestamp id; the prompt's closing no-timestamps
    token (the id before it) is dropped, as ``generate(return_timestamps=True)`` drops it."""
    begin = values["timestamp_begin"]
    if begin < 1:
        raise DecodingError("timestamps: this export has no timestamp tokens (its search block sets no "
                            "timestamp_begin)")
    if begin >= size:
        raise DecodingError(f"timestamp_begin {begin} is outside the target vocabulary (0..{size - 1})")
    prompt = tuple(values["decoder_prompt"])
    if prompt and prompt[-1] == begin - 1:
        values["decoder_prompt"] = prompt[:-1]


def _token_id(vocab: Vocabulary, token: str, open_slot: bool = False) -> int:
    """A token's id; ``"-1"`` is the open slot where the option allows one (a CLI's strings)."""
    if open_slot and token == str(OPEN_SLOT):
        return OPEN_SLOT
    if token not in vocab.tokens:
        raise DecodingError(f"{token!r} is not a token of the target vocabulary")
    return vocab.tokens.index(token)


def _check_in_vocabulary(name: str, value: tuple[Any, ...], size: int) -> None:
    ids = [i for row in value for i in row] if value and isinstance(value[0], tuple) else list(value)
    outside = [i for i in ids if i >= size]
    if outside:
        raise DecodingError(f"{name} holds id {outside[0]}, outside the target vocabulary (0..{size - 1})")


def _as_reals(value: Any) -> Any:
    """A caller's number list as a tuple of floats; a string is comma-separated (``"0,0.2,0.4"``).
    Anything else is left for the kind to refuse."""
    if isinstance(value, str):
        try:
            return tuple(float(item) for item in value.split(",") if item.strip())
        except ValueError:
            return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (float(value),)
    if isinstance(value, list | tuple) and all(isinstance(v, int | float) and not isinstance(v, bool)
                                                 for v in value):
        return tuple(float(v) for v in value)
    return _tupled(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _tupled(value: Any) -> Any:
    """JSON lists (and a caller's lists) as the tuples a frozen config holds."""
    if isinstance(value, list | tuple):
        return tuple(_tupled(item) for item in value)
    return int(value) if isinstance(value, np.integer) else value
