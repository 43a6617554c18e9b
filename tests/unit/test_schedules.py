"""Unit tests for duetime.domain.schedules: parsing, at(), rate(), cron semantics, DST, bounds, descriptions."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from duetime.domain.errors import ScheduleError
from duetime.domain.schedules import Schedule, parse_schedule


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def iso(text: str) -> datetime:
    return datetime.fromisoformat(text)


# --------------------------------------------------------------------------------------------------
# at(...)
# --------------------------------------------------------------------------------------------------


def test_at_fires_once_at_the_wall_clock_time_in_its_zone() -> None:
    # Given a one-time schedule in Berlin (CET, +01:00 in December)
    schedule = parse_schedule("at(2026-12-01T10:00:00)", "Europe/Berlin")
    # When asked for the next fire from long before
    fire = schedule.next_after(utc(2026, 1, 1))
    # Then it is 09:00 UTC, and nothing follows it
    assert fire == utc(2026, 12, 1, 9, 0)
    assert schedule.next_after(fire) is None
    assert schedule.kind == "at"


@pytest.mark.parametrize(
    ("expression", "zone"),
    [
        ("at(9999-12-31T23:59:59)", "UTC"),
        ("at(2200-01-01T00:00:00)", "UTC"),
        ("at(1969-12-31T23:59:59)", "UTC"),
    ],
)
def test_at_outside_the_years_every_other_instant_is_held_to_is_refused(expression: str, zone: str) -> None:
    with pytest.raises(ScheduleError) as refused:
        parse_schedule(expression, zone)
    assert "between 1970 and 2199 (UTC)" in str(refused.value)
    # a job stored before the rule still reads
    assert parse_schedule(expression, zone, stored=True).kind == "at"


def test_at_at_the_ends_of_the_supported_years_is_accepted() -> None:
    assert parse_schedule("at(2199-12-31T23:59:59)").next_after(datetime(2199, 1, 1, tzinfo=UTC)) == datetime(
        2199, 12, 31, 23, 59, 59, tzinfo=UTC
    )
    assert parse_schedule("at(1970-01-01T00:00:00)", "UTC").kind == "at"


def test_at_defaults_to_utc() -> None:
    schedule = parse_schedule("at(2026-12-01T10:00:00)")
    assert schedule.timezone == "UTC"
    assert schedule.next_after(utc(2026, 1, 1)) == utc(2026, 12, 1, 10, 0)


def test_at_keywords_are_case_insensitive_and_expression_is_stripped() -> None:
    schedule = parse_schedule("  AT(2026-12-01t10:00:00) ")
    assert schedule.expression == "AT(2026-12-01t10:00:00)"
    assert schedule.next_after(utc(2026, 1, 1)) == utc(2026, 12, 1, 10, 0)


def test_at_is_strictly_after_the_instant_asked() -> None:
    schedule = parse_schedule("at(2026-12-01T10:00:00)")
    assert schedule.next_after(utc(2026, 12, 1, 10, 0)) is None
    assert schedule.next_after(utc(2026, 12, 1, 9, 59, 59)) == utc(2026, 12, 1, 10, 0)


def test_at_in_the_spring_gap_fires_at_the_first_instant_after_the_gap() -> None:
    # Given 02:30 on the day New York jumps from 02:00 EST to 03:00 EDT (02:30 never exists)
    schedule = parse_schedule("at(2026-03-08T02:30:00)", "America/New_York")
    # Then it fires at 03:00 EDT = 07:00 UTC
    assert schedule.next_after(utc(2026, 1, 1)) == iso("2026-03-08T03:00:00-04:00")


def test_at_in_a_half_hour_gap_fires_when_the_gap_ends() -> None:
    # Lord Howe Island springs forward 30 minutes, 02:00 -> 02:30 local, on 2026-10-04
    schedule = parse_schedule("at(2026-10-04T02:10:00)", "Australia/Lord_Howe")
    assert schedule.next_after(utc(2026, 1, 1)) == iso("2026-10-04T02:30:00+11:00")


def test_at_in_the_repeated_hour_fires_at_the_first_occurrence() -> None:
    schedule = parse_schedule("at(2026-11-01T01:30:00)", "America/New_York")
    assert schedule.next_after(utc(2026, 1, 1)) == iso("2026-11-01T01:30:00-04:00")


def test_at_in_a_gap_under_skip_can_never_fire_and_is_refused() -> None:
    # Given a one-off at 02:30 on New York's spring-forward day, with skip (a fire in a gap is dropped)
    with pytest.raises(ScheduleError) as err:
        parse_schedule("at(2027-03-14T02:30:00)", "America/New_York", dst_policy="skip")
    # Then it is refused as never firing, saying the time is in a DST gap
    assert err.value.field == "schedule.expression"
    assert err.value.message == (
        "`at(2027-03-14T02:30:00)` is in a DST gap: 02:30:00 does not occur on 2027-03-14 in America/New_York"
        " (clocks jump to 03:00:00), and dst_policy skip drops a fire in a gap:"
        " `at(2027-03-14T02:30:00)` can never fire"
    )


def test_at_in_a_gap_under_shift_fires_when_the_gap_ends() -> None:
    schedule = parse_schedule("at(2027-03-14T02:30:00)", "America/New_York", dst_policy="shift")
    assert schedule.next_after(utc(2026, 1, 1)) == iso("2027-03-14T03:00:00-04:00")


def test_at_outside_a_gap_under_skip_fires_at_its_time() -> None:
    schedule = parse_schedule("at(2027-03-14T03:30:00)", "America/New_York", dst_policy="skip")
    assert schedule.next_after(utc(2026, 1, 1)) == iso("2027-03-14T03:30:00-04:00")


def test_a_stored_at_in_a_gap_under_skip_still_fires_after_the_gap() -> None:
    # Given such a one-off stored before the rule: it keeps the fire it was accepted with
    schedule = parse_schedule("at(2027-03-14T02:30:00)", "America/New_York", dst_policy="skip", stored=True)
    assert schedule.next_after(utc(2026, 1, 1)) == iso("2027-03-14T03:00:00-04:00")


@pytest.mark.parametrize(
    "expression",
    ["at(2026-02-30T10:00:00)", "at(2026-12-01 10:00:00)", "at(2026-12-01T25:00:00)", "at()", "at(tomorrow)"],
)
def test_malformed_at_is_rejected_on_the_expression_field(expression: str) -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule(expression)
    assert err.value.field == "schedule.expression"


def test_at_latest_at_or_before() -> None:
    schedule = parse_schedule("at(2026-12-01T10:00:00)")
    assert schedule.latest_at_or_before(utc(2026, 12, 1, 9, 59)) is None
    assert schedule.latest_at_or_before(utc(2026, 12, 1, 10, 0)) == utc(2026, 12, 1, 10, 0)
    assert schedule.latest_at_or_before(utc(2030, 1, 1)) == utc(2026, 12, 1, 10, 0)


# --------------------------------------------------------------------------------------------------
# rate(...)
# --------------------------------------------------------------------------------------------------


def test_rate_fires_at_anchor_plus_whole_periods() -> None:
    # Given every 5 minutes from 10:00:30
    schedule = parse_schedule("rate(5 minutes)", anchor=utc(2026, 1, 1, 10, 0, 30))
    # When asked from 10:07
    fires = schedule.preview(utc(2026, 1, 1, 10, 7), 3)
    # Then fires keep the anchor's phase
    assert fires == [utc(2026, 1, 1, 10, 10, 30), utc(2026, 1, 1, 10, 15, 30), utc(2026, 1, 1, 10, 20, 30)]


def test_rate_fires_at_the_anchor_itself_when_asked_from_before_it() -> None:
    schedule = parse_schedule("rate(1 hour)", anchor=utc(2026, 1, 1, 10))
    assert schedule.next_after(utc(2025, 6, 1)) == utc(2026, 1, 1, 10)


def test_rate_next_is_strictly_after_a_fire_instant() -> None:
    schedule = parse_schedule("rate(1 hour)", anchor=utc(2026, 1, 1, 10))
    assert schedule.next_after(utc(2026, 1, 1, 11)) == utc(2026, 1, 1, 12)


def test_rate_anchor_defaults_to_start_at() -> None:
    schedule = parse_schedule("rate(2 days)", start_at=utc(2026, 1, 1, 6))
    assert schedule.anchor == utc(2026, 1, 1, 6)
    assert schedule.preview(utc(2020, 1, 1), 2) == [utc(2026, 1, 1, 6), utc(2026, 1, 3, 6)]


def test_rate_without_anchor_or_start_at_is_rejected() -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule("rate(5 minutes)")
    assert err.value.field == "schedule.start_at"


def test_rate_counts_real_time_across_spring_forward() -> None:
    # Given every 24 hours from 12:00 the day before Berlin springs forward
    schedule = parse_schedule("rate(24 hours)", "Europe/Berlin", anchor=iso("2026-03-28T12:00:00+01:00"))
    # Then the next fire is 24 real hours later: 13:00 local (CEST), not 12:00
    assert schedule.next_after(iso("2026-03-28T12:00:00+01:00")) == iso("2026-03-29T13:00:00+02:00")


def test_rate_in_seconds_is_accepted() -> None:
    schedule = parse_schedule("rate(30 seconds)", anchor=utc(2026, 1, 1))
    assert schedule.next_after(utc(2026, 1, 1, 0, 0, 45)) == utc(2026, 1, 1, 0, 1, 0)


@pytest.mark.parametrize(
    "expression",
    ["RATE(1 Minute)", "rate(1 minutes)", "rate(2 minute)", "rate( 3 hours )", "rate(1 day)", "rate(7 DAYS)"],
)
def test_rate_accepts_singular_plural_and_any_case(expression: str) -> None:
    assert parse_schedule(expression, anchor=utc(2026, 1, 1)).kind == "rate"


@pytest.mark.parametrize(
    "expression",
    [
        "rate(0 minutes)",
        "rate(-5 minutes)",
        "rate(1.5 hours)",
        "rate(5 weeks)",
        "rate(five minutes)",
        "rate()",
    ],
)
def test_bad_rate_is_rejected(expression: str) -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule(expression, anchor=utc(2026, 1, 1))
    assert err.value.field == "schedule.expression"


@pytest.mark.parametrize(
    "expression", ["rate(1 second)", "rate(2 seconds)", "rate(5 seconds)", "rate(9 seconds)"]
)
def test_rate_below_the_ten_second_floor_is_rejected_with_the_floor(expression: str) -> None:
    # one claim takes every fire of its ~75 s lookahead: rate(1 second) would make 75 runs at once
    with pytest.raises(ScheduleError) as err:
        parse_schedule(expression, anchor=utc(2026, 1, 1))
    assert err.value.field == "schedule.expression"
    assert f"`{expression}` is too frequent" in err.value.message
    assert "at most once every 10 seconds" in err.value.message


def test_rate_at_the_floor_is_accepted_and_fires_every_ten_seconds() -> None:
    from duetime.domain.schedules import MIN_RATE_SECONDS

    assert MIN_RATE_SECONDS == 10
    schedule = parse_schedule("rate(10 seconds)", anchor=utc(2026, 1, 1))
    assert schedule.preview(utc(2026, 1, 1), 3) == [
        utc(2026, 1, 1, 0, 0, 10),
        utc(2026, 1, 1, 0, 0, 20),
        utc(2026, 1, 1, 0, 0, 30),
    ]


def test_rate_latest_at_or_before_is_arithmetic() -> None:
    schedule = parse_schedule("rate(1 minute)", anchor=utc(2000, 1, 1))
    started = time.perf_counter()
    latest = schedule.latest_at_or_before(utc(2026, 5, 17, 13, 42, 59))
    assert time.perf_counter() - started < 0.01
    assert latest == utc(2026, 5, 17, 13, 42)


def test_rate_latest_before_anchor_is_none() -> None:
    schedule = parse_schedule("rate(1 minute)", anchor=utc(2026, 1, 1))
    assert schedule.latest_at_or_before(utc(2025, 12, 31, 23, 59)) is None


def test_rate_describe() -> None:
    assert parse_schedule("rate(5 minutes)", anchor=utc(2026, 1, 1)).describe() == "Every 5 minutes"
    assert parse_schedule("rate(1 hour)", anchor=utc(2026, 1, 1)).describe() == "Every hour"


# --------------------------------------------------------------------------------------------------
# Bounds, time zones, instants
# --------------------------------------------------------------------------------------------------


def test_start_at_is_inclusive_and_nothing_fires_before_it() -> None:
    schedule = parse_schedule("rate(1 hour)", anchor=utc(2026, 1, 1), start_at=utc(2026, 1, 1, 5))
    assert schedule.next_after(utc(2025, 1, 1)) == utc(2026, 1, 1, 5)


def test_end_at_is_inclusive_and_nothing_fires_after_it() -> None:
    schedule = parse_schedule("rate(1 hour)", anchor=utc(2026, 1, 1), end_at=utc(2026, 1, 1, 2))
    assert schedule.preview(utc(2025, 1, 1), 10) == [
        utc(2026, 1, 1, 0),
        utc(2026, 1, 1, 1),
        utc(2026, 1, 1, 2),
    ]


def test_latest_at_or_before_respects_end_at() -> None:
    schedule = parse_schedule("rate(1 hour)", anchor=utc(2026, 1, 1), end_at=utc(2026, 1, 1, 2, 30))
    assert schedule.latest_at_or_before(utc(2026, 6, 1)) == utc(2026, 1, 1, 2)


def test_end_before_start_is_rejected_on_end_at() -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule("rate(1 hour)", start_at=utc(2026, 1, 2), end_at=utc(2026, 1, 1))
    assert err.value.field == "schedule.end_at"


def test_at_outside_its_bounds_is_rejected() -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule("at(2026-12-01T10:00:00)", end_at=utc(2026, 6, 1))
    assert err.value.field == "schedule.end_at"


@pytest.mark.parametrize(
    ("kwarg", "field"),
    [("start_at", "schedule.start_at"), ("end_at", "schedule.end_at"), ("anchor", "schedule.anchor")],
)
def test_naive_bounds_are_rejected(kwarg: str, field: str) -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule("rate(1 hour)", **{kwarg: datetime(2026, 1, 1)})  # type: ignore[arg-type]
    assert err.value.field == field


@pytest.mark.parametrize("zone", ["localtime", "posixrules", "right/UTC", "Etc/../UTC", " UTC", "utc"])
def test_zoneinfo_files_that_are_no_iana_names_are_rejected(zone: str) -> None:
    # /usr/share/zoneinfo/localtime (a link to /etc/localtime) loads with ZoneInfo, and means another zone
    # on every host
    with pytest.raises(ScheduleError) as err:
        parse_schedule("0 * * * *", zone)
    assert err.value.field == "schedule.timezone"
    assert f"unknown time zone {zone!r}" in err.value.message


def test_localtime_is_refused_with_the_reason() -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule("@daily", "localtime")
    assert err.value.message == (
        "unknown time zone 'localtime': 'localtime' is a file of this host's zoneinfo directory, not an "
        "IANA zone name: give an IANA name such as 'Europe/Berlin' or 'UTC'"
    )


def test_the_factory_placeholder_zone_is_refused_with_the_reason() -> None:
    # "Factory" loads with ZoneInfo (UTC, abbreviated -00) but names no place
    with pytest.raises(ScheduleError) as err:
        parse_schedule("@daily", "Factory")
    assert err.value.field == "schedule.timezone"
    assert err.value.message.startswith(
        "unknown time zone 'Factory': 'Factory' is the tz database's placeholder for an unset local zone (-00)"
    )


def test_a_zone_in_the_wrong_case_is_refused_with_the_right_spelling() -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule("@daily", "america/new_york")
    assert "did you mean 'America/New_York'?" in err.value.message


def test_every_iana_zone_of_the_tzdata_package_is_accepted_but_the_factory_placeholder() -> None:
    from importlib import resources

    names = resources.files("tzdata").joinpath("zones").read_text().split()
    assert len(names) > 590 and "Europe/Berlin" in names and "Etc/GMT+5" in names and "Factory" in names
    for name in [n for n in names if n != "Factory"] + ["UTC"]:
        assert parse_schedule("@daily", name).timezone == name


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "europe/berlin", "../etc/passwd", "posix/UTC"])
def test_unknown_timezone_is_rejected_on_the_timezone_field(zone: str) -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule("0 * * * *", zone)
    assert err.value.field == "schedule.timezone"


def test_unknown_dst_policy_is_rejected() -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule("0 * * * *", dst_policy="maybe")  # type: ignore[arg-type]
    assert err.value.field == "schedule.dst_policy"


def test_instants_in_any_zone_are_accepted_and_results_are_utc() -> None:
    schedule = parse_schedule("rate(1 hour)", anchor=utc(2026, 1, 1))
    fire = schedule.next_after(datetime(2026, 1, 1, 5, 30, tzinfo=timezone(timedelta(hours=5))))
    assert fire == utc(2026, 1, 1, 1)
    assert fire is not None and fire.tzinfo is UTC


def test_naive_instant_raises_value_error() -> None:
    schedule = parse_schedule("rate(1 hour)", anchor=utc(2026, 1, 1))
    with pytest.raises(ValueError):
        schedule.next_after(datetime(2026, 1, 1))


def test_schedule_is_immutable() -> None:
    schedule = parse_schedule("rate(1 hour)", anchor=utc(2026, 1, 1))
    with pytest.raises(AttributeError):
        schedule.expression = "rate(2 hours)"  # type: ignore[misc]
    assert isinstance(schedule, Schedule)


def test_preview_rejects_negative_count_and_returns_empty_for_zero() -> None:
    schedule = parse_schedule("rate(1 hour)", anchor=utc(2026, 1, 1))
    assert schedule.preview(utc(2026, 1, 1), 0) == []
    with pytest.raises(ValueError):
        schedule.preview(utc(2026, 1, 1), -1)


# --------------------------------------------------------------------------------------------------
# Cron: syntax (Vixie crontab(5))
# --------------------------------------------------------------------------------------------------


def fires(
    expression: str, after: datetime, count: int, zone: str = "UTC", **kwargs: object
) -> list[datetime]:
    return parse_schedule(expression, zone, **kwargs).preview(after, count)  # type: ignore[arg-type]


def test_every_five_minutes() -> None:
    assert fires("*/5 * * * *", utc(2026, 5, 1, 10, 3, 20), 3) == [
        utc(2026, 5, 1, 10, 5),
        utc(2026, 5, 1, 10, 10),
        utc(2026, 5, 1, 10, 15),
    ]


def test_cron_next_is_strictly_after_a_matching_instant() -> None:
    assert fires("*/5 * * * *", utc(2026, 5, 1, 10, 5), 1) == [utc(2026, 5, 1, 10, 10)]


def test_start_slash_step_means_start_to_max() -> None:
    # "5/15" in the minute field = 5,20,35,50
    assert fires("5/15 * * * *", utc(2026, 5, 1, 10, 0), 5) == [
        utc(2026, 5, 1, 10, 5),
        utc(2026, 5, 1, 10, 20),
        utc(2026, 5, 1, 10, 35),
        utc(2026, 5, 1, 10, 50),
        utc(2026, 5, 1, 11, 5),
    ]


def test_lists_and_ranges_combine() -> None:
    assert fires("0 8-9,17 * * *", utc(2026, 5, 1), 4) == [
        utc(2026, 5, 1, 8),
        utc(2026, 5, 1, 9),
        utc(2026, 5, 1, 17),
        utc(2026, 5, 2, 8),
    ]


def test_month_names_and_ranges() -> None:
    assert fires("0 0 1 jan-mar,JUL *", utc(2026, 2, 15), 3) == [
        utc(2026, 3, 1),
        utc(2026, 7, 1),
        utc(2027, 1, 1),
    ]


def test_weekday_names_are_case_insensitive() -> None:
    # 2026-05-01 is a Friday
    assert fires("0 9 * * Mon,WED", utc(2026, 5, 1), 2) == [utc(2026, 5, 4, 9), utc(2026, 5, 6, 9)]


def test_weekday_range_may_wrap_through_sunday() -> None:
    # fri-mon = Fri, Sat, Sun, Mon; 2026-05-06 is a Wednesday
    assert fires("0 0 * * fri-mon", utc(2026, 5, 6), 5) == [
        utc(2026, 5, 8),
        utc(2026, 5, 9),
        utc(2026, 5, 10),
        utc(2026, 5, 11),
        utc(2026, 5, 15),
    ]


def test_sunday_is_zero_and_seven_alike() -> None:
    assert (
        fires("0 0 * * 0", utc(2026, 5, 1), 2)
        == fires("0 0 * * 7", utc(2026, 5, 1), 2)
        == [utc(2026, 5, 3), utc(2026, 5, 10)]
    )


def test_weekday_range_ending_in_seven() -> None:
    # 5-7 = Fri, Sat, Sun
    assert fires("0 0 * * 5-7", utc(2026, 5, 4), 3) == [utc(2026, 5, 8), utc(2026, 5, 9), utc(2026, 5, 10)]


def test_last_day_of_month() -> None:
    assert fires("0 0 L * *", utc(2028, 1, 15), 3) == [utc(2028, 1, 31), utc(2028, 2, 29), utc(2028, 3, 31)]


def test_days_before_the_last_day_of_month() -> None:
    assert fires("0 0 L-2 * *", utc(2027, 2, 1), 2) == [utc(2027, 2, 26), utc(2027, 3, 29)]


def test_nearest_weekday() -> None:
    # 2026-08-15 is a Saturday -> Friday 14th; 2026-11-15 is a Sunday -> Monday 16th
    assert fires("0 0 15W 8,11 *", utc(2026, 8, 1), 2) == [utc(2026, 8, 14), utc(2026, 11, 16)]


def test_nearest_weekday_never_leaves_the_month() -> None:
    # 2026-08-01 is a Saturday: 1W is Monday the 3rd, not Friday July 31st
    assert fires("0 0 1W 8 *", utc(2026, 7, 1), 1) == [utc(2026, 8, 3)]
    # 2026-05-31 is a Sunday: 31W is Friday the 29th
    assert fires("0 0 31W 5 *", utc(2026, 5, 1), 1) == [utc(2026, 5, 29)]


def test_last_weekday_of_month() -> None:
    # 2026-05-31 is a Sunday, 2026-10-31 a Saturday
    assert fires("0 0 LW 5,10 *", utc(2026, 5, 1), 2) == [utc(2026, 5, 29), utc(2026, 10, 30)]


def test_nth_weekday_of_month() -> None:
    # third Friday: 2026-05-15, 2026-06-19
    assert fires("0 0 ? * 5#3", utc(2026, 5, 1), 2) == [utc(2026, 5, 15), utc(2026, 6, 19)]


def test_fifth_weekday_skips_months_without_one() -> None:
    # Fifth Monday: 2026-06-29, then 2026-08-31
    assert fires("0 0 * * 1#5", utc(2026, 6, 1), 2) == [utc(2026, 6, 29), utc(2026, 8, 31)]


def test_last_weekday_x_of_month() -> None:
    # last Friday: 2026-05-29, 2026-06-26
    assert fires("0 0 ? * 5L", utc(2026, 5, 1), 2) == [utc(2026, 5, 29), utc(2026, 6, 26)]


def test_l_alone_in_day_of_week_is_saturday() -> None:
    assert fires("0 0 ? * L", utc(2026, 5, 1), 2) == [utc(2026, 5, 2), utc(2026, 5, 9)]


@pytest.mark.parametrize(
    ("macro", "expected"),
    [
        ("@hourly", [utc(2026, 5, 1, 11), utc(2026, 5, 1, 12)]),
        ("@daily", [utc(2026, 5, 2), utc(2026, 5, 3)]),
        ("@midnight", [utc(2026, 5, 2), utc(2026, 5, 3)]),
        ("@weekly", [utc(2026, 5, 3), utc(2026, 5, 10)]),
        ("@monthly", [utc(2026, 6, 1), utc(2026, 7, 1)]),
        ("@yearly", [utc(2027, 1, 1), utc(2028, 1, 1)]),
        ("@ANNUALLY", [utc(2027, 1, 1), utc(2028, 1, 1)]),
    ],
)
def test_macros(macro: str, expected: list[datetime]) -> None:
    assert fires(macro, utc(2026, 5, 1, 10, 30), 2) == expected


def test_day_fields_or_when_both_restricted() -> None:
    # Friday the 13th style: the 13th OR any Friday (2026-11-13 is itself a Friday)
    assert fires("0 0 13 * fri", utc(2026, 11, 1), 4) == [
        utc(2026, 11, 6),
        utc(2026, 11, 13),
        utc(2026, 11, 20),
        utc(2026, 11, 27),
    ]


def test_day_fields_and_when_one_starts_with_star() -> None:
    # "*/2" day-of-month with Monday: odd days that are Mondays (Vixie rule)
    # Mondays of 2026-06: 1, 8, 15, 22, 29 -> odd ones 1, 15, 29
    assert fires("0 0 */2 * 1", utc(2026, 5, 31), 3) == [utc(2026, 6, 1), utc(2026, 6, 15), utc(2026, 6, 29)]


def test_question_mark_is_any_in_either_day_field() -> None:
    assert fires("0 0 1 * ?", utc(2026, 5, 15), 1) == [utc(2026, 6, 1)]


def test_leap_day_job_fires_only_in_leap_years() -> None:
    assert fires("0 0 29 2 *", utc(2026, 5, 1), 2) == [utc(2028, 2, 29), utc(2032, 2, 29)]


def test_leap_day_job_skips_the_non_leap_century_year() -> None:
    assert fires("0 0 29 2 *", utc(2096, 3, 1), 1) == [utc(2104, 2, 29)]


def test_impossible_day_is_fine_when_the_weekday_field_can_fire() -> None:
    # Feb 31 never exists, but Mondays in February do (Vixie OR)
    assert fires("0 0 31 2 mon", utc(2026, 1, 1), 2) == [utc(2026, 2, 2), utc(2026, 2, 9)]


# --------------------------------------------------------------------------------------------------
# Cron: EventBridge cron(min hour dom month dow year)
# --------------------------------------------------------------------------------------------------


def test_eventbridge_daily_noon() -> None:
    assert fires("cron(0 12 * * ? *)", utc(2026, 5, 1, 13), 2) == [utc(2026, 5, 2, 12), utc(2026, 5, 3, 12)]


def test_eventbridge_weekdays_count_sunday_as_one() -> None:
    # 2-6 = MON-FRI in EventBridge; 2026-05-01 is a Friday
    assert fires("cron(0 10 ? * 2-6 *)", utc(2026, 5, 1, 11), 2) == fires(
        "cron(0 10 ? * MON-FRI *)", utc(2026, 5, 1, 11), 2
    )
    assert fires("cron(0 10 ? * 2-6 *)", utc(2026, 5, 1, 11), 2) == [utc(2026, 5, 4, 10), utc(2026, 5, 5, 10)]


def test_eventbridge_one_is_sunday() -> None:
    assert fires("cron(0 8 ? * 1 *)", utc(2026, 5, 1), 1) == [utc(2026, 5, 3, 8)]


def test_eventbridge_last_friday_uses_its_own_numbering() -> None:
    # 6L = last Friday in EventBridge
    assert fires("cron(0 18 ? * 6L *)", utc(2026, 5, 1), 1) == [utc(2026, 5, 29, 18)]


def test_eventbridge_third_friday() -> None:
    assert fires("cron(0 10 ? * 6#3 *)", utc(2026, 5, 1), 1) == [utc(2026, 5, 15, 10)]


def test_eventbridge_last_day_of_month_in_a_year_range() -> None:
    schedule = parse_schedule("cron(15 10 L 2 ? 2030-2032)")
    assert schedule.preview(utc(2026, 1, 1), 5) == [
        utc(2030, 2, 28, 10, 15),
        utc(2031, 2, 28, 10, 15),
        utc(2032, 2, 29, 10, 15),
    ]


def test_eventbridge_year_list_and_step() -> None:
    assert fires("cron(0 0 1 1 ? 2030/5)", utc(2026, 1, 1), 3) == [
        utc(2030, 1, 1),
        utc(2035, 1, 1),
        utc(2040, 1, 1),
    ]


def test_eventbridge_keyword_is_case_insensitive() -> None:
    assert parse_schedule("CRON(0 12 * * ? *)").kind == "cron"


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("cron(0 12 * * * *)", "exactly one of day-of-month and day-of-week must be `?`"),
        ("cron(0 12 ? * ? *)", "exactly one of day-of-month and day-of-week must be `?`"),
        ("cron(0 12 1 * MON *)", "exactly one of day-of-month and day-of-week must be `?`"),
        ("cron(0 12 * * ?)", "EventBridge cron() takes 6"),
        ("cron(0 12 ? * 0 *)", "out of range 1-7"),
        ("cron(0 12 * * ? 2200)", "out of range 1970-2199"),
        ("cron(0 0 1 1 ? 2001-2005)", "in the past"),
        ("cron(0 0 30 2 ? 2030)", "never occurs in February of 2030"),
        ("cron(0 0 29 2 ? 2029-2031)", "never occurs in February"),
    ],
)
def test_bad_eventbridge_expressions_are_rejected_with_the_reason(expression: str, reason: str) -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule(expression)
    assert err.value.field == "schedule.expression"
    assert reason in err.value.message


# --------------------------------------------------------------------------------------------------
# Cron: rejections (each says why)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("0 0 30 2 *", "day 30 never occurs in February: `0 0 30 2 *` can never fire"),
        ("0 0 31 2 *", "day 31 never occurs in February"),
        ("0 0 30,31 feb *", "days 30 and 31 never occur in February"),
        ("0 0 31 4,6,9,11 *", "day 31 never occurs in April, June, September or November"),
        ("0 0 31 apr ?", "day 31 never occurs in April"),
        ("0 0 L-29 2 *", "can never fire"),
        ("0 0 30W 2 *", "can never fire"),
        ("61 * * * *", "minute value 61 in `61 * * * *` is out of range 0-59"),
        ("0 24 * * *", "hour value 24"),
        ("0 0 0 * *", "day-of-month value 0"),
        ("0 0 1 13 *", "month value 13"),
        ("0 0 * * 8", "day-of-week value 8"),
        ("* * *", "has 3 fields; cron takes 5"),
        ("0 12 * * ? *", "write cron(min hour dom month dow year)"),
        ("*/0 * * * *", "step '0'"),
        ("0 5-3 * * *", "runs backwards"),
        ("? * * * *", "`?` is only allowed"),
        ("0 L * * *", "not a number"),
        ("0 0 * * 5#6", "1 to 5 times a month"),
        ("0 0 * * foo", "not a number"),
        ("0 0 1,,2 * *", "empty item"),
        ("@reboot", "boots"),
        ("@fortnightly", "unknown cron macro"),
        ("every day", "has 2 fields"),
    ],
)
def test_bad_cron_is_rejected_with_the_reason(expression: str, reason: str) -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule(expression)
    assert err.value.field == "schedule.expression"
    assert reason in err.value.message


def test_empty_expression_is_rejected() -> None:
    with pytest.raises(ScheduleError, match="empty"):
        parse_schedule("   ")


# --------------------------------------------------------------------------------------------------
# Cron: DST under the Debian/ISC rule, in other zones and years than the vectors
# --------------------------------------------------------------------------------------------------


def test_weekly_job_keeps_local_hour_across_a_southern_hemisphere_change() -> None:
    # Sydney leaves DST on 2026-04-05 (AEDT +11 -> AEST +10)
    assert fires("0 9 * * 3", iso("2026-03-30T00:00:00+11:00"), 3, "Australia/Sydney") == [
        iso("2026-04-01T09:00:00+11:00"),
        iso("2026-04-08T09:00:00+10:00"),
        iso("2026-04-15T09:00:00+10:00"),
    ]


def test_fixed_job_at_midnight_that_does_not_exist_runs_when_the_gap_ends() -> None:
    # Sao Paulo sprang forward at midnight on 2018-11-04 (00:00 -03 -> 01:00 -02)
    assert fires("0 0 * * *", iso("2018-11-03T12:00:00-03:00"), 2, "America/Sao_Paulo") == [
        iso("2018-11-04T01:00:00-02:00"),
        iso("2018-11-05T00:00:00-02:00"),
    ]


def test_fixed_job_in_gap_runs_at_gap_end_in_berlin() -> None:
    assert fires("30 2 * * *", iso("2026-03-28T12:00:00+01:00"), 2, "Europe/Berlin") == [
        iso("2026-03-29T03:00:00+02:00"),
        iso("2026-03-30T02:30:00+02:00"),
    ]


def test_fixed_job_in_a_half_hour_gap_runs_at_gap_end() -> None:
    # Lord Howe: 2026-10-04 02:00 +10:30 -> 02:30 +11
    assert fires("10 2 * * *", iso("2026-10-03T12:00:00+10:30"), 2, "Australia/Lord_Howe") == [
        iso("2026-10-04T02:30:00+11:00"),
        iso("2026-10-05T02:10:00+11:00"),
    ]


def test_several_fixed_times_in_the_gap_run_once() -> None:
    # 02:00, 02:20 and 02:40 are all skipped by New York's 2026 gap; plus 03:00 itself
    assert fires("0,20,40 2,3 * * *", iso("2026-03-08T01:00:00-05:00"), 4, "America/New_York") == [
        iso("2026-03-08T03:00:00-04:00"),
        iso("2026-03-08T03:20:00-04:00"),
        iso("2026-03-08T03:40:00-04:00"),
        iso("2026-03-09T02:00:00-04:00"),
    ]


def test_skip_policy_drops_a_fixed_time_in_the_gap() -> None:
    assert fires(
        "30 2 * * *", iso("2026-03-08T00:00:00-05:00"), 2, "America/New_York", dst_policy="skip"
    ) == [iso("2026-03-09T02:30:00-04:00"), iso("2026-03-10T02:30:00-04:00")]


def test_skip_policy_does_not_change_a_normal_day() -> None:
    assert fires("30 2 * * *", utc(2026, 6, 1), 3, "Europe/Berlin", dst_policy="skip") == fires(
        "30 2 * * *", utc(2026, 6, 1), 3, "Europe/Berlin"
    )


def test_interval_job_skips_wall_times_inside_the_gap() -> None:
    # Sydney springs forward 2026-10-04 02:00 AEST -> 03:00 AEDT
    assert fires("0 * * * *", iso("2026-10-04T01:00:00+10:00"), 2, "Australia/Sydney") == [
        iso("2026-10-04T03:00:00+11:00"),
        iso("2026-10-04T04:00:00+11:00"),
    ]


def test_hourly_fires_in_both_passes_of_londons_repeated_hour() -> None:
    assert fires("0 * * * *", iso("2026-10-25T00:30:00+01:00"), 3, "Europe/London") == [
        iso("2026-10-25T01:00:00+01:00"),
        iso("2026-10-25T01:00:00+00:00"),
        iso("2026-10-25T02:00:00+00:00"),
    ]


def test_quarter_hourly_keeps_fifteen_real_minutes_through_berlins_repeated_hour() -> None:
    got = fires("*/15 * * * *", iso("2026-10-25T02:30:00+02:00"), 6, "Europe/Berlin")
    assert got == [
        iso("2026-10-25T02:45:00+02:00"),
        iso("2026-10-25T02:00:00+01:00"),
        iso("2026-10-25T02:15:00+01:00"),
        iso("2026-10-25T02:30:00+01:00"),
        iso("2026-10-25T02:45:00+01:00"),
        iso("2026-10-25T03:00:00+01:00"),
    ]
    assert all(b - a == timedelta(minutes=15) for a, b in zip(got, got[1:], strict=False))


def test_interval_job_asked_from_inside_the_second_pass() -> None:
    # 01:10 EST is in New York's second 01:xx hour; the next */30 is 01:30 EST, not 01:30 EDT (already past)
    assert fires("*/30 * * * *", iso("2026-11-01T01:10:00-05:00"), 2, "America/New_York") == [
        iso("2026-11-01T01:30:00-05:00"),
        iso("2026-11-01T02:00:00-05:00"),
    ]


def test_fixed_job_asked_from_inside_the_second_pass_waits_for_tomorrow() -> None:
    assert fires("30 1 * * *", iso("2026-11-01T01:10:00-05:00"), 1, "America/New_York") == [
        iso("2026-11-02T01:30:00-05:00")
    ]


def test_fixed_job_in_sydneys_repeated_hour_fires_once() -> None:
    # Sydney 2026-04-05: 03:00 AEDT -> 02:00 AEST, so 02:30 happens twice
    assert fires("30 2 * * *", iso("2026-04-04T12:00:00+11:00"), 2, "Australia/Sydney") == [
        iso("2026-04-05T02:30:00+11:00"),
        iso("2026-04-06T02:30:00+10:00"),
    ]


def test_fixed_hour_with_many_minutes_fires_each_minute_once_at_fall_back() -> None:
    got = fires("0,30 1 * * *", iso("2026-11-01T00:00:00-04:00"), 3, "America/New_York")
    assert got == [
        iso("2026-11-01T01:00:00-04:00"),
        iso("2026-11-01T01:30:00-04:00"),
        iso("2026-11-02T01:00:00-05:00"),
    ]


def test_half_hour_repeat_on_lord_howe_fires_interval_jobs_twice() -> None:
    # Lord Howe 2026-04-05: 02:00 +11 -> 01:30 +10:30, so 01:30-01:59 repeats
    assert fires("*/20 1 * * *", iso("2026-04-05T01:30:00+11:00"), 4, "Australia/Lord_Howe") == [
        iso("2026-04-05T01:40:00+11:00"),
        iso("2026-04-05T01:40:00+10:30"),
        iso("2026-04-06T01:00:00+10:30"),
        iso("2026-04-06T01:20:00+10:30"),
    ]


@pytest.mark.parametrize(
    ("zone", "first"),
    [
        ("Asia/Kolkata", utc(2026, 5, 1, 10, 30)),  # +05:30
        ("Asia/Kathmandu", utc(2026, 5, 1, 10, 15)),  # +05:45
        ("Australia/Lord_Howe", utc(2026, 5, 1, 10, 30)),  # +10:30 in May
        ("America/St_Johns", utc(2026, 5, 1, 10, 30)),  # -02:30 in May
    ],
)
def test_hourly_fires_at_local_top_of_the_hour_in_non_hour_zones(zone: str, first: datetime) -> None:
    got = fires("0 * * * *", utc(2026, 5, 1, 10, 0), 2, zone)
    assert got == [first, first + timedelta(hours=1)]
    assert all(
        fire.astimezone(parse_schedule("0 * * * *", zone)._rule.zone).minute == 0  # type: ignore[attr-defined]
        for fire in got
    )


def test_lord_howe_hourly_is_ninety_minutes_apart_across_its_half_hour_fall_back() -> None:
    assert fires("0 * * * *", iso("2026-04-05T00:30:00+11:00"), 3, "Australia/Lord_Howe") == [
        iso("2026-04-05T01:00:00+11:00"),
        iso("2026-04-05T02:00:00+10:30"),
        iso("2026-04-05T03:00:00+10:30"),
    ]


def test_utc_job_ignores_every_dst_date() -> None:
    assert fires("30 1 * * *", utc(2026, 3, 28, 23), 3) == [
        utc(2026, 3, 29, 1, 30),
        utc(2026, 3, 30, 1, 30),
        utc(2026, 3, 31, 1, 30),
    ]


def test_rate_counts_real_time_across_lord_howes_half_hour_fall_back() -> None:
    schedule = parse_schedule("rate(1 hour)", "Australia/Lord_Howe", anchor=iso("2026-04-05T01:00:00+11:00"))
    assert schedule.preview(iso("2026-04-05T01:00:00+11:00"), 2) == [
        iso("2026-04-05T01:30:00+10:30"),
        iso("2026-04-05T02:30:00+10:30"),
    ]


# --------------------------------------------------------------------------------------------------
# Cron: latest_at_or_before, bounds, speed, descriptions
# --------------------------------------------------------------------------------------------------


def test_cron_latest_at_or_before_finds_the_previous_weekday_fire() -> None:
    # Saturday 2026-05-02: the latest weekday noon in Berlin was Friday 12:00 CEST
    schedule = parse_schedule("0 12 * * 1-5", "Europe/Berlin")
    assert schedule.latest_at_or_before(iso("2026-05-02T18:00:00+02:00")) == iso("2026-05-01T12:00:00+02:00")


def test_cron_latest_at_or_before_includes_the_instant_itself() -> None:
    schedule = parse_schedule("*/5 * * * *")
    assert schedule.latest_at_or_before(utc(2026, 5, 1, 10, 5)) == utc(2026, 5, 1, 10, 5)


def test_cron_latest_at_or_before_reaches_back_years_for_sparse_jobs() -> None:
    schedule = parse_schedule("0 0 29 2 *", "America/New_York")
    started = time.perf_counter()
    latest = schedule.latest_at_or_before(utc(2031, 6, 1))
    assert time.perf_counter() - started < 0.1
    assert latest == iso("2028-02-29T00:00:00-05:00")


def test_cron_latest_at_or_before_sees_the_second_pass_of_a_repeated_hour() -> None:
    schedule = parse_schedule("0 * * * *", "America/Los_Angeles")
    assert schedule.latest_at_or_before(iso("2026-11-01T01:30:00-08:00")) == iso("2026-11-01T01:00:00-08:00")


def test_cron_latest_at_or_before_honours_start_at() -> None:
    schedule = parse_schedule("0 0 * * *", start_at=utc(2026, 5, 1, 12))
    assert schedule.latest_at_or_before(utc(2026, 5, 1, 23)) is None
    assert schedule.latest_at_or_before(utc(2026, 5, 2, 1)) == utc(2026, 5, 2)


def test_cron_bounds() -> None:
    schedule = parse_schedule("0 0 * * *", start_at=utc(2026, 5, 1), end_at=utc(2026, 5, 3))
    assert schedule.preview(utc(2020, 1, 1), 10) == [utc(2026, 5, 1), utc(2026, 5, 2), utc(2026, 5, 3)]


def test_cron_that_cannot_fire_between_its_bounds_is_rejected() -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule("0 0 1 1 *", start_at=utc(2026, 2, 1), end_at=utc(2026, 12, 1))
    assert err.value.field == "schedule.end_at"


def test_next_after_is_fast_for_frequent_and_sparse_jobs() -> None:
    frequent = parse_schedule("*/5 * * * *", "Europe/Berlin")
    sparse = parse_schedule("0 0 ? 2 1#5", "America/New_York")  # fifth Monday of February: 2044
    instant = utc(2026, 3, 1)
    started = time.perf_counter()
    for i in range(1000):
        frequent.next_after(instant + timedelta(minutes=7 * i))
    per_frequent = (time.perf_counter() - started) / 1000
    started = time.perf_counter()
    for i in range(100):
        sparse.next_after(instant + timedelta(days=i))
    per_sparse = (time.perf_counter() - started) / 100
    assert sparse.next_after(instant) == iso("2044-02-29T00:00:00-05:00")
    assert per_frequent < 0.001
    assert per_sparse < 0.01


@pytest.mark.parametrize(
    ("expression", "zone", "description"),
    [
        ("*/5 * * * *", "UTC", "Every 5 minutes (UTC)"),
        ("0 12 * * 1-5", "Europe/Berlin", "At 12:00 PM, Monday through Friday (Europe/Berlin)"),
        ("cron(0 12 ? * 2-6 *)", "Europe/Berlin", "At 12:00 PM, Monday through Friday (Europe/Berlin)"),
        ("@daily", "UTC", "At 12:00 AM (UTC)"),
        ("0 0 ? * 5#3", "UTC", "At 12:00 AM, on the third Friday of the month (UTC)"),
        ("0 0 L-3 * *", "UTC", "At 12:00 AM, 3 days before the last day of the month (UTC)"),
        ("0 0 */2 * 1", "UTC", "At 12:00 AM, every 2 days, but only on Monday (UTC)"),
    ],
)
def test_cron_describe(expression: str, zone: str, description: str) -> None:
    assert parse_schedule(expression, zone).describe() == description


def test_at_describe() -> None:
    assert parse_schedule("at(2026-12-01T10:00:00)", "Europe/Berlin").describe() == (
        "Once, at 2026-12-01 10:00:00 (Europe/Berlin)"
    )


def test_a_day_long_jump_is_a_clock_correction_and_fixed_jobs_in_it_are_skipped() -> None:
    # Samoa skipped 30 December 2011 (23:59:59 -10:00 on the 29th -> 00:00 +14:00 on the 31st)
    assert fires("0 12 * * *", iso("2011-12-29T00:00:00-10:00"), 2, "Pacific/Apia") == [
        iso("2011-12-29T12:00:00-10:00"),
        iso("2011-12-31T12:00:00+14:00"),
    ]


def test_a_two_hour_gap_is_still_made_up_for() -> None:
    # Antarctica/Troll jumps from +00 to +02 at 01:00 UTC on the last Sunday of March (2026-03-29)
    assert fires("30 1 * * *", iso("2026-03-28T12:00:00+00:00"), 2, "Antarctica/Troll") == [
        iso("2026-03-29T03:00:00+02:00"),
        iso("2026-03-30T01:30:00+02:00"),
    ]


@pytest.mark.parametrize(
    ("expression", "first"),
    [
        ("cron(0 0 1 1 ? 2150)", datetime(2150, 1, 1, tzinfo=UTC)),
        ("cron(0 0 1 1 ? 2199)", datetime(2199, 1, 1, tzinfo=UTC)),
        ("cron(0 12 ? * MON#5 2150)", datetime(2150, 3, 30, 12, tzinfo=UTC)),
        ("cron(0 0 29 2 ? 2100-2199)", datetime(2104, 2, 29, tzinfo=UTC)),  # 2100 is not a leap year
    ],
)
def test_an_explicit_far_year_is_found_however_far_ahead(expression: str, first: datetime) -> None:
    schedule = parse_schedule(expression)
    assert schedule.next_after(datetime(2026, 11, 29, tzinfo=UTC)) == first
    assert schedule.next_after(first) is None or schedule.next_after(first) > first


def test_a_stored_schedule_accepted_before_a_submit_rule_tightened_still_fires() -> None:
    # a job stored with rate(5 seconds) or zone `localtime` before the floor and the IANA-only rule
    anchor = datetime(2026, 11, 29, 12, tzinfo=UTC)
    with pytest.raises(ScheduleError):
        parse_schedule("rate(5 seconds)", anchor=anchor)
    stored = parse_schedule("rate(5 seconds)", anchor=anchor, stored=True)
    assert stored.next_after(anchor) == anchor + timedelta(seconds=5)
    assert parse_schedule("0 4 * * *", "localtime", stored=True).next_after(anchor) is not None
    with pytest.raises(ScheduleError):
        parse_schedule("0 4 * * *", "Not/AZone", stored=True)


@pytest.mark.parametrize(
    ("expression", "described", "first_fires"),
    [
        # a step past the field's values picks only the range's first one: described as that value
        (
            "*/99999999999999999999 * * * *",
            "Every hour (UTC)",
            ["2026-01-01T00:00:00+00:00", "2026-01-01T01:00:00+00:00"],
        ),
        (
            "5/90 * * * *",
            "At 5 minutes past the hour (UTC)",
            ["2026-01-01T00:05:00+00:00", "2026-01-01T01:05:00+00:00"],
        ),
        ("0 */30 * * *", "At 12:00 AM (UTC)", ["2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00"]),
        # a step that does reach a second value is described as a step
        (
            "*/15 * * * *",
            "Every 15 minutes (UTC)",
            ["2026-01-01T00:00:00+00:00", "2026-01-01T00:15:00+00:00"],
        ),
    ],
)
def test_a_step_longer_than_its_field_is_described_as_the_one_value_it_fires_at(
    expression: str, described: str, first_fires: list[str]
) -> None:
    schedule = parse_schedule(expression)
    assert schedule.describe() == described
    fires = [schedule.next_after(utc(2025, 12, 31, 23, 59, 59))]
    fires.append(schedule.next_after(fires[0]))
    assert [f.isoformat() for f in fires] == first_fires


# --------------------------------------------------------------------------------------------------
# Numbers are ASCII digits
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "character"),
    [
        ("² * * * *", "'²' (U+00B2)"),
        ("0 ² * * *", "'²' (U+00B2)"),
        ("cron(0 0 ² * ? *)", "'²' (U+00B2)"),
        ("rate(² minutes)", "'²' (U+00B2)"),
        ("*/² * * * *", "'²' (U+00B2)"),
        ("1-² * * * *", "'²' (U+00B2)"),
        ("٠ * * * *", "'٠' (U+0660)"),
        ("１ * * * *", "'１' (U+FF11)"),
        ("rate(１０ minutes)", "'１' (U+FF11)"),
        ("at(２０２７-01-01T00:00:00)", "'２' (U+FF12)"),
        ("0 0 L-٣ * *", "'٣' (U+0663)"),
        ("0 0 ٣W * *", "'٣' (U+0663)"),
        ("0 0 * * 1#٢", "'٢' (U+0662)"),
    ],
)
def test_a_digit_that_is_not_ascii_is_refused_naming_it(expression: str, character: str) -> None:
    # Given an expression with a superscript, Arabic-Indic or fullwidth digit (int() reads most of them)
    # When it is parsed for a submit
    with pytest.raises(ScheduleError) as err:
        parse_schedule(expression, anchor=utc(2026, 1, 1))
    # Then it is refused on the expression, naming the character
    assert err.value.field == "schedule.expression"
    assert err.value.message == f"{character} in `{expression}` is not an ASCII digit: write numbers with 0-9"


def test_a_stored_expression_with_a_decimal_digit_of_another_script_still_fires() -> None:
    # Given a job stored before the rule, with minute `٥` (Arabic-Indic 5)
    schedule = parse_schedule("٥ * * * *", stored=True)
    # Then it reads, keeps its expression, and fires at minute 5 as it did
    assert schedule.expression == "٥ * * * *"
    assert schedule.preview(utc(2026, 1, 1), 2) == [utc(2026, 1, 1, 0, 5), utc(2026, 1, 1, 1, 5)]


def test_a_preview_stops_at_the_end_of_the_supported_range() -> None:
    # Given @daily previewed from the last day of 2199 (UTC), the supported range's last year
    schedule = parse_schedule("@daily")
    # When five fire times are asked for
    fires = schedule.preview(utc(2199, 12, 30, 12), 5)
    # Then only the one left in 2199 comes, none in 2200
    assert fires == [utc(2199, 12, 31)]
