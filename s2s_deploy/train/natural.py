"""Natural phrasings of a built-in task's sources: the same values and targets, said as people say them.

The task's generators write each English source one way (``March 3, 2021``; ``one thousand, nine
hundred and eighty-four``), and espeak-ng reads digits one way too (``2021`` as "two thousand and
twenty-one"). People say ``March third, twenty twenty-one``, ``the 5th of July 1999``, ``nineteen
eighty-four``, ``a hundred and five``, ``an hour``. A speech model trained only on the generator's
forms hears only those, so this module writes every family of the task (dates with and without a
weekday, numbers, quantities, relative dates) in spoken forms, each with the target the task's own
target language gives the same value. Values are drawn as the task draws them in distribution
(``tasks.IN_DISTRIBUTION``): no held-out ``ood`` value appears.

    natural_pairs("en-fr", 1000, seed=0)   # distinct sources, the same for the same seed everywhere
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable

from s2s_deploy.errors import S2SError, UnknownNameError
from s2s_deploy.train.tasks import BUILTIN_TASKS, IN_DISTRIBUTION, Pair, Unit, _Language, _num2words

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def cardinal(n: int, rng: random.Random) -> str:
    """``n`` in words as a speaker says it: British "and" or American without, no commas, "a hundred"
    for one hundred now and then, "twelve hundred" for round hundreds above a thousand."""
    if 1100 <= n <= 9999 and n % 100 == 0 and n % 1000 and rng.random() < 0.5:
        return f"{_num2words(n // 100, 'en')} hundred"
    words = _num2words(n, "en").replace(",", "")
    if rng.random() < 0.4:
        words = words.replace(" and ", " ")
    if words.startswith("one hundred") or words.startswith("one thousand"):
        words = ("a" if rng.random() < 0.3 else "one") + words[3:]
    return words


def year_words(year: int, rng: random.Random) -> str:
    """A year of 1000-9999 as it is spoken: "nineteen eighty-four", "twenty twenty-one", "two thousand
    and five", "nineteen oh five", "nineteen hundred", "two thousand"."""
    high, low = divmod(year, 100)
    if year % 1000 == 0:
        return f"{ONES[year // 1000]} thousand"
    if year % 1000 < 10 and (high % 10 == 0 or rng.random() < 0.5):
        return f"{ONES[year // 1000]} thousand{' and' if rng.random() < 0.6 else ''} {ONES[year % 10]}"
    if high % 10 == 0 and rng.random() < 0.5:  # 2021: "two thousand and twenty-one" as often as "twenty twenty-one"
        return cardinal(year, rng)
    if low == 0:
        return f"{_num2words(high, 'en')} hundred"
    if low < 10:
        return f"{_num2words(high, 'en')} {'oh' if rng.random() < 0.8 else 'hundred and'} {ONES[low]}"
    return f"{_num2words(high, 'en')} {_num2words(low, 'en')}"


def day_words(day: int, rng: random.Random) -> str:
    """The day of the month as an ordinal, in words ("third") or in digits ("3rd", read by the synthesiser)."""
    if rng.random() < 0.7:
        return _ordinal(day)
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def _ordinal(day: int) -> str:
    from num2words import num2words

    return str(num2words(day, to="ordinal", lang="en"))


def month_day(date: datetime.date, rng: random.Random) -> str:
    """"March third", "the third of March", "March the 3rd", "3rd March"."""
    month, day = MONTHS[date.month - 1], day_words(date.day, rng)
    return rng.choice((f"{month} {day}", f"the {day} of {month}", f"{month} the {day}", f"{day} of {month}",
                       f"{month} {day}"))


def _date(lang: _Language, rng: random.Random) -> Pair:
    date = IN_DISTRIBUTION.date(rng)
    if rng.random() < 0.5:  # people mostly name years near their own
        date = date.replace(year=IN_DISTRIBUTION.value(rng, 1900, 2099), day=min(date.day, 28))
    weekday = rng.random() < 0.35
    year = year_words(date.year, rng) if rng.random() < 0.8 else str(date.year)
    said = month_day(date, rng)
    said = f"{said}, {year}" if rng.random() < 0.6 else f"{said} {year}"
    if weekday:
        said = f"{WEEKDAYS[date.weekday()]}{rng.choice((', ', ' '))}{said}"
    return Pair(said, lang.date(date, weekday))


def _number(lang: _Language, rng: random.Random) -> Pair:
    n = IN_DISTRIBUTION.value(rng, 0, 9999) if rng.random() < 0.7 else IN_DISTRIBUTION.value(rng, 0, 199)
    if 1100 <= n <= 9999 and n % 1000 >= 10 and (n // 100) % 10 and rng.random() < 0.3:
        said = year_words(n, rng)  # "nineteen eighty-four"
    else:
        said = cardinal(n, rng)
    return Pair(said, lang.number(n))


def quantity_words(n: int, unit: Unit, rng: random.Random) -> str:
    """"a day", "an hour", "one week", "3 days", "a hundred and five pages"."""
    if n == 1 and rng.random() < 0.6:
        return f"{'an' if unit.en == 'hour' else 'a'} {unit.en}"
    number = str(n) if rng.random() < 0.2 else cardinal(n, rng)
    return f"{number} {unit.en if n == 1 else unit.en_plural}"


def _quantity(lang: _Language, rng: random.Random) -> Pair:
    n, unit = IN_DISTRIBUTION.count(rng) if rng.random() < 0.85 else 1, rng.choice(lang.units)  # "a week"
    return Pair(quantity_words(n, unit, rng), lang.quantity(n, unit))


def _relative(lang: _Language, rng: random.Random) -> Pair:
    n, unit = IN_DISTRIBUTION.relative(rng) if rng.random() < 0.85 else 1, rng.choice(lang.units[:4])
    date, after = IN_DISTRIBUTION.date(rng), rng.random() < 0.5
    said = f"{quantity_words(n, unit, rng)} {'after' if after else 'before'} {month_day(date, rng)}"
    return Pair(said, lang.relative(lang.quantity(n, unit), after, date))


GENERATORS: tuple[tuple[Callable[[_Language, random.Random], Pair], float], ...] = (
    (_date, 0.4), (_number, 0.2), (_quantity, 0.2), (_relative, 0.2))
"""Dates weigh most: they carry the most ways of saying one value."""


def natural_pairs(name: str, count: int, seed: int = 0, exclude: frozenset[str] = frozenset()) -> list[Pair]:
    """``count`` distinct-source natural phrasings of built-in task ``name``, none of whose sources is
    in ``exclude``; the same for the same seed everywhere (its own seed stream, not the task's)."""
    if name not in BUILTIN_TASKS:
        raise UnknownNameError("task", name, list(BUILTIN_TASKS))
    lang = BUILTIN_TASKS[name]
    rng = random.Random(f"{name}/natural/{seed}")
    generators, weights = [g for g, _ in GENERATORS], [w for _, w in GENERATORS]
    pairs: dict[str, Pair] = {}
    for _ in range(50 * count + 1000):
        if len(pairs) >= count:
            break
        pair = rng.choices(generators, weights)[0](lang, rng)
        if pair.source not in exclude:
            pairs.setdefault(pair.source, pair)
    if len(pairs) < count:
        raise S2SError(f"task {name}: cannot generate {count} distinct natural phrasings")
    return list(pairs.values())
