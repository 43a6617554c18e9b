"""Cron evaluation: a compiled cron expression and its next fire time.

:class:`_CronRule` holds the sorted values of each field, as ``duetime.domain.schedules.parse`` compiled
them, and a :class:`_DayRule` for the two day fields. Evaluation is in two steps:

* wall clock -- :meth:`_CronRule.next_match`, the first matching wall-clock minute at or after a given one,
  jumping field by field (years, months, days, hours, minutes) rather than minute by minute;
* real time -- :meth:`_CronRule.next_after` maps matches to UTC instants under the schedule's
  :data:`~duetime.domain.schedules.dst.DstPolicy`: gaps and folds (``duetime.domain.schedules.dst``), and
  the second occurrence of a repeated wall time for interval jobs.

The day fields follow crontab(5)'s Vixie rule (see :meth:`_DayRule.days`); ``L``, ``W`` and ``#`` are the
Quartz/EventBridge meanings. Duetime evaluates cron itself: croniter's DST handling does not follow the
Debian/ISC rule.
"""

from __future__ import annotations

import bisect
import calendar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from duetime.domain.schedules.dst import (
    _CLOCK_CORRECTION,
    _FALLBACK_PROBE,
    DstPolicy,
    _first_offset_change,
    _offset,
    _resolve_local,
)
from duetime.domain.schedules.rules import _Rule

_MINUTE = timedelta(minutes=1)
_SECOND = timedelta(seconds=1)
# A cron search gives up after this many years (every calendar pattern recurs well within it:
# the rarest, e.g. "the fifth Monday of February", recurs within 40 years).
_SEARCH_YEARS = 50


