"""``/console``: the web console's pages, served by the API's own resolver (one router, not in the OpenAPI).

Each page calls the same services as the JSON routes (``duetime.services.jobs``, ``slots``, ``lag``) with the
same tenant (``Tenant``: the authorizer's identity; locally the bearer token's tenant), so another tenant's
ids are a 404 page exactly where the API answers 404. Pages are HTML (:mod:`duetime.api.console.render`);
actions are POST forms with a CSRF token (a POST without it is a 403 page and changes nothing), each behind
a confirmation page, answering 303 to the page that shows the result. Errors the API would answer as JSON
are pages with the same status and message: 400 (naming the field), 404, 409. A query parameter a page does
not take (``/console/jobs?name_prefix=a``: its filter is ``name``) is a 400 page naming it, as the API's
routes answer one (:func:`duetime.api.resolver.reject_unknown_query`), never silently ignored (every page
below but ``/console`` itself, the static assets and the shell, whose OIDC callback brings its own).

Routes (GET unless marked):
    /console, /console/            -> 303 to /console/jobs
    /console/jobs                  jobs: ?state=ACTIVE|PAUSED|COMPLETED|DELETED, ?name= (prefix), ?next_token=
    /console/jobs/{id}             a job: schedule in words, next 10 fires, slots, runs, actions
    /console/jobs/{id}/edit        the job as JSON; POST: a JSON Merge Patch, the API's 400 at the field
    /console/jobs/{id}/{action}    a confirmation (pause, resume, trigger, delete); POST: do it
    /console/runs/{id}             a run: attempts, events, its log (?attempt=N), following a RUNNING one
    /console/runs/{id}/log         the log viewer alone (polled by htmx while the run runs)
    /console/runs/{id}/{action}    a confirmation (cancel, retry); POST: do it
    /console/dead-letters          dead-lettered runs, ?next_token=; each with re-drive
    /console/lag                   the tenant's last hour: p50/p99 lag per minute, runs started and failed
    /console/static/{name}         the vendored htmx, the stylesheet
    /console/sign-in               a stack with tenants: the tenant's token; POST: keep it in a cookie
    /console/sign-out              POST: forget it
    /console/shell                 AWS: the static shell signing in at the OIDC issuer (no data)

Signing in (``duetime local --tenant NAME:TOKEN``): the form keeps the token in an ``HttpOnly``,
``SameSite=Strict`` cookie (path ``/console``); the local stack's authorizer takes it as the bearer token of
console requests (:class:`duetime.local.http_adapter.HttpApiAdapter`), so the tenant is found exactly as for
the API's ``Authorization: Bearer``. On AWS the static shell sends the JWT in that header instead.
"""

from __future__ import annotations

import json
import posixpath
import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import wraps
from typing import Any, ParamSpec
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from pydantic import ValidationError

from duetime.api.console import render as r
from duetime.api.dependencies import ServiceDeps
from duetime.api.errors import HANDLERS
from duetime.api.routers import new_router
from duetime.api.strict_json import read_json_body
from duetime.api.tenancy import Tenant
from duetime.config.deps import Deps
from duetime.domain.admission import schedule_of
from duetime.domain.api_models import JobResponse, RunResponse, UpdateJobRequest, lag_stats, schedule_lag
from duetime.domain.errors import DuetimeError, NotFoundError
from duetime.domain.models import Job, JobState, JobSummary, Run, RunState
from duetime.services import jobs, slots
from duetime.services.lag import tenant_lag

router = new_router()
P = ParamSpec("P")

