"""Retry timing: exponential backoff with optional full jitter (pure).

Source: [S0] "wait 10 seconds, then 40, then a few minutes, with a bit of randomness"; AWS Architecture Blog,
"Exponential Backoff And Jitter" (full jitter: ``uniform(0, min(cap, base * multiplier**n))``).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from duetime.models import RetryPolicy


def backoff_ceiling(policy: RetryPolicy, failed_attempt: int) -> float:
    """The un-jittered delay, seconds, after attempt number ``failed_attempt`` (1-based) failed.

    ``backoff_seconds * backoff_multiplier ** (failed_attempt - 1)``, capped at ``max_backoff_seconds``.
    With the defaults: 10, 40, 160, 640, 900, 900...

    Raises:
        ValueError: if ``failed_attempt`` < 1.
    """
    if failed_attempt < 1:
        raise ValueError("failed_attempt is 1-based")
    exponent = min(failed_attempt - 1, 64)  # avoid float overflow on absurd attempt counts
    return float(
        min(policy.max_backoff_seconds, policy.backoff_seconds * policy.backoff_multiplier**exponent)
    )


def backoff_delay(
    policy: RetryPolicy, failed_attempt: int, *, rand: Callable[[], float] = random.random
) -> float:
    """Seconds to wait before the next attempt after ``failed_attempt`` failed.

    ``jitter="full"``: ``rand() * ceiling`` (uniform in ``[0, ceiling)``); ``"none"``: the ceiling itself.
    ``rand`` is injectable so tests are deterministic.
    """
    ceiling = backoff_ceiling(policy, failed_attempt)
    return ceiling * rand() if policy.jitter == "full" else ceiling
