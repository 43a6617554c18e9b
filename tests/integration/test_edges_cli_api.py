"""The CLI (`jobs update`, `import crontab`) against the real API handler served over HTTP (moto in-process)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from duetime.cli.client import Client
from duetime.cli.main import app
from duetime.local.http_adapter import HttpApiAdapter, make_api_server
from duetime.local.lambda_runtime import LocalLambdaContext

CRONTABS = Path(__file__).resolve().parents[1] / "data" / "crontabs"
runner = CliRunner()

Serve = Callable[..., str]


@pytest.fixture(autouse=True)
def _no_api_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # `duetime --api URL ...` in another test of this process exports DUETIME_API_URL: start clean
    monkeypatch.delenv("DUETIME_API_URL", raising=False)
    monkeypatch.delenv("DUETIME_TOKEN", raising=False)


@pytest.fixture
def serve(api: ModuleType) -> Iterator[Serve]:
    """``serve(tenants=None) -> URL``: the API handler behind the local stack's HTTP adapter, on a free port."""
    servers = []

    def start(tenants: dict[str, str] | None = None) -> str:
        adapter = HttpApiAdapter(
            lambda event: api.lambda_handler(event, LocalLambdaContext("api")), tenants=tenants
        )
        server = make_api_server("127.0.0.1", 0, adapter)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server, thread in servers:
        server.shutdown()
        thread.join(timeout=5)


def jobs_of(url: str, token: str | None = None) -> list[dict[str, object]]:
    page = Client(url, token).request("GET", "/jobs", query={"limit": 100})
    jobs: list[dict[str, object]] = page["jobs"]
    return jobs


# --------------------------------------------------------------------------------------------------
# jobs update --schedule keeps the job's zone
# --------------------------------------------------------------------------------------------------


def test_updating_only_the_schedule_keeps_the_jobs_time_zone(serve: Serve) -> None:
    url = serve()
    # Given a job at 03:00 Berlin time
    made = runner.invoke(
        app,
        [
            "jobs",
            "create",
            "--api",
            url,
            "--name",
            "backup",
            "--schedule",
            "0 3 * * *",
            "--tz",
            "Europe/Berlin",
        ]
        + ["--json", "--", "/usr/bin/backup"],
    )
    assert made.exit_code == 0, made.output
    job_id = json.loads(made.stdout)["job_id"]
    # When only its schedule changes
    updated = runner.invoke(
        app, ["jobs", "update", job_id, "--api", url, "--schedule", "0 4 * * *", "--json"]
    )
    assert updated.exit_code == 0, updated.output
    job = json.loads(updated.stdout)
    # Then it stays in Berlin: 04:00 CET on 2026-11-30 is 03:00 UTC (not 04:00 UTC)
    assert job["schedule"]["expression"] == "0 4 * * *"
    assert job["schedule"]["timezone"] == "Europe/Berlin"
    assert job["next_fire_at"] == "2026-11-30T03:00:00.000Z"


def test_tz_alone_moves_the_schedule_to_another_zone_and_keeps_the_expression(serve: Serve) -> None:
    url = serve()
    made = runner.invoke(
        app,
        ["jobs", "create", "--api", url, "--schedule", "0 3 * * *", "--tz", "Europe/Berlin", "--json"]
        + ["--", "/usr/bin/backup"],
    )
    job_id = json.loads(made.stdout)["job_id"]
    updated = runner.invoke(
        app, ["jobs", "update", job_id, "--api", url, "--tz", "America/New_York", "--json"]
    )
    assert updated.exit_code == 0, updated.output
    job = json.loads(updated.stdout)
    assert (job["schedule"]["expression"], job["schedule"]["timezone"]) == ("0 3 * * *", "America/New_York")
    assert job["next_fire_at"] == "2026-11-30T08:00:00.000Z"  # 03:00 EST


# --------------------------------------------------------------------------------------------------
# import crontab: idempotent, every invalid line reported, the CLI's API options
# --------------------------------------------------------------------------------------------------


def test_a_second_import_of_the_same_file_creates_nothing(serve: Serve) -> None:
    url = serve()
    path = str(CRONTABS / "sysstat")
    # Given the file imported once: two jobs with stable ids
    first = runner.invoke(app, ["import", "crontab", path, "--system", "--api", url])
    assert first.exit_code == 0, first.output
    assert first.stdout.count("    created job cron-") == 2
    assert first.stdout.rstrip().endswith("2 created, 0 already present")
    ids = sorted(str(j["job_id"]) for j in jobs_of(url))
    assert len(ids) == 2 and all(i.startswith("cron-") for i in ids)
    # When it is imported again
    second = runner.invoke(app, ["import", "crontab", path, "--system", "--api", url])
    # Then nothing new exists, each entry is reported as present, and the exit code is 0
    assert second.exit_code == 0, second.output
    assert sorted(str(j["job_id"]) for j in jobs_of(url)) == ids
    for job_id in ids:
        assert f"    already present: job {job_id} (ACTIVE)" in second.stdout
    assert second.stdout.rstrip().endswith("0 created, 2 already present")
    assert second.stderr == ""


