"""Translation tasks: built-in ones generated offline from real locale data, or a user's TSV file.

The built-in tasks need no download: dates come from babel's CLDR data and numbers from
num2words, so every machine generates the same pairs from the same seed. They are small
enough to learn on a CPU yet need real reordering (``March 3`` → ``3 mars``) and agreement
(``twenty-one weeks`` → ``vingt et une semaines``, ``two days`` → ``两天``), not copying.

Years span 1000-9999 so that a model learns to copy digits rather than memorise years. The
``ood`` split checks exactly that, on longer inputs: it is drawn from another seed, only from
the long end of each generator (years, numbers and quantities of 1000-9999, relative dates of
100-999 units), and only from held-out values (one in ten of 100-9999, scattered by a hash),
which no other split ever draws.
"""

from __future__ import annotations

import datetime
import random
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from s2s_deploy.errors import S2SError, UnknownNameError

FIRST_YEAR, LAST_YEAR = 1000, 9999


def _format_date(date: datetime.date, pattern: str, locale: str) -> str:
    """babel's ``format_date``, imported when a built-in task is generated: reading a task's pairs
    (a speech dataset's, on a machine without babel) needs none of it."""
    from babel.dates import format_date

    return format_date(date, pattern, locale=locale)


def _num2words(n: int, lang: str) -> str:
    from num2words import num2words

    return num2words(n, lang=lang)


@dataclass(frozen=True)
class Pair:
    source: str
    target: str


@dataclass(frozen=True)
class SplitSizes:
    train: int = 20000
    valid: int = 1000
    test: int = 1000
    ood: int = 1000


@dataclass(frozen=True)
class TaskSplits:
    """Disjoint by source sentence, so no test source was ever trained on.

    ``ood`` (built-in tasks only) is disjoint from the others by construction: it holds only
    values that the generators of the other splits never draw.
    """

    name: str
    train: tuple[Pair, ...]
    valid: tuple[Pair, ...]
    test: tuple[Pair, ...]
    bleu_tokenize: str = "13a"
    ood: tuple[Pair, ...] = ()


# English source formats of a date; the target keeps the weekday exactly when the source has one.
_EN_DATE_FORMATS: tuple[tuple[str, bool], ...] = (
    ("EEEE, MMMM d, y", True),
    ("EEEE d MMMM y", True),
    ("MMMM d, y", False),
    ("MMM d, y", False),
    ("d MMMM y", False),
    ("y-MM-dd", False),
)


@dataclass(frozen=True)
class Unit:
    """A counted noun: English singular/plural, target singular/plural, and its agreement."""

    en: str
    en_plural: str
    target: str
    target_plural: str
    feminine: bool = False


_FR_UNITS = (
    Unit("day", "days", "jour", "jours"),
    Unit("week", "weeks", "semaine", "semaines", feminine=True),
    Unit("month", "months", "mois", "mois"),
    Unit("year", "years", "an", "ans"),
    Unit("hour", "hours", "heure", "heures", feminine=True),
    Unit("minute", "minutes", "minute", "minutes", feminine=True),
    Unit("night", "nights", "nuit", "nuits", feminine=True),
    Unit("page", "pages", "page", "pages", feminine=True),
    Unit("book", "books", "livre", "livres"),
)

# Chinese has no plural; the target is the measure word (classifier) that follows the number.
_ZH_UNITS = (
    Unit("day", "days", "天", "天"),
    Unit("week", "weeks", "周", "周"),
    Unit("month", "months", "个月", "个月"),
    Unit("year", "years", "年", "年"),
    Unit("hour", "hours", "个小时", "个小时"),
    Unit("minute", "minutes", "分钟", "分钟"),
    Unit("night", "nights", "晚", "晚"),
    Unit("page", "pages", "页", "页"),
    Unit("book", "books", "本书", "本书"),
)

_ZH_DIGITS = "零一二三四五六七八九"


