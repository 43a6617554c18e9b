"""``duetime jobs|runs|dead-letters``: the HTTP API from a terminal. Tables for people, ``--json`` for scripts.

Exit codes: 0 done; 1 the API refused the request (4xx); 2 bad usage; 3 not found (404); 4 the API failed
or could not be reached (5xx, connection).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Column, Table

from duetime.cli.client import ApiError, Client
from duetime.domain.logs import LOG_PENDING_HEADER

jobs_app = typer.Typer(no_args_is_help=True, help="Create, list, change and run jobs.")
runs_app = typer.Typer(no_args_is_help=True, help="Read, follow, cancel and re-drive runs.")

Api = Annotated[
    str | None, typer.Option("--api", help="API URL (default: $DUETIME_API_URL, then the local stack)")
]
Token = Annotated[str | None, typer.Option("--token", help="bearer token (default: $DUETIME_TOKEN)")]
SigV4 = Annotated[bool, typer.Option("--sigv4", help="sign with AWS SigV4 (a deployed, IAM-authorized API)")]
AsJson = Annotated[bool, typer.Option("--json", help="print the API's JSON")]

TERMINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"}
#: piped or redirected output (scripts, grep) is never wrapped or cropped to 80 columns: rows stay whole lines
_out = Console(width=None if sys.stdout.isatty() else 10_000)


#: `duetime runs logs` (without -f): the attempt ended but its worker has not stored its log yet (it lingers
#: over its log pack, ``log_pack_linger_seconds``): nothing on stdout, a note on stderr; read it again
LOG_NOT_STORED_EXIT = 5


def exit_code(exc: ApiError) -> int:
    """The CLI's exit code for an API error: 3 not found, 4 the API failed or is unreachable, else 1."""
    return 3 if exc.status == 404 else 4 if exc.status == 0 or exc.status >= 500 else 1


def _call(api: str | None, token: str | None, sigv4: bool, method: str, path: str, **kw: Any) -> Any:
    try:
        return Client.resolve(api, token, sigv4).request(method, path, **kw)
    except ApiError as exc:
        typer.echo(f"duetime: {exc}", err=True)
        raise typer.Exit(exit_code(exc)) from None


def _show(data: Any, as_json: bool, table: Table | None = None) -> None:
    if as_json or table is None:
        typer.echo(json.dumps(data, indent=2))
    else:
        _out.print(table)


def _show_page(
    page: dict[str, Any], as_json: bool, key: str, table: Callable[[list[dict[str, Any]]], Table]
) -> None:
    """One page of a listing (``page[key]``) as JSON or as ``table``, then how to ask for the next one."""
    _show(page, as_json, table(page[key]))
    if not as_json and page.get("next_token"):
        typer.echo(f"more: --next-token {page['next_token']}")


def _id(header: str) -> Column:
    """An id column: on a narrow terminal the id folds onto more lines, never cut short (ids are copied)."""
    return Column(header, overflow="fold", min_width=12)


def _job_table(found: list[dict[str, Any]]) -> Table:
    table = Table(_id("job_id"), "name", "state", "schedule", "next fire (UTC)", "last run")
    for j in found:
        sched = j.get("schedule") or {}
        last = j.get("last_run") or {}
        table.add_row(
            j["job_id"],
            j["name"],
            j["state"],
            f"{sched.get('expression', 'now')} {sched.get('timezone', '')}".strip(),
            (j.get("next_fire_at") or "-")[:19],
            last.get("state", "-"),
        )
    return table


def _run_table(found: list[dict[str, Any]]) -> Table:
    table = Table(_id("run_id"), "due (UTC)", "state", "attempt", "exit", "lag s", "trigger")
    for r in found:
        table.add_row(
            r["run_id"],
            r["due_at"][:19],
            r["state"],
            f"{r['attempt']}/{r['max_attempts']}",
            str(r["exit_code"]) if r["exit_code"] is not None else "-",
            str(r["lag_seconds"]) if r["lag_seconds"] is not None else "-",
            r["trigger"],
        )
    return table


