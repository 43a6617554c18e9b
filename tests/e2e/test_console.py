"""The web console (/console) in a real browser: Playwright for Python driving Debian's chromium package
against the real local stack with two tenants (alice, bob).

Every page and action, user-written names that try to inject markup, another tenant's ids (a 404 page), the
CSRF check, the Content-Security-Policy, and axe-core (vendored under tests/e2e/vendor/) finding no serious
or critical violation on any page. Never skipped: without /usr/bin/chromium (``.ci/run`` installs it) or
Playwright the tests fail.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import FAST, Stack, start_stack, stop_stack

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
AXE = Path(__file__).parent / "vendor" / "axe-4.10.2.min.js"
ALICE, BOB = "token-a", "token-b"
HOSTILE = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>']
#: the OIDC issuer the AWS shell signs in at (played by the browser test itself: nothing leaves the machine)
ISSUER, CLIENT = "https://login.test", "console-client"


# ---- the stack, the browser and the jobs the pages show -----------------------------------------------
@pytest.fixture(scope="module")
def console_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(
        tmp_path_factory.mktemp("console"),
        *FAST,
        "--tenant",
        f"alice:{ALICE}",
        "--tenant",
        f"bob:{BOB}",
        "--console-oidc",
        f"{ISSUER}/authorize,{ISSUER}/token,{CLIENT}",
    )
    yield s
    stop_stack(s)


def launch(playwright: Any) -> Any:
    """Debian's chromium, headless (Playwright's own browser download is never used)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # never a skip: CI must run these
        pytest.fail("playwright is not installed: pip install -e '.[dev]'")
    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


def new_page(browser: Any, stack: Stack, token: str) -> Any:
    """A page of a fresh context (its own cookies) acting as the tenant of ``token``, at 1280x800, that
    records dialogs (an injected ``alert``) and console messages (CSP violations)."""
    context = browser.new_context(
        base_url=stack.api,
        viewport={"width": 1280, "height": 800},
        extra_http_headers={"Authorization": f"Bearer {token}"},
    )
    page = context.new_page()
    page.dialogs = []
    page.messages = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.on("console", lambda m: page.messages.append(m.text))
    return page


@pytest.fixture
def alice(browser: Any, console_stack: Stack) -> Iterator[Any]:
    page = new_page(browser, console_stack, ALICE)
    yield page
    assert page.dialogs == [], "a script ran: an injected name was not escaped"
    csp = [m for m in page.messages if "Content Security Policy" in m]
    assert csp == [], csp
    page.context.close()


@pytest.fixture
def bob(browser: Any, console_stack: Stack) -> Iterator[Any]:
    page = new_page(browser, console_stack, BOB)
    yield page
    page.context.close()


def submit(stack: Stack, body: dict[str, Any], token: str = ALICE) -> dict[str, Any]:
    status, job = stack.request("POST", "/jobs", body, token=token)
    assert status == 201, job
    return job


def container(*command: str) -> dict[str, Any]:
    return {"kind": "container", "command": list(command)}


@pytest.fixture(scope="module")
def seeded(console_stack: Stack) -> dict[str, Any]:
    """Alice's jobs: two with hostile names (one monthly in Berlin, whose next 10 fires cross DST; one that
    fails twice and is dead-lettered), a long-running one, and a job per action."""
    s = console_stack
    monthly = submit(
        s,
        {
            "name": HOSTILE[0],
            "schedule": {"expression": "0 12 1 * *", "timezone": "Europe/Berlin"},
            "task": container("echo", "hi"),
        },
    )
    failing = submit(
        s,
        {
            "name": HOSTILE[1],
            "task": container("sh", "-c", "echo attempt $DUETIME_ATTEMPT; exit 3"),
            "retry": {"max_attempts": 2, "backoff_seconds": 1, "jitter": "none"},
        },
    )
    runs = s.wait_run(failing["job_id"], {"FAILED"}, timeout=60, token=ALICE)
    dead = runs[0]
    assert dead["dead_lettered"], dead
    return {"monthly": monthly, "failing": failing, "dead_run": dead["run_id"]}


