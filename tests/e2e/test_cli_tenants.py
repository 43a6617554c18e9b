"""The CLI against a local stack with two tenants (the local HTTP adapter acting as a JWT authorizer)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tenants_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(
        tmp_path_factory.mktemp("tenants"),
        "--tick-seconds",
        "1",
        "--workers",
        "1",
        "--tenant",
        "alice:token-a",
        "--tenant",
        "bob:token-b",
    )
    yield s
    stop_stack(s)


def cli(stack: Stack, token: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    auth = ["--token", token] if token else []
    # options right after the subcommand: anything after `--` is the task's command
    cmd = [sys.executable, "-m", "duetime", *args[:2], "--api", stack.api, *auth, *args[2:]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=stack.workdir)


def test_requests_without_a_known_token_are_401(tenants_stack: Stack) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}):
        req = urllib.request.Request(tenants_stack.api + "/jobs", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == 401


def test_each_tenant_sees_only_its_own_jobs_runs_and_logs_through_the_cli(tenants_stack: Stack) -> None:
    made = cli(
        tenants_stack,
        "token-a",
        "jobs",
        "create",
        "--name",
        "alice-job",
        "--json",
        "--",
        "sh",
        "-c",
        "echo alice was here",
    )
    assert made.returncode == 0, made.stderr
    job_id = json.loads(made.stdout)["job_id"]
    # alice follows the run to its end and sees its log; the exit code says it succeeded
    runs = json.loads(cli(tenants_stack, "token-a", "runs", "list", job_id, "--json").stdout)["runs"]
    follow = cli(tenants_stack, "token-a", "runs", "logs", runs[0]["run_id"], "--follow", "--interval", "0.3")
    assert follow.returncode == 0 and "alice was here" in follow.stdout
    # bob cannot see any of it: not found is exit code 3
    assert cli(tenants_stack, "token-b", "jobs", "get", job_id).returncode == 3
    assert cli(tenants_stack, "token-b", "runs", "logs", runs[0]["run_id"]).returncode == 3
    listed = json.loads(cli(tenants_stack, "token-b", "jobs", "list", "--json").stdout)["jobs"]
    assert listed == []
    mine = json.loads(cli(tenants_stack, "token-a", "jobs", "list", "--json").stdout)["jobs"]
    assert [j["job_id"] for j in mine] == [job_id]


def test_cli_lifecycle_and_exit_codes(tenants_stack: Stack) -> None:
    made = cli(
        tenants_stack,
        "token-b",
        "jobs",
        "create",
        "--name",
        "hourly",
        "--schedule",
        "rate(1 hour)",
        "--json",
        "--",
        "true",
    )
    job_id = json.loads(made.stdout)["job_id"]
    assert (
        json.loads(cli(tenants_stack, "token-b", "jobs", "pause", job_id, "--json").stdout)["state"]
        == "PAUSED"
    )
    assert (
        json.loads(cli(tenants_stack, "token-b", "jobs", "resume", job_id, "--json").stdout)["state"]
        == "ACTIVE"
    )
    run = json.loads(cli(tenants_stack, "token-b", "jobs", "trigger", job_id, "--json").stdout)
    assert run["trigger"] == "manual"
    deleted = cli(tenants_stack, "token-b", "jobs", "delete", job_id, "--cancel-running", "--json")
    assert json.loads(deleted.stdout)["state"] == "DELETED"
    bad = cli(tenants_stack, "token-b", "jobs", "create", "--schedule", "0 0 30 2 *", "--", "true")
    assert bad.returncode == 1 and "never" in bad.stderr
    assert cli(tenants_stack, "token-b", "jobs", "get", "job-none").returncode == 3
    unreachable = subprocess.run(
        [sys.executable, "-m", "duetime", "jobs", "list", "--api", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unreachable.returncode == 4


def _post(stack: Stack, token: str, body: dict) -> dict:
    req = urllib.request.Request(
        stack.api + "/jobs",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_one_tenants_burst_does_not_starve_another_tenants_single_run(tenants_stack: Stack) -> None:
    # Given alice's burst of run-now jobs queued ahead on the small tier (two workers)
    from concurrent.futures import ThreadPoolExecutor

    burst = {"name": "burst", "task": {"kind": "container", "command": ["sh", "-c", "sleep 0.2"]}}
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: _post(tenants_stack, "token-a", burst), range(200)))
    # When bob submits a single run
    job = _post(
        tenants_stack, "token-b", {"name": "single", "task": {"kind": "container", "command": ["true"]}}
    )
    req = urllib.request.Request(
        tenants_stack.api + f"/jobs/{job['job_id']}/runs", headers={"Authorization": "Bearer token-b"}
    )
    import time

    deadline = time.monotonic() + 30
    run: dict = {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(req, timeout=10) as resp:
            run = json.loads(resp.read())["runs"][0]
        if run["state"] == "SUCCEEDED":
            break
        time.sleep(0.3)
    # Then it starts within a few seconds, not after alice's ~200 x 0.2 s / 2 workers = 20 s backlog
    assert run["state"] == "SUCCEEDED", run
    assert run["lag_seconds"] < 5, run


def test_a_listing_longer_than_its_limit_tells_how_to_get_the_next_page(tenants_stack: Stack) -> None:
    ids = [
        _post(
            tenants_stack,
            "token-b",
            {
                "name": f"paged-{i}",
                "schedule": {"expression": "rate(1 day)"},
                "task": {"kind": "container", "command": ["true"]},
            },
        )["job_id"]
        for i in range(3)
    ]
    first = cli(tenants_stack, "token-b", "jobs", "list", "--prefix", "paged-", "--limit", "2")
    assert first.returncode == 0, first.stderr
    more = [line for line in first.stdout.splitlines() if line.startswith("more: --next-token ")]
    assert len(more) == 1
    rest = cli(
        tenants_stack,
        "token-b",
        "jobs",
        "list",
        "--prefix",
        "paged-",
        "--limit",
        "2",
        *more[0].split()[1:],
        "--json",
    )
    page = json.loads(rest.stdout)
    assert [j["job_id"] for j in page["jobs"]] == ids[:1] and page.get("next_token") is None  # newest first
