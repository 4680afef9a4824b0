"""The decoding options as data: one row per option, the one table that the manifest schema's
``search`` block, the search's ``SearchConfig`` (runtime/decoding.py) and the CLI's decoding
options are all made from. Adding an option is adding a row (and teaching the search its meaning).

A row says the option's name, its kind (whole number, number, switch, token ids), its built-in
default, the CLI flag and help, and any older manifest key that also sets it. Standard library only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Literal

MAX_DECODE = 1 << 16
"""The most target tokens this runtime decodes: the step loop keeps (rows, max_len) arrays, so a
typo must not allocate gigabytes. Also the schema's bound on every count."""
MAX_IDS = 4096
MAX_ID = 10_000_000
OPEN_SLOT = -1
"""A ``decoder_prompt`` entry: the token of the vocabulary's ``languages`` the model scores best
at that position (language detection), per sentence."""


@dataclass(frozen=True)
class Whole:
    """An integer in ``[low, high]`` (``high`` None: unbounded)."""

    low: int = 0
    high: int | None = MAX_DECODE
    python_type = int

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be a whole number, not {shown(value)}"
        if value < self.low or (self.high is not None and value > self.high):
            return f"must be {_bounds(self.low, self.high)}, not {value}"
        return None

    def schema(self) -> dict[str, Any]:
        bounds = {"minimum": self.low} | ({"maximum": self.high} if self.high is not None else {})
        return {"type": "integer", **bounds}


@dataclass(frozen=True)
class Real:
    """A finite number in ``[low, high]``, or ``(low, high]`` when ``open_low``; with ``nullable``
    also None (off: a threshold that is not applied)."""

    low: float = 0.0
    high: float = 1e6
    open_low: bool = False
    nullable: bool = False
    python_type = float

    def problem(self, value: Any) -> str | None:
        if value is None and self.nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return f"must be a finite number, not {shown(value)}"
        if value < self.low or (self.open_low and value == self.low) or value > self.high:
            low = f"above {self.low:g}" if self.open_low else f">= {self.low:g}"
            return f"must be {low} and <= {self.high:g}, not {value:g}"
        return None

    def schema(self) -> dict[str, Any]:
        low = {"exclusiveMinimum": self.low} if self.open_low else {"minimum": self.low}
        return {"type": ["number", "null"] if self.nullable else "number", **low, "maximum": self.high}


@dataclass(frozen=True)
class Reals:
    """A tuple of at most ``MAX_REALS`` finite numbers in ``[low, high]`` (``temperature``'s schedule);
    a caller's string is comma-separated (``"0,0.2,0.4"``)."""

    low: float = 0.0
    high: float = 1e6
    python_type = tuple[float, ...]

    def problem(self, value: Any) -> str | None:
        if isinstance(value, str):
            return f"must be numbers, comma-separated (0,0.2,0.4), not {value!r:.40}"
        if not isinstance(value, tuple) or len(value) > MAX_REALS:
            return f"must be a tuple of at most {MAX_REALS} numbers, not {value!r:.40}"
        for item in value:
            problem = Real(self.low, self.high).problem(item)
            if problem:
                return f"holds a value that {problem}"
        return None

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "maxItems": MAX_REALS,
                "items": {"type": "number", "minimum": self.low, "maximum": self.high}}


@dataclass(frozen=True)
class Switch:
    python_type = bool

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else f"must be true or false, not {shown(value)}"

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


IDS_GIVEN = {"text": "text or a list of target ids", "token": "a list of tokens or target ids",
             "texts": "a list of texts or of target id lists"}
"""What a caller may give a token option, in the words of JSON (HTTP, manifests) and of Python lists alike."""