def every_page(seeded: dict[str, Any]) -> dict[str, str]:
    job, run = seeded["monthly"]["job_id"], seeded["dead_run"]
    return {
        "jobs": "/console/jobs",
        "job": f"/console/jobs/{job}",
        "edit": f"/console/jobs/{job}/edit",
        "confirm": f"/console/jobs/{job}/pause",
        "run": f"/console/runs/{run}",
        "dead-letters": "/console/dead-letters",
        "lag": "/console/lag",
    }


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations of the page as it is."""
    page.evaluate(AXE.read_text())  # evaluated over CDP: the page's CSP (no inline script) stays as it is
    found = page.evaluate("async () => (await axe.run(document)).violations")
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["html"] for n in v["nodes"]][:3]}
        for v in found
        if v["impact"] in ("serious", "critical")
    ]


def raw(
    stack: Stack, method: str, path: str, *, token: str, data: dict[str, str] | None = None, cookie: str = ""
) -> tuple[int, dict[str, str], str]:
    """A request outside the browser: status, headers (lower-cased names), body text; no redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    body = urllib.parse.urlencode(data).encode() if data is not None else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if cookie:
        headers["Cookie"] = cookie
    req = urllib.request.Request(stack.api + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=15) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read().decode()


def job_state(stack: Stack, job_id: str) -> str:
    status, job = stack.request("GET", f"/jobs/{job_id}", token=ALICE)
    assert status == 200, job
    return str(job["state"])


# ---- every page -----------------------------------------------------------------------------------------
def test_every_page_renders_with_no_serious_accessibility_violation(
    alice: Any, seeded: dict[str, Any]
) -> None:
    for name, path in every_page(seeded).items():
        response = alice.goto(path)
        assert response.status == 200, (name, path)
        assert alice.locator("h1").count() == 1, name
        assert axe_violations(alice) == [], name


def test_every_page_has_a_csp_without_inline_scripts_and_no_inline_handlers(
    console_stack: Stack, seeded: dict[str, Any]
) -> None:
    for name, path in every_page(seeded).items():
        status, headers, html = raw(console_stack, "GET", path, token=ALICE)
        assert status == 200, name
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == [], name  # no inline script
        assert re.findall(r"<[^>]+\son[a-z]+\s*=", html) == [], name  # no inline event handler
        assert "//cdn" not in html and "https://" not in html  # nothing fetched from elsewhere


def test_console_redirects_to_the_jobs_page(alice: Any) -> None:
    alice.goto("/console")
    assert alice.url.endswith("/console/jobs")


# ---- hostile names ------------------------------------------------------------------------------------
def test_names_that_carry_markup_render_as_text(alice: Any, seeded: dict[str, Any]) -> None:
    alice.goto("/console/jobs")
    for name in HOSTILE:
        assert alice.get_by_role("link", name=name, exact=True).count() == 1
    assert alice.locator("img").count() == 0
    for key in ("monthly", "failing"):
        alice.goto(f"/console/jobs/{seeded[key]['job_id']}")
        assert alice.locator("h1 .subject").inner_text() == seeded[key]["name"]
        assert alice.title().startswith(seeded[key]["name"])
        assert alice.locator("img").count() == 0
    alice.goto(f"/console/jobs/{seeded['failing']['job_id']}/delete")
    assert alice.locator(".subject").inner_text() == HOSTILE[1]
    # the fixture fails the test if any alert() ran


