"""Built-in tasks are deterministic, disjoint and linguistically right; user TSVs load or fail clearly."""

from __future__ import annotations

import datetime
import re

import pytest

from s2s_deploy.errors import S2SError, UnknownNameError
from s2s_deploy.train.tasks import (
    BUILTIN_TASKS,
    Pair,
    SplitSizes,
    TaskSplits,
    generate_pairs,
    held_out,
    load_task,
    read_tsv,
    zh_number,
)

SMALL = SplitSizes(train=400, valid=50, test=50, ood=50)
FR, ZH = BUILTIN_TASKS["en-fr"], BUILTIN_TASKS["en-zh"]


def fresh(name: str, seed: int) -> TaskSplits:
    """Bypass load_task's cache so determinism is really exercised."""
    return load_task.__wrapped__(name, seed, SMALL)


@pytest.mark.parametrize("name", ["en-fr", "en-zh"])
def test_same_seed_same_splits_other_seed_differs(name: str) -> None:
    assert fresh(name, 0) == fresh(name, 0)
    assert fresh(name, 0).train != fresh(name, 1).train


@pytest.mark.parametrize("name", ["en-fr", "en-zh"])
def test_splits_sized_deduplicated_and_disjoint(name: str) -> None:
    splits = fresh(name, 3)
    assert (len(splits.train), len(splits.valid), len(splits.test), len(splits.ood)) == (400, 50, 50, 50)
    sources = [p.source for split in (splits.train, splits.valid, splits.test, splits.ood) for p in split]
    assert len(set(sources)) == len(sources)
    assert sum(p.source == p.target for p in splits.train) < 10  # only cognates: six pages → six pages


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d{4}", text)]


def test_no_length_cap_and_years_far_beyond_the_last_range() -> None:
    """Every length the generators make (the long four-digit numbers above all) and years 1000-9999."""
    pairs = generate_pairs("en-fr", 4000, seed=0)
    assert max(len(p.source) for p in pairs) > 40
    assert any(re.fullmatch(r"\w+ thousand, \w+ hundred and \w+-\w+", p.source) for p in pairs)
    years = [y for p in pairs for y in _numbers(p.source)]
    assert min(years) < 1500 and max(years) > 9000
    assert not any(held_out(y) for y in years)


def test_ood_split_holds_only_values_the_others_never_draw() -> None:
    """ood: another seed stream, the long end of each generator, held-out values only."""
    splits = fresh("en-fr", 0)
    assert splits.ood == fresh("en-fr", 0).ood != fresh("en-fr", 1).ood
    assert splits.ood != tuple(generate_pairs("en-fr", 50, seed=0))
    assert splits.ood == tuple(generate_pairs("en-fr", 50, seed=0, ood=True))
    in_dist = [FR.number(n) for n in range(1000, 10000) if not held_out(n)]
    for pair in splits.ood:
        years = _numbers(pair.source)
        assert all(held_out(y) for y in years)
        assert pair.target not in in_dist
    assert held_out(1963) and not held_out(1945) and not held_out(7384) and not held_out(75)
    kept = [str(y) for y in range(1000, 10000) if not held_out(y)]
    assert 0.85 < len(kept) / 9000 < 0.95
    assert all({y[i] for y in kept} == set("0123456789") - ({"0"} if i == 0 else set()) for i in range(4))
    assert sum(len(p.source) for p in splits.ood) > sum(len(p.source) for p in splits.test)


def test_held_out_splits_do_not_move_with_the_train_size() -> None:
    small = load_task.__wrapped__("en-fr", 0, SMALL)
    larger = load_task.__wrapped__("en-fr", 0, SplitSizes(train=800, valid=50, test=50, ood=50))
    assert (small.valid, small.test, small.ood) == (larger.valid, larger.test, larger.ood)
    assert set(small.train) < set(larger.train)


def test_task_metadata() -> None:
    assert fresh("en-fr", 0).bleu_tokenize == "13a"
    assert fresh("en-zh", 0).bleu_tokenize == "zh"


