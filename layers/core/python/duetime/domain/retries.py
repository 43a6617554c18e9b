"""Retry timing: exponential backoff with equal, full or no jitter (pure).

Source: [S0] "wait 10 seconds, then 40, then a few minutes, with a bit of randomness"; AWS Architecture Blog,
"Exponential Backoff And Jitter" (equal jitter: ``c/2 + uniform(0, c/2)``, full jitter: ``uniform(0, c)``,
with ``c = min(cap, base * multiplier**n)``).

The default is equal jitter: it keeps [S0]'s "a bit of randomness" (the delays of runs that failed together
spread over half of each window, so a broken dependency is not hammered by every job at once) and its
"10 seconds, then 40": with a multiplier >= 2 each gap is at least as long as the one before it, until the
cap. Full jitter (DESIGN.md section 5's wording) spreads wider but may wait 1 s after waiting 9 s, which a
user reads as a shrinking backoff; it stays available as ``jitter: "full"``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from duetime.domain.models import RetryPolicy


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

    ``jitter="equal"`` (default): ``ceiling / 2 + rand() * ceiling / 2`` (uniform in ``[ceiling/2, ceiling)``);
    ``"full"``: ``rand() * ceiling`` (uniform in ``[0, ceiling)``); ``"none"``: the ceiling itself.
    ``rand`` returns a float in ``[0, 1)`` and is injectable so tests are deterministic.

    Raises:
        ValueError: if ``failed_attempt`` < 1.
    """
    ceiling = backoff_ceiling(policy, failed_attempt)
    if policy.jitter == "equal":
        return ceiling / 2 + rand() * ceiling / 2
    if policy.jitter == "full":
        return ceiling * rand()
    return ceiling