# ---- jobs -----------------------------------------------------------------------------------------------
def test_jobs_filter_by_state_and_name_and_page(
    console_stack: Stack, alice: Any, seeded: dict[str, Any]
) -> None:
    for i in range(27):
        submit(
            console_stack,
            {"name": f"paged-{i:02d}", "schedule": {"expression": "@daily"}, "task": container("true")},
        )
    paused = submit(
        console_stack, {"name": "filter-me", "schedule": {"expression": "@daily"}, "task": container("true")}
    )
    console_stack.request("POST", f"/jobs/{paused['job_id']}/pause", token=ALICE)

    alice.goto("/console/jobs")
    alice.fill("#name", "paged-")  # htmx swaps the table as one types
    alice.wait_for_url(re.compile(r"name=paged-"))
    alice.wait_for_function(
        "() => [...document.querySelectorAll('#jobs-table tbody tr td:first-child a')]"
        ".every(a => a.textContent.startsWith('paged-'))"
    )
    names = alice.locator("#jobs-table tbody tr td:first-child a").all_inner_texts()
    assert all(n.startswith("paged-") for n in names) and names[0] == "paged-26"  # newest first
    alice.get_by_role("link", name="Next page").click()
    alice.wait_for_url(re.compile(r"next_token="))
    assert alice.locator("#jobs-table tbody tr td:first-child a").all_inner_texts() == [
        "paged-01",
        "paged-00",
    ]

    alice.goto("/console/jobs")
    alice.select_option("#state", "PAUSED")
    alice.wait_for_function("() => document.querySelectorAll('#jobs-table tbody tr').length === 1")
    assert alice.locator("#jobs-table tbody a").first.inner_text() == "filter-me"
    assert "state=PAUSED" in alice.url  # the filter is in the address (htmx pushes it)


def test_jobs_page_shows_next_fire_last_outcome_and_a_lag_sparkline(
    alice: Any, seeded: dict[str, Any]
) -> None:
    alice.goto("/console/jobs?name=" + urllib.parse.quote(HOSTILE[1]))
    row = alice.locator("#jobs-table tbody tr").first
    assert "FAILED" in row.inner_text() and "exit 3" in row.inner_text()
    assert row.locator("svg.spark").count() == 1
    alice.goto("/console/jobs?name=" + urllib.parse.quote(HOSTILE[0]))
    assert "UTC" in alice.locator("#jobs-table tbody tr td").nth(3).inner_text()


# ---- a job ----------------------------------------------------------------------------------------------
def test_job_page_shows_the_schedule_in_words_ten_fires_with_dst_notes_slots_and_runs(
    alice: Any, seeded: dict[str, Any]
) -> None:
    alice.goto(f"/console/jobs/{seeded['monthly']['job_id']}")
    facts = alice.locator("dl.facts").inner_text()
    assert "At 12:00 PM, on day 1 of the month (Europe/Berlin)" in facts
    fires = alice.locator("section[aria-labelledby=h-schedule] table tbody tr")
    assert fires.count() == 10
    notes = [n for n in fires.locator("td:nth-child(3)").all_inner_texts() if n]
    # ten monthly fires always cross one DST change of Berlin's (at most two)
    assert 1 <= len(notes) <= 2 and all(
        re.search(r"after a DST change: UTC\+0[12]:00 -> UTC\+0[12]:00", n) for n in notes
    )

    alice.goto(f"/console/jobs/{seeded['failing']['job_id']}")
    run = alice.locator("section[aria-labelledby=h-runs] tbody tr").first
    assert (
        "FAILED" in run.inner_text() and "2 of 2" in run.inner_text() and "dead-lettered" in run.inner_text()
    )
    slot = alice.locator("ol.timeline li").first
    assert "ran" in slot.inner_text() and "FAILED" in slot.inner_text()


def confirm(page: Any, job_id: str, action: str, label: str) -> None:
    page.goto(f"/console/jobs/{job_id}")
    page.get_by_role("link", name=f"{label}…").click()
    page.wait_for_url(re.compile(rf"/{action}$"))
    assert page.locator("h1").inner_text() == f"{label} job?"
    page.get_by_role("button", name=label).click()