def _body_from(file: Path | None) -> dict[str, Any]:
    if file is None:
        return {}
    try:
        data = json.loads(sys.stdin.read() if str(file) == "-" else file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise typer.BadParameter(f"cannot read a JSON object: {exc}", param_hint="--file") from None
    if not isinstance(data, dict):
        raise typer.BadParameter("must hold a JSON object", param_hint="--file")
    return data


@jobs_app.command("create")
def jobs_create(
    command: Annotated[
        list[str] | None, typer.Argument(help="the task's argv (after --), or one shell string")
    ] = None,
    name: Annotated[str | None, typer.Option(help="job name")] = None,
    schedule: Annotated[
        str | None, typer.Option(help="rate(...), at(...) or cron; omit to run once now")
    ] = None,
    tz: Annotated[str | None, typer.Option("--tz", help="IANA time zone of --schedule (default UTC)")] = None,
    tier: Annotated[str, typer.Option(help="small, medium or large")] = "small",
    timeout: Annotated[int | None, typer.Option(help="timeout_seconds per attempt")] = None,
    max_attempts: Annotated[int | None, typer.Option(help="retry.max_attempts")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE, repeatable")] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="a full JSON job body (- = stdin)")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Idempotency-Key: a retry returns the first job")
    ] = None,
    api: Api = None,
    token: Token = None,
    sigv4: SigV4 = False,
    as_json: AsJson = False,
) -> None:
    """Submit a job: `duetime jobs create --name backup --schedule "0 3 * * *" -- /usr/bin/backup --all`."""
    body = _body_from(file)
    if command:
        argv = shlex.split(command[0]) if len(command) == 1 and " " in command[0] else list(command)
        body["task"] = {**body.get("task", {}), "kind": "container", "command": argv, "tier": tier}
    if tz is not None and not schedule:
        if not isinstance(body.get("schedule"), dict):
            raise typer.BadParameter(
                "a time zone applies to a --schedule; give one (or leave out --tz)", param_hint="--tz"
            )
        body["schedule"]["timezone"] = tz  # the --file's schedule
    if env:
        bad = [e for e in env if "=" not in e or e.startswith("=")]
        if bad:
            raise typer.BadParameter(f"{bad[0]!r} is not NAME=VALUE", param_hint="--env")
        pairs = dict(e.split("=", 1) for e in env)
        body.setdefault("task", {})["env"] = pairs
    if name:
        body["name"] = name
    body.setdefault("name", (body.get("task", {}).get("command") or ["job"])[0].rsplit("/", 1)[-1])
    if schedule:
        body["schedule"] = {"expression": schedule, "timezone": tz or "UTC"}
    if timeout is not None:
        body["timeout_seconds"] = timeout
    if max_attempts is not None:
        body.setdefault("retry", {})["max_attempts"] = max_attempts
    if "task" not in body:
        raise typer.BadParameter("give the command after -- or a --file with a task", param_hint="COMMAND")
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    job = _call(api, token, sigv4, "POST", "/jobs", body=body, headers=headers)
    _show(job, as_json, _job_table([job]))


