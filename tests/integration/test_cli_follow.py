"""`duetime runs logs RUN_ID --follow` prints a RUNNING run's output as it is written (a real CLI process)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import replace

import pytest

import duetime.services.worker as worker_module
from duetime.cli.client import Client
from duetime.config.deps import Deps
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.models import ContainerTask, RunState
from duetime.services import jobs
from duetime.services.worker import Worker
from tests.helpers import running_worker, wait_for
from tests.integration.test_edges_cli_api import Serve, serve  # noqa: F401 - the fixture

SCRIPT = "echo first line; sleep 7; echo second line"


def test_follow_prints_a_running_runs_output_before_the_run_ends(serve: Serve, deps: Deps) -> None:  # noqa: F811
    url = serve()
    # Given a run whose task prints a line, works 7 s, then prints another, on a worker of this process
    job = jobs.create_job(
        CreateJobRequest(name="follow", task=ContainerTask(command=["sh", "-c", SCRIPT])),
        tenant="local",
        deps=deps,
    )
    [run] = deps.store.list_runs(job.job_id)
    worker = threading.Thread(target=Worker(deps, "small", owner="w").poll_once, daemon=True)
    worker.start()
    # When someone follows its log with the CLI
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    follow = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "duetime",
            "runs",
            "logs",
            run.run_id,
            "--follow",
            "--interval",
            "0.3",
            "--api",
            url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()
        # Then the first line shows while the run is still RUNNING (streamed after ~5 s, the task ends at ~7 s)
        state = Client(url).request("GET", f"/runs/{run.run_id}")["state"]
        assert first == "first line\n" and state == "RUNNING"
        rest, errors = follow.communicate(timeout=60)
    finally:
        follow.kill()
    # And the rest follows, once, with the attempt's end and the run's outcome on stderr; exit 0 (SUCCEEDED)
    assert rest == "second line\n"
    assert follow.returncode == 0
    assert "--- attempt 1 ---" in errors and "--- run SUCCEEDED ---" in errors
    worker.join(timeout=30)


def _follow(url: str, run_id: str) -> subprocess.CompletedProcess[str]:
    """`duetime runs logs RUN_ID -f` polling every 0.3 s, run to its end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    command = [
        sys.executable,
        "-m",
        "duetime",
        "runs",
        "logs",
        run_id,
        "-f",
        "--interval",
        "0.3",
        "--api",
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def test_follow_waits_for_a_log_its_worker_has_not_stored_yet(serve: Serve, deps: Deps) -> None:  # noqa: F811
    url = serve()
    # Given a worker that lingers 8 s over its log packs (the AWS stages' way) and a run it ends at once
    lingering = replace(deps, settings=deps.settings.model_copy(update={"log_pack_linger_seconds": 8.0}))
    job = jobs.create_job(
        CreateJobRequest(name="quick", task=ContainerTask(command=["echo", "quick output"])),
        tenant="local",
        deps=deps,
    )
    [run] = deps.store.list_runs(job.job_id)
    with running_worker(Worker(lingering, "small", owner="w")):
        wait_for(
            "the run to succeed", lambda: deps.store.list_runs(job.job_id)[0].state is RunState.SUCCEEDED
        )
        assert "is not stored yet" in Client(url).request("GET", f"/runs/{run.run_id}/logs")
        # (read without -f, it is nothing on stdout, the note on stderr and exit 5: read it again)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
        once = subprocess.run(
            [sys.executable, "-m", "duetime", "runs", "logs", run.run_id, "--api", url],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert (once.returncode, once.stdout) == (5, "") and "is not stored yet" in once.stderr, once
        # When someone follows its log before the pack is stored
        follow = _follow(url, run.run_id)
    # Then it prints the log itself once stored, not the note, and exits 0 (SUCCEEDED)
    assert follow.stdout == "quick output\n", follow
    assert follow.returncode == 0 and "--- run SUCCEEDED ---" in follow.stderr


def test_follow_prints_the_tail_a_lingering_log_holds_beyond_its_chunks(
    serve: Serve,  # noqa: F811
    deps: Deps,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = serve()
    # Given a worker lingering 6 s, streaming chunks every 1 s, and a run that prints, works, prints again
    monkeypatch.setattr(worker_module, "FLUSH_SECONDS", 1.0)
    lingering = replace(deps, settings=deps.settings.model_copy(update={"log_pack_linger_seconds": 6.0}))
    job = jobs.create_job(
        CreateJobRequest(
            name="tail", task=ContainerTask(command=["sh", "-c", "echo first; sleep 2.5; echo second"])
        ),
        tenant="local",
        deps=deps,
    )
    [run] = deps.store.list_runs(job.job_id)
    with running_worker(Worker(lingering, "small", owner="w")):
        wait_for("the run to start", lambda: deps.store.list_runs(job.job_id)[0].state is RunState.RUNNING)
        # When someone follows its log (before the pack is stored: 6 s after the end)
        follow = _follow(url, run.run_id)
    # Then it prints the whole log, the tail after the last chunk too ("waits for the log itself")
    assert follow.stdout == "first\nsecond\n", follow
