"""Parsing: expression strings to rules, and every error a bad or never-firing expression gets.

:func:`parse_schedule` is the entry point. Three kinds of expression are accepted (keywords are
case-insensitive):

* ``at(yyyy-mm-ddThh:mm:ss)`` -- one wall-clock instant in the schedule's time zone (EventBridge
  Scheduler's one-time form). A local time that does not exist (spring-forward gap) fires at the first
  instant after the gap under ``dst_policy`` ``shift``; under ``skip`` such a one-off could never fire and
  is refused (a :class:`ScheduleError` saying it is in a DST gap). A local time that occurs twice
  (fall-back) fires at its first occurrence. A one-time job is never silently dropped.
* ``rate(N unit)`` with ``unit`` one of ``minute(s)``, ``hour(s)``, ``day(s)`` (EventBridge's units) and
  also ``second(s)`` (a Duetime extension); ``N >= 1`` and the period at least
  :data:`MIN_RATE_SECONDS` (10 s): every fire is a run, and a tick or a submit claims every fire in its
  lookahead, so ``rate(1 second)`` would make ~75 runs per claim. A rate counts **real elapsed
  time** from an anchor: it fires at ``anchor + k * period`` for every integer ``k >= 0``, never by
  wall-clock arithmetic, so DST changes neither stretch nor shrink it.
* cron: the 5-field Vixie/Debian form of crontab(5) (``min hour dom month dow``, dow 0-7 with 0 and 7
  = Sunday, plus the macros ``@hourly @daily @midnight @weekly @monthly @yearly @annually``) and
  EventBridge Scheduler's ``cron(min hour dom month dow year)`` (dow 1-7 = SUN-SAT, year 1970-2199,
  exactly one of the two day fields ``?``). Each field is a list ``a,b,c`` of items: ``*``, a value, a
  range ``a-b``, each optionally stepped (``*/15``, ``5-55/10``, ``5/15`` = 5 to the maximum by 15).
  Values are numbers or names (``jan``-``dec``, ``sun``-``sat``). The day fields also take ``?`` (any);
  day of month takes ``L`` (last day), ``L-n`` (n days before it), ``nW`` (the weekday nearest day n,
  never leaving the month), ``LW`` (last weekday); day of week takes ``n#k`` (k-th weekday n, k 1-5),
  ``nL`` (last weekday n of the month), ``L`` alone (Saturday) and wrapping ranges (``fri-mon``).
  Day of month and day of week follow the Vixie rule (crontab(5)): when either field starts with ``*``
  (or is ``?``) a day must match both; otherwise a day matching either fires (``0 0 1-7 * 1`` = the
  first seven days and every Monday). Expressions no date satisfies are rejected at parse.

Every number (cron values, ranges and steps, the rate count, the at() date and time) is written in ASCII
digits ``0``-``9``: any other digit (``²``, Arabic-Indic ``٠``, fullwidth ``１``) is a
:class:`ScheduleError` on ``schedule.expression`` naming the character.

All instants returned are timezone-aware UTC ``datetime`` objects. Cron fields are matched against the
wall clock of the schedule's IANA time zone; the DST rule is described on :data:`DstPolicy`. A zone is
an IANA tz database name (``Europe/Berlin``, ``UTC``, ``Etc/GMT+5``...): host files of the zoneinfo
directory that are not zone names, such as ``localtime`` (a link to the host's ``/etc/localtime``), are
refused, since they mean different zones on different machines.

Here only the syntax is read: a cron expression compiles to a
:class:`~duetime.domain.schedules.cron._CronRule` (evaluated in ``duetime.domain.schedules.cron``),
``at``/``rate`` to the rules of ``duetime.domain.schedules.rules``, and zone names are checked by
``duetime.domain.schedules.zones``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from duetime.domain.errors import ScheduleError
from duetime.domain.schedules.cron import _CronRule, _DayRule
from duetime.domain.schedules.dst import DstPolicy, _resolve_local
from duetime.domain.schedules.rules import _AtRule, _RateRule, _Rule
from duetime.domain.schedules.schedule import _MICROSECOND, Schedule, ScheduleKind
from duetime.domain.schedules.zones import _stored_zone, _zone

MIN_RATE_SECONDS = 10
"""The shortest ``rate(...)`` period, in seconds. Every fire is a run, and the tick (and a fresh submit)
claims every fire inside its lookahead (a 60 s tick plus its margin): a ``rate(1 second)`` job would claim
about 75 runs at once."""


# --------------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------------

_ASCII_NUMBER_RE = re.compile(r"[0-9]+")


def _ascii_digits(text: str, *, stored: bool = False) -> str:
    """``text`` with every number in ASCII digits, or a :class:`ScheduleError` naming the first other digit.

    Python's ``int()``, ``str.isdigit()`` and regex ``\\d`` also take other scripts' digits (``٠``, ``１``)
    and superscripts (``²``, on which ``int()`` raises); a schedule's numbers are ``0``-``9`` only. A stored
    expression (``stored``) accepted before this rule has its decimal digits read as ASCII instead, so it
    keeps firing as it did.
    """
    for ch in text:
        if ch.isascii() or not ch.isnumeric():
            continue
        if stored and ch.isdecimal():
            continue
        raise ScheduleError(
            f"{ch!r} (U+{ord(ch):04X}) in `{text}` is not an ASCII digit: write numbers with 0-9"
        )
    if stored:
        return "".join(str(int(ch)) if ch.isdecimal() and not ch.isascii() else ch for ch in text)
    return text


def _number(token: str) -> int | None:
    """``token`` as an ``int`` when it is ASCII digits only (``"07"`` is 7), else ``None``."""
    return int(token) if _ASCII_NUMBER_RE.fullmatch(token) else None


# --------------------------------------------------------------------------------------------------
# at() and rate()
# --------------------------------------------------------------------------------------------------


# numbers are ASCII digits only: ``\d`` (and ``int()``, ``str.isdigit()``) also take Arabic-Indic,
# fullwidth and superscript digits; _ascii_digits refuses those first, and _number reads every number
_AT_RE = re.compile(
    r"^at\(\s*([0-9]{4})-([0-9]{2})-([0-9]{2})t([0-9]{2}):([0-9]{2}):([0-9]{2})\s*\)$", re.IGNORECASE
)
_RATE_RE = re.compile(r"^rate\(\s*(\S+)\s+([a-z]+)\s*\)$", re.IGNORECASE)
_RATE_UNITS = {
    "second": timedelta(seconds=1),
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
}


def _parse_at(
    expression: str, zone: ZoneInfo, zone_name: str, dst_policy: DstPolicy, *, stored: bool = False
) -> _AtRule:
    m = _AT_RE.match(expression)
    if m is None:
        raise ScheduleError(
            f"`{expression}` is not a valid at() expression: write at(yyyy-mm-ddThh:mm:ss), "
            "e.g. at(2026-12-01T10:00:00)"
        )
    y, mo, d, h, mi, s = (int(g) for g in m.groups())
    try:
        local = datetime(y, mo, d, h, mi, s)
    except ValueError as exc:
        raise ScheduleError(f"`{expression}` is not a real date and time: {exc}") from exc
    try:
        fire, exists = _resolve_local(zone, local)
    except (OverflowError, ValueError) as exc:
        raise ScheduleError(f"`{expression}` is outside the supported range: {exc}") from exc
    if not exists and dst_policy == "skip" and not stored:
        # skip drops a fire in a gap, and a one-off has no other: a submit's rule (a job stored before it
        # keeps firing after the gap)
        raise ScheduleError(
            f"`{expression}` is in a DST gap: {local:%H:%M:%S} does not occur on {local:%Y-%m-%d} in"
            f" {zone_name} (clocks jump to {fire.astimezone(zone):%H:%M:%S}), and dst_policy skip drops a"
            f" fire in a gap: `{expression}` can never fire"
        )
    if not stored and not _EB_YEAR_MIN <= fire.year <= _EB_YEAR_MAX:
        # the years every other instant of a job is held to (EventBridge Scheduler's 1970-2199): a
        # submit's rule, so a job stored before it still reads
        raise ScheduleError(
            f"`{expression}` is outside the supported range: it must lie between {_EB_YEAR_MIN} and"
            f" {_EB_YEAR_MAX} (UTC)"
        )
    return _AtRule(fire, local, zone_name)


def _parse_rate(expression: str, anchor: datetime | None, *, floor: bool = True) -> _RateRule:
    m = _RATE_RE.match(expression)
    if m is None:
        raise ScheduleError(
            f"`{expression}` is not a valid rate() expression: write rate(N unit) with unit one of "
            "minute(s), hour(s), day(s) or second(s), e.g. rate(5 minutes)"
        )
    raw_count, raw_unit = m.group(1), m.group(2).lower()
    count = _number(raw_count)
    if count is None:
        raise ScheduleError(f"rate value {raw_count!r} in `{expression}` must be a whole number >= 1")
    if count < 1:
        raise ScheduleError(f"rate value must be at least 1 (got {count} in `{expression}`)")
    unit = raw_unit[:-1] if raw_unit.endswith("s") else raw_unit
    if unit not in _RATE_UNITS:
        raise ScheduleError(
            f"unknown rate unit {raw_unit!r} in `{expression}`: use minute(s), hour(s), day(s) or second(s)"
        )
    try:
        period = count * _RATE_UNITS[unit]
    except OverflowError as exc:
        raise ScheduleError(f"rate period in `{expression}` is too long") from exc
    if floor and period < timedelta(seconds=MIN_RATE_SECONDS):
        raise ScheduleError(
            f"`{expression}` is too frequent: a rate schedule fires at most once every {MIN_RATE_SECONDS} "
            f"seconds (each fire is a run, and one claim takes every fire of the next ~75 s); "
            f"use rate({MIN_RATE_SECONDS} seconds) or longer"
        )
    if anchor is None:
        raise ScheduleError(
            f"`{expression}` needs an anchor to count from: give start_at (or anchor)", "schedule.start_at"
        )
    return _RateRule(anchor, period, count, unit)


# --------------------------------------------------------------------------------------------------
# Cron: field grammar
# --------------------------------------------------------------------------------------------------

# EventBridge's year field range (EventBridge Scheduler docs, "Cron expressions").
_EB_YEAR_MIN, _EB_YEAR_MAX = 1970, 2199

_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1
    )
}
_DOW_NAMES = {name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_MONTH_TITLES = (
    "",
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
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MAX_MONTH_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

_LAST_OFFSET_RE = re.compile(r"^l(?:-([0-9]+))?$")
_NEAREST_RE = re.compile(r"^([0-9]+)w$")
_LAST_DOW_RE = re.compile(r"^([a-z0-9]+)l$")
_NTH_DOW_RE = re.compile(r"^([a-z0-9]+)#([0-9]+)$")


@dataclass(frozen=True)
class _Field:
    """How one cron field is written: its name, accepted numbers, the range ``*`` means, names."""

    name: str
    lo: int
    hi: int
    star_lo: int
    star_hi: int
    names: dict[str, int] | None = None
    cyclic: bool = False  # ranges may wrap (day of week: fri-mon)


_MINUTE_F = _Field("minute", 0, 59, 0, 59)
_HOUR_F = _Field("hour", 0, 23, 0, 23)
_DOM_F = _Field("day-of-month", 1, 31, 1, 31)
_MONTH_F = _Field("month", 1, 12, 1, 12, _MONTH_NAMES)
# Vixie: 0-7, 0 and 7 are Sunday; "*" means 0-6 so "*/2" is Sun, Tue, Thu, Sat.
_VIXIE_DOW_F = _Field("day-of-week", 0, 7, 0, 6, _DOW_NAMES, cyclic=True)
# EventBridge: 1-7 = SUN-SAT.
_EB_DOW_F = _Field("day-of-week", 1, 7, 1, 7, {k: v + 1 for k, v in _DOW_NAMES.items()}, cyclic=True)
_EB_YEAR_F = _Field("year", _EB_YEAR_MIN, _EB_YEAR_MAX, _EB_YEAR_MIN, _EB_YEAR_MAX)


def _value(token: str, spec: _Field, expr: str) -> int:
    number = _number(token)
    if number is None and spec.names is not None:
        number = spec.names.get(token)
    if number is None:
        hint = ""
        if spec.names is not None:
            hint = f" or a name ({', '.join(list(spec.names)[:3])}, ...)"
        raise ScheduleError(f"{spec.name} value {token!r} in `{expr}` is not a number{hint}")
    if not spec.lo <= number <= spec.hi:
        raise ScheduleError(f"{spec.name} value {number} in `{expr}` is out of range {spec.lo}-{spec.hi}")
    return number


def _expand(item: str, spec: _Field, expr: str) -> list[int]:
    """Expand one list item (``*``, ``a``, ``a-b``, each optionally ``/step``) in written numbering."""
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        parsed = _number(step_text)
        if parsed is None or parsed < 1:
            raise ScheduleError(f"step {step_text!r} in {spec.name} field `{item}` of `{expr}` must be >= 1")
        step = parsed
    if base in ("*", "?"):
        return list(range(spec.star_lo, spec.star_hi + 1, step))
    if not base:
        raise ScheduleError(f"empty {spec.name} value in `{expr}`")
    first_text, dash, last_text = base.partition("-")
    first = _value(first_text, spec, expr)
    if not dash:
        last = spec.star_hi if slash else first
        if slash and first > last:
            return [first]
    else:
        last = _value(last_text, spec, expr)
    if first <= last:
        return list(range(first, last + 1, step))
    if not spec.cyclic:
        raise ScheduleError(
            f"{spec.name} range {base} in `{expr}` runs backwards; cron ranges go low-high "
            f"(write {first_text}-{spec.hi},{spec.lo}-{last_text} to wrap around)"
        )
    # Day of week wraps: fri-mon = Fri, Sat, Sun, Mon.
    span = spec.star_hi - spec.star_lo + 1
    values = []
    current = first
    while True:
        values.append(current)
        if current == last or len(values) > span:
            break
        current = spec.star_lo + (current - spec.star_lo + 1) % span
    return values[::step]


def _plain_values(text: str, spec: _Field, expr: str) -> list[int]:
    values: set[int] = set()
    for item in text.split(","):
        if item == "?":
            raise ScheduleError(f"`?` is only allowed in the day-of-month and day-of-week fields of `{expr}`")
        if not item:
            raise ScheduleError(f"empty item in the {spec.name} field of `{expr}`")
        values.update(_expand(item, spec, expr))
    return sorted(values)


def _parse_dom(text: str, expr: str) -> tuple[set[int], set[int], set[int], bool]:
    plain: set[int] = set()
    last: set[int] = set()
    nearest: set[int] = set()
    last_weekday = False
    for item in text.split(","):
        if item == "?":
            plain.update(range(1, 32))
        elif item in ("lw", "wl"):
            last_weekday = True
        elif (m := _LAST_OFFSET_RE.match(item)) is not None:
            offset = _number(m.group(1) or "0") or 0
            if offset > 30:
                raise ScheduleError(f"`{item.upper()}` in `{expr}`: a month has at most 31 days")
            last.add(offset)
        elif (m := _NEAREST_RE.match(item)) is not None:
            nearest.add(_value(m.group(1), _DOM_F, expr))
        elif not item:
            raise ScheduleError(f"empty item in the day-of-month field of `{expr}`")
        else:
            if "l" in item or "w" in item or "#" in item:
                raise ScheduleError(
                    f"day-of-month item `{item.upper()}` in `{expr}` is not valid: use L, L-n, nW or LW"
                )
            plain.update(_expand(item, _DOM_F, expr))
    return plain, last, nearest, last_weekday


def _parse_dow(
    text: str, spec: _Field, to_weekday: Callable[[int], int], expr: str
) -> tuple[set[int], set[tuple[int, int]], set[int]]:
    plain: set[int] = set()
    nth: set[tuple[int, int]] = set()
    last: set[int] = set()
    for item in text.split(","):
        if item == "?":
            plain.update(range(7))
        elif item == "l":  # alone: the last day of the week, Saturday (Quartz / EventBridge)
            plain.add(6)
        elif (m := _NTH_DOW_RE.match(item)) is not None:
            n = _number(m.group(2)) or 0
            if not 1 <= n <= 5:
                raise ScheduleError(f"`{item.upper()}` in `{expr}`: a weekday occurs 1 to 5 times a month")
            nth.add((to_weekday(_value(m.group(1), spec, expr)), n))
        elif (m := _LAST_DOW_RE.match(item)) is not None:
            last.add(to_weekday(_value(m.group(1), spec, expr)))
        elif not item:
            raise ScheduleError(f"empty item in the day-of-week field of `{expr}`")
        else:
            if "#" in item or "w" in item.replace("wed", ""):
                raise ScheduleError(
                    f"day-of-week item `{item.upper()}` in `{expr}` is not valid: use a weekday, "
                    "a range, nL or n#k"
                )
            plain.update(to_weekday(v) for v in _expand(item, spec, expr))
    return plain, nth, last


# --------------------------------------------------------------------------------------------------
# Cron: whole expressions
# --------------------------------------------------------------------------------------------------


def _join(words: list[str], conjunction: str = "or") -> str:
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + f" {conjunction} " + words[-1]


def _split_cron(text: str) -> tuple[tuple[str, ...], bool]:
    """Split into lower-cased fields; returns (fields, is_eventbridge)."""
    lowered = text.lower()
    if lowered.startswith("@"):
        if lowered == "@reboot":
            raise ScheduleError(
                "`@reboot` runs when a machine boots and has no fire times; Duetime cannot schedule it"
            )
        if lowered not in _MACROS:
            raise ScheduleError(f"unknown cron macro `{text}`: use one of {', '.join(sorted(_MACROS))}")
        return tuple(_MACROS[lowered].split()), False
    if lowered.startswith("cron"):
        m = re.match(r"^cron\s*\((.*)\)$", lowered, re.DOTALL)
        if m is None:
            raise ScheduleError(
                f"`{text}` is not a valid cron() expression: write cron(min hour dom month dow year)"
            )
        fields = tuple(m.group(1).split())
        if len(fields) != 6:
            raise ScheduleError(
                f"`{text}` has {len(fields)} field{'s' if len(fields) != 1 else ''}; EventBridge cron() takes 6: "
                "minute hour day-of-month month day-of-week year"
            )
        return fields, True
    fields = tuple(lowered.split())
    if len(fields) != 5:
        hint = ""
        if len(fields) == 6:
            hint = " (for EventBridge's 6-field form with a year, write cron(min hour dom month dow year))"
        raise ScheduleError(
            f"`{text}` has {len(fields)} field{'s' if len(fields) != 1 else ''}; cron takes 5: "
            f"minute hour day-of-month month day-of-week{hint}"
        )
    return fields, False


def _parse_cron(text: str, zone: ZoneInfo, zone_name: str, dst_policy: DstPolicy) -> _CronRule:
    """Compile a cron expression.

    Grammar (case-insensitive), per field: a list ``a,b,c`` of items; an item is ``*``, a value, a range
    ``a-b``, any of these with a step ``/n`` (``*/15``, ``5-55/10``, ``5/15`` = 5-max/15). Values are
    numbers or names (``jan``-``dec``, ``sun``-``sat``). Day fields also take ``?`` (any), and

    * day of month: ``L`` (last day), ``L-n`` (n days before the last), ``nW`` (weekday nearest day n,
      within the month), ``LW`` (last weekday of the month);
    * day of week: ``n#k`` (k-th weekday n of the month, k 1-5), ``nL`` (last weekday n of the month),
      ``L`` alone (Saturday, the last day of the week); ranges may wrap (``fri-mon``).

    5-field (Vixie/Debian, crontab(5)): ``min hour dom month dow``, dow 0-7 with 0 and 7 = Sunday, and
    the macros @yearly @annually @monthly @weekly @daily @midnight @hourly. EventBridge:
    ``cron(min hour dom month dow year)`` with dow 1-7 = SUN-SAT, year 1970-2199, and exactly one of the
    two day fields ``?`` (EventBridge Scheduler docs, "Cron expressions").

    The day fields follow the Vixie rule: when either starts with ``*`` or is ``?``, a day must match
    both; otherwise a day matching either fires.
    """
    fields, eventbridge = _split_cron(text)
    minute_t, hour_t, dom_t, month_t, dow_t = fields[:5]
    if eventbridge:
        if (dom_t == "?") == (dow_t == "?"):
            raise ScheduleError(
                f"`{text}`: in EventBridge cron() exactly one of day-of-month and day-of-week must be `?` "
                f"(got `{dom_t}` and `{dow_t}`)"
            )
        dow_spec: _Field = _EB_DOW_F

        def to_weekday(v: int) -> int:
            return v - 1
    else:
        dow_spec = _VIXIE_DOW_F

        def to_weekday(v: int) -> int:
            return v % 7

    minutes = _plain_values(minute_t, _MINUTE_F, text)
    hours = _plain_values(hour_t, _HOUR_F, text)
    months = _plain_values(month_t, _MONTH_F, text)
    years: list[int] | None = None
    if eventbridge and fields[5] != "*":
        years = _plain_values(fields[5], _EB_YEAR_F, text)
    dom, dom_last, dom_nearest, dom_lw = _parse_dom(dom_t, text)
    dow, dow_nth, dow_last = _parse_dow(dow_t, dow_spec, to_weekday, text)
    day_rule = _DayRule(
        dom=frozenset(dom),
        dom_last=frozenset(dom_last),
        dom_nearest=frozenset(dom_nearest),
        dom_last_weekday=dom_lw,
        dom_star=dom_t.startswith("*") or dom_t == "?",
        dow=frozenset(dow),
        dow_nth=frozenset(dow_nth),
        dow_last=frozenset(dow_last),
        dow_star=dow_t.startswith("*") or dow_t == "?",
    )
    rule = _CronRule(
        source=text,
        eventbridge=eventbridge,
        fields=fields,
        minutes=minutes,
        hours=hours,
        months=months,
        years=years,
        day_rule=day_rule,
        zone=zone,
        zone_name=zone_name,
        dst_policy=dst_policy,
    )
    _check_can_fire(rule, text, dom_t, dow_t)
    return rule


def _check_can_fire(rule: _CronRule, text: str, dom_t: str, dow_t: str) -> None:
    """Reject expressions no date can satisfy, saying why."""
    if rule.years is None:
        shapes = {
            (ndays, wd)
            for month in rule.months
            for ndays in ((28, 29) if month == 2 else (_MAX_MONTH_DAYS[month],))
            for wd in range(7)
        }
        possible = any(rule.day_rule.days(*shape) for shape in shapes)
    else:
        possible = any(rule._days(year, month) for year in rule.years for month in rule.months)
    if not possible:
        raise ScheduleError(_never_message(rule, text, dom_t, dow_t))
    if rule.years is not None:
        now = datetime.now(UTC)
        if rule.next_after(now) is None:
            if rule.years[-1] < now.astimezone(rule.zone).year:
                raise ScheduleError(
                    f"every year in the year field of `{text}` is in the past (the latest is {rule.years[-1]}): "
                    "it can never fire again"
                )
            raise ScheduleError(f"`{text}` has no fire time left in its years: it can never fire again")


def _never_message(rule: _CronRule, text: str, dom_t: str, dow_t: str) -> str:
    month_names = [_MONTH_TITLES[m] for m in rule.months]
    where = f"in {_join(month_names)}" if len(rule.months) < 12 else "in any month"
    if rule.years is not None:
        where += (
            f" of {_join([str(y) for y in rule.years])}" if len(rule.years) <= 5 else " of the given years"
        )
    dr = rule.day_rule
    plain_dom_only = not (dr.dom_last or dr.dom_nearest or dr.dom_last_weekday) and dr.dow_star
    if plain_dom_only and dr.dom:
        days = sorted(dr.dom)
        if len(days) == 1:
            return f"day {days[0]} never occurs {where}: `{text}` can never fire"
        return f"days {_join([str(d) for d in days], 'and')} never occur {where}: `{text}` can never fire"
    return (
        f"no date {where} matches day-of-month `{dom_t.upper()}` and day-of-week `{dow_t.upper()}`: "
        f"`{text}` can never fire"
    )


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------


def _aware(value: datetime | None, what: str, field_name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ScheduleError(f"{what} must be a datetime, got {type(value).__name__}", field_name)
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(f"{what} must be timezone-aware (got naive {value.isoformat()})", field_name)
    return value.astimezone(UTC)


def parse_schedule(
    expression: str,
    timezone: str = "UTC",
    *,
    anchor: datetime | None = None,
    dst_policy: DstPolicy = "shift",
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    stored: bool = False,
) -> Schedule:
    """Parse and validate a schedule expression.

    Args:
        expression: ``at(...)``, ``rate(...)``, a 5-field cron line or macro, or ``cron(...)``
            (EventBridge, 6 fields); the grammar is in the module docstring.
        timezone: IANA zone name the wall-clock fields are read in (default ``"UTC"``).
        anchor: the instant a ``rate`` counts from; defaults to ``start_at``. Ignored for other kinds.
        dst_policy: ``"shift"`` (Debian/ISC, default) or ``"skip"`` (EventBridge); see :data:`DstPolicy`.
        start_at: optional inclusive lower bound on fire times (aware).
        end_at: optional inclusive upper bound on fire times (aware).
        stored: the schedule of a stored job, accepted when it was submitted: rules added since for
            submits (the :data:`MIN_RATE_SECONDS` floor, IANA names only) are not applied again, so a
            tightened rule never stops an existing job from firing.

    Returns:
        An immutable :class:`Schedule`.

    Raises:
        ScheduleError: with ``field`` ``"schedule.expression"`` (bad syntax, values out of range, an
            expression that can never fire -- the message says why), ``"schedule.timezone"`` (unknown
            zone), ``"schedule.start_at"`` / ``"schedule.end_at"`` (naive datetimes, ``end_at`` before
            ``start_at``, no fire between them, a ``rate`` with neither anchor nor start_at),
            ``"schedule.anchor"`` (naive anchor) or ``"schedule.dst_policy"`` (unknown policy).
    """
    if not isinstance(expression, str):
        raise ScheduleError(f"schedule expression must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise ScheduleError("schedule expression is empty")
    source, text = text, _ascii_digits(text, stored=stored)
    zone = _stored_zone(timezone) if stored else _zone(timezone)
    if dst_policy not in ("shift", "skip"):
        raise ScheduleError(
            f"dst_policy must be 'shift' or 'skip', got {dst_policy!r}", "schedule.dst_policy"
        )
    start = _aware(start_at, "start_at", "schedule.start_at")
    end = _aware(end_at, "end_at", "schedule.end_at")
    anchor_utc = _aware(anchor, "anchor", "schedule.anchor")
    if start is not None and end is not None and end < start:
        raise ScheduleError(
            f"end_at {end.isoformat()} is before start_at {start.isoformat()}", "schedule.end_at"
        )

    lowered = text.lower()
    rule: _Rule
    kind: ScheduleKind
    if lowered.startswith("at(") or lowered.startswith("at "):
        kind, rule = "at", _parse_at(text, zone, timezone, dst_policy, stored=stored)
    elif lowered.startswith("rate(") or lowered.startswith("rate "):
        kind, rule = (
            "rate",
            _parse_rate(text, anchor_utc if anchor_utc is not None else start, floor=not stored),
        )
        anchor_utc = rule.anchor
    else:
        kind, rule = "cron", _parse_cron(text, zone, timezone, dst_policy)
    if kind != "rate":
        anchor_utc = None

    schedule = Schedule(kind, source, timezone, dst_policy, anchor_utc, start, end, rule)
    if start is not None or (end is not None and kind == "at"):
        probe = start - _MICROSECOND if start is not None else datetime.min.replace(tzinfo=UTC)
        if schedule.next_after(probe) is None:
            if start is not None and end is not None:
                where = f"between start_at {start.isoformat()} and end_at {end.isoformat()}"
            elif start is not None:
                where = f"at or after start_at {start.isoformat()}"
            else:
                where = f"at or before end_at {end.isoformat() if end else ''}"
            raise ScheduleError(
                f"`{text}` never fires {where}", "schedule.end_at" if end else "schedule.start_at"
            )
    return schedule