@jobs_app.command("list")
def jobs_list(
    state: Annotated[str | None, typer.Option(help="ACTIVE, PAUSED, COMPLETED or DELETED")] = None,
    prefix: Annotated[str | None, typer.Option(help="names starting with this")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    next_token: Annotated[str | None, typer.Option(help="the page after a previous listing")] = None,
    api: Api = None,
    token: Token = None,
    sigv4: SigV4 = False,
    as_json: AsJson = False,
) -> None:
    """Your jobs, newest first."""
    page = _call(
        api,
        token,
        sigv4,
        "GET",
        "/jobs",
        query={"state": state, "name_prefix": prefix, "limit": limit, "next_token": next_token},
    )
    _show_page(page, as_json, "jobs", _job_table)


@jobs_app.command("get")
def jobs_get(
    job_id: str, api: Api = None, token: Token = None, sigv4: SigV4 = False, as_json: AsJson = False
) -> None:
    """One job with its next fire times and last run."""
    job = _call(api, token, sigv4, "GET", f"/jobs/{job_id}")
    if as_json:
        _show(job, True)
        return
    _out.print(_job_table([job]))
    for fire in job.get("next_fire_times", []):
        typer.echo(f"  next: {fire}")
    lag = job.get("lag") or {}
    if lag.get("runs"):
        typer.echo(
            f"  lag of the last {lag['runs']} runs: p50 {lag['p50_seconds']} s, p99 {lag['p99_seconds']} s"
        )


def _slot_table(found: list[dict[str, Any]]) -> Table:
    table = Table("due (UTC)", "outcome", "state / reason", _id("run_id"), "lag s")
    for slot in found:
        table.add_row(
            slot["due_at"][:19],
            slot["outcome"],
            slot.get("reason") or slot.get("state") or "-",
            slot.get("run_id") or "-",
            str(slot["lag_seconds"]) if slot.get("lag_seconds") is not None else "-",
        )
    return table


@jobs_app.command("slots")
def jobs_slots(
    job_id: str,
    since: Annotated[
        str | None, typer.Option(help="due at or after (ISO-8601 with offset; default 24 h ago)")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="due at or before (ISO-8601 with offset; default now)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    next_token: Annotated[str | None, typer.Option()] = None,
    api: Api = None,
    token: Token = None,
    sigv4: SigV4 = False,
    as_json: AsJson = False,
) -> None:
    """Did it run? Each expected fire time of a job's schedule, newest first, with its outcome (ran,
    skipped, missed, pending, upcoming)."""
    page = _call(
        api,
        token,
        sigv4,
        "GET",
        f"/jobs/{job_id}/slots",
        query={"since": since, "until": until, "limit": limit, "next_token": next_token},
    )
    _show_page(page, as_json, "slots", _slot_table)


def _delivery_table(found: list[dict[str, Any]]) -> Table:
    table = Table("occurred (UTC)", "event", _id("run_id"), "notified", "target", "status", "tries", "last")
    for event in found:
        deliveries = event.get("deliveries") or [None]
        for delivery in deliveries:
            last = (delivery or {}).get("attempts") or [{}]
            outcome = last[-1].get("status_code") or last[-1].get("error") or "-"
            table.add_row(
                event["occurred_at"][:19],
                event["type"],
                event["run_id"],
                event["notified"],
                delivery["target"] if delivery else "-",
                delivery["status"] if delivery else "-",
                str(delivery["tries"]) if delivery else "-",
                str(outcome)[:60],
            )
    return table


@jobs_app.command("deliveries")
def jobs_deliveries(
    job_id: str,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    next_token: Annotated[str | None, typer.Option()] = None,
    api: Api = None,
    token: Token = None,
    sigv4: SigV4 = False,
    as_json: AsJson = False,
) -> None:
    """A job's notification events, newest first, with each delivery's status and last try (muted and
    suppressed events too)."""
    page = _call(
        api,
        token,
        sigv4,
        "GET",
        f"/jobs/{job_id}/deliveries",
        query={"limit": limit, "next_token": next_token},
    )
    _show_page(page, as_json, "events", _delivery_table)


@jobs_app.command("update")
def jobs_update(
    job_id: str,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="a JSON object of fields to change")
    ] = None,
    name: Annotated[str | None, typer.Option(help="a new job name")] = None,
    schedule: Annotated[
        str | None, typer.Option(help="a new expression; the job keeps its time zone unless --tz is given")
    ] = None,
    tz: Annotated[
        str | None,
        typer.Option("--tz", help="a new IANA time zone for the schedule (default: the job's zone is kept)"),
    ] = None,
    api: Api = None,
    token: Token = None,
    sigv4: SigV4 = False,
    as_json: AsJson = False,
) -> None:
    """Change a job (PATCH, a JSON merge patch): only the fields given change; `--schedule` keeps the job's
    time zone unless `--tz` is given too."""
    body = _body_from(file)
    if name:
        body["name"] = name
    if schedule or tz:
        patch = body.get("schedule")
        patch = dict(patch) if isinstance(patch, dict) else {}
        if schedule:
            patch["expression"] = schedule
        if tz:
            patch["timezone"] = tz
        body["schedule"] = patch
    if not body:
        raise typer.BadParameter("nothing to change: give --file, --name, --schedule or --tz")
    job = _call(api, token, sigv4, "PATCH", f"/jobs/{job_id}", body=body)
    _show(job, as_json, _job_table([job]))