#: jobs on a page of the jobs list
PAGE_SIZE = 25
#: runs each job's sparkline draws (the same one Query that finds its last run)
SPARK_RUNS = 20
#: one job's runs on its page, its slots, its next fires
JOB_RUNS = 20
JOB_SLOTS = 30
NEXT_FIRES = 10
#: most listing Queries run side by side (each job's recent runs)
READERS = 8
#: the longest name filter (as ``GET /jobs?name_prefix=``)
MAX_NAME_FILTER = 128
#: the fields of a job its edit form shows (the rest of a PATCH body may be added by hand)
EDITABLE = (
    "name",
    "schedule",
    "task",
    "timeout_seconds",
    "retry",
    "on_timeout",
    "catch_up",
    "overlap",
    "starting_deadline_seconds",
    "late_after_seconds",
    "expected_duration_seconds",
)
JOB_ACTIONS = {
    "pause": ("Pause", "No new runs from now on; runs already started continue."),
    "resume": ("Resume", "The catch-up policy decides the slots that came due during the pause."),
    "trigger": ("Trigger", "Start a manual run now (even of a paused job)."),
    "delete": ("Delete", "No further runs, at once; its history stays readable."),
}
#: what a job page says after an action
DONE = {"pause": "paused", "resume": "resumed", "delete": "deleted"}
RUN_ACTIONS = {
    "cancel": ("Cancel", "A PENDING run never starts; a RUNNING one is fenced off and its task killed."),
    "retry": ("Re-drive", "Run it again with a fresh retry budget."),
}
_STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
_STATIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.(js|css)$")


# ---- plumbing ------------------------------------------------------------------------------------------
def _event() -> Mapping[str, Any]:
    return router.current_event.raw_event


def _query() -> dict[str, str]:
    return {k: v for k, v in (router.current_event.query_string_parameters or {}).items() if v != ""}


def _form() -> dict[str, str]:
    body = router.current_event.body or ""
    return dict(parse_qsl(body, keep_blank_values=True))


def page(template: str, *, status: int = 200, **context: Any) -> Response[str]:
    """``template`` as a page, with the CSRF token its forms carry (set as a cookie when new)."""
    token, new = r.csrf_token(_event())
    context.setdefault("nav", "")
    context.setdefault("signed_in", r.session_token(r.cookies_of(_event())) is not None)
    body = r.render(template, csrf=token, **context)
    return r.html_response(body, status=status, token=token, new_token=new)


def error_page(status: int, code: str, message: str, field: str | None = None) -> Response[str]:
    return page("error.html", status=status, code=code, message=message, field=field)


def api_error(exc: Exception) -> tuple[int, dict[str, Any]]:
    """The API's answer to ``exc`` (its status and ``error`` object), from the JSON routes' own handlers."""
    if isinstance(exc, ValidationError):
        exc = RequestValidationError(exc.errors())
    for kind, handler in HANDLERS.items():
        if isinstance(exc, kind):
            answer = handler(exc)
            body = json.loads(str(answer.body))
            return answer.status_code, body["error"]
    raise exc


def html_errors(func: Callable[P, Response[str]]) -> Callable[P, Response[str]]:
    """A page handler whose domain errors are error pages with the API's status and message (another
    tenant's or an unknown id: the 404 page), its time in a ``Server-Timing: app;dur=MS`` header."""

    @wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Response[str]:
        started = time.perf_counter()
        try:
            response = func(*args, **kwargs)
        except (DuetimeError, ValidationError) as exc:
            status, error = api_error(exc)
            response = error_page(status, error["code"], error["message"], error.get("field"))
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
        return response

    return wrapper


def takes_query(*names: str) -> Callable[[Callable[P, Response[str]]], Callable[P, Response[str]]]:
    """A page handler that takes only the query parameters ``names``: any other (empty ones included) is the
    400 page naming it and listing those the page takes, as the API's routes answer
    (:func:`duetime.api.resolver.reject_unknown_query`), instead of a page that silently ignores it."""

    def decorate(func: Callable[P, Response[str]]) -> Callable[P, Response[str]]:
        @wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Response[str]:
            unknown = sorted(set(router.current_event.query_string_parameters or {}) - set(names))
            if unknown:
                path, allowed = router.current_event.path, ", ".join(sorted(names)) or "none"
                message = f"{unknown[0]}: unknown query parameter of {path} (it takes: {allowed})"
                return error_page(400, "validation_error", message, unknown[0])
            return func(*args, **kwargs)

        return wrapper

    return decorate


def checked_post(func: Callable[P, Response[str]]) -> Callable[P, Response[str]]:
    """A POST handler that runs only when its form carries the CSRF token of its cookie (else a 403 page)."""

    @wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Response[str]:
        if not r.csrf_ok(_event(), _form()):
            return error_page(
                403,
                "csrf",
                "This form has no valid CSRF token (reload the page and try again); nothing changed.",
            )
        return func(*args, **kwargs)

    return wrapper