def test_pause_resume_trigger_and_delete_each_after_a_confirmation(console_stack: Stack, alice: Any) -> None:
    job = submit(
        console_stack,
        {"name": "actions", "schedule": {"expression": "rate(1 hour)"}, "task": container("echo", "manual")},
    )
    job_id = job["job_id"]
    alice.goto(f"/console/jobs/{job_id}/pause")  # the confirmation alone changes nothing
    assert job_state(console_stack, job_id) == "ACTIVE"

    confirm(alice, job_id, "pause", "Pause")
    alice.wait_for_url(re.compile(r"done=paused"))
    assert "PAUSED" in alice.locator("h1").inner_text() and job_state(console_stack, job_id) == "PAUSED"

    confirm(alice, job_id, "resume", "Resume")
    alice.wait_for_url(re.compile(r"done=resumed"))
    assert job_state(console_stack, job_id) == "ACTIVE"

    confirm(alice, job_id, "trigger", "Trigger")
    alice.wait_for_url(re.compile(r"/console/runs/.+done=triggered"))
    assert "manual" in alice.locator("main > p").first.inner_text()

    confirm(alice, job_id, "delete", "Delete")
    alice.wait_for_url(re.compile(r"done=deleted"))
    assert job_state(console_stack, job_id) == "DELETED"
    assert alice.locator(".actions a").all_inner_texts() == []


def test_edit_as_json_shows_the_apis_400_at_the_field_then_saves(console_stack: Stack, alice: Any) -> None:
    job = submit(
        console_stack, {"name": "editable", "schedule": {"expression": "@daily"}, "task": container("true")}
    )
    alice.goto(f"/console/jobs/{job['job_id']}/edit")
    text = alice.locator("#body").input_value()
    assert '"expression": "@daily"' in text
    alice.fill("#body", text.replace('"@daily"', '"rate(1 fortnight)"'))
    alice.get_by_role("button", name="Save").click()
    error = alice.get_by_role("alert")
    assert error.locator("code.field").inner_text() == "schedule.expression"
    assert "fortnight" in error.inner_text() and "invalid_schedule" in error.inner_text()
    assert alice.locator("#body").get_attribute("aria-invalid") == "true"
    assert "rate(1 fortnight)" in alice.locator("#body").input_value()  # the text is kept to fix

    alice.fill("#body", '{"timeout_seconds": "10"}')
    alice.get_by_role("button", name="Save").click()
    assert alice.get_by_role("alert").locator("code.field").inner_text() == "timeout_seconds"

    alice.fill("#body", '{"name": "edited", "schedule": {"expression": "*/5 * * * *"}}')
    alice.get_by_role("button", name="Save").click()
    alice.wait_for_url(re.compile(r"done=edited"))
    assert alice.locator("h1 .subject").inner_text() == "edited"
    assert "Every 5 minutes" in alice.locator("dl.facts").inner_text()


# ---- runs, logs, dead letters, lag --------------------------------------------------------------------
def test_run_page_shows_attempts_exit_codes_reasons_fencing_tokens_and_earlier_logs(
    alice: Any, seeded: dict[str, Any]
) -> None:
    alice.goto(f"/console/runs/{seeded['dead_run']}")
    rows = alice.locator("section[aria-labelledby=h-attempts] tbody tr")
    assert rows.count() == 2
    first = rows.nth(0).locator("td").all_inner_texts()
    assert first[:5] == ["1", "FAILED", "exit_code", "3", first[4]] and first[4].isdigit()
    assert int(rows.nth(1).locator("td").nth(4).inner_text()) > int(first[4])  # fencing token raised
    assert "attempt 2" in alice.locator("pre.logtext").inner_text()
    alice.get_by_role("link", name="attempt 1", exact=True).click()
    alice.wait_for_url(re.compile(r"attempt=1"))
    assert "attempt 1" in alice.locator("pre.logtext").inner_text()
    assert "Log of attempt 1" in alice.locator("#h-log").inner_text()


