"""Import crontab files (Vixie/Debian crontab(5)) as Duetime job specs.

Pure: it parses the text it is given and never touches the file system, the clock or the network.

What a crontab line means (crontab(5), Vixie cron 4.1 as shipped by Debian, and cronie for ``CRON_TZ``):

* Blank lines and lines whose first non-blank character is ``#`` are ignored (there are no trailing
  comments: a ``#`` later in a line belongs to the command).
* ``NAME = VALUE`` sets an environment variable for the entries that **follow** it (spaces around ``=``
  are optional; a value wrapped in matching single or double quotes is unquoted, which keeps blanks).
  ``SHELL`` picks the shell that runs commands (default ``/bin/sh``); ``CRON_TZ`` (cronie) and ``TZ``
  set the time zone the following entries' schedules are read in.
* An entry is 5 time fields (or one ``@`` macro), then -- in the system format of ``/etc/crontab`` and
  ``/etc/cron.d`` -- a user name, then the command: the rest of the line. The first unescaped ``%`` ends
  the command; the text after it is the command's standard input, with each later unescaped ``%``
  turned into a newline; ``\\%`` is a literal ``%`` in both parts (Vixie ``do_command.c``). Like cron we
  end non-empty standard input with a newline.
* ``@reboot`` entries cannot be imported (Duetime has no boot event); they are reported as skipped
  (``kind="unsupported"``), as are malformed lines (``kind="invalid"``), each with its reason.

Each entry gets a stable job id (:func:`stable_job_id`): the same file imported twice yields the same ids,
so the API's 409 for a taken ``job_id`` makes a second import create nothing.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from typing import Literal

from duetime.domain.errors import ScheduleError
from duetime.domain.schedules import parse_schedule

__all__ = ["CrontabEntry", "CrontabImport", "SkippedLine", "parse_crontab", "stable_job_id"]

DEFAULT_SHELL = "/bin/sh"

_ENV_RE = re.compile(
    r"""^\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<name>[^\s="']+))\s*=\s*(?P<value>.*?)\s*$"""
)
_NAME_OK = re.compile(r"[^a-z0-9]+")
# Words that say how a command runs rather than what it is; skipped when suggesting a job name.
_NOISE_WORDS = frozenset(
    {
        "[",
        "[[",
        "]",
        "]]",
        "!",
        "test",
        "if",
        "then",
        "else",
        "elif",
        "fi",
        "do",
        "done",
        "for",
        "while",
        "command",
        "exec",
        "nice",
        "ionice",
        "nohup",
        "sudo",
        "env",
        "cd",
        "time",
        "timeout",
        "flock",
        "sh",
        "bash",
        "/bin/sh",
        "/bin/bash",
        "run-parts",
        "true",
        "false",
        "&&",
        "||",
        ";",
        "|",
    }
)


@dataclass(frozen=True)
class CrontabEntry:
    """One importable crontab entry.

    Attributes:
        line: 1-based line number in the text.
        schedule: the schedule expression as Duetime accepts it (5 fields joined by single spaces, or the
            ``@`` macro as written).
        timezone: IANA zone the schedule is read in (the last ``CRON_TZ``/``TZ`` line above the entry,
            else the import's default).
        user: the system format's user column, ``None`` for a user crontab.
        command: the shell command (the text before the first unescaped ``%``, ``\\%`` unescaped).
        argv: ``[SHELL, "-c", command]`` -- how cron runs it (``SHELL`` from the crontab, default
            ``/bin/sh``).
        env: the environment lines in effect for this entry (``SHELL``, ``PATH``, ``MAILTO``, ``CRON_TZ``
            and any other ``NAME=VALUE``), values unquoted. A fresh dict per entry.
        stdin: standard input built from the text after the first ``%``, or ``None`` if there was none.
        name: a suggested job name: lower-case ``[a-z0-9-]``, unique within the import.
        job_id: a stable job id (:func:`stable_job_id`): ``cron-`` and 16 hex digits of a hash of the
            import's ``source``, the user column and the normalized line; the same line of the same
            file gives the same id on every import.
    """

    line: int
    schedule: str
    timezone: str
    user: str | None
    command: str
    argv: list[str]
    env: dict[str, str]
    stdin: str | None
    name: str
    job_id: str = ""


@dataclass(frozen=True)
class SkippedLine:
    """A line that is neither blank, a comment, an environment setting nor an importable entry.

    ``kind`` is ``"invalid"`` for a line cron itself would refuse or misread (bad syntax, values out of
    range, an expression that never fires, an unknown ``CRON_TZ``) and ``"unsupported"`` for a valid
    line Duetime cannot run as it is (``@reboot``).
    """

    line: int
    text: str
    reason: str
    kind: Literal["invalid", "unsupported"] = "invalid"


@dataclass(frozen=True)
class CrontabImport:
    """The result of :func:`parse_crontab`: importable entries and skipped lines, in file order."""

    entries: list[CrontabEntry] = field(default_factory=list)
    skipped: list[SkippedLine] = field(default_factory=list)


