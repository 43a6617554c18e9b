"""Retry backoff timing ([S0] "wait 10 seconds, then 40, then a few minutes, with a bit of randomness")."""

from __future__ import annotations

import random

import pytest

from duetime.domain.models import RetryPolicy
from duetime.domain.retries import backoff_ceiling, backoff_delay


def test_the_default_ceilings_are_10_40_160_640_then_the_15_minute_cap() -> None:
    policy = RetryPolicy()
    assert [backoff_ceiling(policy, n) for n in range(1, 7)] == [10, 40, 160, 640, 900, 900]


def test_equal_jitter_is_the_default_and_stays_in_the_upper_half_of_each_window() -> None:
    policy = RetryPolicy()
    assert policy.jitter == "equal"
    assert backoff_delay(policy, 1, rand=lambda: 0.0) == 5.0
    assert backoff_delay(policy, 1, rand=lambda: 0.5) == 7.5
    assert backoff_delay(policy, 2, rand=lambda: 0.999) == pytest.approx(39.98)


def test_with_default_equal_jitter_every_gap_is_at_least_as_long_as_the_one_before() -> None:
    # Given many runs' worth of random draws over five failed attempts with the default policy
    policy = RetryPolicy(max_attempts=6)
    rng = random.Random(42)
    for _ in range(2000):
        gaps = [backoff_delay(policy, n, rand=rng.random) for n in range(1, 6)]
        # Then the backoff never shrinks (until the cap, where both windows are [450, 900))
        assert all(b >= a for a, b in zip(gaps[:3], gaps[1:4], strict=True)), gaps
        assert all(450 <= g < 900 for g in gaps[4:]), gaps


def test_full_jitter_spans_the_whole_window_and_none_is_the_ceiling() -> None:
    full = RetryPolicy(jitter="full")
    assert backoff_delay(full, 2, rand=lambda: 0.0) == 0.0
    assert backoff_delay(full, 2, rand=lambda: 0.25) == 10.0
    assert backoff_delay(RetryPolicy(jitter="none"), 3, rand=lambda: 0.9) == 160.0


def test_attempt_numbers_are_one_based() -> None:
    with pytest.raises(ValueError, match="1-based"):
        backoff_delay(RetryPolicy(), 0)


def test_an_unknown_jitter_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="'equal', 'full' or 'none'"):
        RetryPolicy(jitter="decorrelated")  # type: ignore[arg-type]