def zh_number(n: int) -> str:
    """Chinese numerals for 0..9999 (num2words has no Chinese): 一千零一, 十五, 两千."""
    if not 0 <= n <= 9999:
        raise ValueError(f"zh_number supports 0..9999, got {n}")
    if n == 0:
        return "零"
    if 10 <= n <= 19:
        return "十" + (_ZH_DIGITS[n - 10] if n > 10 else "")
    parts: list[str] = []
    pending_zero = False
    for value, unit in ((1000, "千"), (100, "百"), (10, "十"), (1, "")):
        digit = n // value % 10
        if digit == 0:
            pending_zero = bool(parts)
            continue
        if pending_zero:
            parts.append("零")
            pending_zero = False
        parts.append(("两" if digit == 2 and value == 1000 else _ZH_DIGITS[digit]) + unit)
    return "".join(parts)


def _fr_feminine(words: str) -> str:
    """French ``un`` agrees with a feminine noun: vingt et une, quatre-vingt-une."""
    return words[:-2] + "une" if words == "un" or words.endswith((" un", "-un")) else words


def _fr_day(day: int) -> str:
    """French writes the first of the month as an ordinal: 1er mars (CLDR gives 1 mars)."""
    return "1er" if day == 1 else str(day)


def held_out(value: int) -> bool:
    """One value in ten from 100 up, scattered by a hash so that every digit still appears in
    every position of the training values: only the ``ood`` split draws these (1975 is one)."""
    return value >= 100 and zlib.crc32(str(value).encode()) % 10 == 0


@dataclass(frozen=True)
class _Ranges:
    """What one family of splits draws: in distribution (train/valid/test) or out of it (ood)."""

    ood: bool

    def value(self, rng: random.Random, low: int, high: int) -> int:
        """A value in [low, high] that is held out exactly when this family is out of distribution."""
        while True:
            n = rng.randint(low, high)
            if held_out(n) == self.ood:
                return n

    def date(self, rng: random.Random) -> datetime.date:
        year = self.value(rng, FIRST_YEAR, LAST_YEAR)
        start = datetime.date(year, 1, 1).toordinal()
        return datetime.date.fromordinal(rng.randint(start, datetime.date(year, 12, 31).toordinal()))

    def count(self, rng: random.Random) -> int:
        """Quantities: everyday small counts half the time in distribution; the long end only out of it."""
        if self.ood:
            return self.value(rng, 1000, 9999)
        roll = rng.random()
        return rng.randint(0, 31) if roll < 0.5 else self.value(rng, 0, 999 if roll < 0.75 else 9999)

    def relative(self, rng: random.Random) -> int:
        """Units before or after a date: 1-999 in distribution, 100-999 out of it."""
        if self.ood:
            return self.value(rng, 100, 999)
        return rng.randint(1, 99) if rng.random() < 0.5 else self.value(rng, 100, 999)


IN_DISTRIBUTION = _Ranges(ood=False)
OUT_OF_DISTRIBUTION = _Ranges(ood=True)


def _en_quantity(n: int, unit: Unit) -> str:
    return f"{_num2words(n, lang='en')} {unit.en if n == 1 else unit.en_plural}"


class _Language:
    """What a target language contributes to the generators."""

    locale: str
    units: tuple[Unit, ...]
    bleu_tokenize = "13a"

    def date(self, date: datetime.date, weekday: bool) -> str:
        raise NotImplementedError

    def number(self, n: int) -> str:
        raise NotImplementedError

    def quantity(self, n: int, unit: Unit) -> str:
        raise NotImplementedError

    def relative(self, quantity: str, after: bool, date: datetime.date) -> str:
        raise NotImplementedError