def _path(*parts: str) -> str:
    return "/console/" + "/".join(quote(p, safe="") for p in parts)


# ---- views ---------------------------------------------------------------------------------------------
def job_row(job: JobSummary, deps: Deps, now: datetime) -> dict[str, Any]:
    """One line of the jobs list: the listed job, its next fire by its schedule, its last run and sparkline
    (one Query of its recent runs)."""
    recent = jobs.recent_runs(job.job_id, deps=deps, limit=SPARK_RUNS)
    schedule = schedule_of(job)
    return {
        "job": job,
        "describe": schedule.describe() if schedule is not None else "Once, now",
        "next_fire": jobs.next_fire_of(job, now=now),
        "last": recent[0] if recent else None,
        "spark": r.sparkline([schedule_lag(run) for run in reversed(recent)]),
    }


@router.get("/console", include_in_schema=False)
@router.get("/console/", include_in_schema=False)
def console_home() -> Response[str]:
    return Response(status_code=303, body="", headers={**r.SECURITY_HEADERS, "Location": "/console/jobs"})


@router.get("/console/sign-in", include_in_schema=False)
@takes_query("failed", "next")
def sign_in_page() -> Response[str]:
    """The sign-in form of a stack with tenants: the tenant's token, kept in :data:`render.SESSION_COOKIE`.
    ``?failed=1``: the stack's authorizer refused the token the cookie held (a 401 page); ``?next=``: the
    console page to go to once signed in."""
    query = _query()
    failed = "failed" in query
    error = (
        {"field": "token", "message": "that token is not one of this stack's tenants'"} if failed else None
    )
    return page(
        "sign_in.html", status=401 if failed else 200, error=error, next=_next_page(query.get("next"))
    )


@router.post("/console/sign-in", include_in_schema=False)
@checked_post
def sign_in() -> Response[str]:
    """Keep the form's token in the session cookie and go on to ``next`` (the jobs page by default). The
    token is checked where every request's is, by the authorizer, on the next page: a wrong one comes back
    here with ``?failed=1``."""
    form = _form()
    token, goal = form.get("token", "").strip(), _next_page(form.get("next"))
    why = None
    if not token:
        why = "token: required"
    elif len(token) > r.MAX_TOKEN_CHARS or not token.isprintable():
        why = f"token: at most {r.MAX_TOKEN_CHARS} printable characters"
    if why is not None:
        return page("sign_in.html", status=400, error={"field": "token", "message": why}, next=goal)
    return r.redirect(goal, cookies=[r.session_cookie(token, secure=_https())])


@router.post("/console/sign-out", include_in_schema=False)
@checked_post
def sign_out() -> Response[str]:
    """Forget the session cookie's token; 303 to the sign-in form."""
    return r.redirect("/console/sign-in", cookies=[r.session_cookie(None, secure=_https())])


def _next_page(value: str | None) -> str:
    """Where a sign-in goes on to: ``value`` if it is a console page of this origin, else the jobs page.

    ``value`` is percent-decoded, then its dot segments are resolved (:func:`posixpath.normpath`, as RFC 3986
    section 5.2.4 removes them); what comes out must still be under ``/console/``. Refused (the jobs page):
    a scheme or a host (``https://evil.example``, ``//evil.example``), a backslash or an empty segment
    (``//``) anywhere once decoded (browsers read ``/\\evil.example`` as another host), a character that is
    not printable, and a path that leaves the console (``/console/../jobs``, ``/console/%2e%2e/jobs``). The
    answer is the normalized path (percent-encoded again) and ``value``'s query, if any."""
    fallback = "/console/jobs"
    if not value or not value.isprintable() or "\\" in value:
        return fallback
    parts = urlsplit(value)
    path = unquote(parts.path)
    if parts.scheme or parts.netloc or "\\" in path or "//" in path or not path.isprintable():
        return fallback
    normal = posixpath.normpath(path)
    if not normal.startswith("/console/"):
        return fallback
    query = quote(parts.query, safe="=&%+")
    return quote(normal) + (f"?{query}" if query else "")