def test_an_invalid_line_is_reported_with_its_place_and_nothing_is_created(
    serve: Serve, tmp_path: Path
) -> None:
    url = serve()
    crontab = tmp_path / "mixed"
    crontab.write_text(
        "0 2 * * * /usr/bin/fine\n61 * * * * /usr/bin/bad-minute\n@reboot /usr/bin/warm\n0 0 30 2 * /usr/bin/never\n"
    )
    result = runner.invoke(app, ["import", "crontab", str(crontab), "--api", url])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert (
        f"{crontab}:2: invalid: minute value 61 in `61 * * * *` is out of range 0-59: 61 * * * * /usr/bin/bad-minute"
        in lines
    )
    assert any(line.startswith(f"{crontab}:4: invalid: ") and "never" in line for line in lines)
    assert any(line.startswith(f"{crontab}:3: skipped: @reboot") for line in lines)  # reported, not an error
    assert (
        lines[-1] == f"duetime: {crontab}: 2 invalid lines: nothing imported (fix or comment them out first)"
    )
    assert jobs_of(url) == []


def test_import_uses_duetime_api_url_and_the_token_like_every_other_command(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = serve(tenants={"token-a": "alice"})
    monkeypatch.setenv("DUETIME_API_URL", url)
    path = str(CRONTABS / "anacron")
    # Without a token the API refuses: exit 1, one line
    refused = runner.invoke(app, ["import", "crontab", path, "--system"])
    assert refused.exit_code == 1
    assert refused.stderr.splitlines() == ["duetime: 401 http_error: Unauthorized"]
    # With --token (after the command, or before it) the job is alice's
    made = runner.invoke(app, ["import", "crontab", path, "--system", "--token", "token-a"])
    assert made.exit_code == 0, made.output
    [job] = jobs_of(url, "token-a")
    assert job["tenant"] == "alice" and str(job["job_id"]).startswith("cron-")
    again = runner.invoke(app, ["--token", "token-a", "import", "crontab", path, "--system"])
    assert again.exit_code == 0 and "already present" in again.stdout


def test_an_id_taken_by_another_tenant_is_refused_not_reported_present(serve: Serve) -> None:
    url = serve(tenants={"token-a": "alice", "token-b": "bob"})
    path = str(CRONTABS / "anacron")
    assert (
        runner.invoke(
            app, ["import", "crontab", path, "--system", "--api", url, "--token", "token-a"]
        ).exit_code
        == 0
    )
    # bob imports the same file on the same path: the id is alice's (job ids are global, README "Tenants")
    bob = runner.invoke(app, ["import", "crontab", path, "--system", "--api", url, "--token", "token-b"])
    assert bob.exit_code == 1
    [job_id] = [str(j["job_id"]) for j in jobs_of(url, "token-a")]
    assert f"{path}:6: refused: job id {job_id} is taken by another tenant" in bob.stderr
    assert jobs_of(url, "token-b") == []


def test_reimporting_a_job_changed_since_says_how_it_differs(serve: Serve) -> None:
    url = serve()
    path = str(CRONTABS / "anacron")
    runner.invoke(app, ["import", "crontab", path, "--system", "--api", url])
    [job] = jobs_of(url)
    moved = runner.invoke(app, ["jobs", "update", str(job["job_id"]), "--api", url, "--tz", "Asia/Tokyo"])
    assert moved.exit_code == 0, moved.output
    again = runner.invoke(app, ["import", "crontab", path, "--system", "--api", url])
    assert again.exit_code == 0
    assert (
        f"{path}:6: note: job {job['job_id']} differs from this line in schedule.timezone; left as it is"
        in again.stderr
    )


def test_reimporting_a_deleted_job_does_not_recreate_it_and_says_so(serve: Serve) -> None:
    url = serve()
    path = str(CRONTABS / "anacron")
    runner.invoke(app, ["import", "crontab", path, "--system", "--api", url])
    [job] = jobs_of(url)
    assert runner.invoke(app, ["jobs", "delete", str(job["job_id"]), "--api", url]).exit_code == 0
    again = runner.invoke(app, ["import", "crontab", path, "--system", "--api", url])
    assert again.exit_code == 0
    assert f"already present: job {job['job_id']} (DELETED)" in again.stdout
    assert "was deleted; its id stays taken" in again.stderr


# --------------------------------------------------------------------------------------------------
# jobs slots: did it run?
# --------------------------------------------------------------------------------------------------
def test_jobs_slots_prints_each_expected_fire_with_its_outcome(serve: Serve) -> None:
    url = serve()
    made = Client(url).request(
        "POST",
        "/jobs",
        body={
            "name": "slots",
            "schedule": {"expression": "rate(1 minute)", "timezone": "UTC"},
            "task": {"kind": "container", "command": ["true"]},
        },
    )
    window = ["--since", "2026-11-29T12:00:00Z", "--until", "2026-11-29T12:03:00Z", "--api", url]
    shown = runner.invoke(app, ["jobs", "slots", made["job_id"], *window])
    assert shown.exit_code == 0, shown.output
    rows = [
        [cell for cell in line.replace("│", " ").split()][:2]
        for line in shown.output.splitlines()
        if "2026-11-29" in line
    ]
    # 12:01 claimed at submit (pending), 12:02 and 12:03 not yet (upcoming); nothing at 12:00 (the submit)
    assert rows == [
        ["2026-11-29T12:03:00", "upcoming"],
        ["2026-11-29T12:02:00", "upcoming"],
        ["2026-11-29T12:01:00", "pending"],
    ]
    as_json = runner.invoke(app, ["jobs", "slots", made["job_id"], *window, "--json", "--limit", "2"])
    page = json.loads(as_json.output)
    assert [s["outcome"] for s in page["slots"]] == ["upcoming", "upcoming"] and page["next_token"]
    missing = runner.invoke(app, ["jobs", "slots", "job-absent", "--api", url])
    assert missing.exit_code == 3
