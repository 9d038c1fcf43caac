"""The built-in demo task: human-written dates to ISO 8601 (`YYYY-MM-DD`).

A small translation problem that needs no download and trains in minutes on a CPU, yet needs
reordering (day-month-year to year-month-day), a lookup from words to numbers (`March` to
`03`) and ignoring noise (weekdays, ordinal suffixes).

Every source string names exactly one date:

- Slashed numeric dates with the year last are US month-first: `03/04/2021` is 2021-03-04.
- Dotted numeric dates are day-first, as in most of Europe: `04.03.2021` is also 2021-03-04.
- Years have four digits: two (`3.3.21`) would be ambiguous over 1900-2099.
- Month and weekday names are English, whatever the locale.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable

from qkv.errors import ConfigError

FIRST_DATE = datetime.date(1900, 1, 1)
LAST_DATE = datetime.date(2099, 12, 31)

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def ordinal(day: int) -> str:
    """A day of the month as an English ordinal: 1st, 2nd, 3rd, 4th, 11th, 21st."""
    if 11 <= day % 100 <= 13:
        return f"{day}th"
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def _month(day: datetime.date) -> str:
    return MONTHS[day.month - 1]


# Renderers of one date style each, keyed by how they write Wednesday 3 March 2021.
DATE_FORMATS: dict[str, Callable[[datetime.date], str]] = {
    "3 March 2021": lambda d: f"{d.day} {_month(d)} {d.year}",
    "March 3, 2021": lambda d: f"{_month(d)} {d.day}, {d.year}",
    "03/03/2021 (US month first)": lambda d: f"{d.month:02d}/{d.day:02d}/{d.year}",
    "3/3/2021 (US month first)": lambda d: f"{d.month}/{d.day}/{d.year}",
    "03.03.2021 (day first)": lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",
    "Wednesday, March 3, 2021": lambda d: f"{WEEKDAYS[d.weekday()]}, {_month(d)} {d.day}, {d.year}",
    "Wed 3 Mar 2021": lambda d: f"{WEEKDAYS[d.weekday()][:3]} {d.day} {_month(d)[:3]} {d.year}",
    "Mar 3 2021": lambda d: f"{_month(d)[:3]} {d.day} {d.year}",
    "Mar. 3, 2021": lambda d: f"{_month(d)[:3]}. {d.day}, {d.year}",
    "2021/03/03": lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",
    "3rd of March 2021": lambda d: f"{ordinal(d.day)} of {_month(d)} {d.year}",
    "the 3rd of March, 2021": lambda d: f"the {ordinal(d.day)} of {_month(d)}, {d.year}",
    "MARCH 3 2021": lambda d: f"{_month(d).upper()} {d.day} {d.year}",
    "march 3rd, 2021": lambda d: f"{_month(d).lower()} {ordinal(d.day)}, {d.year}",
    "3-Mar-2021": lambda d: f"{d.day}-{_month(d)[:3]}-{d.year}",
    "03 MAR 2021": lambda d: f"{d.day:02d} {_month(d)[:3].upper()} {d.year}",
}


def generate_date_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """Draws `n` (human-written date, ISO date) pairs, such as
    `("Wednesday, March 3, 2021", "2021-03-03")`: dates uniform over FIRST_DATE..LAST_DATE, each
    in a style drawn uniformly from `DATE_FORMATS`, from a private generator seeded by `seed`."""
    if n < 0:
        raise ConfigError(f"the number of date pairs must be zero or more, got {n}")
    rng = random.Random(seed)
    renderers = list(DATE_FORMATS.values())
    first, last = FIRST_DATE.toordinal(), LAST_DATE.toordinal()
    pairs = []
    for _ in range(n):
        day = datetime.date.fromordinal(rng.randint(first, last))
        pairs.append((rng.choice(renderers)(day), day.isoformat()))
    return pairs
