"""Unit tests for duetime.domain.crontab: real Debian /etc/cron.d files and crontab(5) edge cases."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from duetime.domain.crontab import (
    MAILTO_EVENTS,
    CrontabImport,
    Mailto,
    mailto_rules,
    parse_crontab,
    split_percent,
    stable_job_id,
)
from duetime.domain.errors import ScheduleError
from duetime.domain.models import NotificationRule
from duetime.domain.schedules import parse_schedule

CRONTABS = Path(__file__).resolve().parents[1] / "data" / "crontabs"
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/sbin:/bin:/usr/sbin:/usr/bin"


def load(name: str) -> CrontabImport:
    return parse_crontab((CRONTABS / name).read_text(), system=True)


# --------------------------------------------------------------------------------------------------
# The real files in tests/data/crontabs (Debian 12 packages), one test per file
# --------------------------------------------------------------------------------------------------


def test_anacron_file_imports_its_hourly_daytime_entry() -> None:
    # Given Debian's /etc/cron.d/anacron
    result = load("anacron")
    # Then its single entry comes through with SHELL and PATH in effect
    assert result.skipped == []
    [entry] = result.entries
    assert entry.line == 6
    assert entry.schedule == "30 7-23 * * *"
    assert entry.timezone == "UTC"
    assert entry.user == "root"
    assert entry.command == (
        "[ -x /etc/init.d/anacron ] && if [ ! -d /run/systemd/system ]; then "
        "/usr/sbin/invoke-rc.d anacron start >/dev/null; fi"
    )
    assert entry.argv == ["/bin/sh", "-c", entry.command]
    assert entry.env == {"SHELL": "/bin/sh", "PATH": DEBIAN_PATH}
    assert entry.stdin is None
    assert entry.name == "anacron"


def test_certbot_file_keeps_backslash_bang_and_quotes_in_the_command() -> None:
    result = load("certbot")
    assert result.skipped == []
    [entry] = result.entries
    assert entry.line == 17
    assert entry.schedule == "0 */12 * * *"
    assert entry.user == "root"
    assert entry.command == (
        "test -x /usr/bin/certbot -a \\! -d /run/systemd/system && perl -e 'sleep int(rand(43200))' "
        "&& certbot -q renew --no-random-sleep-on-renew"
    )
    assert entry.argv == ["/bin/sh", "-c", entry.command]
    assert entry.env == {"SHELL": "/bin/sh", "PATH": DEBIAN_PATH}
    assert entry.stdin is None
    assert entry.name == "certbot"


def test_mdadm_file_unescapes_percent_in_the_date_format() -> None:
    result = load("mdadm")
    assert result.skipped == []
    [entry] = result.entries
    assert entry.line == 12
    assert entry.schedule == "57 0 * * 0"
    assert entry.user == "root"
    # "\%" is a literal percent sign, so the command is not cut at "date +"
    assert entry.command == (
        "if [ -x /usr/share/mdadm/checkarray ] && [ $(date +%d) -le 7 ]; then "
        "/usr/share/mdadm/checkarray --cron --all --idle --quiet; fi"
    )
    assert entry.stdin is None
    assert entry.env == {}
    assert entry.argv == ["/bin/sh", "-c", entry.command]


def test_munin_node_file_applies_mailto_and_tab_separated_user() -> None:
    result = load("munin-node")
    assert result.skipped == []
    [entry] = result.entries
    assert entry.line == 11
    assert entry.schedule == "*/5 * * * *"
    assert entry.user == "root"
    assert entry.command.startswith(
        "if [ -x /etc/munin/plugins/apt_all ]; then /etc/munin/plugins/apt_all update"
    )
    assert entry.command.endswith(
        "elif [ -x /etc/munin/plugins/apt ]; then /etc/munin/plugins/apt update 7200 12 >/dev/null; fi"
    )
    assert entry.env == {"MAILTO": "root"}
    assert entry.argv[0] == "/bin/sh"


def test_sysstat_file_imports_both_entries_with_its_own_path() -> None:
    result = load("sysstat")
    assert result.skipped == []
    first, second = result.entries
    assert (first.line, first.schedule, first.user) == (6, "5-55/10 * * * *", "root")
    assert first.command == "command -v debian-sa1 > /dev/null && debian-sa1 1 1"
    assert (second.line, second.schedule, second.user) == (9, "59 23 * * *", "root")
    assert second.command == "command -v debian-sa1 > /dev/null && debian-sa1 60 2"
    sysstat_path = "/usr/lib/sysstat:/usr/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert first.env == second.env == {"PATH": sysstat_path}
    # Names are unique within one import
    assert (first.name, second.name) == ("debian-sa1", "debian-sa1-2")


def test_every_real_file_yields_schedules_duetime_evaluates() -> None:
    # The imported schedules fire where cron would: e.g. sysstat's 5-55/10 and anacron's 30 7-23
    from datetime import UTC, datetime

    sysstat = parse_schedule(load("sysstat").entries[0].schedule)
    assert sysstat.next_after(datetime(2026, 1, 1, 10, 50, tzinfo=UTC)) == datetime(
        2026, 1, 1, 10, 55, tzinfo=UTC
    )
    anacron = parse_schedule(load("anacron").entries[0].schedule)
    assert anacron.next_after(datetime(2026, 1, 1, 23, 45, tzinfo=UTC)) == datetime(
        2026, 1, 2, 7, 30, tzinfo=UTC
    )


def test_name_prefix_is_applied_to_suggested_names() -> None:
    result = parse_crontab((CRONTABS / "sysstat").read_text(), system=True, name_prefix="sysstat")
    assert [e.name for e in result.entries] == ["sysstat-debian-sa1", "sysstat-debian-sa1-2"]


# --------------------------------------------------------------------------------------------------
# % handling (crontab(5), Vixie do_command.c)
# --------------------------------------------------------------------------------------------------


def test_first_percent_ends_the_command_and_later_ones_are_newlines() -> None:
    result = parse_crontab("0 9 * * 1 mail -s report ops%Hello,%Weekly report attached.%\n")
    [entry] = result.entries
    assert entry.command == "mail -s report ops"
    assert entry.stdin == "Hello,\nWeekly report attached.\n"


def test_escaped_percent_is_literal_in_command_and_stdin() -> None:
    assert split_percent(r"date +\%F%100\% done") == ("date +%F", "100% done\n")


def test_other_backslashes_are_kept() -> None:
    assert split_percent(r"echo a\ b \\x") == (r"echo a\ b \\x", None)


def test_an_escaped_backslash_does_not_escape_the_following_percent() -> None:
    # Vixie: with two backslashes before it the first escapes the second, so the % still ends the command
    assert split_percent("printf x\\\\%data") == ("printf x\\\\", "data\n")


def test_trailing_percent_gives_empty_stdin() -> None:
    assert split_percent("cat%") == ("cat", "")


# --------------------------------------------------------------------------------------------------
# Environment lines, shell, time zones
# --------------------------------------------------------------------------------------------------


def test_environment_applies_only_to_following_entries() -> None:
    text = "0 1 * * * first\nFOO=bar\n0 2 * * * second\n"
    first, second = parse_crontab(text).entries
    assert first.env == {}
    assert second.env == {"FOO": "bar"}


def test_quoted_values_are_unquoted_and_spaces_around_equals_allowed() -> None:
    text = "GREETING = \"  hello world  \"\nEMPTY=''\nPLAIN =  value with spaces   \n* * * * * env\n"
    [entry] = parse_crontab(text).entries
    assert entry.env == {"GREETING": "  hello world  ", "EMPTY": "", "PLAIN": "value with spaces"}


def test_shell_line_sets_the_interpreter_in_argv() -> None:
    [entry] = parse_crontab("SHELL=/bin/bash\n*/10 * * * * echo $BASH_VERSION\n").entries
    assert entry.argv == ["/bin/bash", "-c", "echo $BASH_VERSION"]
    assert entry.env["SHELL"] == "/bin/bash"


def test_cron_tz_and_tz_set_the_zone_of_following_entries() -> None:
    text = "0 9 * * * a\nCRON_TZ=Europe/Berlin\n0 9 * * * b\nTZ=Asia/Kolkata\n0 9 * * * c\n"
    a, b, c = parse_crontab(text, default_timezone="America/New_York").entries
    assert (a.timezone, b.timezone, c.timezone) == ("America/New_York", "Europe/Berlin", "Asia/Kolkata")
    assert c.env == {"CRON_TZ": "Europe/Berlin", "TZ": "Asia/Kolkata"}


def test_entries_under_an_unknown_cron_tz_are_skipped_with_the_reason() -> None:
    result = parse_crontab("CRON_TZ=Mars/Base\n0 9 * * * job\n")
    assert result.entries == []
    [skipped] = result.skipped
    assert skipped.line == 2
    assert "Mars/Base" in skipped.reason
    assert skipped.kind == "invalid"


def test_unknown_default_timezone_raises() -> None:
    with pytest.raises(ScheduleError) as err:
        parse_crontab("", default_timezone="Nowhere/Special")
    assert err.value.field == "schedule.timezone"


# --------------------------------------------------------------------------------------------------
# Entries, macros, skipped lines
# --------------------------------------------------------------------------------------------------


def test_user_crontab_has_no_user_column() -> None:
    [entry] = parse_crontab("15 3 * * sun /usr/local/bin/backup --full\n").entries
    assert entry.user is None
    assert entry.schedule == "15 3 * * sun"
    assert entry.command == "/usr/local/bin/backup --full"
    assert entry.name == "backup"


def test_macros_are_imported_as_written() -> None:
    [entry] = parse_crontab("@daily root /usr/sbin/logrotate /etc/logrotate.conf\n", system=True).entries
    assert (entry.schedule, entry.user, entry.command) == (
        "@daily",
        "root",
        "/usr/sbin/logrotate /etc/logrotate.conf",
    )


def test_tabs_and_extra_blanks_between_fields_are_normalised_in_the_schedule() -> None:
    [entry] = parse_crontab("  0\t12  *\t* \tmon-fri\tcmd  arg\n").entries
    assert entry.schedule == "0 12 * * mon-fri"
    assert entry.command == "cmd  arg"


def test_hash_inside_a_command_is_not_a_comment() -> None:
    [entry] = parse_crontab("0 0 * * * echo '#1' # not a comment\n").entries
    assert entry.command == "echo '#1' # not a comment"


def test_comments_blank_lines_and_crlf_are_ignored() -> None:
    result = parse_crontab("# header\r\n\r\n   # indented comment\r\n0 0 * * * job\r\n")
    assert [e.command for e in result.entries] == ["job"]
    assert result.skipped == []


def test_reboot_is_skipped_because_it_cannot_run_as_is() -> None:
    result = parse_crontab("@reboot root /usr/bin/start-thing\n", system=True)
    assert result.entries == []
    [skipped] = result.skipped
    assert skipped.line == 1
    assert "@reboot" in skipped.reason and "boot" in skipped.reason
    # a valid line Duetime cannot run: reported, but not an error of the file
    assert skipped.kind == "unsupported"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("0 0 30 2 * root job", "day 30 never occurs in February"),
        ("61 * * * * root job", "out of range 0-59"),
        ("0 0 * * root job", "day-of-week value 'root'"),
        ("* * * *", "too few fields"),
        ("0 0 * * * root", "no command"),
        ("@fortnightly root job", "unknown cron macro"),
    ],
)
def test_malformed_lines_are_skipped_with_the_reason(line: str, reason: str) -> None:
    result = parse_crontab(f"PATH=/bin\n{line}\n0 1 * * * root ok\n", system=True)
    [skipped] = result.skipped
    assert skipped.line == 2
    assert skipped.text == line
    assert reason in skipped.reason
    assert skipped.kind == "invalid"
    assert [e.command for e in result.entries] == ["ok"]


def test_every_entry_gets_its_own_env_copy() -> None:
    first, second = parse_crontab("A=1\n0 1 * * * x\n0 2 * * * y\n").entries
    first.env["A"] = "changed"
    assert second.env == {"A": "1"}


def test_names_fall_back_to_the_line_number() -> None:
    [entry] = parse_crontab("0 0 * * * [ -d /tmp ] && true\n").entries
    assert entry.name == "tmp"
    [entry] = parse_crontab("0 0 * * * true\n").entries
    assert entry.name == "cron-line-1"


# --------------------------------------------------------------------------------------------------
# Stable job ids (a second import of the same file creates nothing)
# --------------------------------------------------------------------------------------------------

JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


def test_job_ids_are_stable_across_imports_and_fit_the_api_pattern() -> None:
    text = (CRONTABS / "sysstat").read_text()
    first = parse_crontab(text, system=True, source="/etc/cron.d/sysstat")
    again = parse_crontab(text, system=True, source="/etc/cron.d/sysstat")
    ids = [e.job_id for e in first.entries]
    assert ids == [e.job_id for e in again.entries]
    assert len(set(ids)) == 2
    for job_id in ids:
        assert JOB_ID_PATTERN.fullmatch(job_id) and re.fullmatch(r"cron-[0-9a-f]{16}", job_id)
    # the id is cron- and a SHA-256 prefix of (source, user, normalized line, occurrence)
    assert ids[0] == stable_job_id(
        "/etc/cron.d/sysstat", "root", "5-55/10 * * * * command -v debian-sa1 > /dev/null && debian-sa1 1 1"
    )


def test_job_ids_ignore_line_numbers_comments_and_blank_runs_between_fields() -> None:
    a = parse_crontab("0 3 * * * /usr/bin/backup --all\n", source="/home/me/crontab").entries[0]
    b = parse_crontab(
        "# moved down, with a comment above\n\n0  3\t* * *   /usr/bin/backup --all  \n",
        source="/home/me/crontab",
    ).entries[0]
    assert (a.line, b.line) == (1, 3)
    assert a.job_id == b.job_id


def test_job_ids_differ_by_file_user_schedule_and_command() -> None:
    def job_id(line: str, source: str = "/etc/cron.d/x") -> str:
        return parse_crontab(line, system=True, source=source).entries[0].job_id

    base = job_id("0 3 * * * root /usr/bin/backup")
    assert job_id("0 3 * * * root /usr/bin/backup", source="/etc/cron.d/y") != base
    assert job_id("0 3 * * * backup /usr/bin/backup") != base
    assert job_id("0 4 * * * root /usr/bin/backup") != base
    assert job_id("0 3 * * * root /usr/bin/backup --all") != base


def test_identical_lines_of_one_file_get_distinct_ids_since_cron_runs_each() -> None:
    first, second = parse_crontab("*/5 * * * * ping-it\n*/5 * * * * ping-it\n", source="/f").entries
    assert first.job_id != second.job_id
    again = parse_crontab("*/5 * * * * ping-it\n*/5 * * * * ping-it\n", source="/f").entries
    assert [e.job_id for e in again] == [first.job_id, second.job_id]


# --------------------------------------------------------------------------------------------------
# MAILTO -> an email notification rule
# --------------------------------------------------------------------------------------------------


def test_mailto_addresses_become_one_email_rule_on_failures_and_recovery() -> None:
    # Given a crontab mailing two addresses (commas and spaces, as cronie reads them)
    [entry] = parse_crontab("MAILTO=ops@example.com, dba@example.com\n0 1 * * * /bin/backup\n").entries
    # Then its job gets one rule on failed, dead_lettered, timed_out and recovered to both
    assert mailto_rules(entry.env) == Mailto(
        rules=[
            {
                "on": ["failed", "dead_lettered", "timed_out", "recovered"],
                "email": ["ops@example.com", "dba@example.com"],
            }
        ]
    )
    # And the rule is one the API accepts
    NotificationRule.model_validate(mailto_rules(entry.env).rules[0])


def test_an_empty_or_absent_mailto_gives_no_rule() -> None:
    for text in ('MAILTO=""\n0 1 * * * /bin/ok\n', "0 1 * * * /bin/ok\n"):
        [entry] = parse_crontab(text).entries
        assert mailto_rules(entry.env) == Mailto()


def test_a_mailto_to_a_local_user_gives_no_rule_and_names_the_user() -> None:
    # Given Debian's munin-node file (MAILTO=root: cron's local mailer)
    [entry] = load("munin-node").entries
    assert mailto_rules(entry.env) == Mailto(rules=[], local_users=["root"])


def test_each_entry_takes_the_mailto_above_it() -> None:
    text = "MAILTO=a@example.com\n0 1 * * * /bin/one\nMAILTO=\n0 2 * * * /bin/two\nMAILTO=b@example.com root\n0 3 * * * /bin/three\n"
    one, two, three = parse_crontab(text).entries
    assert [r["email"] for r in mailto_rules(one.env).rules] == [["a@example.com"]]
    assert mailto_rules(two.env) == Mailto()
    assert mailto_rules(three.env) == Mailto(
        rules=[{"on": list(MAILTO_EVENTS), "email": ["b@example.com"]}], local_users=["root"]
    )


def test_a_long_mailto_is_split_into_rules_of_ten_addresses() -> None:
    addresses = [f"u{i}@example.com" for i in range(12)]
    [entry] = parse_crontab(f"MAILTO={','.join(addresses)}\n0 1 * * * /bin/ok\n").entries
    rules = mailto_rules(entry.env).rules
    assert [r["email"] for r in rules] == [addresses[:10], addresses[10:]]
    for rule in rules:
        NotificationRule.model_validate(rule)