def test_french_dates_numbers_and_agreement() -> None:
    assert FR.date(datetime.date(2021, 3, 3), weekday=True) == "mercredi 3 mars 2021"
    assert FR.date(datetime.date(2021, 3, 3), weekday=False) == "3 mars 2021"
    assert FR.date(datetime.date(2021, 9, 1), weekday=True) == "mercredi 1er septembre 2021"
    assert FR.number(71) == "soixante et onze"
    assert FR.number(80) == "quatre-vingts"
    day, week = FR.units[0], FR.units[1]
    assert FR.quantity(21, day) == "vingt et un jours"
    assert FR.quantity(21, week) == "vingt et une semaines"
    assert FR.quantity(81, week) == "quatre-vingt-une semaines"
    assert FR.quantity(1, week) == "une semaine"
    assert FR.quantity(0, day) == "zéro jour"
    assert FR.relative(FR.quantity(3, day), True, datetime.date(2021, 3, 1)) == "trois jours après le 1er mars"


def test_generated_pairs_include_known_mappings() -> None:
    pairs = generate_pairs("en-fr", 3000, seed=0)
    by_source = {p.source: p.target for p in pairs}
    dates = [s for s in by_source if s.startswith("Wednesday, March 3, ")]
    for source in dates:
        assert by_source[source] == f"mercredi 3 mars {source[-4:]}"
    assert by_source.get("seventy-one", "soixante et onze") == "soixante et onze"
    assert any(t.endswith(("jours", "semaines", "mois", "ans")) for t in by_source.values())


def test_chinese_dates_numbers_and_measure_words() -> None:
    assert ZH.date(datetime.date(2021, 3, 3), weekday=True) == "2021年3月3日星期三"
    assert ZH.date(datetime.date(2021, 3, 3), weekday=False) == "2021年3月3日"
    expected = {0: "零", 10: "十", 15: "十五", 20: "二十", 101: "一百零一", 110: "一百一十",
                1001: "一千零一", 1010: "一千零一十", 2000: "两千", 9999: "九千九百九十九"}
    assert {n: zh_number(n) for n in expected} == expected
    day, month = ZH.units[0], ZH.units[2]
    assert ZH.quantity(2, day) == "两天"
    assert ZH.quantity(12, day) == "十二天"
    assert ZH.quantity(3, month) == "三个月"


def test_unknown_task_lists_known_names() -> None:
    with pytest.raises(UnknownNameError, match="en-fr, en-zh"):
        load_task("en-xx")


def test_user_tsv_three_columns_and_deterministic_split(tmp_path) -> None:
    path = tmp_path / "fra.txt"
    lines = [f"Go {i}.\tVa {i} !\tCC-BY 2.0 (France) Attribution: tatoeba.org" for i in range(100)]
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    splits = load_task.__wrapped__(str(path), 0)
    assert splits == load_task.__wrapped__(str(path), 0)
    assert (len(splits.train), len(splits.valid), len(splits.test)) == (90, 5, 5)
    assert Pair("Go 7.", "Va 7 !") in splits.train + splits.valid + splits.test
    sources = [p.source for split in (splits.train, splits.valid, splits.test) for p in split]
    assert len(set(sources)) == 100


def test_user_folder_keeps_its_split(tmp_path) -> None:
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.tsv").write_text(f"{split} a\t{split} b\n", encoding="utf-8")
    splits = load_task.__wrapped__(str(tmp_path), 0)
    assert splits.test == (Pair("test a", "test b"),) and splits.ood == ()
    (tmp_path / "ood.tsv").write_text("ood a\tood b\n", encoding="utf-8")
    assert load_task.__wrapped__(str(tmp_path), 0).ood == (Pair("ood a", "ood b"),)


def test_user_tsv_errors(tmp_path) -> None:
    with pytest.raises(S2SError, match="not found"):
        load_task.__wrapped__(str(tmp_path / "missing.tsv"), 0)
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nno tab here\n", encoding="utf-8")
    with pytest.raises(S2SError, match=r"bad\.tsv:2: .*no tab"):
        read_tsv(bad)
    empty = tmp_path / "empty.tsv"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(S2SError, match="no source<TAB>target pairs"):
        read_tsv(empty)
    tiny = tmp_path / "tiny.tsv"
    tiny.write_text("a\tb\n", encoding="utf-8")
    with pytest.raises(S2SError, match="at least 3"):
        load_task.__wrapped__(str(tiny), 0)