def split_percent(text: str) -> tuple[str, str | None]:
    """Split a crontab command at its first unescaped ``%`` the way Vixie cron does.

    Returns ``(command, stdin)``: ``\\%`` becomes ``%`` in both parts, later unescaped ``%`` become
    newlines in ``stdin``, other backslashes are kept; non-empty ``stdin`` ends with a newline.
    ``stdin`` is ``None`` when the text has no unescaped ``%``.
    """
    # Vixie do_command.c: a backslash escapes the next character; only "\\%" collapses (to "%").
    command: list[str] = []
    escaped = False
    i = 0
    for i, ch in enumerate(text):  # noqa: B007 - i is used after the loop
        if escaped:
            escaped = False
            if ch == "%":
                command[-1] = "%"
            else:
                command.append(ch)
            continue
        if ch == "%":
            break
        escaped = ch == "\\"
        command.append(ch)
    else:
        return "".join(command), None
    rest = text[i + 1 :]
    data: list[str] = []
    j = 0
    while j < len(rest):
        ch = rest[j]
        if ch == "\\" and j + 1 < len(rest) and rest[j + 1] == "%":
            data.append("%")
            j += 2
            continue
        data.append("\n" if ch == "%" else ch)
        j += 1
    stdin = "".join(data)
    if stdin and not stdin.endswith("\n"):
        stdin += "\n"
    return "".join(command), stdin


def stable_job_id(source: str, user: str | None, normalized_line: str, occurrence: int = 1) -> str:
    """A job id for one crontab line: ``cron-`` and the first 16 hex digits of a SHA-256.

    The hash covers ``source`` (the file, e.g. its absolute path), ``user`` (the system format's user
    column) and ``normalized_line`` (the time fields joined by single spaces, lower-cased, then the
    command as written); ``occurrence`` tells identical lines of one file apart (cron runs each). The id
    matches the API's ``job_id`` pattern ``[A-Za-z0-9_-]{1,64}``. Line numbers are left out: moving a line,
    or adding comments above it, keeps its id; changing its schedule or command makes a new job.
    """
    key = "\0".join((source, user or "", normalized_line, str(occurrence)))
    return "cron-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _env_setting(line: str) -> tuple[str, str] | None:
    """``(name, value)`` if the line is an environment setting (Vixie ``load_env``), else ``None``."""
    m = _ENV_RE.match(line)
    if m is None:
        return None
    name = m.group("dq") if m.group("dq") is not None else m.group("sq")
    if name is None:
        name = m.group("name")
    if not name:
        return None
    return name, _unquote(m.group("value"))


def _take_fields(text: str, count: int) -> tuple[list[str], str] | None:
    """Split off ``count`` blank-separated words; return them and the rest (leading blanks removed)."""
    words: list[str] = []
    rest = text.lstrip(" \t")
    for _ in range(count):
        m = re.match(r"(\S+)[ \t]*", rest)
        if m is None:
            return None
        words.append(m.group(1))
        rest = rest[m.end() :]
    return words, rest


def _suggest_name(command: str, prefix: str | None) -> str:
    try:
        words = shlex.split(command, comments=False, posix=True)
    except ValueError:
        words = command.split()
    chosen = ""
    for word in words:
        bare = word.rstrip(";")
        if (
            not bare
            or bare in _NOISE_WORDS
            or bare.startswith(("-", "$", ">", "<", "2>", "&", "("))
            or "=" in bare
            or bare.isdigit()
        ):
            continue
        chosen = bare.rsplit("/", 1)[-1]
        if chosen:
            break
    slug = _NAME_OK.sub("-", chosen.lower()).strip("-")
    if prefix:
        prefix_slug = _NAME_OK.sub("-", prefix.lower()).strip("-")
        slug = prefix_slug if not slug or slug == prefix_slug else f"{prefix_slug}-{slug}"
    return slug[:56].strip("-")


