"""Property tests for duetime.domain.schedules against an independent brute-force evaluator.

The oracle below walks real UTC minutes one by one, reads each on the zone's wall clock and applies the
Debian/ISC DST rule directly (fixed-time jobs: first occurrence only, plus one fire at the end of a gap
that swallowed a matching wall time; interval jobs: every real matching minute). Expressions are drawn
together with the value sets they denote, so the oracle never parses cron text itself.
"""

from __future__ import annotations

import calendar
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from duetime.domain.schedules import MIN_RATE_SECONDS, parse_schedule

MINUTE = timedelta(minutes=1)
# DUETIME_PROPERTY_EXAMPLES=5000 for a thorough run; the default keeps the suite fast.
SETTINGS = settings(
    max_examples=int(os.environ.get("DUETIME_PROPERTY_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

ZONES = [
    "UTC",
    "Europe/Berlin",
    "Europe/London",
    "Europe/Dublin",  # negative DST in the tz database
    "America/New_York",
    "America/Los_Angeles",
    "America/Sao_Paulo",  # sprang forward at midnight until 2019
    "America/Havana",  # transitions at midnight
    "America/St_Johns",  # -03:30 / -02:30
    "Australia/Sydney",
    "Australia/Lord_Howe",  # 30-minute DST
    "Asia/Kolkata",  # +05:30, no DST
    "Asia/Kathmandu",  # +05:45
    "Pacific/Chatham",  # +12:45 / +13:45
    "Africa/Casablanca",  # DST suspended during Ramadan
    "Antarctica/Troll",  # 2-hour DST jumps
    "Pacific/Apia",  # skipped 30 December 2011 (a 24-hour jump)
]


# --------------------------------------------------------------------------------------------------
# Expressions with the sets they mean
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    dom: Callable[[int, int], bool]  # (day, days in month) -> bool
    months: frozenset[int]
    dows: frozenset[int]  # 0 = Sunday
    dom_star: bool
    dow_star: bool

    @property
    def fixed(self) -> bool:
        minute, hour = self.text.split()[:2]
        return not minute.startswith("*") and not hour.startswith("*")

    def matches(self, wall: datetime) -> bool:
        ndays = calendar.monthrange(wall.year, wall.month)[1]
        dom_ok = self.dom(wall.day, ndays)
        dow_ok = (wall.weekday() + 1) % 7 in self.dows
        day_ok = dom_ok and dow_ok if self.dom_star or self.dow_star else dom_ok or dow_ok
        return (
            wall.minute in self.minutes and wall.hour in self.hours and wall.month in self.months and day_ok
        )


@st.composite
def numeric_field(
    draw: st.DrawFn, lo: int, hi: int, star_hi: int | None = None, favour: list[int] | None = None
) -> tuple[str, frozenset[int]]:
    star_hi = hi if star_hi is None else star_hi
    value = st.sampled_from(favour) if favour and draw(st.booleans()) else st.integers(lo, hi)
    kind = draw(st.sampled_from(["star", "value", "list", "range", "star_step", "range_step", "start_step"]))
    if kind == "star":
        return "*", frozenset(range(lo, star_hi + 1))
    if kind == "value":
        v = draw(value)
        return str(v), frozenset([v])
    if kind == "list":
        values = sorted(set(draw(st.lists(value, min_size=2, max_size=4))))
        return ",".join(map(str, values)), frozenset(values)
    if kind == "star_step":
        step = draw(st.integers(1, max(1, (star_hi - lo) // 2 + 1)))
        return f"*/{step}", frozenset(range(lo, star_hi + 1, step))
    a = draw(value)
    b = draw(st.integers(a, hi))
    if kind == "range":
        return f"{a}-{b}", frozenset(range(a, b + 1))
    step = draw(st.integers(1, 12))
    if kind == "range_step":
        return f"{a}-{b}/{step}", frozenset(range(a, b + 1, step))
    # "a/step" runs to the end of the "*" range (day of week: 6); "7/2" is just Sunday
    return f"{a}/{step}", frozenset(range(a, star_hi + 1, step)) if a <= star_hi else frozenset([a])


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    minute_t, minutes = draw(numeric_field(0, 59, favour=[0, 15, 30, 45]))
    hour_t, hours = draw(numeric_field(0, 23, favour=[0, 1, 2, 3, 23]))
    # Day and month fields are often "*" so that most draws fire within the two-day window.
    dom_kind = draw(st.sampled_from(["star", "star", "numeric", "last", "question"]))
    dom: Callable[[int, int], bool]
    if dom_kind == "star":
        dom_t, dom = "*", (lambda day, ndays: True)
    elif dom_kind == "last":
        dom_t, dom = "L", (lambda day, ndays: day == ndays)
    elif dom_kind == "question":
        dom_t, dom = "?", (lambda day, ndays: True)
    else:
        dom_t, dom_values = draw(numeric_field(1, 31))

        def dom(day: int, ndays: int, values: frozenset[int] = dom_values) -> bool:
            return day in values

    month_t, months = "*", frozenset(range(1, 13))
    if draw(st.integers(0, 2)) == 0:
        month_t, months = draw(numeric_field(1, 12, favour=[3, 4, 10, 11]))
    dow_t, dow_values = "*", frozenset(range(7))
    if draw(st.booleans()):
        dow_t, dow_values = draw(numeric_field(0, 7, star_hi=6))
    return Spec(
        text=f"{minute_t} {hour_t} {dom_t} {month_t} {dow_t}",
        minutes=minutes,
        hours=hours,
        dom=dom,
        months=months,
        dows=frozenset(v % 7 for v in dow_values),
        dom_star=dom_t.startswith("*") or dom_t == "?",
        dow_star=dow_t.startswith("*"),
    )


# --------------------------------------------------------------------------------------------------
# Instants, biased towards DST transitions
# --------------------------------------------------------------------------------------------------


@cache
def transitions(zone_name: str, year: int) -> tuple[datetime, ...]:
    zone = ZoneInfo(zone_name)
    found = []
    t = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    step = timedelta(hours=12)
    while t < end:
        if t.astimezone(zone).utcoffset() != (t + step).astimezone(zone).utcoffset():
            lo, hi = t, t + step
            while hi - lo > MINUTE:
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    hi = mid
            found.append(hi.replace(second=0, microsecond=0))
        t += step
    return tuple(found)


@st.composite
def zone_and_instant(draw: st.DrawFn) -> tuple[str, datetime]:
    zone = draw(st.sampled_from(ZONES))
    year = draw(st.integers(2005, 2035))
    near = transitions(zone, year)
    if near and draw(st.integers(0, 3)) > 0:
        base = draw(st.sampled_from(near))
        offset = draw(st.integers(-26 * 3600, 26 * 3600))
        return zone, base + timedelta(seconds=offset)
    seconds = draw(st.integers(0, 365 * 86400))
    return zone, datetime(year, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)


# --------------------------------------------------------------------------------------------------
# The oracle
# --------------------------------------------------------------------------------------------------


def oracle(
    spec: Spec, zone_name: str, after: datetime, until: datetime, policy: str = "shift"
) -> list[datetime]:
    """Every fire in (after, until], by walking real minutes (Debian/ISC rule)."""
    zone = ZoneInfo(zone_name)
    fixed = spec.fixed
    t = after.replace(second=0, microsecond=0) + MINUTE
    previous = (t - MINUTE).astimezone(zone).utcoffset()
    assert previous is not None
    found: list[datetime] = []
    while t <= until:
        local = t.astimezone(zone)
        offset = local.utcoffset()
        assert offset is not None
        # A forward jump of 3 hours or more is a clock correction (Debian): nothing is made up for
        if previous < offset < previous + timedelta(hours=3) and fixed and policy == "shift":
            wall = t.replace(tzinfo=None) + previous
            gap_end = t.replace(tzinfo=None) + offset
            while wall < gap_end:
                if spec.matches(wall):
                    found.append(t)
                    break
                wall += MINUTE
        if spec.matches(local.replace(tzinfo=None)) and (not fixed or local.fold == 0):
            found.append(t)
        previous = offset
        t += MINUTE
    return sorted(set(found))


def chain(
    schedule_text: str, zone: str, after: datetime, until: datetime, policy: str = "shift"
) -> list[datetime]:
    schedule = parse_schedule(schedule_text, zone, dst_policy=policy)  # type: ignore[arg-type]
    out: list[datetime] = []
    cursor = after
    while True:
        fire = schedule.next_after(cursor)
        if fire is None or fire > until:
            return out
        out.append(fire)
        cursor = fire


def can_fire(spec: Spec) -> bool:
    """Whether some real date satisfies the day fields (tested expressions must parse)."""
    for year in (2024, 2025, 2026, 2027, 2028, 2029, 2030):
        for month in spec.months:
            ndays = calendar.monthrange(year, month)[1]
            for day in range(1, ndays + 1):
                if spec.matches(datetime(year, month, day, min(spec.hours), min(spec.minutes))):
                    return True
    return False


# --------------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------------


@SETTINGS
@given(spec=specs(), where=zone_and_instant(), policy=st.sampled_from(["shift", "shift", "skip"]))
def test_fires_equal_the_brute_force_oracle_over_two_days(
    spec: Spec, where: tuple[str, datetime], policy: str
) -> None:
    # Given a random expression that can fire, a zone and an instant (often near a DST change)
    zone, after = where
    if not can_fire(spec):
        return
    until = after + timedelta(days=2)
    # When we chain next_after through two days
    got = chain(spec.text, zone, after, until, policy)
    # Then we get exactly the oracle's fires
    expected = oracle(spec, zone, after, until, policy)
    assert got == expected
    folds = {fire.astimezone(ZoneInfo(zone)).fold for fire in expected}
    event("fires in a repeated hour's second pass" if 1 in folds else "no second-pass fire")
    event("fixed job" if spec.fixed else "interval job")
    event("no fire" if not expected else "fires")
    zone_info = ZoneInfo(zone)
    if any(not spec.matches(fire.astimezone(zone_info).replace(tzinfo=None)) for fire in expected):
        event("fixed job fired at the end of a gap")


@SETTINGS
@given(spec=specs(), where=zone_and_instant())
def test_next_is_strictly_after_and_fires_strictly_increase(spec: Spec, where: tuple[str, datetime]) -> None:
    zone, after = where
    if not can_fire(spec):
        return
    schedule = parse_schedule(spec.text, zone)
    cursor = after
    for _ in range(25):
        fire = schedule.next_after(cursor)
        assert fire is not None
        assert fire > cursor
        assert fire.utcoffset() == timedelta(0)
        cursor = fire


@SETTINGS
@given(spec=specs(), where=zone_and_instant())
def test_every_fire_matches_on_the_wall_clock_or_ends_a_gap(spec: Spec, where: tuple[str, datetime]) -> None:
    zone_name, after = where
    if not can_fire(spec):
        return
    zone = ZoneInfo(zone_name)
    for fire in parse_schedule(spec.text, zone_name).preview(after, 25):
        local = fire.astimezone(zone)
        if spec.matches(local.replace(tzinfo=None)):
            continue
        # Otherwise it must be a fixed-time job at the first instant after a gap
        before = (fire - timedelta(microseconds=1)).astimezone(zone).utcoffset()
        now = local.utcoffset()
        assert spec.fixed
        assert before is not None and now is not None and now > before


@SETTINGS
@given(
    minute=st.integers(0, 59),
    hour=st.sampled_from([0, 1, 2, 3, 12, 23]),
    where=zone_and_instant(),
    policy=st.sampled_from(["shift", "skip"]),
)
def test_a_fixed_daily_job_never_fires_twice_on_one_local_date(
    minute: int, hour: int, where: tuple[str, datetime], policy: str
) -> None:
    zone_name, after = where
    zone = ZoneInfo(zone_name)
    schedule = parse_schedule(f"{minute} {hour} * * *", zone_name, dst_policy=policy)  # type: ignore[arg-type]
    dates = [fire.astimezone(zone).date() for fire in schedule.preview(after - timedelta(days=3), 8)]
    assert len(dates) == len(set(dates))


@SETTINGS
@given(spec=specs(), where=zone_and_instant())
def test_latest_at_or_before_is_the_fire_just_before_next_after(
    spec: Spec, where: tuple[str, datetime]
) -> None:
    zone, instant = where
    if not can_fire(spec):
        return
    schedule = parse_schedule(spec.text, zone)
    latest = schedule.latest_at_or_before(instant)
    assert latest is not None  # every drawn expression fires within a few years
    assert latest <= instant
    assert schedule.next_after(latest - timedelta(microseconds=1)) == latest
    following = schedule.next_after(latest)
    assert following is not None and following > instant


@SETTINGS
@given(
    count=st.integers(1, 600),
    unit=st.sampled_from(["seconds", "minutes", "hours", "days"]),
    anchor_s=st.integers(0, 20 * 365 * 86400),
    offset_s=st.integers(-86400 * 30, 86400 * 3650),
)
def test_rate_fires_are_whole_periods_from_the_anchor(
    count: int, unit: str, anchor_s: int, offset_s: int
) -> None:
    assume(unit != "seconds" or count >= MIN_RATE_SECONDS)  # the floor (schedules.MIN_RATE_SECONDS)
    anchor = datetime(2010, 1, 1, tzinfo=UTC) + timedelta(seconds=anchor_s, microseconds=anchor_s % 997)
    instant = anchor + timedelta(seconds=offset_s)
    schedule = parse_schedule(f"rate({count} {unit})", "Europe/Berlin", anchor=anchor)
    period = timedelta(**{unit: count})
    fire = schedule.next_after(instant)
    assert fire is not None and fire > instant and fire >= anchor
    assert (fire - anchor) % period == timedelta(0)
    assert fire - period <= instant or fire == anchor
    latest = schedule.latest_at_or_before(instant)
    if instant < anchor:
        assert latest is None
    else:
        assert latest is not None and latest <= instant and schedule.next_after(latest) == fire


@st.composite
def near_transition(draw: st.DrawFn) -> tuple[str, datetime, datetime]:
    """(zone, transition instant, a wall time within a couple of hours of it)."""
    zone_name = draw(
        st.sampled_from([z for z in ZONES if z not in ("UTC", "Asia/Kolkata", "Asia/Kathmandu")])
    )
    year = draw(st.integers(2005, 2035))
    candidates = transitions(zone_name, year)
    if not candidates:
        candidates = transitions("America/New_York", year)
        zone_name = "America/New_York"
    transition = draw(st.sampled_from(candidates))
    before = (transition - MINUTE).astimezone(ZoneInfo(zone_name)).utcoffset()
    assert before is not None
    wall = transition.replace(tzinfo=None) + before + timedelta(minutes=draw(st.integers(-150, 150)))
    return zone_name, transition, wall


@SETTINGS
@given(
    where=near_transition(),
    policy=st.sampled_from(["shift", "skip"]),
    interval=st.booleans(),
    step=st.sampled_from([1, 5, 15, 20, 30]),
)
def test_jobs_timed_at_a_dst_change_equal_the_oracle(
    where: tuple[str, datetime, datetime], policy: str, interval: bool, step: int
) -> None:
    # Given a daily job whose wall time sits in, just before or just after a gap or a repeated hour
    zone, transition, wall = where
    if interval:
        text = f"*/{step} {wall.hour} * * *"
        spec_minutes = frozenset(range(0, 60, step))
    else:
        text = f"{wall.minute} {wall.hour} * * *"
        spec_minutes = frozenset([wall.minute])
    spec = Spec(
        text,
        spec_minutes,
        frozenset([wall.hour]),
        lambda day, ndays: True,
        frozenset(range(1, 13)),
        frozenset(range(7)),
        True,
        True,
    )
    after = transition - timedelta(hours=30)
    until = transition + timedelta(hours=30)
    # Then chaining next_after gives exactly the brute-force fires, under either policy
    expected = oracle(spec, zone, after, until, policy)
    assert chain(text, zone, after, until, policy) == expected
    zone_info = ZoneInfo(zone)
    if any(not spec.matches(fire.astimezone(zone_info).replace(tzinfo=None)) for fire in expected):
        event("fixed job fired at the end of a gap")
    if any(fire.astimezone(zone_info).fold for fire in expected):
        event("fired in a second pass")