class _French(_Language):
    locale = "fr"
    units = _FR_UNITS

    def date(self, date: datetime.date, weekday: bool) -> str:
        text = _format_date(date, "full" if weekday else "long", locale=self.locale)
        return re.sub(r"(?<!\d)1 ", "1er ", text, count=1) if date.day == 1 else text

    def number(self, n: int) -> str:
        return _num2words(n, lang="fr")

    def quantity(self, n: int, unit: Unit) -> str:
        words = self.number(n)
        if unit.feminine:
            words = _fr_feminine(words)
        # French counts zero and one in the singular: zéro jour, un jour, deux jours.
        return f"{words} {unit.target if n <= 1 else unit.target_plural}"

    def relative(self, quantity: str, after: bool, date: datetime.date) -> str:
        month = _format_date(date, "MMMM", locale=self.locale)
        return f"{quantity} {'après' if after else 'avant'} le {_fr_day(date.day)} {month}"


class _Chinese(_Language):
    locale = "zh"
    units = _ZH_UNITS
    bleu_tokenize = "zh"

    def date(self, date: datetime.date, weekday: bool) -> str:
        return _format_date(date, "full" if weekday else "long", locale=self.locale)

    def number(self, n: int) -> str:
        return zh_number(n)

    def quantity(self, n: int, unit: Unit) -> str:
        # Before a measure word two is 两, not 二: 两天, 两个月 (but 十二天).
        return f"{'两' if n == 2 else zh_number(n)}{unit.target}"

    def relative(self, quantity: str, after: bool, date: datetime.date) -> str:
        return f"{_format_date(date, 'M月d日', locale=self.locale)}{'后' if after else '前'}{quantity}"


def _gen_date(lang: _Language, rng: random.Random, ranges: _Ranges) -> Pair:
    date = ranges.date(rng)
    pattern, weekday = rng.choice(_EN_DATE_FORMATS)
    return Pair(_format_date(date, pattern, locale="en"), lang.date(date, weekday))


def _gen_number(lang: _Language, rng: random.Random, ranges: _Ranges) -> Pair:
    if ranges.ood:
        n = ranges.value(rng, 1000, 9999)
    else:
        n = ranges.value(rng, 0, 9999) if rng.random() < 0.7 else ranges.value(rng, 0, 199)
    return Pair(_num2words(n, lang="en"), lang.number(n))


def _gen_quantity(lang: _Language, rng: random.Random, ranges: _Ranges) -> Pair:
    n, unit = ranges.count(rng), rng.choice(lang.units)
    return Pair(_en_quantity(n, unit), lang.quantity(n, unit))


def _gen_relative(lang: _Language, rng: random.Random, ranges: _Ranges) -> Pair:
    n, unit = ranges.relative(rng), rng.choice(lang.units[:4])
    date, after = ranges.date(rng), rng.random() < 0.5
    source = f"{_en_quantity(n, unit)} {'after' if after else 'before'} {_format_date(date, 'MMMM d', locale='en')}"
    return Pair(source, lang.relative(lang.quantity(n, unit), after, date))


_GENERATORS: tuple[tuple[Callable[[_Language, random.Random, _Ranges], Pair], float], ...] = (
    (_gen_date, 0.35),
    (_gen_number, 0.25),
    (_gen_quantity, 0.25),
    (_gen_relative, 0.15),
)

BUILTIN_TASKS: dict[str, _Language] = {"en-fr": _French(), "en-zh": _Chinese()}
DEFAULT_TASK = "en-fr"


def generate_pairs(name: str, count: int, seed: int = 0, ood: bool = False) -> list[Pair]:
    """``count`` distinct-source pairs of a built-in task, the same for the same seed everywhere.

    ``ood`` draws the out-of-distribution family, from its own seed stream.
    """
    if name not in BUILTIN_TASKS:
        raise UnknownNameError("task", name, list(BUILTIN_TASKS))
    lang = BUILTIN_TASKS[name]
    ranges = OUT_OF_DISTRIBUTION if ood else IN_DISTRIBUTION
    rng = random.Random(f"{name}/ood/{seed}" if ood else f"{name}/{seed}")
    generators = [g for g, _ in _GENERATORS]
    weights = [w for _, w in _GENERATORS]
    pairs: dict[str, Pair] = {}
    attempts = 0
    while len(pairs) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise S2SError(f"task {name}: cannot generate {count} distinct pairs")
        pair = rng.choices(generators, weights)[0](lang, rng, ranges)
        pairs.setdefault(pair.source, pair)
    return list(pairs.values())


