"""Time-zone names: which names a schedule may be read in.

A zone is an IANA tz database name (``Europe/Berlin``, ``UTC``, ``Etc/GMT+5``...). Host files of the
zoneinfo directory that are not zone names, such as ``localtime`` (a link to the host's ``/etc/localtime``),
are refused for submits, since they mean different zones on different machines. A stored job keeps any
name ``zoneinfo`` loads (:func:`_stored_zone`), so tightening the rule never stops a job that was accepted.
"""

from __future__ import annotations

import re
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from duetime.domain.errors import ScheduleError

# Each /-separated part of a tz database name starts with an upper-case ASCII letter
# ("America/Port-au-Prince", "Etc/GMT+5", "EST5EDT"). The zoneinfo directory also holds host files that are
# no zone names (Debian's and Red Hat's "localtime", a link to the host's /etc/localtime), and
# available_timezones() lists them too.
_IANA_NAME_RE = re.compile(r"[A-Z][A-Za-z0-9_+-]*(?:/[A-Z][A-Za-z0-9_+-]*)*")

#: tz database entries that name no place: ``Factory`` (the tz source's ``factory`` file) is the placeholder
#: a distribution installs as the local zone before one is chosen, abbreviated "-00" ("local time is
#: unspecified"); a schedule read in it would fire at UTC under a name that says nothing. Refused at submit.
_PLACEHOLDER_ZONES = frozenset({"Factory"})


@lru_cache(maxsize=1)
def _zoneinfo_files() -> frozenset[str]:
    """Every name ``zoneinfo`` can load here (the tz directories and the ``tzdata`` package), read once."""
    return frozenset(available_timezones())


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    """The IANA zone names this host can load, plus ``UTC``."""
    names = (n for n in _zoneinfo_files() if _IANA_NAME_RE.fullmatch(n) and n not in _PLACEHOLDER_ZONES)
    return frozenset(names) | {"UTC"}


@lru_cache(maxsize=1)
def _zones_by_lower_name() -> dict[str, str]:
    return {name.lower(): name for name in _known_zones()}


@lru_cache(maxsize=1024)
def _stored_zone(name: str) -> ZoneInfo:
    """The zone of a stored job: any name ``zoneinfo`` loads (a job stored before names were restricted
    to IANA ones keeps firing), or ``ScheduleError(field="schedule.timezone")``."""
    if name in _known_zones():
        return _zone(name)
    try:
        return ZoneInfo(name)
    except (ValueError, OSError, ZoneInfoNotFoundError, ModuleNotFoundError):
        raise ScheduleError(f"unknown time zone {name!r}", "schedule.timezone") from None


@lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo:
    """The ``ZoneInfo`` for an IANA name, or ``ScheduleError(field="schedule.timezone")``."""
    if not isinstance(name, str) or not name.strip():
        raise ScheduleError(
            "time zone is empty: give an IANA name such as 'Europe/Berlin' or 'UTC'", "schedule.timezone"
        )
    if name not in _known_zones():
        hint = "give an IANA name such as 'Europe/Berlin' or 'UTC'"
        if name in _PLACEHOLDER_ZONES:
            hint = (
                f"{name!r} is the tz database's placeholder for an unset local zone (-00), not a zone: {hint}"
            )
        elif name in _zoneinfo_files():  # e.g. "localtime": a host file, not a zone name
            hint = f"{name!r} is a file of this host's zoneinfo directory, not an IANA zone name: {hint}"
        elif name.lower() in _zones_by_lower_name():
            hint = f"did you mean {_zones_by_lower_name()[name.lower()]!r}? (IANA names are case-sensitive)"
        raise ScheduleError(f"unknown time zone {name!r}: {hint}", "schedule.timezone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # pragma: no cover - listed but unreadable
        raise ScheduleError(f"time zone {name!r} cannot be loaded: {exc}", "schedule.timezone") from exc