@dataclass(frozen=True)
class Ids:
    """Target ids. ``strings`` says what a caller's string means: ``"text"`` is tokenised into the
    ids (the whole option), ``"token"`` is one vocabulary entry (each item), ``"texts"`` makes each
    item a tokenised sequence (a list of id sequences)."""

    strings: Literal["text", "token", "texts"]
    per_sentence: bool = False
    """A caller (never a manifest) may also give one id tuple per sentence of the batch."""
    open_slot: bool = False
    """``OPEN_SLOT`` (-1) may stand for an id (``decoder_prompt``'s language detection)."""
    continues: bool = False
    """A string is earlier text that the output continues (``prompt``): stripped, then tokenised after
    one space, as a tokenizer splits it in running text (Whisper's ``get_prompt_ids``)."""

    @property
    def nested(self) -> bool:
        return self.strings == "texts"

    @property
    def python_type(self) -> Any:
        return tuple[tuple[int, ...], ...] if self.nested else tuple[int, ...]

    def problem(self, value: Any) -> str | None:
        if self.per_sentence and isinstance(value, tuple) and value and isinstance(value[0], tuple):
            return next(filter(None, (replace(self, per_sentence=False).problem(row) for row in value)), None)
        rows = value if self.nested else (value,)
        if not isinstance(value, tuple) or not all(isinstance(row, tuple) for row in rows):
            return f"must be {IDS_GIVEN[self.strings]}, not {shown(value)}"
        for row in rows:
            low = OPEN_SLOT if self.open_slot else 0
            if any(isinstance(i, bool) or not isinstance(i, int) or i < low for i in row):
                return f"holds {shown(row)}, not target ids"
            if self.nested and not row:
                return "holds an empty sequence"
        return None

    def schema(self) -> dict[str, Any]:
        low = OPEN_SLOT if self.open_slot else 0
        ids = {"type": "array", "maxItems": MAX_IDS, "items": {"type": "integer", "minimum": low, "maximum": MAX_ID}}
        return {"type": "array", "maxItems": MAX_IDS, "items": ids} if self.nested else ids


@dataclass(frozen=True)
class OneOf:
    """One of a few JSON values (``early_stopping``: true, false or "never")."""

    values: tuple[Any, ...]
    python_type = Any

    def problem(self, value: Any) -> str | None:
        ok = any(value is v if isinstance(v, bool) else (value == v and not isinstance(value, bool))
                 for v in self.values)
        return None if ok else f"must be one of {', '.join(map(shown, self.values))}, not {shown(value)}"

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.values)}


@dataclass(frozen=True)
class Code:
    """A code naming one of the target tokens the vocabulary lists under ``among`` (``languages``,
    ``tasks``; docs/manifest.md's rule). Resolve puts that token's id into the decoder prompt in
    place of one of the same list (or of the open slot, for ``languages``); a prompt without one
    takes it right after its token of list ``after``; else it sets option ``sets``. ``""``: none."""

    among: Literal["languages", "tasks"]
    sets: str | None = None
    after: Literal["languages"] | None = None
    python_type = str

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, str) or len(value) > MAX_CODE:
            return f"must be a code of at most {MAX_CODE} characters, not {shown(value)}"
        return None

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "maxLength": MAX_CODE}


MAX_CODE = 64
MAX_REALS = 64
Kind = Whole | Real | Reals | Switch | Ids | OneOf | Code
WINDOW_CUTS = ("fixed", "pause")
"""``window_cut``'s values: windows at fixed offsets, or ending at pauses (runtime/pauses.py)."""
PRESETS = ("", "faster-whisper")
"""``preset``'s values: none, or faster-whisper's ``WhisperModel.transcribe`` defaults
(runtime/decoding.py's ``preset_values`` says which options each sets)."""


