"""Rules: the unbounded fire-time sets. :class:`~duetime.domain.schedules.schedule.Schedule` applies
``start_at``/``end_at`` on top.

:class:`_Rule` is the interface (``next_after``, ``latest_at_or_before``, on UTC instants); this module
holds the two simple rules, ``at(...)`` (one instant) and ``rate(...)`` (``anchor + k * period``, real
elapsed time, so DST changes neither stretch nor shrink it). The cron rule is in
``duetime.domain.schedules.cron``; the words for each rule in ``duetime.domain.schedules.describe``.
"""

from __future__ import annotations

from datetime import datetime, timedelta


class _Rule:
    def next_after(self, instant: datetime) -> datetime | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def latest_at_or_before(self, instant: datetime) -> datetime | None:  # pragma: no cover - abstract
        raise NotImplementedError


class _AtRule(_Rule):
    def __init__(self, fire: datetime, local: datetime, zone_name: str) -> None:
        self.fire = fire
        self.local = local
        self.zone_name = zone_name

    def next_after(self, instant: datetime) -> datetime | None:
        return self.fire if self.fire > instant else None

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        return self.fire if self.fire <= instant else None


class _RateRule(_Rule):
    def __init__(self, anchor: datetime, period: timedelta, count: int, unit: str) -> None:
        self.anchor = anchor
        self.period = period
        self.count = count
        self.unit = unit

    def next_after(self, instant: datetime) -> datetime | None:
        if instant < self.anchor:
            return self.anchor
        k = (instant - self.anchor) // self.period + 1
        try:
            return self.anchor + k * self.period
        except OverflowError:
            return None

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        if instant < self.anchor:
            return None
        k = (instant - self.anchor) // self.period
        return self.anchor + k * self.period
