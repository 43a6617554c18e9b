"""Regenerate the console's screenshots (docs/console/*.png, 1280x800) from a fresh local stack.

    python -m tests.e2e.console_screenshots [--out docs/console]

Starts ``duetime local`` (the same helper as the end-to-end tests) with tenant alice, submits a few jobs
(one every 10 s for the lag chart and sparklines, one that fails twice, one that runs for a while, one
named with markup), waits about a minute for their runs, then drives Debian's chromium through every page.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.e2e.conftest import FAST, start_stack, stop_stack
from tests.e2e.test_console import ALICE, HOSTILE, container, launch, new_page, submit

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "console")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds of runs before the screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp), *FAST, "--tenant", f"alice:{ALICE}")
        try:
            every = submit(
                stack,
                {
                    "name": "nightly-report",
                    "schedule": {"expression": "rate(10 seconds)"},
                    "task": container("sh", "-c", "echo building report $DUETIME_RUN_ID; sleep 1; echo done"),
                },
            )
            submit(
                stack,
                {
                    "name": "billing-sync",
                    "schedule": {"expression": "0 9 * * MON-FRI", "timezone": "Europe/Berlin"},
                    "task": container("echo", "sync"),
                },
            )
            hostile = submit(
                stack,
                {
                    "name": HOSTILE[1],
                    "schedule": {"expression": "0 12 1 * *", "timezone": "America/New_York"},
                    "task": container("true"),
                },
            )
            failing = submit(
                stack,
                {
                    "name": "flaky-export",
                    "task": container("sh", "-c", "echo exporting; echo 'error: upstream 503' >&2; exit 3"),
                    "retry": {"max_attempts": 2, "backoff_seconds": 1, "jitter": "none"},
                },
            )
            time.sleep(args.warmup)
            long = submit(
                stack,
                {
                    "name": "long-backfill",
                    "task": container(
                        "sh", "-c", "for i in $(seq 1 60); do echo step $i of 60; sleep 1; done"
                    ),
                },
            )
            running = stack.wait_run(long["job_id"], {"RUNNING"}, timeout=30, token=ALICE)[0]
            time.sleep(6)
            dead = stack.wait_run(failing["job_id"], {"FAILED"}, timeout=30, token=ALICE)[0]
            with sync_playwright() as p:
                browser = launch(p)
                page: Any = new_page(browser, stack, ALICE)
                shots = {
                    "jobs": "/console/jobs",
                    "job": f"/console/jobs/{every['job_id']}",
                    "job-dst": f"/console/jobs/{hostile['job_id']}",
                    "confirm": f"/console/jobs/{every['job_id']}/pause",
                    "run": f"/console/runs/{running['run_id']}",
                    "run-failed": f"/console/runs/{dead['run_id']}?attempt=1",
                    "dead-letters": "/console/dead-letters",
                    "lag": "/console/lag",
                    "not-found": "/console/jobs/someone-elses-job",
                }
                for name, path in shots.items():
                    page.goto(path)
                    page.screenshot(path=str(args.out / f"{name}.png"))
                page.goto(f"/console/jobs/{every['job_id']}/edit")
                text = page.locator("#body").input_value()
                page.fill("#body", text.replace('"rate(10 seconds)"', '"rate(1 fortnight)"'))
                page.get_by_role("button", name="Save").click()
                page.screenshot(path=str(args.out / "edit-400.png"))
                # a browser with no token: any page leads to the sign-in form
                bare = browser.new_context(base_url=stack.api, viewport={"width": 1280, "height": 800})
                signing = bare.new_page()
                signing.goto(f"/console/jobs/{every['job_id']}")
                signing.screenshot(path=str(args.out / "sign-in.png"))
                bare.close()
                browser.close()
        finally:
            stop_stack(stack)
    print(f"screenshots in {args.out}")


if __name__ == "__main__":
    main()