def test_log_viewer_follows_a_running_run(console_stack: Stack, alice: Any) -> None:
    job = submit(
        console_stack,
        {
            "name": "follow-me",
            "task": container("sh", "-c", "for i in $(seq 1 14); do echo tick $i; sleep 1; done"),
        },
    )
    run = console_stack.wait_run(job["job_id"], {"RUNNING"}, timeout=30, token=ALICE)[0]
    alice.goto(f"/console/runs/{run['run_id']}")
    assert "Following" in alice.locator("#log").inner_text()
    # no reload: htmx polls the log while the run runs, then stops once it ended
    alice.wait_for_function(
        "() => (document.querySelector('pre.logtext')?.textContent || '').includes('tick 14')", timeout=40_000
    )
    alice.wait_for_function("() => !document.querySelector('#log[hx-trigger]')", timeout=15_000)
    assert "SUCCEEDED" in alice.locator("#log").inner_text()


def test_a_followed_run_shows_its_final_state_without_a_reload(console_stack: Stack, alice: Any) -> None:
    # Given the page of a RUNNING run (its badge RUNNING, Cancel offered, no exit code, not finished)
    job = submit(
        console_stack, {"name": "ends-while-shown", "task": container("sh", "-c", "sleep 4; echo done")}
    )
    run = console_stack.wait_run(job["job_id"], {"RUNNING"}, timeout=30, token=ALICE)[0]
    alice.goto(f"/console/runs/{run['run_id']}")
    assert alice.locator("h1 .state").inner_text() == "RUNNING"
    assert alice.get_by_role("link", name="Cancel…").count() == 1
    assert facts_of(alice)["Finished"] == "-"
    # When the run ends while the page is open (the log stops following)
    alice.wait_for_function("() => !document.querySelector('#log[hx-trigger]')", timeout=40_000)
    # Then, without a reload, the whole page shows the run's end: the badge, the facts, the attempt's row,
    # and no Cancel any more
    assert console_stack.wait_run(job["job_id"], {"SUCCEEDED"}, timeout=10, token=ALICE)
    assert alice.locator("h1 .state").inner_text() == "SUCCEEDED"
    facts = facts_of(alice)
    assert facts["Exit code"] == "0" and facts["Finished"] != "-"
    row = alice.locator("section[aria-labelledby=h-attempts] tbody tr").nth(0).locator("td").all_inner_texts()
    assert row[:2] == ["1", "SUCCEEDED"] and row[3] == "0"
    assert alice.get_by_role("link", name="Cancel…").count() == 0
    assert "The run is SUCCEEDED." in alice.locator("#log").inner_text()
    assert "done" in alice.locator("pre.logtext").inner_text()


def facts_of(page: Any) -> dict[str, str]:
    """The run page's facts list, term -> value."""
    terms = page.locator("dl.facts dt").all_inner_texts()
    return dict(zip(terms, page.locator("dl.facts dd").all_inner_texts(), strict=True))


def test_dead_letters_list_and_re_drive(console_stack: Stack, alice: Any, seeded: dict[str, Any]) -> None:
    alice.goto("/console/dead-letters")
    row = alice.locator("tbody tr", has_text=seeded["dead_run"])
    assert "FAILED" in row.inner_text() and "2 of 2" in row.inner_text()
    row.get_by_role("link", name="Re-drive…").click()
    alice.get_by_role("button", name="Re-drive").click()
    alice.wait_for_url(re.compile(r"done=re-driven"))
    status, run = console_stack.request("GET", f"/runs/{seeded['dead_run']}", token=ALICE)
    assert run["attempt"] == 3 and not run["dead_lettered"]
    console_stack.wait_run(seeded["failing"]["job_id"], {"FAILED"}, timeout=60, token=ALICE)
    time.sleep(0.5)