def parse_crontab(
    text: str,
    *,
    system: bool = False,
    default_timezone: str = "UTC",
    name_prefix: str | None = None,
    source: str = "",
) -> CrontabImport:
    """Parse a crontab's text into importable entries and skipped lines.

    Args:
        text: the whole crontab file.
        system: ``True`` for the system format (``/etc/crontab``, ``/etc/cron.d/*``), whose 6th column is
            the user to run as; ``False`` for a user crontab (``crontab -e``).
        default_timezone: IANA zone for entries before any ``CRON_TZ``/``TZ`` line.
        name_prefix: optional prefix for suggested job names, e.g. the file name (``"certbot"``).
        source: what identifies the file in the entries' :func:`stable_job_id` (the CLI passes its
            absolute path); with the default ``""`` the ids depend on the lines only.

    Returns:
        A :class:`CrontabImport`. Every schedule in ``entries`` has been validated with
        :func:`duetime.domain.schedules.parse_schedule` in its zone.

    Raises:
        ScheduleError: ``default_timezone`` is not an IANA zone (``field="schedule.timezone"``).
    """
    parse_schedule("@daily", default_timezone)  # validates the default zone up front
    env: dict[str, str] = {}
    timezone = default_timezone
    timezone_error: str | None = None
    entries: list[CrontabEntry] = []
    skipped: list[SkippedLine] = []
    used_names: dict[str, int] = {}
    seen_lines: dict[tuple[str | None, str], int] = {}

    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r\n")
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        setting = _env_setting(line)
        if setting is not None:
            name, value = setting
            env[name] = value
            if name in ("CRON_TZ", "TZ"):
                try:
                    parse_schedule("@daily", value or "UTC")
                    timezone, timezone_error = value or "UTC", None
                except ScheduleError as exc:
                    timezone_error = f"{name}={value!r}: {exc.message}"
            continue

        def skip(reason: str, number: int = number, stripped: str = stripped, invalid: bool = True) -> None:
            skipped.append(SkippedLine(number, stripped, reason, "invalid" if invalid else "unsupported"))

        body = line.lstrip(" \t")
        split = _take_fields(body, 1) if body.startswith("@") else _take_fields(body, 5)
        if split is None:
            skip(
                "not an environment setting and too few fields for a cron entry "
                "(need 5 time fields or an @macro, " + ("a user, " if system else "") + "then a command)"
            )
            continue
        time_fields, rest = split
        if time_fields[0].lower() == "@reboot":
            skip(
                "@reboot runs once when cron starts; Duetime has no boot event, so it cannot run as-is",
                invalid=False,
            )
            continue
        schedule_text = " ".join(time_fields)
        if timezone_error is not None:
            skip(f"its time zone is invalid: {timezone_error}")
            continue
        try:
            parse_schedule(schedule_text, timezone)
        except ScheduleError as exc:
            skip(exc.message)
            continue
        user: str | None = None
        if system:
            user_split = _take_fields(rest, 1)
            if user_split is None:
                skip("no user column and no command (system crontabs need: schedule, user, command)")
                continue
            user, rest = user_split[0][0], user_split[1]
        if not rest.strip():
            skip("no command")
            continue
        command, stdin = split_percent(rest)
        shell = env.get("SHELL") or DEFAULT_SHELL
        name = _suggest_name(command, name_prefix) or (f"{name_prefix}-line-{number}" if name_prefix else "")
        name = name or f"cron-line-{number}"
        seen = used_names.get(name, 0)
        used_names[name] = seen + 1
        if seen:
            name = f"{name}-{seen + 1}"
        normalized = f"{schedule_text.lower()} {rest.strip()}"
        occurrence = seen_lines[user, normalized] = seen_lines.get((user, normalized), 0) + 1
        entries.append(
            CrontabEntry(
                line=number,
                schedule=schedule_text,
                timezone=timezone,
                user=user,
                command=command,
                argv=[shell, "-c", command],
                env=dict(env),
                stdin=stdin,
                name=name,
                job_id=stable_job_id(source, user, normalized, occurrence),
            )
        )
    return CrontabImport(entries=entries, skipped=skipped)


# ---- MAILTO -> a notification rule ----------------------------------------------------------------------
#: the events an imported ``MAILTO`` mails (:func:`mailto_rules`)
MAILTO_EVENTS = ("failed", "dead_lettered", "timed_out", "recovered")
#: addresses per rule (``models.MAX_EMAILS``): a longer ``MAILTO`` gives several rules
_EMAILS_PER_RULE = 10


@dataclass(frozen=True)
class Mailto:
    """What an entry's ``MAILTO`` becomes.

    Attributes:
        rules: email notification rules (JSON-ready, as a job's ``notifications`` takes them); empty for
            no ``MAILTO``, ``MAILTO=""`` or only local users.
        local_users: recipients without ``@`` (``root``): cron hands them to the machine's local mailer,
            which Duetime has not; they get no rule.
    """

    rules: list[dict[str, object]] = field(default_factory=list)
    local_users: list[str] = field(default_factory=list)


def mailto_rules(env: dict[str, str]) -> Mailto:
    """The email rules of an entry's ``MAILTO`` (``MAILTO=a@b,c@d``: recipients split on commas and
    spaces, as cronie reads them; ``MAILTO=""`` or no ``MAILTO``: none).

    Cron mails a job's output after each run that printed something, success or not. Duetime keeps every
    run's output as its log (``duetime runs logs``) and alerts the owner when something needs them, so
    the rule is on ``failed`` (an attempt failed: the first of a failing streak, noise control holds the
    rest), ``dead_lettered`` (the run gave up: every attempt failed), ``timed_out`` (an attempt ran past its
    timeout, which cron has no notion of) and ``recovered`` (the first success after the streak, so the
    owner knows it is over). Not ``late``, ``missed`` or ``overran``: cron says nothing of those, and an
    imported job sets no ``late_after_seconds`` or ``expected_duration_seconds``.
    """
    recipients = [r for r in re.split(r"[\s,]+", env.get("MAILTO", "")) if r]
    addresses = list(dict.fromkeys(r for r in recipients if "@" in r))
    local = [r for r in recipients if "@" not in r]
    rules: list[dict[str, object]] = [
        {"on": list(MAILTO_EVENTS), "email": addresses[i : i + _EMAILS_PER_RULE]}
        for i in range(0, len(addresses), _EMAILS_PER_RULE)
    ]
    return Mailto(rules=rules, local_users=local)
