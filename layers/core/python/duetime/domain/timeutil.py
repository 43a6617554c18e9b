"""UTC instants as DynamoDB-friendly strings.

Stored instants are fixed-width ISO-8601 UTC strings with millisecond precision,
``YYYY-MM-DDTHH:MM:SS.mmmZ``, so that lexical order is time order (GSI sort keys rely on it).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


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


#: the Unix epoch, the origin of :func:`to_epoch_ms`
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def to_epoch_ms(instant: datetime) -> int:
    """Milliseconds since the Unix epoch (UTC), floored, in exact integer arithmetic: ``timestamp() * 1000``
    in floating point comes out a millisecond short for some instants (``2038-03-01T12:00:00.003Z``), which
    would give a run an id that names another instant (:func:`~duetime.domain.models.run_id_for`)."""
    return (instant.astimezone(UTC) - _EPOCH) // _MS


def from_epoch_ms(ms: int) -> datetime:
    """The aware UTC instant ``ms`` milliseconds after the Unix epoch (exact: ``to_epoch_ms``'s inverse)."""
    return _EPOCH + ms * _MS


def truncate_ms(instant: datetime) -> datetime:
    """``instant`` in UTC with sub-millisecond precision dropped (the stored precision)."""
    utc = instant.astimezone(UTC)
    return utc.replace(microsecond=(utc.microsecond // 1000) * 1000)