def test_lag_page_counts_the_last_hours_runs_per_minute(alice: Any, seeded: dict[str, Any]) -> None:
    alice.goto("/console/lag")
    summary = alice.locator("main > p").first.inner_text()
    started = int(re.search(r"(\d+) runs started", summary).group(1))  # type: ignore[union-attr]
    failed = int(re.search(r"(\d+) failed", summary).group(1))  # type: ignore[union-attr]
    assert started >= 1 and failed >= 1
    assert alice.locator("svg.chart polyline.p50").count() == 1
    assert alice.locator("table tbody tr").count() >= 1


# ---- tenants and CSRF ----------------------------------------------------------------------------------
def test_another_tenants_ids_are_the_404_page(console_stack: Stack, bob: Any, seeded: dict[str, Any]) -> None:
    job, run = seeded["monthly"]["job_id"], seeded["dead_run"]
    for path in (
        f"/console/jobs/{job}",
        f"/console/jobs/{job}/edit",
        f"/console/jobs/{job}/pause",
        f"/console/runs/{run}",
        f"/console/runs/{run}/log",
        f"/console/runs/{run}/retry",
    ):
        response = bob.goto(path)
        assert response.status == 404, path
        assert bob.locator("h1").inner_text() == "Not found"
        assert HOSTILE[0] not in bob.content()
    bob.goto("/console/jobs")
    assert bob.locator("#jobs-table tbody tr").count() == 0
    # with bob's own valid CSRF token, alice's job still cannot be paused
    token = bob.context.cookies()[0]["value"]
    status, _, _ = raw(
        console_stack,
        "POST",
        f"/console/jobs/{job}/pause",
        token=BOB,
        data={"csrf": token},
        cookie=f"duetime_csrf={token}",
    )
    assert status == 404 and job_state(console_stack, job) == "ACTIVE"


def test_an_action_without_the_csrf_token_is_refused_and_changes_nothing(
    console_stack: Stack, seeded: dict[str, Any]
) -> None:
    job = seeded["monthly"]["job_id"]
    good = "a" * 64
    for data, cookie in (
        ({}, ""),
        ({"csrf": good}, ""),
        ({}, f"duetime_csrf={good}"),
        ({"csrf": "b" * 64}, f"duetime_csrf={good}"),
    ):
        status, headers, html = raw(
            console_stack, "POST", f"/console/jobs/{job}/pause", token=ALICE, data=data, cookie=cookie
        )
        assert status == 403 and "CSRF" in html, (data, cookie)
    assert job_state(console_stack, job) == "ACTIVE"
    status, headers, _ = raw(
        console_stack,
        "POST",
        f"/console/jobs/{job}/pause",
        token=ALICE,
        data={"csrf": good},
        cookie=f"duetime_csrf={good}",
    )
    assert status == 303 and headers["location"].endswith("done=paused")
    assert job_state(console_stack, job) == "PAUSED"
    console_stack.request("POST", f"/jobs/{job}/resume", token=ALICE)


def test_the_csrf_cookie_is_same_site_strict_and_http_only(console_stack: Stack) -> None:
    _, headers, _ = raw(console_stack, "GET", "/console/jobs", token=ALICE)
    cookie = headers["set-cookie"]
    assert cookie.startswith("duetime_csrf=") and "SameSite=Strict" in cookie and "HttpOnly" in cookie


# ---- signing in -----------------------------------------------------------------------------------------
def sign_in(page: Any, token: str) -> Any:
    page.fill("#token", token)
    with page.expect_navigation():
        page.get_by_role("button", name="Sign in").click()
    return page


