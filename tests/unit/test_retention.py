"""The hot window's tiers (domain/retention.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from duetime.domain.models import Run, RunState
from duetime.domain.retention import RetentionPolicy, is_failure
from tests.contract.factories import make_job, make_run

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = RetentionPolicy(hot_days=14, failed_days=90, keep_last=20)


def finished(state: RunState, *, dead: bool = False) -> Run:
    run = make_run(make_job("job-1"), T0)
    return run.model_copy(
        update={"state": state, "finished_at": T0 + timedelta(seconds=5), "dead_lettered": dead}
    )


def test_a_succeeded_run_stays_hot_for_the_hot_window_after_its_finish() -> None:
    run = finished(RunState.SUCCEEDED)
    assert POLICY.expires_at(run) == T0 + timedelta(days=14, seconds=5)


@pytest.mark.parametrize("state", [RunState.FAILED, RunState.TIMED_OUT])
def test_a_failure_stays_hot_for_the_failed_window(state: RunState) -> None:
    run = finished(state)
    assert is_failure(run)
    assert POLICY.expires_at(run) == T0 + timedelta(days=90, seconds=5)


def test_a_dead_lettered_run_is_in_the_failed_tier() -> None:
    run = finished(RunState.CANCELLED, dead=True)
    assert POLICY.expires_at(run) == T0 + timedelta(days=90, seconds=5)


def test_an_unfinished_run_is_bounded_by_the_longer_tier_from_its_due_time() -> None:
    run = make_run(make_job("job-1"), T0)
    assert run.state is RunState.PENDING
    assert POLICY.expires_at(run) == T0 + timedelta(days=90)
    assert not POLICY.archivable(run, now=T0 + timedelta(days=1000), rank=100)


def test_fractional_days_give_seconds() -> None:
    policy = RetentionPolicy(hot_days=0.001, failed_days=0.002, keep_last=0)
    run = finished(RunState.SUCCEEDED)
    assert policy.expires_at(run) == T0 + timedelta(seconds=5 + 86.4)


def test_the_last_n_runs_of_a_job_stay_hot_whatever_their_age() -> None:
    run = finished(RunState.SUCCEEDED)
    late = T0 + timedelta(days=365)
    assert not POLICY.archivable(run, now=late, rank=19)
    assert POLICY.archivable(run, now=late, rank=20)


def test_a_run_is_archivable_exactly_at_its_ttl() -> None:
    run = finished(RunState.SUCCEEDED)
    ttl = POLICY.expires_at(run)
    assert not POLICY.archivable(run, now=ttl - timedelta(microseconds=1), rank=50)
    assert POLICY.archivable(run, now=ttl, rank=50)


def test_a_row_written_under_the_old_ttl_keeps_it() -> None:
    run = finished(RunState.SUCCEEDED)
    old_ttl = T0 + timedelta(days=90)
    assert not POLICY.archivable(run, now=T0 + timedelta(days=30), rank=50, expires_at=old_ttl)
    assert POLICY.archivable(run, now=old_ttl, rank=50, expires_at=old_ttl)


def test_a_kept_run_is_rearmed_one_hot_window_on() -> None:
    assert POLICY.rearmed(T0) == T0 + timedelta(days=14)


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError):
        RetentionPolicy(hot_days=0)
    with pytest.raises(ValueError):
        RetentionPolicy(keep_last=-1)
