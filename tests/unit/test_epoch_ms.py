"""Epoch milliseconds in exact integer arithmetic: a run id names exactly its due time, at any instant."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from duetime.domain.models import parse_run_id, run_id_for
from duetime.domain.timeutil import from_epoch_ms, to_epoch_ms


def test_an_instant_whose_float_timestamp_is_a_millisecond_short_keeps_its_millisecond() -> None:
    # timestamp() * 1000 gives 2151057600002.9998 for this instant: truncated, a millisecond short
    due = datetime(2038, 3, 1, 12, 0, 0, 3000, tzinfo=UTC)
    assert to_epoch_ms(due) == 2_151_057_600_003
    assert from_epoch_ms(2_151_057_600_003) == due
    assert run_id_for("job-1", due) == "job-1.2151057600003"
    assert parse_run_id("job-1.2151057600003") == ("job-1", due)


def test_every_millisecond_instant_round_trips_through_its_run_id() -> None:
    rng = random.Random(20261204)
    start, span_ms = (
        datetime(1970, 1, 1, tzinfo=UTC),
        (datetime(2200, 1, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1),
    )
    for _ in range(20_000):
        due = start + timedelta(milliseconds=rng.randrange(span_ms))
        assert from_epoch_ms(to_epoch_ms(due)) == due
        assert parse_run_id(run_id_for("job-1", due)) == ("job-1", due)


def test_sub_millisecond_precision_is_floored() -> None:
    due = datetime(2026, 12, 4, 3, 0, 0, 999_999, tzinfo=UTC)
    assert to_epoch_ms(due) == to_epoch_ms(due.replace(microsecond=999_000))
