"""Injectable clocks. Every service takes a :class:`Clock` so tests control time.

All instants are timezone-aware and in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Anything with ``now() -> datetime`` (aware, UTC)."""

    def now(self) -> datetime: ...


class SystemClock:
    """The wall clock, in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class FixedClock:
    """A clock tests move by hand.

    Args:
        start: the initial instant; must be timezone-aware (converted to UTC).

    Raises:
        ValueError: if ``start`` is naive.
    """

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("FixedClock needs a timezone-aware datetime")
        self._now = start.astimezone(UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> datetime:
        """Move the clock forward by ``seconds`` (may be fractional) and return the new instant."""
        self._now += timedelta(seconds=seconds)
        return self._now

    def set(self, instant: datetime) -> None:
        """Jump to ``instant`` (aware)."""
        if instant.tzinfo is None:
            raise ValueError("FixedClock needs a timezone-aware datetime")
        self._now = instant.astimezone(UTC)