def test_sign_in_keeps_the_token_in_an_http_only_strict_cookie_as_the_apis_tenant(
    browser: Any, console_stack: Stack, seeded: dict[str, Any]
) -> None:
    # Given a browser with no token at all (no Authorization header)
    context = browser.new_context(base_url=console_stack.api, viewport={"width": 1280, "height": 800})
    page = context.new_page()
    job = seeded["monthly"]["job_id"]
    try:
        # When it opens alice's job, it is sent to the sign-in form, which passes axe
        page.goto(f"/console/jobs/{job}")
        assert urllib.parse.urlsplit(page.url).path == "/console/sign-in"
        assert page.locator("h1").inner_text() == "Sign in"
        assert axe_violations(page) == []
        # And a token that is no tenant's comes back to it with the error at the field (a 401 page)
        sign_in(page, "not-a-token")
        assert urllib.parse.urlsplit(page.url).path == "/console/sign-in"
        assert "failed=1" in page.url
        assert page.locator("#token-error .field").inner_text() == "token"
        assert page.locator("#token").get_attribute("aria-invalid") == "true"
        # When bob signs in there, he lands on the page he asked for: alice's job is a 404 page to him
        response = page.goto(f"/console/jobs/{job}")
        sign_in(page, BOB)
        assert urllib.parse.urlsplit(page.url).path == f"/console/jobs/{job}"
        assert page.locator("h1").inner_text() == "Not found"
        assert HOSTILE[0] not in page.content()
        # And the cookie holding his token is HttpOnly (no script sees it), SameSite=Strict, path /console
        session = next(c for c in context.cookies() if c["name"] == "duetime_session")
        assert session["httpOnly"] and session["sameSite"] == "Strict" and session["path"] == "/console"
        assert "duetime_session" not in page.evaluate("document.cookie")
        # And the JSON API never takes the cookie for a token (API Gateway's authorizer reads a header)
        response = context.request.get("/jobs", headers={"Cookie": f"duetime_session={BOB}"})
        assert response.status == 401
        # When he signs out, the cookie is gone and the console asks for a token again
        with page.expect_navigation():
            page.get_by_role("button", name="Sign out").click()
        assert urllib.parse.urlsplit(page.url).path == "/console/sign-in"
        assert not [c for c in context.cookies() if c["name"] == "duetime_session"]
        page.goto("/console/jobs")
        assert urllib.parse.urlsplit(page.url).path == "/console/sign-in"
        # When alice signs in, her jobs page lists her jobs, and her job page shows its name as text
        sign_in(page, ALICE)
        assert urllib.parse.urlsplit(page.url).path == "/console/jobs"
        page.goto("/console/jobs?name=" + urllib.parse.quote(HOSTILE[0]))
        assert page.get_by_role("link", name=HOSTILE[0], exact=True).count() == 1
        page.goto(f"/console/jobs/{job}")
        assert page.locator("h1 .subject").inner_text() == HOSTILE[0]
    finally:
        context.close()


def test_signing_in_needs_the_csrf_token_and_goes_only_to_console_pages(console_stack: Stack) -> None:
    # Given the sign-in form's CSRF cookie
    status, headers, _ = raw(console_stack, "GET", "/console/sign-in", token="")
    assert status == 200
    csrf = headers["set-cookie"].split(";")[0].split("=", 1)[1]
    # When the form is posted without it, nothing is set (a login CSRF is refused)
    status, headers, html = raw(console_stack, "POST", "/console/sign-in", token="", data={"token": ALICE})
    assert status == 403 and "duetime_session" not in headers.get("set-cookie", "")
    # When it is posted with it and a next page on another site, the answer stays on the console
    for goal in ("https://evil.example/", "//evil.example/x", "/jobs"):
        status, headers, _ = raw(
            console_stack,
            "POST",
            "/console/sign-in",
            token="",
            data={"csrf": csrf, "token": ALICE, "next": goal},
            cookie=f"duetime_csrf={csrf}",
        )
        assert status == 303 and headers["location"] == "/console/jobs", goal
        assert "duetime_session=" in headers["set-cookie"] and "HttpOnly" in headers["set-cookie"]
    # And an empty token is a 400 page naming the field
    status, _, html = raw(
        console_stack,
        "POST",
        "/console/sign-in",
        token="",
        data={"csrf": csrf, "token": " "},
        cookie=f"duetime_csrf={csrf}",
    )
    assert status == 400 and "token: required" in html


