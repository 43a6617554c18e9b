"""Schedules in words: the one-line English description :meth:`Schedule.describe` returns.

``at(...)`` and cron descriptions name the zone their times are read in; rates count real time, so they
carry none. Cron goes through ``cron_descriptor`` (the only import of it in Duetime), after rewriting what
it does not know (``L-n``, ``L`` alone as a day of week, ``?`` in a 5-field line) and correcting its "or"
between the two day fields where crontab(5)'s Vixie rule means "and"; the ``"skip"`` DST policy is
named. A failing ``cron_descriptor`` never breaks scheduling: the description is then the expression.
"""

from __future__ import annotations

import re

from duetime.domain.schedules.cron import _CronRule
from duetime.domain.schedules.rules import _AtRule, _RateRule, _Rule


def _describe(rule: _Rule) -> str:
    """The description of a rule, as :meth:`Schedule.describe` returns it."""
    if isinstance(rule, _AtRule):
        return f"Once, at {rule.local:%Y-%m-%d %H:%M:%S} ({rule.zone_name})"
    if isinstance(rule, _RateRule):
        if rule.count == 1:
            return f"Every {rule.unit}"
        return f"Every {rule.count} {rule.unit}s"
    if isinstance(rule, _CronRule):
        return f"{_describe_cron(rule)} ({rule.zone_name})"
    raise NotImplementedError  # pragma: no cover - every rule is one of the three


#: minute, hour, day of month and month: the same bounds in both cron dialects (days of week differ)
_FIELD_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12))


def _unstep(item: str, lo: int, hi: int) -> str:
    """``item`` with a step too long to reach a second value written as its one value (``*/90`` in minutes
    is minute 0, which cron_descriptor would call "every 90 minutes"); other items unchanged."""
    match = re.fullmatch(r"(\*|\?|[0-9]+)(?:-([0-9]+))?/([0-9]+)", item)
    if match is None:
        return item
    first = lo if match[1] in ("*", "?") else int(match[1])
    last = int(match[2]) if match[2] is not None else hi
    return str(first) if int(match[3]) > last - first else item


def _describe_cron(rule: _CronRule) -> str:
    fields = [f.upper() for f in rule.fields]
    extra: list[str] = []
    dom_items = fields[2].split(",")
    offsets = [item for item in dom_items if re.fullmatch(r"L-[0-9]+", item)]
    if offsets:  # cron_descriptor does not know L-n
        dom_items = [item for item in dom_items if item not in offsets] or ["*"]
        extra.extend(f"{item[2:]} days before the last day of the month" for item in offsets)
        fields[2] = ",".join(dom_items)
    fields[4] = ",".join("SAT" if item == "L" else item for item in fields[4].split(","))
    for i, bounds in enumerate(_FIELD_BOUNDS):
        fields[i] = ",".join(_unstep(item, *bounds) for item in fields[i].split(","))
    if not rule.eventbridge:
        fields = ["*" if f == "?" else f for f in fields]
    try:
        from cron_descriptor import Options, get_description

        options = Options()
        options.day_of_week_start_index_zero = not rule.eventbridge
        options.verbose = False
        description = str(get_description(" ".join(fields), options))
    except Exception:  # noqa: BLE001 - a description must never break scheduling
        return f"cron `{rule.source}`"
    dr = rule.day_rule
    restricted = fields[2] not in ("*", "?") and fields[4] not in ("*", "?")
    if (dr.dom_star or dr.dow_star) and restricted:
        # Vixie: "*/2" in one day field and a weekday in the other means both must hold.
        description = description.replace(", or on ", ", but only on ")
    if extra:
        description += ", " + ", ".join(extra)
    if rule.dst_policy == "skip":
        description += ", skipping times that fall in a DST gap"
    return description
