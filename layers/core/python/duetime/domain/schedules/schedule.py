"""The public :class:`Schedule`: a rule bounded by ``start_at``/``end_at``, asked for fire times.

Built by :func:`~duetime.domain.schedules.parse.parse_schedule`. ``next_after`` and ``preview`` ask the
rule directly; ``latest_at_or_before`` (catch-up "latest") is O(1) for ``at`` and ``rate`` and a bisection
over ``next_after`` for cron; ``describe`` is in ``duetime.domain.schedules.describe``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from duetime.domain.models import MAX_YEAR
from duetime.domain.schedules.cron import _SEARCH_YEARS, _SECOND
from duetime.domain.schedules.describe import _describe
from duetime.domain.schedules.dst import DstPolicy
from duetime.domain.schedules.rules import _AtRule, _RateRule, _Rule

ScheduleKind = Literal["at", "rate", "cron"]

_MICROSECOND = timedelta(microseconds=1)


def _utc(instant: datetime) -> datetime:
    if not isinstance(instant, datetime) or instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"instant must be a timezone-aware datetime, got {instant!r}")
    return instant.astimezone(UTC)


@dataclass(frozen=True)
class Schedule:
    """A parsed, validated schedule. Immutable; build it with :func:`parse_schedule`.

    Attributes:
        kind: ``"at"``, ``"rate"`` or ``"cron"``.
        expression: the expression as given, stripped of surrounding whitespace.
        timezone: the IANA time-zone name cron fields and ``at()`` times are read in.
        dst_policy: ``"shift"`` or ``"skip"`` (see :data:`DstPolicy`).
        anchor: for ``rate``, the UTC instant the rate counts from (``None`` for other kinds).
        start_at: no fire before this UTC instant (inclusive), or ``None``.
        end_at: no fire after this UTC instant (inclusive), or ``None``.

    Every method takes timezone-aware datetimes in any zone (a naive one raises ``ValueError``) and
    returns timezone-aware UTC datetimes.
    """

    kind: ScheduleKind
    expression: str
    timezone: str
    dst_policy: DstPolicy
    anchor: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    _rule: _Rule = field(repr=False, compare=False)

    def next_after(self, instant: datetime) -> datetime | None:
        """The first fire time strictly after ``instant``, within ``[start_at, end_at]``.

        Args:
            instant: any timezone-aware datetime.

        Returns:
            An aware UTC datetime, or ``None`` if the schedule never fires again (past ``end_at``, an
            ``at()`` already passed, an EventBridge year range exhausted, or no match within 50 years).

        Raises:
            ValueError: ``instant`` is naive.
        """
        x = _utc(instant)
        if self.start_at is not None and x < self.start_at:
            x = self.start_at - _MICROSECOND
        try:
            fire = self._rule.next_after(x)
        except OverflowError:
            return None
        if fire is None or (self.end_at is not None and fire > self.end_at):
            return None
        return fire

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        """The most recent fire time ``<= instant`` within ``[start_at, end_at]``, or ``None``.

        Used for catch-up "latest". O(1) for ``at`` and ``rate``; for ``cron`` a bisection over
        :meth:`next_after` (about 10-40 evaluations, well under a few milliseconds).

        Raises:
            ValueError: ``instant`` is naive.
        """
        hi = _utc(instant)
        if self.end_at is not None and self.end_at < hi:
            hi = self.end_at
        if self.start_at is not None and hi < self.start_at:
            return None
        if isinstance(self._rule, _AtRule | _RateRule):
            fire = self._rule.latest_at_or_before(hi)
        else:
            fire = self._latest_by_bisection(hi)
        if fire is None or (self.start_at is not None and fire < self.start_at):
            return None
        return fire

    def _latest_by_bisection(self, hi: datetime) -> datetime | None:
        floor = None if self.start_at is None else self.start_at - _MICROSECOND
        windows = (
            timedelta(minutes=2),
            timedelta(hours=1),
            timedelta(days=1),
            timedelta(days=35),
            timedelta(days=400),
            timedelta(days=366 * (_SEARCH_YEARS + 1)),
        )
        lo: datetime | None = None
        for width in windows:
            try:
                candidate_lo = hi - width
            except OverflowError:
                candidate_lo = datetime.min.replace(tzinfo=UTC)
            at_floor = floor is not None and candidate_lo <= floor
            if at_floor:
                assert floor is not None
                candidate_lo = floor
            fire = self.next_after(candidate_lo)
            if fire is not None and fire <= hi:
                lo = candidate_lo
                break
            if at_floor:
                return None
        if lo is None:
            return None
        # A fire exists in (lo, hi]; the latest one lies in (lo, top].
        top = hi
        while top - lo > _SECOND:
            mid = lo + (top - lo) / 2
            fire = self.next_after(mid)
            if fire is not None and fire <= hi:
                lo = mid
            else:
                top = mid
        fire = self.next_after(lo)
        assert fire is not None
        while True:
            following = self.next_after(fire)
            if following is None or following > hi:
                return fire
            fire = following

    def preview(self, after: datetime, count: int) -> list[datetime]:
        """The next ``count`` fire times strictly after ``after``, UTC: fewer if the schedule ends or reaches
        the end of the supported range (year :data:`~duetime.domain.models.MAX_YEAR` UTC, the range every
        instant of a job and an ``at()`` are held to).

        Raises:
            ValueError: ``after`` is naive or ``count`` is negative.
        """
        if count < 0:
            raise ValueError("count must be >= 0")
        fires: list[datetime] = []
        cursor = after
        while len(fires) < count:
            fire = self.next_after(cursor)
            if fire is None or fire.year > MAX_YEAR:
                break
            fires.append(fire)
            cursor = fire
        return fires

    def describe(self) -> str:
        """A one-line English description, e.g. ``"Every 5 minutes"`` or
        ``"At 12:00 PM, Monday through Friday (Europe/Berlin)"``. Rates count real time, so they carry
        no zone; cron and ``at()`` descriptions name the zone their times are read in."""
        return _describe(self._rule)
