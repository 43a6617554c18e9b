"""Every vector in tests/data/cron-vectors.json, as a parametrized test.

The vectors were distilled from public bug reports against cron libraries and computed by an independent
brute-force evaluator (Debian/ISC DST rule, Vixie day rule). "after" is the instant handed to
``next_after``; the expected list is the next fires in order. Rate vectors count from ``anchor``.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime.domain.errors import ScheduleError
from duetime.domain.schedules import parse_schedule

VECTORS_FILE = Path(__file__).resolve().parents[1] / "data" / "cron-vectors.json"


def _load() -> list[dict[str, Any]]:
    data = json.loads(VECTORS_FILE.read_text())
    vectors: list[dict[str, Any]] = data["vectors"]
    return vectors


VECTORS = _load()
FIRING = [v for v in VECTORS if not v.get("reject")]
REJECTED = [v for v in VECTORS if v.get("reject")]


def test_the_vector_file_has_both_kinds() -> None:
    assert len(FIRING) >= 20
    assert len(REJECTED) >= 4


@pytest.mark.parametrize("vector", FIRING, ids=[v["id"] for v in FIRING])
def test_vector_fires_exactly_at_the_expected_instants(vector: dict[str, Any]) -> None:
    # Given the vector's schedule
    if vector["kind"] == "rate":
        schedule = parse_schedule(
            f"rate({vector['every_minutes']} minutes)",
            vector["timezone"],
            anchor=datetime.fromisoformat(vector["anchor"]),
        )
    else:
        schedule = parse_schedule(vector["expression"], vector["timezone"])
    expected = [datetime.fromisoformat(text) for text in vector["expected"]]
    # When previewing from its "after" instant
    fires = schedule.preview(datetime.fromisoformat(vector["after"]), len(expected))
    # Then the instants are exactly the expected ones (compared as instants), in UTC
    assert fires == expected, vector["note"]
    assert all(fire.utcoffset() == timedelta(0) for fire in fires)


@pytest.mark.parametrize("vector", FIRING, ids=[v["id"] for v in FIRING])
def test_vector_fires_one_at_a_time_match_the_preview(vector: dict[str, Any]) -> None:
    # next_after chained by hand gives the same instants as preview (no state hidden in preview)
    if vector["kind"] == "rate":
        schedule = parse_schedule(
            f"rate({vector['every_minutes']} minutes)",
            vector["timezone"],
            anchor=datetime.fromisoformat(vector["anchor"]),
        )
    else:
        schedule = parse_schedule(vector["expression"], vector["timezone"])
    cursor = datetime.fromisoformat(vector["after"])
    for text in vector["expected"]:
        fire = schedule.next_after(cursor)
        assert fire == datetime.fromisoformat(text)
        assert fire is not None and fire > cursor
        cursor = fire


@pytest.mark.parametrize("vector", FIRING, ids=[v["id"] for v in FIRING])
def test_vector_latest_at_or_before_each_expected_fire_is_that_fire(vector: dict[str, Any]) -> None:
    if vector["kind"] == "rate":
        schedule = parse_schedule(
            f"rate({vector['every_minutes']} minutes)",
            vector["timezone"],
            anchor=datetime.fromisoformat(vector["anchor"]),
        )
    else:
        schedule = parse_schedule(vector["expression"], vector["timezone"])
    for text in vector["expected"]:
        fire = datetime.fromisoformat(text)
        assert schedule.latest_at_or_before(fire) == fire


@pytest.mark.parametrize("vector", REJECTED, ids=[v["id"] for v in REJECTED])
def test_vector_is_rejected_at_parse_with_a_reason(vector: dict[str, Any]) -> None:
    with pytest.raises(ScheduleError) as err:
        parse_schedule(vector["expression"], vector.get("timezone", "UTC"))
    assert err.value.field == "schedule.expression"
    assert len(err.value.message) > 20
