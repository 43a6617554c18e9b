"""UTC instants as DynamoDB-friendly strings.

Stored instants are fixed-width ISO-8601 UTC strings with millisecond precision,
``YYYY-MM-DDTHH:MM:SS.mmmZ``, so that lexical order is time order (GSI sort keys rely on it).
"""

from __future__ import annotations

from datetime import UTC, datetime


def to_iso(instant: datetime) -> str:
    """Format an aware instant as ``2026-11-29T18:52:10.123Z`` (UTC, millisecond precision, truncated).

    Raises:
        ValueError: if ``instant`` is naive.
    """
    if instant.tzinfo is not UTC:
        if instant.tzinfo is None:
            raise ValueError("naive datetime: every Duetime instant must be timezone-aware")
        instant = instant.astimezone(UTC)
    # isoformat truncates to the millisecond (as strftime + microsecond // 1000 did), in C: this runs for
    # every stored instant, several per run; "+00:00" is 6 characters
    return instant.isoformat(timespec="milliseconds")[:-6] + "Z"


def from_iso(text: str) -> datetime:
    """Parse a stored (or any ISO-8601 with offset) instant into an aware UTC datetime.

    Raises:
        ValueError: if ``text`` is not ISO-8601 or carries no offset.
    """
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError(f"instant {text!r} has no UTC offset")
    return parsed.astimezone(UTC)


def to_epoch_ms(instant: datetime) -> int:
    """Milliseconds since the Unix epoch (UTC), truncated."""
    return int(instant.astimezone(UTC).timestamp() * 1000)


def from_epoch_ms(ms: int) -> datetime:
    """The aware UTC instant ``ms`` milliseconds after the Unix epoch."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def truncate_ms(instant: datetime) -> datetime:
    """``instant`` in UTC with sub-millisecond precision dropped (the stored precision)."""
    utc = instant.astimezone(UTC)
    return utc.replace(microsecond=(utc.microsecond // 1000) * 1000)