@lru_cache(maxsize=8)
def load_task(name_or_path: str, seed: int = 0, sizes: SplitSizes = SplitSizes()) -> TaskSplits:
    """A built-in task by name, or a user's ``source<TAB>target`` file split deterministically.

    A directory holding ``train.tsv``, ``valid.tsv`` and ``test.tsv`` is used as it is split
    (and ``ood.tsv`` when present). ``sizes`` applies to built-in tasks only.
    """
    if name_or_path in BUILTIN_TASKS:
        # valid and test come first in the seeded stream, so they stay the same whatever the train size
        pairs = generate_pairs(name_or_path, sizes.train + sizes.valid + sizes.test, seed)
        valid_end = sizes.valid
        test_end = valid_end + sizes.test
        return TaskSplits(
            name_or_path, tuple(pairs[test_end:]), tuple(pairs[:valid_end]), tuple(pairs[valid_end:test_end]),
            BUILTIN_TASKS[name_or_path].bleu_tokenize, tuple(generate_pairs(name_or_path, sizes.ood, seed, ood=True)),
        )
    path = Path(name_or_path)
    if path.is_dir():
        splits = [read_tsv(path / f"{split}.tsv") for split in ("train", "valid", "test")]
        ood = tuple(read_tsv(path / "ood.tsv")) if (path / "ood.tsv").is_file() else ()
        return TaskSplits(str(path), *map(tuple, splits), _tokenize_for(p for s in splits for p in s), ood)
    if path.suffix or path.exists() or "/" in name_or_path or "\\" in name_or_path:
        return split_pairs(str(path), read_tsv(path), seed)
    raise UnknownNameError("task (or TSV file)", name_or_path, list(BUILTIN_TASKS))


def read_tsv(path: str | Path) -> list[Pair]:
    """``source<TAB>target[<TAB>anything]`` per line, as in the seeds' fra-eng data; blank lines skip."""
    path = Path(path)
    if not path.is_file():
        raise S2SError(f"task file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise S2SError(f"{path} is not UTF-8 text: {exc}") from exc
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.replace("\u202f", " ").replace("\xa0", " ")
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise S2SError(f"{path}:{number}: expected source<TAB>target, found no tab")
        source, target = fields[0].strip(), fields[1].strip()
        if not source or not target:
            raise S2SError(f"{path}:{number}: empty source or target")
        pairs.append(Pair(source, target))
    if not pairs:
        raise S2SError(f"{path} holds no source<TAB>target pairs")
    return pairs


def split_pairs(name: str, pairs: list[Pair], seed: int = 0) -> TaskSplits:
    """Split one file 90/5/5 by distinct source (at most 1000 each for valid and test)."""
    by_source: dict[str, list[Pair]] = {}
    for pair in dict.fromkeys(pairs):
        by_source.setdefault(pair.source, []).append(pair)
    sources = list(by_source)
    if len(sources) < 3:
        raise S2SError(f"{name}: need at least 3 distinct sources to split, found {len(sources)}")
    random.Random(f"split/{seed}").shuffle(sources)
    held_out = min(1000, max(1, round(len(sources) * 0.05)))

    def gather(chunk: list[str]) -> tuple[Pair, ...]:
        return tuple(p for s in chunk for p in by_source[s])

    return TaskSplits(
        name, gather(sources[2 * held_out:]), gather(sources[:held_out]), gather(sources[held_out:2 * held_out]),
        _tokenize_for(pairs),
    )


def _tokenize_for(pairs: Iterable[Pair]) -> str:
    """sacrebleu's ``zh`` tokenizer when targets contain CJK ideographs, ``13a`` otherwise."""
    return "zh" if any("\u4e00" <= ch <= "\u9fff" for p in pairs for ch in p.target) else "13a"