def _action(verb: str, help_text: str) -> None:
    def command(
        job_id: str, api: Api = None, token: Token = None, sigv4: SigV4 = False, as_json: AsJson = False
    ) -> None:
        job = _call(api, token, sigv4, "POST", f"/jobs/{job_id}/{verb}")
        _show(job, as_json, _job_table([job]))

    command.__doc__ = help_text
    jobs_app.command(verb)(command)


_action("pause", "Pause a job: no new runs until resumed (runs in flight continue).")
_action("resume", "Resume a paused job (its catch-up policy decides about the slots it missed).")


@jobs_app.command("trigger")
def jobs_trigger(
    job_id: str,
    ignore_overlap: Annotated[bool, typer.Option(help="run even if the overlap policy would not")] = False,
    api: Api = None,
    token: Token = None,
    sigv4: SigV4 = False,
    as_json: AsJson = False,
) -> None:
    """Run a job now (a manual run)."""
    run = _call(
        api,
        token,
        sigv4,
        "POST",
        f"/jobs/{job_id}/trigger",
        query={"ignore_overlap": str(ignore_overlap).lower()},
    )
    _show(run, as_json, _run_table([run]))


@jobs_app.command("delete")
def jobs_delete(
    job_id: str,
    cancel_running: Annotated[bool, typer.Option(help="also cancel its runs in flight")] = False,
    api: Api = None,
    token: Token = None,
    sigv4: SigV4 = False,
    as_json: AsJson = False,
) -> None:
    """Delete a job: no further runs; its history stays readable."""
    job = _call(
        api, token, sigv4, "DELETE", f"/jobs/{job_id}", query={"cancel_running": str(cancel_running).lower()}
    )
    _show(job, as_json, _job_table([job]))


@runs_app.command("list")
def runs_list(
    job_id: str,
    state: Annotated[str | None, typer.Option()] = None,
    since: Annotated[str | None, typer.Option(help="due at or after (ISO-8601 with offset)")] = None,
    until: Annotated[str | None, typer.Option(help="due at or before (ISO-8601 with offset)")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    next_token: Annotated[str | None, typer.Option()] = None,
    api: Api = None,
    token: Token = None,
    sigv4: SigV4 = False,
    as_json: AsJson = False,
) -> None:
    """A job's runs, newest first."""
    page = _call(
        api,
        token,
        sigv4,
        "GET",
        f"/jobs/{job_id}/runs",
        query={"state": state, "since": since, "until": until, "limit": limit, "next_token": next_token},
    )
    _show_page(page, as_json, "runs", _run_table)


@runs_app.command("get")
def runs_get(
    run_id: str, api: Api = None, token: Token = None, sigv4: SigV4 = False, as_json: AsJson = False
) -> None:
    """One run with its attempts."""
    run = _call(api, token, sigv4, "GET", f"/runs/{run_id}")
    if as_json:
        _show(run, True)
        return
    _out.print(_run_table([run]))
    table = Table("attempt", "state", "exit", "reason", "worker", "started", "finished")
    current = [run["current_attempt"]] if run.get("current_attempt") else []
    for a in [*run["attempts"], *current]:
        table.add_row(
            str(a["attempt"]),
            a["state"],
            str(a["exit_code"]) if a.get("exit_code") is not None else "-",
            a.get("reason") or "-",
            a.get("worker") or "-",
            (a.get("started_at") or "-")[:19],
            (a.get("finished_at") or "-")[:19],
        )
    _out.print(table)
    if run.get("error"):
        typer.echo(f"error: {run['error']}")


@runs_app.command("logs")
def runs_logs(
    run_id: str,
    attempt: Annotated[int | None, typer.Option(min=1, help="an earlier attempt's log")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="print the output as it is written until the run ends")
    ] = False,
    interval: Annotated[float, typer.Option(help="seconds between polls with --follow")] = 1.0,
    api: Api = None,
    token: Token = None,
    sigv4: SigV4 = False,
) -> None:
    """Print a run's stdout+stderr; with --follow, print its output as it is written, attempt by attempt,
    until the run ends (exit 0 if it SUCCEEDED, else 1)."""
    if not follow:
        headers: dict[str, str] = {}
        text = _call(
            api,
            token,
            sigv4,
            "GET",
            f"/runs/{run_id}/logs",
            query={"attempt": attempt},
            response_headers=headers,
        )
        pending = headers.get(LOG_PENDING_HEADER.lower())
        if pending == "note":  # the body is a note, not the log: say it on stderr, and exit 5 (try again)
            typer.echo(str(text), err=True, nl=False)
            raise typer.Exit(LOG_NOT_STORED_EXIT)
        typer.echo(text, nl=False)
        if pending == "partial":
            typer.echo(
                "duetime: the attempt ended; the rest of its log is not stored yet: read it again in a few seconds",
                err=True,
            )
        return
    client = Client.resolve(api, token, sigv4)
    printed: dict[int, int] = {}  # attempt -> characters of its log printed so far
    done: set[int] = set()

    def log_of(number: int) -> tuple[str, str | None]:
        """The attempt's log so far, and its pending state (LOG_PENDING_HEADER: its worker has not stored the
        final log yet)."""
        headers: dict[str, str] = {}
        try:
            text = str(
                client.request(
                    "GET", f"/runs/{run_id}/logs", query={"attempt": number}, response_headers=headers
                )
            )
        except ApiError as exc:
            if exc.status == 404:  # nothing written yet, or the attempt left no log
                return "", None
            typer.echo(f"duetime: {exc}", err=True)
            raise typer.Exit(exit_code(exc)) from None
        return text, headers.get(LOG_PENDING_HEADER.lower())

    def show(number: int, text: str, *, ended: str | None) -> None:
        offset = printed.get(number)
        if offset is None and (text or ended):
            typer.echo(f"--- attempt {number} ---", err=True)
            offset = 0
        if offset is not None and len(text) > offset:
            # a log over 4 MB ends as its head and tail: the new text then is not an extension of the old
            typer.echo(text[offset:], nl=False)
            printed[number] = len(text)
        if ended:
            typer.echo(f"--- attempt {number}: {ended} ---", err=True)
            done.add(number)

    while True:
        run = _call(api, token, sigv4, "GET", f"/runs/{run_id}")
        waiting = False  # an ended attempt whose log its worker has not stored yet: read it again
        for record in run["attempts"]:
            if record["attempt"] not in done:
                text, pending = log_of(record["attempt"])
                if pending:
                    waiting = True
                    if pending == "partial":  # the output streamed so far; the rest comes with the log
                        show(record["attempt"], text, ended=None)
                    continue
                show(record["attempt"], text, ended=record["state"])
        if run["state"] == "RUNNING" and run["attempt"] not in done:
            show(run["attempt"], log_of(run["attempt"])[0], ended=None)
        if run["state"] in TERMINAL and not waiting:
            typer.echo(f"--- run {run['state']} ---", err=True)
            raise typer.Exit(0 if run["state"] == "SUCCEEDED" else 1)
        time.sleep(interval)


@runs_app.command("cancel")
def runs_cancel(
    run_id: str, api: Api = None, token: Token = None, sigv4: SigV4 = False, as_json: AsJson = False
) -> None:
    """Cancel a run (a running task is stopped through its fencing token)."""
    run = _call(api, token, sigv4, "POST", f"/runs/{run_id}/cancel")
    _show(run, as_json, _run_table([run]))


@runs_app.command("retry")
def runs_retry(
    run_id: str, api: Api = None, token: Token = None, sigv4: SigV4 = False, as_json: AsJson = False
) -> None:
    """Re-drive a dead-lettered run."""
    run = _call(api, token, sigv4, "POST", f"/runs/{run_id}/retry")
    _show(run, as_json, _run_table([run]))


def dead_letters(
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    next_token: Annotated[str | None, typer.Option(help="the page after a previous listing")] = None,
    api: Api = None,
    token: Token = None,
    sigv4: SigV4 = False,
    as_json: AsJson = False,
) -> None:
    """Runs that exhausted their attempts, newest first."""
    page = _call(api, token, sigv4, "GET", "/dead-letters", query={"limit": limit, "next_token": next_token})
    _show_page(page, as_json, "runs", _run_table)