@dataclass(frozen=True)
class _DayRule:
    """The day-of-month and day-of-week fields, evaluated on a month's shape.

    ``dow`` values are 0=Sunday..6=Saturday whatever the written numbering.
    """

    dom: frozenset[int]
    dom_last: frozenset[int]  # "L" -> 0, "L-3" -> 3
    dom_nearest: frozenset[int]  # "15W"
    dom_last_weekday: bool  # "LW"
    dom_star: bool
    dow: frozenset[int]
    dow_nth: frozenset[tuple[int, int]]  # "5#3" -> (weekday, 3)
    dow_last: frozenset[int]  # "5L" -> weekday
    dow_star: bool

    def days(self, ndays: int, first_wd: int) -> tuple[int, ...]:
        """Matching days of a month with ``ndays`` days whose 1st is weekday ``first_wd`` (0=Sunday)."""
        dom_hits: set[int] = {d for d in self.dom if d <= ndays}
        dom_hits.update(ndays - k for k in self.dom_last if ndays - k >= 1)
        for target in self.dom_nearest:
            if target <= ndays:
                dom_hits.add(_nearest_weekday(target, ndays, first_wd))
        if self.dom_last_weekday:
            dom_hits.add(_nearest_weekday(ndays, ndays, first_wd))
        dow_hits: set[int] = set()
        for day in range(1, ndays + 1):
            wd = (first_wd + day - 1) % 7
            if (
                wd in self.dow
                or (wd, (day - 1) // 7 + 1) in self.dow_nth
                or (wd in self.dow_last and day + 7 > ndays)
            ):
                dow_hits.add(day)
        # Vixie rule (crontab(5)): if either day field starts with "*" (or is "?") both must match;
        # otherwise a day matching either field matches.
        hits = dom_hits & dow_hits if self.dom_star or self.dow_star else dom_hits | dow_hits
        return tuple(sorted(hits))


def _nearest_weekday(target: int, ndays: int, first_wd: int) -> int:
    """Quartz/EventBridge ``W``: the weekday (Mon-Fri) nearest ``target``, never leaving the month."""
    wd = (first_wd + target - 1) % 7
    if wd == 6:  # Saturday -> Friday, or Monday if that would leave the month
        return target - 1 if target > 1 else target + 2
    if wd == 0:  # Sunday -> Monday, or Friday if that would leave the month
        return target + 1 if target < ndays else target - 2
    return target


@lru_cache(maxsize=4096)
def _month_shape(year: int, month: int) -> tuple[int, int]:
    """(number of days, weekday of the 1st with 0=Sunday)."""
    first_wd, ndays = calendar.monthrange(year, month)
    return ndays, (first_wd + 1) % 7


def _ceil_minute(naive: datetime) -> datetime:
    floor = naive.replace(second=0, microsecond=0, fold=0)
    return floor if floor == naive else floor + _MINUTE


class _CronRule(_Rule):
    """A cron expression compiled to sorted value tuples plus a day rule, evaluated on the wall clock."""

    def __init__(
        self,
        *,
        source: str,
        eventbridge: bool,
        fields: tuple[str, ...],
        minutes: list[int],
        hours: list[int],
        months: list[int],
        years: list[int] | None,
        day_rule: _DayRule,
        zone: ZoneInfo,
        zone_name: str,
        dst_policy: DstPolicy,
    ) -> None:
        self.source = source
        self.eventbridge = eventbridge
        self.fields = fields
        self.minutes = tuple(minutes)
        self.hours = tuple(hours)
        self.months = tuple(months)
        self.years = None if years is None else tuple(years)
        self.day_rule = day_rule
        self.zone = zone
        self.zone_name = zone_name
        self.dst_policy = dst_policy
        # Debian/ISC: a job is "fixed-time" unless its minute or hour field starts with "*".
        self.fixed = not fields[0].startswith("*") and not fields[1].startswith("*")
        self._day_cache: dict[tuple[int, int], tuple[int, ...]] = {}

    # -- wall-clock matching -------------------------------------------------------------------

    def _days(self, year: int, month: int) -> tuple[int, ...]:
        shape = _month_shape(year, month)
        days = self._day_cache.get(shape)
        if days is None:
            days = self._day_cache[shape] = self.day_rule.days(*shape)
        return days

    def matches(self, naive: datetime) -> bool:
        """Whether a wall-clock time (seconds ignored) matches every field."""
        return (
            (self.years is None or naive.year in self.years)
            and naive.month in self.months
            and naive.day in self._days(naive.year, naive.month)
            and naive.hour in self.hours
            and naive.minute in self.minutes
        )

    def next_match(self, start: datetime, last_year: int) -> datetime | None:
        """The first matching wall-clock minute at or after ``start`` (a whole minute), or None."""
        y, mo, d, h, mi = start.year, start.month, start.day, start.hour, start.minute
        years, months, hours, minutes = self.years, self.months, self.hours, self.minutes
        while True:
            if y > last_year:
                return None
            if years is not None:
                i = bisect.bisect_left(years, y)
                if i == len(years):
                    return None
                if years[i] != y:
                    y, mo, d, h, mi = years[i], 1, 1, 0, 0
                    continue
            i = bisect.bisect_left(months, mo)
            if i == len(months):
                y, mo, d, h, mi = y + 1, 1, 1, 0, 0
                continue
            if months[i] != mo:
                mo, d, h, mi = months[i], 1, 0, 0
            days = self._days(y, mo)
            i = bisect.bisect_left(days, d)
            if i == len(days):
                mo, d, h, mi = mo + 1, 1, 0, 0
                continue
            if days[i] != d:
                d, h, mi = days[i], 0, 0
            i = bisect.bisect_left(hours, h)
            if i == len(hours):
                d, h, mi = d + 1, 0, 0
                continue
            if hours[i] != h:
                h, mi = hours[i], 0
            i = bisect.bisect_left(minutes, mi)
            if i == len(minutes):
                h, mi = h + 1, 0
                continue
            return datetime(y, mo, d, h, minutes[i])

    # -- real-time evaluation ------------------------------------------------------------------

    def _first_fire_from(self, start: datetime, last_year: int) -> datetime | None:
        """The earliest "primary" fire for wall-clock minutes >= ``start``.

        A wall time that exists maps to its (first) instant; one inside a spring-forward gap maps to
        the end of the gap for fixed-time jobs under "shift" (gaps under 3 hours) and is dropped
        otherwise.
        """
        candidate: datetime | None = start
        while candidate is not None:
            candidate = self.next_match(candidate, last_year)
            if candidate is None:
                return None
            instant, exists = _resolve_local(self.zone, candidate)
            if exists:
                return instant
            if self.fixed and self.dst_policy == "shift":
                jump = _offset(self.zone, instant) - _offset(self.zone, instant - _SECOND)
                if jump < _CLOCK_CORRECTION:
                    return instant
            candidate = _ceil_minute(instant.astimezone(self.zone).replace(tzinfo=None))
        return None  # pragma: no cover

    def next_after(self, instant: datetime) -> datetime | None:
        zone = self.zone
        local = instant.astimezone(zone)
        wall = local.replace(tzinfo=None, fold=0)
        # an explicit year field bounds the search by itself (the search jumps from listed year to listed
        # year), so `cron(0 0 1 1 ? 2150)` is found; otherwise every pattern recurs within _SEARCH_YEARS
        last_year = (
            self.years[-1]
            if self.years is not None
            else min(wall.year + _SEARCH_YEARS, datetime.max.year - 1)
        )
        fallback: tuple[datetime, timedelta, timedelta] | None = None  # (transition, before, after)
        start = wall.replace(second=0, microsecond=0) + _MINUTE
        if local.fold == 1:
            # `instant` is in the second pass of a repeated hour: every wall time of that hour has had
            # its first occurrence already, so primary fires resume where the repeat ends.
            first_pass = wall.replace(tzinfo=zone).astimezone(UTC)
            if first_pass < instant:
                transition = _first_offset_change(zone, first_pass, instant)
                fallback = (transition, _offset(zone, first_pass), _offset(zone, instant))
                start = _ceil_minute(transition.replace(tzinfo=None) + fallback[1])
        elif not self.fixed:
            probe = instant + _FALLBACK_PROBE
            before = local.utcoffset()
            assert before is not None
            if _offset(zone, probe) < before:
                transition = _first_offset_change(zone, instant, probe)
                after = _offset(zone, transition)
                if after < before:
                    fallback = (transition, before, after)
        fire = self._first_fire_from(start, last_year)
        if fallback is not None and not self.fixed:
            # Interval jobs also fire at the second occurrence of each matching repeated wall time.
            transition, before, after = fallback
            moment = transition.replace(tzinfo=None)
            repeat_start, repeat_end = moment + after, moment + before
            floor = (instant.astimezone(UTC).replace(tzinfo=None) + after).replace(second=0, microsecond=0)
            candidate = self.next_match(max(_ceil_minute(repeat_start), floor + _MINUTE), last_year)
            if candidate is not None and candidate < repeat_end:
                second = (candidate - after).replace(tzinfo=UTC)
                if fire is None or second < fire:
                    fire = second
        return fire