def _https() -> bool:
    headers = router.current_event.headers
    return headers.get("x-forwarded-proto", "").lower() == "https"


@router.get("/console/shell", include_in_schema=False)
def shell(deps: ServiceDeps) -> Response[str]:
    """The static shell of a console behind a JWT authorizer (AWS): no data, served without authorization.
    Its script signs the user in at the OIDC issuer (authorization code with PKCE), keeps the access token
    in memory and loads every page with htmx, ``Authorization: Bearer`` on each request. 404 where no
    sign-in is configured (``DUETIME_CONSOLE_*``)."""
    settings = deps.settings
    if not (settings.console_authorize_url and settings.console_token_url and settings.console_client_id):
        return error_page(404, "not_found", "this stack has no console sign-in (DUETIME_CONSOLE_*)")
    body = r.render(
        "shell.html",
        authorize_url=settings.console_authorize_url,
        token_url=settings.console_token_url,
        client_id=settings.console_client_id,
    )
    response = r.html_response(body)
    token_origin = "{0.scheme}://{0.netloc}".format(urlsplit(settings.console_token_url))
    response.headers["Content-Security-Policy"] = r.CSP.replace(
        "connect-src 'self'", f"connect-src 'self' {token_origin}"
    )
    return response


@router.get("/console/static/<name>", include_in_schema=False)
def static(name: str) -> Response[str]:
    """A vendored or own asset (js, css), cacheable for a day; any other name is a 404."""
    path = r.STATIC / name
    if not _STATIC_NAME.match(name) or not path.is_file():
        return error_page(404, "not_found", f"no asset {name}")
    headers = {**r.SECURITY_HEADERS, "Cache-Control": "public, max-age=86400"}
    return Response(
        status_code=200,
        content_type=_STATIC_TYPES[path.suffix],
        body=path.read_text("utf-8"),
        headers=headers,
    )