# ---- the AWS shell (/console/shell): OIDC sign-in with PKCE, the token as a bearer header -------------------
def test_the_shell_signs_in_with_pkce_and_sends_the_token_in_the_authorization_header(
    browser: Any, console_stack: Stack, seeded: dict[str, Any]
) -> None:
    # Given an OIDC issuer (played here) that sends the browser back with a code and trades it for alice's token
    seen: dict[str, dict[str, str]] = {}

    def authorize(route: Any) -> None:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(route.request.url).query))
        seen["authorize"] = query
        back = (
            query["redirect_uri"]
            + "?"
            + urllib.parse.urlencode({"code": "the-code", "state": query["state"]})
        )
        route.fulfill(status=302, headers={"Location": back})

    def token(route: Any) -> None:
        seen["token"] = dict(urllib.parse.parse_qsl(route.request.post_data or ""))
        route.fulfill(
            status=200,
            content_type="application/json",
            headers={"Access-Control-Allow-Origin": console_stack.api},
            body=json.dumps({"access_token": ALICE, "token_type": "Bearer", "expires_in": 3600}),
        )

    context = browser.new_context(base_url=console_stack.api, viewport={"width": 1280, "height": 800})
    context.route(f"{ISSUER}/authorize*", authorize)
    context.route(f"{ISSUER}/token", token)
    sent: list[tuple[str, str | None]] = []
    context.on(
        "request",
        lambda req: (
            sent.append((req.url, req.all_headers().get("authorization")))
            if req.url.startswith(console_stack.api + "/console/")
            else None
        ),
    )
    page = context.new_page()
    try:
        # When the shell is opened
        page.goto("/console/shell")
        page.wait_for_selector("#jobs-table")
        # Then it asked for a code with an S256 challenge, and traded it with the verifier (no secret)
        asked, traded = seen["authorize"], seen["token"]
        assert asked["response_type"] == "code" and asked["client_id"] == CLIENT
        assert asked["code_challenge_method"] == "S256"
        assert asked["redirect_uri"] == console_stack.api + "/console/shell"
        digest = hashlib.sha256(traded["code_verifier"].encode()).digest()
        assert base64.urlsafe_b64encode(digest).decode().rstrip("=") == asked["code_challenge"]
        assert traded["grant_type"] == "authorization_code" and traded["code"] == "the-code"
        assert "client_secret" not in traded
        # And the jobs page came through the authorizer with the token as a bearer header, the code gone
        assert (console_stack.api + "/console/jobs", f"Bearer {ALICE}") in sent
        assert page.url == console_stack.api + "/console/shell"
        # And the token is in no cookie and no storage (memory only)
        kept = page.evaluate("() => document.cookie + JSON.stringify({...sessionStorage, ...localStorage})")
        assert ALICE not in kept
        # When a link of the shell is followed, that page too is loaded with the token, in the shell
        page.get_by_role("link", name="Dead letters").click()
        page.wait_for_selector("h1:text('Dead letters')")
        assert (console_stack.api + "/console/dead-letters", f"Bearer {ALICE}") in sent
        assert page.url == console_stack.api + "/console/shell"
        assert axe_violations(page) == []
    finally:
        context.close()


def test_the_shell_holds_no_data_and_allows_only_the_token_endpoint_besides_its_origin(
    console_stack: Stack, seeded: dict[str, Any]
) -> None:
    status, headers, html = raw(console_stack, "GET", "/console/shell", token="")
    assert status == 200
    assert seeded["monthly"]["job_id"] not in html and "<table" not in html
    csp = headers["content-security-policy"]
    assert f"connect-src 'self' {ISSUER};" in csp and "script-src 'self';" in csp
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []
