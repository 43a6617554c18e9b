"""The `duetime` CLI's schedule preview and crontab dry-run (no AWS)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from duetime.cli import app

runner = CliRunner()
CRONTABS = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "crontabs"


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

    from duetime.cli_api import _job_table

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

    import duetime.cli_api as cli_api

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
