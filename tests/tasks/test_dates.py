"""The date demo task: deterministic, varied, and always correct."""

from __future__ import annotations

import datetime

import pytest

from qkv.errors import ConfigError
from qkv.tasks.dates import (
    DATE_FORMATS,
    FIRST_DATE,
    LAST_DATE,
    generate_date_pairs,
    ordinal,
)


def formats_matching(source: str, target: str) -> set[str]:
    day = datetime.date.fromisoformat(target)
    return {name for name, render in DATE_FORMATS.items() if render(day) == source}


def test_same_seed_same_pairs_and_different_seed_different_pairs() -> None:
    assert generate_date_pairs(200, seed=7) == generate_date_pairs(200, seed=7)
    assert generate_date_pairs(200, seed=7) != generate_date_pairs(200, seed=8)


def test_count_and_empty() -> None:
    assert len(generate_date_pairs(37, seed=0)) == 37
    assert generate_date_pairs(0, seed=0) == []


def test_negative_count_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="zero or more"):
        generate_date_pairs(-1, seed=0)


def test_targets_are_iso_dates_in_range_and_sources_name_the_year() -> None:
    for source, target in generate_date_pairs(1000, seed=1):
        day = datetime.date.fromisoformat(target)
        assert day.isoformat() == target
        assert FIRST_DATE <= day <= LAST_DATE
        assert str(day.year) in source


def test_every_source_renders_its_target_in_a_known_format() -> None:
    for source, target in generate_date_pairs(1000, seed=2):
        assert formats_matching(source, target), (source, target)


def test_at_least_ten_formats_appear() -> None:
    seen: set[str] = set()
    for source, target in generate_date_pairs(1000, seed=3):
        seen |= formats_matching(source, target)
    assert len(seen) >= 10
    assert len(DATE_FORMATS) >= 10


def test_dates_spread_over_the_whole_range() -> None:
    years = [int(target[:4]) for _, target in generate_date_pairs(2000, seed=4)]
    assert min(years) < 1920
    assert max(years) > 2080


def test_sources_are_unambiguous_for_a_day_that_could_be_month() -> None:
    # 4 March: month-first with slashes, day-first with dots.
    day = datetime.date(2021, 3, 4)
    assert DATE_FORMATS["03/03/2021 (US month first)"](day) == "03/04/2021"
    assert DATE_FORMATS["03.03.2021 (day first)"](day) == "04.03.2021"


def test_example_renderings() -> None:
    day = datetime.date(2021, 3, 3)
    rendered = {render(day) for render in DATE_FORMATS.values()}
    for expected in [
        "3 March 2021",
        "March 3, 2021",
        "03/03/2021",
        "Wednesday, March 3, 2021",
        "Mar 3 2021",
        "2021/03/03",
        "3rd of March 2021",
        "MARCH 3 2021",
        "march 3rd, 2021",
        "3-Mar-2021",
    ]:
        assert expected in rendered


@pytest.mark.parametrize(
    ("day", "expected"),
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (22, "22nd"),
        (23, "23rd"),
        (31, "31st"),
    ],
)
def test_ordinal(day: int, expected: str) -> None:
    assert ordinal(day) == expected
