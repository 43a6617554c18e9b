"""The console's pure parts: the per-minute lag buckets, the DST notes, the CSRF check, escaping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from duetime.api.console import render
from duetime.domain.models import AttemptRecord, Run, RunState
from duetime.services.lag import bucket

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def run_at(due: datetime, lag: float, state: RunState = RunState.SUCCEEDED) -> Run:
    started = due + timedelta(seconds=lag)
    return Run.model_construct(
        job_id="j",
        due_at=due,
        state=state,
        started_at=started,
        finished_at=started + timedelta(seconds=1),
        attempts=[AttemptRecord(attempt=1, fencing_token=1, started_at=started, state=state)],
    )


def test_bucket_counts_runs_started_and_failed_per_minute_with_nearest_rank_percentiles() -> None:
    # Given three runs started in minute 0 (lags 1, 2, 3 s) and one failed in minute 2
    runs = [run_at(T0 + timedelta(seconds=s), lag) for s, lag in ((0, 1.0), (10, 2.0), (20, 3.0))]
    runs.append(run_at(T0 + timedelta(minutes=2), 0.5, RunState.FAILED))
    # When they are bucketed over three minutes
    minutes = bucket(runs, since=T0, until=T0 + timedelta(minutes=3))
    # Then each minute has its own figures
    assert [m.started for m in minutes] == [3, 0, 1]
    assert [m.failed for m in minutes] == [0, 0, 1]
    assert (minutes[0].p50_seconds, minutes[0].p99_seconds) == (2.0, 3.0)
    assert minutes[1].p50_seconds is None


def test_a_fire_after_a_dst_change_carries_a_note() -> None:
    fires = [datetime(2027, 3, 1, 11, tzinfo=UTC), datetime(2027, 4, 1, 10, tzinfo=UTC)]
    notes = render.fires_with_dst_notes(fires, "Europe/Berlin", now=datetime(2027, 2, 1, tzinfo=UTC))
    assert notes[0]["note"] is None
    assert notes[1]["note"] == "after a DST change: UTC+01:00 -> UTC+02:00"
    assert notes[1]["local"].startswith("2027-04-01 12:00:00 CEST")


def test_csrf_needs_the_cookie_and_the_same_value_in_the_form() -> None:
    token = "a" * 64
    event = {"headers": {"cookie": f"duetime_csrf={token}"}}
    assert render.csrf_ok(event, {"csrf": token})
    assert not render.csrf_ok(event, {"csrf": "b" * 64})
    assert not render.csrf_ok(event, {})
    assert not render.csrf_ok({"headers": {}}, {"csrf": token})
    assert render.csrf_ok({"cookies": [f"duetime_csrf={token}"]}, {"csrf": token})  # payload 2.0's list


def test_templates_escape_what_users_wrote() -> None:
    html = render.render(
        "error.html", code="not_found", message="<script>alert(1)</script>", field=None, nav="", csrf="x"
    )
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_sparkline_is_svg_of_numbers_only() -> None:
    svg = str(render.sparkline([0.5, None, 1.0, 0.25]))
    assert svg.startswith('<svg class="spark"') and "<polyline" in svg and "<script" not in svg
    assert "no runs yet" in str(render.sparkline([]))