@dataclass(frozen=True)
class Option:
    """One decoding option. ``flag``: the CLI's, ``""`` for ``--name-with-dashes``, None for none.
    ``aliases``: older manifest keys that set it too, weaker than ``name``. ``shown_default``: the
    default in words where it is not ``default`` itself (``resolve`` derives it). ``more_flags``:
    other CLI spellings of the same option (``--language`` for ``--target-lang``). ``timed``: it applies
    only to inputs with a time axis (audio), so commands that read other media do not offer it."""

    name: str
    kind: Kind
    default: Any
    help: str
    flag: str | None = ""
    aliases: tuple[str, ...] = ()
    shown_default: str | None = None
    more_flags: tuple[str, ...] = ()
    timed: bool = False

    @property
    def cli_flag(self) -> str | None:
        return None if self.flag is None else self.flag or "--" + self.name.replace("_", "-")

    @property
    def manifest_keys(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


OPTIONS: tuple[Option, ...] = (
    Option("beam_size", Whole(1), 1, "Beam size; 1 is greedy.", flag="--beam"),
    Option("n_best", Whole(1), 1, "Print the N best hypotheses per sentence (N <= beam)."),
    Option("max_len", Whole(1), 256, "Most target tokens, EOS included.",
           shown_default="the model's position limit, else 256"),
    Option("alpha", Real(0.0), 0.75, "Length penalty: score = log P / L**alpha.",
           aliases=("length_penalty_alpha",)),  # the key manifest formats 2 to 6 required
    Option("min_len", Whole(0), 0, "Forbid EOS before this many tokens."),
    Option("sampling_topk", Whole(0), 1, "Sample from the K best; 0: all; 1: no sampling (greedy)."),
    Option("sampling_topp", Real(0.0, 1.0, open_low=True), 1.0, "Nucleus: sample from the smallest head of mass P."),
    Option("sampling_temperature", Real(0.0, open_low=True), 1.0, "Divide log-probs by T before sampling."),
    Option("seed", Whole(0, None), 0, "Sampling seed; one stream per sentence."),
    Option("repetition_penalty", Real(0.0, open_low=True), 1.0,
           "Multiply the log-prob of tokens already generated by P (1: off)."),
    Option("no_repeat_ngram_size", Whole(0), 0, "Never repeat an n-gram of this size (0: off)."),
    Option("encoder_no_repeat_ngram_size", Whole(0), 0,
           "Never produce an n-gram of this size that the source sentence's ids hold (0: off; Hugging Face's "
           "encoder_no_repeat_ngram_size; token sources only)."),
    Option("prefix", Ids("text", per_sentence=True), (), "Target text forced at the start of every translation."),
    Option("suppress_tokens", Ids("token"), (), "Never produce this target token (repeatable).", flag="--suppress"),
    Option("disable_unk", Switch(), False, "Never produce <unk>."),
    Option("bad_words_ids", Ids("texts"), (), "Never produce this target text (tokenised; repeatable).",
           flag="--bad-words"),
    Option("forced_eos", Switch(), False, "End every hypothesis with EOS at its max length."),
    Option("max_len_a", Real(0.0), 0.0, "Per sentence: max length = ceil(a * source tokens + b) (0, 0: off)."),
    Option("max_len_b", Whole(0), 0, "See --max-len-a."),
    Option("early_stopping", OneOf((False, True, "never")), False,
           "Hugging Face's beam stopping rule: false, true (stop at K finished) or \"never\" (judge at max_len).",
           flag=None),
    Option("forced_bos", Whole(-1, MAX_ID), -1,
           "Hugging Face's forced_bos_token_id: this id first (unless a prefix), scored 0; -1: none.", flag=None),
    Option("begin_suppress_tokens", Ids("token"), (),
           "Never produce this target token as the first generated one (repeatable).", flag="--begin-suppress"),
    Option("decoder_prompt", Ids("token", open_slot=True), (),
           "Target tokens fed after the start token, before the first generated one: not scored, not counted in "
           "max_len, not in the output (repeatable; Whisper's language, task and no-timestamps tokens; -1: the "
           "listed language the model scores best there).",
           flag="--decoder-prompt"),
    Option("target_lang", Code("languages", sets="forced_bos"), "",
           "Target language by its code (a token the export lists as a language: fra_Latn, fr for <|fr|>): "
           "in the decoder prompt's language slot, else forced first.",
           shown_default="none", more_flags=("--language",)),
    Option("task", Code("tasks", after="languages"), "",
           "Task by its code (a token the export lists as a task: translate for <|translate|>), in the decoder "
           "prompt.", shown_default="none"),
    Option("prompt", Ids("text", continues=True), (),
           "Earlier text (the previous passage, names, spellings) fed before the start token after prompt_start: "
           "not scored, not counted in max_len, not in the output (Whisper's initial prompt).", flag="--prompt"),
    Option("prompt_start", Whole(-1, MAX_ID), -1,
           "The token fed before a prompt's text (Whisper's <|startofprev|>). -1: the export takes no prompt.",
           flag=None),
    Option("timestamps", Switch(), False,
           "Timestamp tokens between segments (ids from timestamp_begin on), by the rules of docs/decoding.md; "
           "audio longer than the encoder's window is then decoded window by window.", flag="--timestamps",
           timed=True),
    Option("batched", Switch(), False,
           "Batched long-form, as faster-whisper's BatchedInferencePipeline: each input cut into fixed windows of "
           "the encoder's length (with --vad, its speech windows), every window decoded once, independently (no "
           "earlier text, its own language), the windows of all inputs in shared batches; times mapped back.",
           flag="--batched", timed=True),
    Option("timestamp_begin", Whole(-1, MAX_ID), -1,
           "The first timestamp token (0 s); every id from it on is one; the id before it is the no-timestamps "
           "token. -1: the export has none.", flag=None),
    Option("max_initial_timestamp", Whole(-1), -1,
           "The latest timestamp index the first generated token may be (-1: any).", flag=None),
    Option("time_precision", Real(0.0, 60.0, open_low=True), 0.02, "Seconds per timestamp index.", flag=None),
    Option("timestamp_frames", Whole(1), 2, "Encoder input frames per timestamp index (window seeking).",
           flag=None),
    Option("window_cut", OneOf(WINDOW_CUTS), "fixed",
           "How audio longer than the encoder's window is cut into windows when no timestamps say where each "
           "window's text ends: fixed (every window full) or pause (each window ends at its quietest moment in "
           "its last 40%, so no word is split; docs/manifest.md).", timed=True),
    Option("preset", OneOf(PRESETS), "",
           "A bundle of defaults over the export's: faster-whisper (its WhisperModel.transcribe defaults: beam 5, "
           "temperature fallback, thresholds, condition_on_previous_text, timestamps, ...; with batched, "
           "BatchedInferencePipeline.transcribe's: beam 5, no fallback, no timestamps); options given override it.",
           shown_default="none"),
    Option("temperature", Reals(0.0, 100.0), (),
           "Temperature fallback, read window by window (comma-separated, e.g. 0,0.2,0.4,0.6,0.8,1): each window "
           "decoded at the first, again at the next while a threshold fails; 0: the search as configured, above "
           "0: sampling (best_of draws). Empty: off.", shown_default="off"),
    Option("best_of", Whole(1, 64), 1, "Sampled candidates per window at a fallback temperature above 0; the "
           "best-scored is kept."),
    Option("compression_ratio_threshold", Real(0.0, nullable=True), None,
           "Fallback when a window's text compresses (zlib) by more than this ratio (repetition). None: off.",
           shown_default="off"),
    Option("log_prob_threshold", Real(-1e6, 0.0, nullable=True), None,
           "Fallback when a window's average token log-prob is below this. None: off.", shown_default="off"),
    Option("no_speech_threshold", Real(0.0, 1.0, nullable=True), None,
           "Skip a window whose no-speech probability exceeds this, unless its average log-prob clears "
           "log_prob_threshold; needs the export's no_speech_token. None: off.", shown_default="off"),
    Option("no_speech_token", Whole(-1, MAX_ID), -1,
           "The token whose probability right after the start token is a window's no-speech probability "
           "(Whisper's <|nospeech|>). -1: the export has none.", flag=None),
    Option("condition_on_previous_text", Switch(), False,
           "Feed each window the text of the input's earlier windows as its prompt (after prompt_start), "
           "until a window ends at a temperature above prompt_reset_on_temperature."),
    Option("initial_prompt", Ids("text", continues=True), (),
           "Earlier text fed to an input's first window only (then carried with condition_on_previous_text), "
           "as faster-whisper's initial_prompt; prompt feeds every window instead."),
    Option("prompt_reset_on_temperature", Real(0.0, 100.0), 0.5,
           "With condition_on_previous_text: a window that ends at a temperature above this feeds no earlier "
           "text to the next."),
    Option("hallucination_silence_threshold", Real(0.0, nullable=True), None,
           "Skip silences longer than this (seconds) before a possible hallucination, as faster-whisper times "
           "words (its word timing is then on: an export made with --word-timestamps). None: off.",
           shown_default="off"),
    Option("speculative", Whole(0, 64), 0,
           "Exact speculative greedy: verify up to K tokens drafted from the source and the hypothesis in one "
           "decoder pass; the same tokens as greedy (0: off)."),
    Option("suppress_blank", Switch(), False,
           "Never produce a blank (the tokenised space) or EOS as the first generated token."),
)
BY_NAME = {option.name: option for option in OPTIONS}


def search_schema() -> dict[str, Any]:
    """The manifest's ``search`` block as JSON Schema: every option by name and alias."""
    return {key: option.kind.schema() for option in OPTIONS for key in option.manifest_keys}


def shown(value: Any) -> str:
    """A refused value as JSON writes it (``true``, ``"x"``, ``[1, 2]``): options arrive as JSON (manifests,
    HTTP requests) or as Python values that JSON writes alike; at most 40 characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):  # not JSON: a Python caller's object
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bounds(low: int, high: int | None) -> str:
    return f">= {low}" if high is None else f"between {low} and {high}"
