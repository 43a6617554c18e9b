"""Daylight saving: the DST policies and how a wall-clock time maps to a real (UTC) instant.

* :data:`DstPolicy` -- ``"shift"`` (the Debian/ISC cron rule, default) or ``"skip"`` (EventBridge
  Scheduler's gap behaviour); the docstring there is the rule for cron schedules.
* :func:`_resolve_local` -- a wall time to its instant: the first occurrence in a fall-back fold, the first
  instant after the gap for a spring-forward gap (PEP 495 ``fold`` semantics). ``at(...)`` uses it as it
  is under ``shift`` and is refused in a gap under ``skip`` (``duetime.domain.schedules.parse``); cron
  applies the policy on top (``duetime.domain.schedules.cron``).
* :func:`_first_offset_change` -- where a zone's UTC offset changes between two instants (a transition).
* :data:`_CLOCK_CORRECTION` -- Debian's 3-hour line between a DST gap and a clock correction.

``rate(...)`` counts real time and never consults any of this.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

DstPolicy = Literal["shift", "skip"]
"""How a cron schedule treats daylight-saving changes.

``"shift"`` (default) is the Debian/ISC cron rule (Debian's cron(8), "Special considerations exist when
the clock is changed by less than 3 hours"): a *fixed-time* job (neither the minute nor the hour field
starts with ``*``) whose local time falls in the spring-forward gap runs once, at the first instant after
the gap; one whose local time occurs twice at fall-back runs once, at the first occurrence. An
*interval* job (minute or hour field starts with ``*``, and ``@hourly``) fires at every real instant
whose wall-clock time matches: wall times inside a gap never occur, wall times in a repeated hour occur
(and fire) twice. As in Debian, a jump forward of 3 hours or more (Samoa skipping 30 December 2011) is a
clock correction, not daylight saving: fixed-time jobs whose time it swallows are skipped, which keeps
"at most once per local date". A repeated wall time always fires once for a fixed-time job, however long
the repeat (Debian would re-run after a fall-back of 3 hours or more; Duetime keeps "never twice").

``"skip"`` is EventBridge Scheduler's gap behaviour: a fire time that falls inside a spring-forward gap
is skipped, for every job. Repeated (fall-back) times are handled as under ``"shift"``. An ``at(...)``
inside a gap would never fire under ``"skip"``, so it is refused at submit; ``rate(...)`` ignores the
policy.
"""

# Widest fall-back we look for around an instant (real ones are 30 min to 3 h).
_FALLBACK_PROBE = timedelta(hours=6)
# Debian cron(8): a forward jump this long is a clock correction, not a DST gap to make up for.
_CLOCK_CORRECTION = timedelta(hours=3)


def _offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    off = instant.astimezone(zone).utcoffset()
    assert off is not None
    return off


def _first_offset_change(zone: ZoneInfo, lo: datetime, hi: datetime) -> datetime:
    """The first instant in ``(lo, hi]`` whose UTC offset differs from ``lo``'s (UTC, whole seconds).

    Requires the offsets at ``lo`` and ``hi`` to differ. tz database transitions fall on whole seconds.
    """
    before = _offset(zone, lo)
    a = int(lo.timestamp() // 1)
    b = -int(-hi.timestamp() // 1)
    while b - a > 1:
        m = (a + b) // 2
        if _offset(zone, datetime.fromtimestamp(m, UTC)) == before:
            a = m
        else:
            b = m
    return datetime.fromtimestamp(b, UTC)


def _resolve_local(zone: ZoneInfo, naive: datetime) -> tuple[datetime, bool]:
    """Map a wall-clock time to a UTC instant.

    Returns ``(instant, True)`` for a time that exists (the first occurrence if it occurs twice) and
    ``(first instant after the gap, False)`` for a time inside a spring-forward gap.
    """
    first = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == naive:
        return first, True
    # In a gap fold=0 reads the time with the offset before the jump (an instant after the gap) and
    # fold=1 with the offset after it (an instant before the gap) (PEP 495).
    early = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    return _first_offset_change(zone, early, first), False