@router.get("/console/jobs", include_in_schema=False)
@html_errors
@takes_query("state", "name", "next_token")
def jobs_page(deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    """The jobs list: a page of :data:`PAGE_SIZE` jobs (never the whole listing), newest first.

    Its reads: one page of the listing index (:func:`duetime.services.jobs.list_job_summaries`: the jobs
    themselves are not read) and one Query of each listed job's :data:`SPARK_RUNS` most recent runs,
    :data:`READERS` at a time; nothing else, whatever the tenant holds.
    """
    query = _query()
    state = query.get("state")
    if state is not None and state not in JobState.__members__:
        return error_page(400, "invalid_field", f"state: not one of {', '.join(JobState)}", "state")
    name = query.get("name")
    if name is not None and len(name) > MAX_NAME_FILTER:
        return error_page(400, "invalid_field", f"name: at most {MAX_NAME_FILTER} characters", "name")
    found, token = jobs.list_job_summaries(
        tenant=tenant,
        deps=deps,
        limit=PAGE_SIZE,
        next_token=query.get("next_token"),
        state=state,
        name_prefix=name,
    )
    now = deps.clock.now()
    if len(found) > 1:
        with ThreadPoolExecutor(max_workers=min(READERS, len(found))) as pool:
            rows = list(pool.map(lambda job: job_row(job, deps, now), found))
    else:
        rows = [job_row(job, deps, now) for job in found]
    filters = {k: v for k, v in (("state", state), ("name", name)) if v}
    next_url = f"/console/jobs?{urlencode({**filters, 'next_token': token})}" if token else None
    first_url = f"/console/jobs?{urlencode(filters)}" if query.get("next_token") else None
    # the filter's own request (htmx, aimed at the table) gets the table alone; any other, the page
    template = (
        "jobs_table.html" if router.current_event.headers.get("hx-target") == "jobs-table" else "jobs.html"
    )
    return page(
        template,
        nav="jobs",
        rows=rows,
        state=state or "",
        name=name or "",
        states=list(JobState),
        next_url=next_url,
        first_url=first_url,
        now=now,
    )


@router.get("/console/jobs/<job_id>", include_in_schema=False)
@html_errors
@takes_query("runs_token", "done")
def job_page(job_id: str, deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    """One job: its schedule in words, its next 10 fires (with DST notes), its slots, and a page of its runs
    from its whole history (the hot store and the archive, as ``GET /jobs/{id}/runs``; ``?runs_token=``)."""
    job = jobs.get_job(job_id, tenant=tenant, deps=deps)
    now = deps.clock.now()
    fires, recent = jobs.describe_job(job, deps, previews=NEXT_FIRES, recent=100)
    schedule = schedule_of(job)
    if not fires and job.state is JobState.PAUSED and schedule is not None:
        fires = schedule.preview(now, NEXT_FIRES)  # the schedule's, once resumed
    zone = job.schedule.timezone if job.schedule is not None else "UTC"
    found_slots, _ = slots.list_slots(job.job_id, tenant=tenant, deps=deps, limit=JOB_SLOTS)
    runs_page = _query().get("runs_token")
    runs, runs_token = jobs.query_history(
        job.job_id, tenant=tenant, deps=deps, limit=JOB_RUNS, next_token=runs_page
    )
    return page(
        "job.html",
        nav="jobs",
        job=job,
        shown=JobResponse.of(job, next_fire_times=fires, last_run=recent[0] if recent else None),
        lag=lag_stats(recent),
        describe=schedule.describe() if schedule is not None else "Once, now (no schedule)",
        fires=r.fires_with_dst_notes(fires, zone, now=now),
        zone=zone,
        slots=found_slots,
        runs=runs,
        older_runs_url=_path("jobs", job.job_id) + "?" + urlencode({"runs_token": runs_token}) + "#h-runs"
        if runs_token
        else None,
        newest_runs_url=_path("jobs", job.job_id) + "#h-runs" if runs_page else None,
        actions=_job_actions(job),
        done=_query().get("done"),
        now=now,
    )


def _job_actions(job: Job) -> list[str]:
    if job.state is JobState.DELETED:
        return []
    actions = ["pause"] if job.state is JobState.ACTIVE else []
    if job.state is JobState.PAUSED:
        actions.append("resume")
    return [*actions, "trigger", "delete"]


def _editable(job: Job) -> str:
    shown = JobResponse.of(job).model_dump(mode="json")
    return r.pretty_json({k: shown[k] for k in EDITABLE if shown.get(k) is not None})


@router.get("/console/jobs/<job_id>/edit", include_in_schema=False)
@html_errors
@takes_query()
def edit_page(job_id: str, deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    """The job's fields as JSON, to change and send as a PATCH (JSON Merge Patch)."""
    job = jobs.get_job(job_id, tenant=tenant, deps=deps)
    return page("edit.html", nav="jobs", job=job, text=_editable(job), error=None)


@router.post("/console/jobs/<job_id>/edit", include_in_schema=False)
@checked_post
@html_errors
def edit_job(job_id: str, deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    """Apply the form's JSON as ``PATCH /jobs/{id}`` would; its 400 is shown at the field, the text kept."""
    job = jobs.get_job(job_id, tenant=tenant, deps=deps)
    text = _form().get("body", "")
    try:
        body = UpdateJobRequest.model_validate(read_json_body(text))
        jobs.update_job(job.job_id, body, tenant=tenant, deps=deps)
    except json.JSONDecodeError as exc:
        error = {
            "code": "invalid_json",
            "message": f"the request body is not valid JSON: {exc}",
            "field": "body",
        }
        return page("edit.html", status=400, nav="jobs", job=job, text=text, error=error)
    except (DuetimeError, ValidationError) as exc:
        status, error = api_error(exc)
        if status == 404:
            raise
        return page("edit.html", status=status, nav="jobs", job=job, text=text, error=error)
    return r.redirect(_path("jobs", job.job_id) + "?done=edited")


@router.get("/console/jobs/<job_id>/<action>", include_in_schema=False)
@html_errors
@takes_query()
def confirm_job_action(job_id: str, action: str, deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    """A confirmation of ``action`` (pause, resume, trigger, delete): a POST form with the CSRF token."""
    if action not in JOB_ACTIONS:
        raise NotFoundError("page", f"/console/jobs/{job_id}/{action}")
    job = jobs.get_job(job_id, tenant=tenant, deps=deps)
    return confirmation(
        JOB_ACTIONS[action],
        "job",
        ("jobs", job.job_id),
        action,
        subject=job.name,
        subject_id=job.job_id,
        cancel_running=action == "delete",
    )


def confirmation(
    labels: tuple[str, str],
    kind: str,
    where: tuple[str, str],
    action: str,
    *,
    subject: str,
    subject_id: str,
    nav: str = "jobs",
    cancel_running: bool = False,
) -> Response[str]:
    """The confirmation page of ``action`` on the ``kind`` at ``/console/{where}``: its ``labels`` (the
    button's, why), a POST form to ``/console/{where}/{action}`` carrying the CSRF token, a way back."""
    label, why = labels
    return page(
        "confirm.html",
        nav=nav,
        what=f"{label} {kind}",
        subject=subject,
        subject_id=subject_id,
        why=why,
        label=label,
        action_url=_path(*where, action),
        back_url=_path(*where),
        cancel_running=cancel_running,
    )


@router.post("/console/jobs/<job_id>/<action>", include_in_schema=False)
@checked_post
@html_errors
def job_action(job_id: str, action: str, deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    """Do ``action`` through the service the JSON route calls; 303 to the job's page (a trigger: its run)."""
    if action == "pause":
        jobs.pause_job(job_id, tenant=tenant, deps=deps)
    elif action == "resume":
        jobs.resume_job(job_id, tenant=tenant, deps=deps)
    elif action == "trigger":
        run = jobs.trigger_job(job_id, tenant=tenant, deps=deps)
        return r.redirect(_path("runs", run.run_id) + "?done=triggered")
    elif action == "delete":
        cancel = _form().get("cancel_running") == "true"
        jobs.delete_job(job_id, tenant=tenant, deps=deps, cancel_running=cancel)
    else:
        raise NotFoundError("page", f"/console/jobs/{job_id}/{action}")
    return r.redirect(_path("jobs", job_id) + f"?done={DONE[action]}")


def _log_view(run: Run, attempt: int | None, deps: Deps, tenant: str) -> dict[str, Any]:
    """The log viewer's context: the attempt shown (default the latest), its text, whether to poll."""
    shown = attempt or run.attempt
    try:
        text = jobs.get_run_log(run.run_id, tenant=tenant, deps=deps, attempt=shown)
    except NotFoundError:
        text = None
    following = run.state is RunState.RUNNING and shown == run.attempt
    return {"run": run, "attempt": shown, "text": text, "following": following}


@router.get("/console/runs/<run_id>", include_in_schema=False)
@html_errors
@takes_query("attempt", "done")
def run_page(run_id: str, deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    """One run: its attempts (exit codes, reasons, fencing tokens), events, and the log of one attempt."""
    run = jobs.get_run(run_id, tenant=tenant, deps=deps)
    attempt = _attempt_param()
    if attempt is not None and not 1 <= attempt <= run.attempt:
        raise NotFoundError("log of attempt", f"{run_id}#{attempt}")
    return page(
        "run.html",
        nav="jobs",
        **_run_parts(run),
        log=_log_view(run, attempt, deps, tenant),
        done=_query().get("done"),
        now=deps.clock.now(),
    )


def _run_parts(run: Run) -> dict[str, Any]:
    """What a run's page shows of it besides the log (``templates/run_parts.html``): the run, its attempts
    (ended ones, then the current one) and the actions it allows."""
    shown = RunResponse.of(run)
    attempts = [*shown.attempts, *([shown.current_attempt] if shown.current_attempt else [])]
    actions = []
    if run.state in (RunState.PENDING, RunState.RUNNING, RunState.RETRY_WAIT):
        actions.append("cancel")
    if run.state is RunState.TIMED_OUT or (run.dead_lettered and run.state is RunState.FAILED):
        actions.append("retry")
    return {"run": shown, "attempts": attempts, "actions": actions}


def _attempt_param() -> int | None:
    raw = _query().get("attempt")
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit():  # int() reads "١" and raises on "²"
        raise NotFoundError("log of attempt", raw)
    return int(raw)


@router.get("/console/runs/<run_id>/log", include_in_schema=False)
@html_errors
@takes_query("attempt")
def run_log(run_id: str, deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    """The log viewer alone: what htmx swaps in every 2 s while the attempt shown is RUNNING. The poll that
    finds it no longer RUNNING (the last one) also carries the run page's other parts that its end changed
    (state, actions, facts, attempts, events) as out-of-band swaps, so the page shows the run's end without
    a reload rather than a stale RUNNING badge."""
    run = jobs.get_run(run_id, tenant=tenant, deps=deps)
    log = _log_view(run, _attempt_param(), deps, tenant)
    polled = router.current_event.headers.get("hx-request") == "true"
    return page("log.html", log=log, ended=_run_parts(run) if polled and not log["following"] else None)


@router.get("/console/runs/<run_id>/<action>", include_in_schema=False)
@html_errors
@takes_query()
def confirm_run_action(run_id: str, action: str, deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    """A confirmation of ``action`` (cancel, re-drive) on a run: a POST form with the CSRF token."""
    if action not in RUN_ACTIONS:
        raise NotFoundError("page", f"/console/runs/{run_id}/{action}")
    run = jobs.get_run(run_id, tenant=tenant, deps=deps)
    return confirmation(
        RUN_ACTIONS[action],
        "run",
        ("runs", run.run_id),
        action,
        subject=run.run_id,
        subject_id=run.state.value,
        nav="dead-letters" if action == "retry" else "jobs",
    )


@router.post("/console/runs/<run_id>/<action>", include_in_schema=False)
@checked_post
@html_errors
def run_action(run_id: str, action: str, deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    if action == "cancel":
        jobs.cancel_run(run_id, tenant=tenant, deps=deps)
        return r.redirect(_path("runs", run_id) + "?done=cancelled")
    if action == "retry":
        jobs.redrive(run_id, tenant=tenant, deps=deps)
        return r.redirect(_path("runs", run_id) + "?done=re-driven")
    raise NotFoundError("page", f"/console/runs/{run_id}/{action}")


@router.get("/console/dead-letters", include_in_schema=False)
@html_errors
@takes_query("next_token")
def dead_letters_page(deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    """Dead-lettered runs, most recently dead-lettered first, a page at a time, each with re-drive."""
    query = _query()
    found, token = jobs.list_dead_letters(
        tenant=tenant, deps=deps, limit=PAGE_SIZE, next_token=query.get("next_token")
    )
    return page(
        "dead_letters.html",
        nav="dead-letters",
        runs=found,
        next_url=f"/console/dead-letters?{urlencode({'next_token': token})}" if token else None,
        first_url="/console/dead-letters" if query.get("next_token") else None,
        now=deps.clock.now(),
    )


@router.get("/console/lag", include_in_schema=False)
@html_errors
@takes_query()
def lag_page(deps: ServiceDeps, tenant: Tenant) -> Response[str]:
    """The tenant's last hour per minute: p50/p99 schedule lag, runs started and failed, as a chart and a
    table (from the runs: :func:`duetime.services.lag.tenant_lag`)."""
    figures = tenant_lag(tenant=tenant, deps=deps)
    return page("lag.html", nav="lag", lag=figures, chart=lag_chart(figures.minutes))


def lag_chart(minutes: list[Any], *, width: int = 960, height: int = 200) -> dict[str, Any]:
    """Polyline points for p50 and p99 over the minutes and bars of runs started/failed (inline SVG)."""
    top = max([m.p99_seconds or 0.0 for m in minutes] + [0.001])
    most = max([m.started for m in minutes] + [1])
    step = width / max(1, len(minutes))

    def line(values: list[float | None]) -> str:
        return " ".join(
            f"{(i + 0.5) * step:.1f},{height - (v / top) * (height - 10):.1f}"
            for i, v in enumerate(values)
            if v is not None
        )

    bars = [
        {
            "x": round(i * step + 1, 1),
            "w": round(max(1.0, step - 2), 1),
            "h": round(m.started / most * 40, 1),
            "fh": round(m.failed / most * 40, 1),
        }
        for i, m in enumerate(minutes)
    ]
    return {
        "width": width,
        "height": height,
        "p50": line([m.p50_seconds for m in minutes]),
        "p99": line([m.p99_seconds for m in minutes]),
        "top": top,
        "bars": bars,
        "most": most,
    }
