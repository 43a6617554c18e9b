"""The `duetime` CLI's schedule preview and crontab dry-run (no AWS)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from duetime.cli.main import app

runner = CliRunner()
CRONTABS = Path(__file__).resolve().parents[1] / "data" / "crontabs"


def test_preview_json_lists_instants_with_offsets_in_the_zone() -> None:
    # 02:30 Berlin falls in the 2026-03-29 spring-forward gap: Debian cron runs it at 03:00 CEST
    result = runner.invoke(
        app,
        [
            "schedule",
            "preview",
            "30 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--after",
            "2026-03-28T00:00:00Z",
            "--count",
            "3",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]


def test_preview_of_an_invalid_expression_exits_2_with_the_reason_on_stderr() -> None:
    result = runner.invoke(app, ["schedule", "preview", "0 0 30 2 *"])
    assert result.exit_code == 2
    assert "never" in result.stderr and result.stdout == ""


def test_preview_with_a_naive_after_is_a_usage_error() -> None:
    result = runner.invoke(app, ["schedule", "preview", "@daily", "--after", "2026-01-01T00:00:00"])
    assert result.exit_code == 2 and "UTC offset" in result.output


def test_import_dry_run_lists_every_entry_and_reports_reboot_lines(tmp_path: Path) -> None:
    crontab = tmp_path / "mine"
    crontab.write_text("MAILTO=ops\n*/15 * * * * /usr/bin/backup --fast\n@reboot /usr/bin/warm-cache\n")
    result = runner.invoke(app, ["import", "crontab", str(crontab), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "`*/15 * * * *` UTC: /usr/bin/backup --fast" in result.stdout
    assert "next:" in result.stdout
    assert "@reboot" in result.stderr and "skipped" in result.stderr


def test_every_real_system_crontab_dry_runs(tmp_path: Path) -> None:
    assert sorted(p.name for p in CRONTABS.iterdir()) == [
        "anacron",
        "certbot",
        "mdadm",
        "munin-node",
        "sysstat",
    ]
    for path in sorted(CRONTABS.iterdir()):
        result = runner.invoke(app, ["import", "crontab", str(path), "--system", "--dry-run"])
        assert result.exit_code == 0, (path.name, result.output)
        assert "(as root)" in result.stdout or "(as munin)" in result.stdout, path.name


def test_api_and_token_given_before_the_command_apply_to_it(monkeypatch) -> None:
    # port 9 (discard) is closed on loopback: the command must try the URL given before it
    monkeypatch.delenv("DUETIME_API_URL", raising=False)
    result = runner.invoke(app, ["--api", "http://127.0.0.1:9", "jobs", "list"])
    assert result.exit_code == 4
    assert result.stderr.startswith("duetime: unreachable: cannot reach http://127.0.0.1:9")


def test_long_ids_fold_in_a_narrow_table_instead_of_being_cut() -> None:
    from rich.console import Console

    from duetime.cli.api_commands import _job_table

    job_id = "nightly-report-for-the-finance-team-" + "x" * 28
    table = _job_table(
        [{"job_id": job_id, "name": "n", "state": "ACTIVE", "schedule": None, "next_fire_at": None}]
    )
    console = Console(width=80, record=True)
    console.print(table)
    text = console.export_text()
    assert "…" not in text
    assert job_id in "".join(line.split("│")[1].strip() for line in text.splitlines() if "│" in line)


def test_piped_tables_keep_every_row_on_one_whole_line(monkeypatch) -> None:
    import importlib
    import io

    from duetime.cli import api_commands as cli_api

    # Given output that is not a terminal (a pipe), and rows wider than 80 columns
    monkeypatch.setattr("sys.stdout", io.StringIO())
    module = importlib.reload(cli_api)
    job_id = "nightly-report-for-the-finance-team-" + "x" * 28
    rows = [{"job_id": job_id, "name": "n" * 40, "state": "ACTIVE", "schedule": None, "next_fire_at": None}]
    buffer = io.StringIO()
    module._out.file = buffer
    module._show(rows, False, module._job_table(rows))
    # Then the id and the name each sit whole on the row's single line
    [row] = [line for line in buffer.getvalue().splitlines() if job_id in line]
    assert "n" * 40 in row and "…" not in buffer.getvalue()
    monkeypatch.undo()
    importlib.reload(cli_api)  # back to the real stdout


def test_jobs_update_help_says_the_zone_is_kept_unless_tz_is_given() -> None:
    result = runner.invoke(app, ["jobs", "update", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "the job keeps its time zone unless --tz is given" in result.stdout
    assert "(default: the job's zone is kept)" in result.stdout
    assert "[default: UTC]" not in result.stdout


def test_import_dry_run_with_invalid_lines_lists_the_rest_and_exits_2(tmp_path: Path) -> None:
    crontab = tmp_path / "mine"
    crontab.write_text("0 1 * * * /bin/ok\n* * * *\nCRON_TZ=Mars/Base\n0 9 * * * /bin/later\n")
    result = runner.invoke(app, ["import", "crontab", str(crontab), "--dry-run"])
    assert result.exit_code == 2
    assert "line 1: mine-ok: `0 1 * * *` UTC: /bin/ok" in result.stdout
    assert "    job id: cron-" in result.stdout
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"{crontab}:2: invalid: not an environment setting and too few fields")
    assert lines[1].startswith(f"{crontab}:4: invalid: its time zone is invalid: CRON_TZ='Mars/Base'")
    assert (
        lines[2] == f"duetime: {crontab}: 2 invalid lines: nothing to import (fix or comment them out first)"
    )


def test_import_notes_that_a_mailto_to_local_users_gives_no_rule() -> None:
    result = runner.invoke(app, ["import", "crontab", str(CRONTABS / "munin-node"), "--system", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"{CRONTABS / 'munin-node'}: note: MAILTO names local users (root), whom Duetime cannot mail: their "
        "jobs get no email rule (set MAILTO to email addresses); output is kept as each run's log "
        "(`duetime runs logs RUN_ID`)"
    ]
    assert "mails:" not in result.stdout


def test_import_dry_run_shows_the_email_rule_of_a_mailto(tmp_path: Path) -> None:
    crontab = tmp_path / "mailed"
    crontab.write_text("MAILTO=ops@example.com, dba@example.com\n0 1 * * * /bin/backup\n")
    result = runner.invoke(app, ["import", "crontab", str(crontab), "--dry-run"])
    assert result.exit_code == 0 and result.stderr == "", result.output
    assert (
        "    mails: ops@example.com, dba@example.com on failed, dead_lettered, timed_out, recovered"
        in result.stdout.splitlines()
    )


def test_import_without_mailto_has_no_note_and_an_empty_mailto_needs_none(tmp_path: Path) -> None:
    crontab = tmp_path / "quiet"
    crontab.write_text('MAILTO=""\n0 1 * * * /bin/ok\n')
    result = runner.invoke(app, ["import", "crontab", str(crontab), "--dry-run"])
    assert result.exit_code == 0 and result.stderr == ""


def test_import_to_an_unreachable_api_exits_4_with_one_line(monkeypatch) -> None:
    monkeypatch.delenv("DUETIME_API_URL", raising=False)
    result = runner.invoke(
        app, ["import", "crontab", str(CRONTABS / "sysstat"), "--system", "--api", "http://127.0.0.1:9"]
    )
    assert result.exit_code == 4
    [line] = result.stderr.splitlines()
    assert line.startswith("duetime: unreachable: cannot reach http://127.0.0.1:9")
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_import_with_no_api_at_all_exits_4_naming_what_was_tried(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DUETIME_API_URL", raising=False)
    state = tmp_path / "none.json"
    result = runner.invoke(
        app, ["import", "crontab", str(CRONTABS / "sysstat"), "--system", "--config", str(state)]
    )
    assert result.exit_code == 4
    assert result.stderr.splitlines() == [
        f"duetime: no_api: no --api, no DUETIME_API_URL and no {state}: is `duetime local` running?"
    ]


def test_import_with_an_unknown_default_zone_is_a_usage_error(tmp_path: Path) -> None:
    crontab = tmp_path / "mine"
    crontab.write_text("0 1 * * * /bin/ok\n")
    result = runner.invoke(app, ["import", "crontab", str(crontab), "--tz", "localtime", "--dry-run"])
    assert result.exit_code == 2
    assert result.stderr.startswith("duetime: --tz: unknown time zone 'localtime'")


def test_an_api_url_without_http_is_refused_in_one_line(monkeypatch) -> None:
    monkeypatch.delenv("DUETIME_API_URL", raising=False)
    result = runner.invoke(app, ["jobs", "list", "--api", "127.0.0.1:8765"])
    assert result.exit_code == 4
    assert result.stderr.splitlines() == [
        "duetime: bad_api_url: '127.0.0.1:8765' is not an http:// or https:// URL"
    ]


def test_a_port_that_does_not_answer_http_exits_4_in_one_line(monkeypatch) -> None:
    import socket
    import threading

    monkeypatch.delenv("DUETIME_API_URL", raising=False)
    # Given something on the port that answers, but not in HTTP (an SSH server, a database...)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_garbage() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    result = runner.invoke(app, ["jobs", "list", "--api", f"http://127.0.0.1:{port}"])
    thread.join(timeout=5)
    listener.close()
    assert result.exit_code == 4
    [line] = result.stderr.splitlines()
    assert (
        line
        == f"duetime: unreachable: no HTTP answer from http://127.0.0.1:{port}: BadStatusLine 'SSH-2.0-OpenSSH_9.2'"
    )


def test_create_refuses_a_time_zone_without_a_schedule_and_an_env_that_is_not_name_value() -> None:
    # refused before any request: no API is reachable at this address, so a request would exit 4
    api = ["--api", "http://127.0.0.1:9"]
    no_schedule = runner.invoke(
        app, ["jobs", "create", *api, "--name", "x", "--tz", "Nope", "--", "echo", "hi"]
    )
    assert no_schedule.exit_code == 2 and "--tz" in no_schedule.output
    bad_env = runner.invoke(app, ["jobs", "create", *api, "--env", "JUSTANAME", "--", "true"])
    assert bad_env.exit_code == 2 and "NAME=VALUE" in bad_env.output


def test_preview_of_a_superscript_digit_exits_2_naming_it() -> None:
    result = runner.invoke(app, ["schedule", "preview", "² * * * *"])
    assert result.exit_code == 2, result.output
    assert "'²' (U+00B2) in `² * * * *` is not an ASCII digit" in result.stderr
    assert "Traceback" not in result.output


def test_import_dry_run_reports_a_superscript_digit_as_an_invalid_line(tmp_path: Path) -> None:
    crontab = tmp_path / "mine"
    crontab.write_text("² * * * * echo x\n")
    result = runner.invoke(app, ["import", "crontab", str(crontab), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"{crontab}:1: invalid: ")
    assert "'²' (U+00B2)" in result.stderr and "is not an ASCII digit" in result.stderr


def test_the_api_commands_find_a_stack_started_with_state_dir_through_duetime_state_dir(
    monkeypatch, tmp_path: Path
) -> None:
    # Given a stack's state directory elsewhere than ./.duetime, named by DUETIME_STATE_DIR
    from duetime.cli.client import Client

    monkeypatch.delenv("DUETIME_API_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    state_dir = tmp_path / "elsewhere"
    state_dir.mkdir()
    (state_dir / "local.json").write_text('{"api_url": "http://127.0.0.1:48123"}')
    monkeypatch.setenv("DUETIME_STATE_DIR", str(state_dir))
    # When the CLI resolves its API with no --api and no DUETIME_API_URL
    client = Client.resolve(None, None, False)
    # Then it takes that stack's URL
    assert client.base_url == "http://127.0.0.1:48123"
    # And with no state file there, the error names the file it looked for
    (state_dir / "local.json").unlink()
    result = runner.invoke(app, ["jobs", "list"])
    assert result.exit_code == 4
    assert f"no {state_dir / 'local.json'}" in result.stderr
