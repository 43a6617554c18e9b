"""Schedule expressions: parse once, then ask for fire times.

:func:`parse_schedule` turns ``at(...)``, ``rate(...)`` or a cron line (5-field, ``@`` macro or
EventBridge ``cron(...)``) into an immutable :class:`Schedule`, whose ``next_after``,
``latest_at_or_before``, ``preview`` and ``describe`` answer in timezone-aware UTC. The grammar is in
the docstring of ``parse``, the DST rule on :data:`DstPolicy`. This package is the only place in Duetime
that knows cron syntax (it evaluates cron itself: croniter's DST handling does not follow the Debian/ISC
rule) and the only one that imports ``cron_descriptor``.

The modules, each importing only those above it:

* ``zones`` -- which time-zone names are accepted (IANA names for submits; stored jobs keep theirs).
* ``dst`` -- :data:`DstPolicy` and wall clock to UTC: spring-forward gaps, fall-back folds, the 3-hour
  line between a DST change and a clock correction.
* ``rules`` -- the rule interface and the ``at(...)`` and ``rate(...)`` fire-time sets.
* ``cron`` -- cron evaluation: field matching on the wall clock, the next fire in real time.
* ``describe`` -- schedules in words (via ``cron_descriptor`` for cron).
* ``schedule`` -- :class:`Schedule`: a rule within ``start_at``/``end_at``; next, latest, preview.
* ``parse`` -- :func:`parse_schedule`, the syntax of all three kinds, :data:`MIN_RATE_SECONDS`, and the
  errors for bad expressions and for expressions that can never fire.

Where the rules come from:

* cron standard: crontab(5) of Vixie/Debian cron -- 5 fields, day of week 0-7, the ``@`` macros, and the
  rule joining day of month and day of week;
* EventBridge Scheduler: its schedule types ``at(...)`` and ``rate(...)`` (``second(s)`` is a Duetime
  extension) and, per its "Cron expressions" reference, the 6-field ``cron(...)`` with a year, ``?`` and
  the Quartz items ``L``, ``W`` and ``#``; also the ``"skip"`` DST policy (a fire time in a
  spring-forward gap is skipped);
* DST: Debian's cron(8) ("Special considerations exist when the clock is changed by less than 3 hours")
  for the default ``"shift"`` policy; PEP 495 ``fold`` for wall times that occur twice.
"""

from duetime.domain.schedules.dst import DstPolicy
from duetime.domain.schedules.parse import MIN_RATE_SECONDS, parse_schedule
from duetime.domain.schedules.schedule import Schedule, ScheduleKind

__all__ = ["MIN_RATE_SECONDS", "DstPolicy", "Schedule", "ScheduleKind", "parse_schedule"]
