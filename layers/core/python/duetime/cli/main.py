"""The ``duetime`` command: ``duetime local`` (the embedded stack) and ``duetime worker`` (a worker process)."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from duetime.cli import api_commands as cli_api

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Duetime: a distributed job scheduler.")


@app.callback()
def _global_options(
    api: Annotated[
        str | None,
        typer.Option("--api", help="API URL for every API command (same as $DUETIME_API_URL)"),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option("--token", help="bearer token for every API command (same as $DUETIME_TOKEN)"),
    ] = None,
) -> None:
    """Options given before the command (`duetime --api URL jobs list`) apply to it as the environment
    variables would; a command's own `--api`/`--token` still win."""
    if api:
        os.environ["DUETIME_API_URL"] = api
    if token:
        os.environ["DUETIME_TOKEN"] = token


@app.command()
def local(
    backend: Annotated[
        str,
        typer.Option(
            help="sqlite: durable state in --state-dir (default); moto: the AWS adapters on moto's server, "
            "state kept in memory only"
        ),
    ] = "sqlite",
    state_dir: Annotated[
        Path, typer.Option(help="where the sqlite backend keeps jobs, runs, queues and logs")
    ] = Path(".duetime"),
    reset: Annotated[bool, typer.Option("--reset", help="start with an empty state directory")] = False,
    api_port: Annotated[int, typer.Option(help="HTTP port of the API (0 = any free port)")] = 8765,
    tick_seconds: Annotated[float, typer.Option(min=0.2, help="clock loop period, seconds")] = 60.0,
    workers: Annotated[int, typer.Option(min=0, help="worker processes per container tier")] = 2,
    slots: Annotated[
        int,
        typer.Option(
            min=0, help="tasks each worker runs at once (0 = the tier's default: small 8, medium 2, large 1)"
        ),
    ] = 0,
    api_processes: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="processes serving the API, sharing its port (default: one per core, at most 2; 0 = a thread "
            "of the stack's own process)",
        ),
    ] = None,
    demo: Annotated[bool, typer.Option("--demo/--no-demo", help="submit the demo jobs in examples/")] = True,
    shards: Annotated[int, typer.Option(min=1, max=64, help="shards of the jobs table")] = 4,
    lease_seconds: Annotated[float, typer.Option(min=1, help="run lease length, seconds")] = 30.0,
    heartbeat_seconds: Annotated[float, typer.Option(min=0.2, help="heartbeat interval, seconds")] = 10.0,
    pending_grace_seconds: Annotated[
        float, typer.Option(min=1, help="a PENDING run this late is re-sent by the sweeper, seconds")
    ] = 60.0,
    run_retention_days: Annotated[
        float,
        typer.Option(min=0.0001, help="the hot window: days a finished run stays hot before the archive"),
    ] = 14.0,
    failed_run_retention_days: Annotated[
        float, typer.Option(min=0.0001, help="days a FAILED, TIMED_OUT or dead-lettered run stays hot")
    ] = 90.0,
    keep_last_runs: Annotated[
        int, typer.Option(min=0, help="the last N runs of every job stay hot whatever their age")
    ] = 20,
    log_pack_linger_seconds: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=60.0,
            help="seconds a worker gathers its ended runs' logs into one object, recording each end at once "
            "(the AWS stages' 15 s: fewer PUTs; a just-ended run's log readable once stored); 0: ends wait",
        ),
    ] = 0.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="handler logs and EMF metrics")] = False,
    tenant: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME:TOKEN, repeatable: requests need `Authorization: Bearer TOKEN` and act as NAME"
        ),
    ] = None,
    tenant_submits_per_minute: Annotated[
        int | None, typer.Option(min=1, help="quota: job submits per tenant per minute (429 over it)")
    ] = None,
    tenant_max_active_jobs: Annotated[
        int | None, typer.Option(min=1, help="quota: ACTIVE or PAUSED jobs per tenant (409 over it)")
    ] = None,
    tenant_max_running: Annotated[
        int | None, typer.Option(min=1, help="quota: RUNNING runs per tenant (more wait PENDING)")
    ] = None,
    aws_endpoint: Annotated[
        str | None,
        typer.Option(
            help="use this already-running moto server (kept running on exit) instead of starting one"
        ),
    ] = None,
    notify_max_backoff_seconds: Annotated[
        float,
        typer.Option(min=0.1, help="notifications: the longest wait between a delivery's tries, seconds"),
    ] = 3600.0,
    console_oidc: Annotated[
        str | None,
        typer.Option(
            help="AUTHORIZE_URL,TOKEN_URL,CLIENT_ID: serve the console's AWS shell (/console/shell) signing in "
            "at this OIDC issuer, as the CDK app's console does (the tokens it gets must be --tenant tokens)"
        ),
    ] = None,
    lambda_: Annotated[
        list[str] | None,
        typer.Option(
            "--lambda",
            help="NAME=module:function, repeatable: a Lambda function for Lambda tasks (added to "
            "pyproject's [tool.duetime.local.lambdas])",
        ),
    ] = None,
) -> None:
    """Run the whole stack on this machine until Ctrl-C: state in .duetime/ (kept across restarts), or on
    moto's server on 127.0.0.1 with --backend moto."""
    from duetime.adapters.sqlite.db import StateFileError
    from duetime.local.api_process import DEFAULT_API_PROCESSES
    from duetime.local.stack import BACKENDS, ApiPortError, LocalOptions, LocalStack, StateDirInUseError

    if backend not in BACKENDS:
        raise typer.BadParameter(f"{backend!r}: one of {', '.join(BACKENDS)}", param_hint="--backend")
    if aws_endpoint and backend != "moto":
        raise typer.BadParameter("needs --backend moto", param_hint="--aws-endpoint")

    if heartbeat_seconds >= lease_seconds:
        raise typer.BadParameter("must be shorter than --lease-seconds", param_hint="--heartbeat-seconds")
    tenants: dict[str, str] = {}
    for spec in tenant or []:
        name, sep, token = spec.partition(":")
        if not sep or not name or not token:
            raise typer.BadParameter(f"{spec!r} is not NAME:TOKEN", param_hint="--tenant")
        if token in tenants:
            raise typer.BadParameter(
                f"token of {name!r} is already {tenants[token]!r}'s", param_hint="--tenant"
            )
        tenants[token] = name
    oidc: tuple[str, str, str] | None = None
    if console_oidc is not None:
        parts = [p.strip() for p in console_oidc.split(",")]
        if (
            len(parts) != 3
            or not all(parts)
            or not all(p.startswith(("http://", "https://")) for p in parts[:2])
        ):
            raise typer.BadParameter("needs AUTHORIZE_URL,TOKEN_URL,CLIENT_ID", param_hint="--console-oidc")
        oidc = (parts[0], parts[1], parts[2])
    from duetime.local.lambda_service import parse_function_spec

    lambdas: dict[str, str] = {}
    for spec in lambda_ or []:
        try:
            lambdas.update([parse_function_spec(spec)])
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--lambda") from None
    stack = LocalStack(
        LocalOptions(
            backend=backend,
            state_dir=state_dir,
            reset=reset,
            state_file=state_dir / "local.json",
            api_port=api_port,
            tick_seconds=tick_seconds,
            workers=workers,
            slots=slots,
            api_processes=DEFAULT_API_PROCESSES if api_processes is None else api_processes,
            demo=demo,
            shards=shards,
            lease_seconds=lease_seconds,
            heartbeat_seconds=heartbeat_seconds,
            pending_grace_seconds=pending_grace_seconds,
            run_retention_days=run_retention_days,
            failed_run_retention_days=failed_run_retention_days,
            keep_last_runs=keep_last_runs,
            log_pack_linger_seconds=log_pack_linger_seconds,
            verbose=verbose,
            aws_endpoint=aws_endpoint,
            tenants=tenants,
            lambdas=lambdas,
            tenant_submits_per_minute=tenant_submits_per_minute,
            tenant_max_active_jobs=tenant_max_active_jobs,
            tenant_max_running=tenant_max_running,
            notify_max_backoff_seconds=notify_max_backoff_seconds,
            console_oidc=oidc,
        )
    )
    try:
        stack.start()
    except (StateDirInUseError, StateFileError, ApiPortError) as exc:
        stack.stop()
        typer.echo(f"duetime local: {exc}", err=True)
        raise typer.Exit(1) from None
    except Exception:
        stack.stop()
        raise
    stack.wait()


def _load_local_env(config: Path) -> None:
    """Fill missing environment variables from a local stack's state file."""
    state: dict[str, Any] = json.loads(config.read_text())
    for key, value in state.get("env", {}).items():
        os.environ.setdefault(key, value)


@app.command()
def worker(
    tier: Annotated[
        str, typer.Option(help="container tier whose queue to pull: small, medium or large")
    ] = "small",
    config: Annotated[
        Path, typer.Option(help="local stack state file, used when DUETIME_* variables are not set")
    ] = Path(".duetime/local.json"),
    slots: Annotated[
        int,
        typer.Option(
            min=0,
            envvar="DUETIME_WORKER_SLOTS",
            help="tasks run at once (0 = the tier's default: small 8, medium 2, large 1; on AWS they share "
            "the tier's Fargate CPU and memory)",
        ),
    ] = 0,
) -> None:
    """Pull runs of one tier from its queue and execute them, up to --slots at once (a Fargate task in AWS;
    its owner id, the lease owner of every run it holds, is ``<host>:<pid>:<random>``)."""
    from duetime.config.settings import CONTAINER_TIERS, SettingsError, get_settings

    if tier not in CONTAINER_TIERS:
        raise typer.BadParameter(f"must be one of {', '.join(CONTAINER_TIERS)}", param_hint="--tier")
    if "DUETIME_JOBS_TABLE" not in os.environ and config.is_file():
        _load_local_env(config)
    try:
        get_settings()
    except SettingsError as exc:
        typer.echo(f"duetime worker: {exc} (is `duetime local` running? see {config})", err=True)
        raise typer.Exit(2) from None

    from duetime.config.deps import default_deps
    from duetime.services.worker import Worker, handle_stop_signals

    if os.environ.get("DUETIME_CALL_COUNT_DIR"):  # bench/: count this worker's AWS calls
        from duetime.local import callcount  # (loads boto3: only then)

        callcount.install_from_env()
    deps = default_deps()
    if deps.settings.backend != "sqlite":  # the AWS clients every run uses, made before the first run
        from duetime.adapters.aws import clients

        clients.warm("dynamodb", "sqs", "s3")
    w = Worker(deps, tier, slots=slots)
    # SIGTERM/SIGINT only set the worker's stop flag (no lock: a second or third signal is harmless)
    handle_stop_signals(w)
    from duetime.local.lifeline import die_with_parent

    die_with_parent()  # a worker of `duetime local` stops (SIGTERM) when the stack dies, even by SIGKILL
    w.run_forever()


schedule_app = typer.Typer(no_args_is_help=True, help="Work with schedule expressions.")
import_app = typer.Typer(no_args_is_help=True, help="Import jobs from other schedulers.")
app.add_typer(schedule_app, name="schedule")
app.add_typer(import_app, name="import")
app.add_typer(cli_api.jobs_app, name="jobs")
app.add_typer(cli_api.runs_app, name="runs")
app.command("dead-letters")(cli_api.dead_letters)


def _instant(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"not an ISO-8601 instant: {value!r}", param_hint=name) from None
    if parsed.tzinfo is None:
        raise typer.BadParameter("needs a UTC offset, e.g. 2026-12-01T10:00:00Z", param_hint=name)
    return parsed


@schedule_app.command("preview")
def schedule_preview(
    expression: Annotated[str, typer.Argument(help="cron, cron(...), rate(...) or at(...)")],
    tz: Annotated[str, typer.Option("--tz", help="IANA time zone of the schedule")] = "UTC",
    after: Annotated[str | None, typer.Option(help="ISO instant to start from (default now)")] = None,
    anchor: Annotated[str | None, typer.Option(help="start of a rate(...) (default --after)")] = None,
    count: Annotated[int, typer.Option(min=1, max=1000, help="how many fire times")] = 5,
    dst_policy: Annotated[str, typer.Option(help="shift (Debian cron) or skip (EventBridge)")] = "shift",
    as_json: Annotated[bool, typer.Option("--json", help="a JSON list of ISO instants in the zone")] = False,
) -> None:
    """Print the next fire times of EXPRESSION (exit 2 with the reason if it is invalid)."""
    from duetime.domain.errors import ScheduleError
    from duetime.services.jobs import preview_schedule

    start = _instant(after, "--after") or datetime.now(UTC)
    if dst_policy not in ("shift", "skip"):
        raise typer.BadParameter("must be shift or skip", param_hint="--dst-policy")
    try:
        result = preview_schedule(
            expression,
            tz,
            after=start,
            anchor=_instant(anchor, "--anchor") or start,
            count=count,
            dst_policy=dst_policy,  # type: ignore[arg-type]
        )
    except ScheduleError as exc:
        typer.echo(f"duetime: {exc.field}: {exc.message}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(result.local_times))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result.expression}  ({result.timezone}): {result.description}")
    table.add_column("#", justify="right")
    table.add_column(f"local ({result.timezone})")
    table.add_column("UTC")
    for i, (local_time, fire) in enumerate(zip(result.local_times, result.fire_times, strict=True), 1):
        table.add_row(str(i), local_time, fire.strftime("%Y-%m-%d %H:%M:%S"))
    Console().print(table)


@import_app.command("crontab")
def import_crontab(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="crontab file")],
    system: Annotated[
        bool, typer.Option("--system", help="system format (/etc/crontab, /etc/cron.d): a user column")
    ] = False,
    tz: Annotated[str, typer.Option("--tz", help="time zone of entries without CRON_TZ")] = "UTC",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="list the jobs, their ids and next 3 fire times only")
    ] = False,
    api: cli_api.Api = None,
    token: cli_api.Token = None,
    sigv4: cli_api.SigV4 = False,
    config: Annotated[
        Path, typer.Option(help="local stack state file, used without --api and $DUETIME_API_URL")
    ] = Path(".duetime/local.json"),
) -> None:
    """Create one job per crontab entry. Importing a file again creates nothing new: each entry's job id
    is stable (`cron-` and a hash of the file's absolute path, the user and the line), and an entry whose
    job exists is reported as present. Lines that cannot run as-is (@reboot) are reported, not dropped.
    Any invalid line is reported on stderr as FILE:LINE: reason, and then nothing is created (exit 2)."""
    from pydantic import ValidationError

    from duetime.cli.client import ApiError, Client
    from duetime.domain.api_models import CreateJobRequest
    from duetime.domain.crontab import CrontabEntry, mailto_rules, parse_crontab
    from duetime.domain.errors import ScheduleError
    from duetime.services.jobs import preview_schedule

    def describe(entry: CrontabEntry, fires: list[str]) -> None:
        who = f" (as {entry.user})" if entry.user else ""
        typer.echo(
            f"line {entry.line}: {entry.name}: `{entry.schedule}` {entry.timezone}{who}: {entry.command}"
        )
        typer.echo(f"    next: {', '.join(fires)}")
        for rule in mailto_rules(entry.env).rules:
            typer.echo(f"    mails: {', '.join(rule['email'])} on {', '.join(rule['on'])}")  # type: ignore[arg-type]

    def differences(job: dict[str, Any], body: dict[str, Any]) -> list[str]:
        """The fields in which a job already there differs from what this line would create."""
        schedule, task = job.get("schedule") or {}, job.get("task") or {}
        changed = ["name"] if job.get("name") != body["name"] else []
        changed += [
            f"schedule.{k}" for k in ("expression", "timezone") if schedule.get(k) != body["schedule"][k]
        ]
        changed += [f"task.{k}" for k in ("command", "env", "stdin") if task.get(k) != body["task"][k]]
        return changed

    where = str(file)
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        typer.echo(f"duetime: {where}: cannot read it as text: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        parsed = parse_crontab(
            text, system=system, default_timezone=tz, name_prefix=file.name, source=str(file.resolve())
        )
    except ScheduleError as exc:
        typer.echo(f"duetime: --tz: {exc.message}", err=True)
        raise typer.Exit(2) from None
    now = datetime.now(UTC)
    invalid = [(s.line, s.reason, s.text) for s in parsed.skipped if s.kind == "invalid"]
    planned: list[tuple[CrontabEntry, list[str], dict[str, Any]]] = []
    for entry in parsed.entries:
        body: dict[str, Any] = {
            "job_id": entry.job_id,
            "name": entry.name,
            "schedule": {"expression": entry.schedule, "timezone": entry.timezone},
            "task": {"kind": "container", "command": entry.argv, "env": entry.env, "stdin": entry.stdin},
        }
        mailto = mailto_rules(entry.env)
        if mailto.rules:  # MAILTO's addresses: alerted on failures and recovery (domain.crontab.mailto_rules)
            body["notifications"] = mailto.rules
        try:
            preview = preview_schedule(entry.schedule, entry.timezone, after=now, anchor=now, count=3)
            CreateJobRequest.model_validate(body)  # what the API would refuse is refused here, up front
        except ScheduleError as exc:
            invalid.append((entry.line, f"cannot import `{entry.schedule}`: {exc.message}", entry.command))
            continue
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            invalid.append((entry.line, f"the job would be refused: {field}: {first['msg']}", entry.command))
            continue
        planned.append((entry, preview.local_times, body))

    for skipped in parsed.skipped:
        if skipped.kind != "invalid":
            typer.echo(f"{where}:{skipped.line}: skipped: {skipped.reason}: {skipped.text}", err=True)
    local_users = sorted({u for entry, _, _ in planned for u in mailto_rules(entry.env).local_users})
    if local_users:
        typer.echo(
            f"{where}: note: MAILTO names local users ({', '.join(local_users)}), whom Duetime cannot mail: "
            "their jobs get no email rule (set MAILTO to email addresses); output is kept as each run's log "
            "(`duetime runs logs RUN_ID`)",
            err=True,
        )
    if dry_run or invalid:
        for entry, fires, _ in planned if dry_run else []:
            describe(entry, fires)
            typer.echo(f"    job id: {entry.job_id}")
        for line, reason, line_text in sorted(invalid):
            typer.echo(f"{where}:{line}: invalid: {reason}: {line_text}", err=True)
        if invalid:
            count = f"{len(invalid)} invalid line{'s' if len(invalid) > 1 else ''}"
            outcome = "nothing to import" if dry_run else "nothing imported"
            typer.echo(f"duetime: {where}: {count}: {outcome} (fix or comment them out first)", err=True)
            raise typer.Exit(2)
        return

    try:
        client = Client.resolve(api, token, sigv4, state=config)
    except ApiError as exc:
        typer.echo(f"duetime: {exc}", err=True)
        raise typer.Exit(cli_api.exit_code(exc)) from None
    created = present = refused = 0
    for entry, fires, body in planned:
        describe(entry, fires)
        try:
            try:
                job = client.request("POST", "/jobs", body=body)
                created += 1
                typer.echo(f"    created job {job['job_id']}")
                continue
            except ApiError as exc:
                if exc.status != 409 or exc.code != "job_exists":
                    raise
            try:
                job = client.request("GET", f"/jobs/{entry.job_id}")
            except ApiError as exc:
                if exc.status != 404:
                    raise
                refused += 1
                typer.echo(
                    f"{where}:{entry.line}: refused: job id {entry.job_id} is taken by another tenant",
                    err=True,
                )
                continue
            present += 1
            typer.echo(f"    already present: job {entry.job_id} ({job.get('state')})")
            if job.get("state") == "DELETED":
                typer.echo(
                    f"{where}:{entry.line}: note: job {entry.job_id} was deleted; its id stays taken, "
                    "so the import does not create it again",
                    err=True,
                )
            elif changed := differences(job, body):
                typer.echo(
                    f"{where}:{entry.line}: note: job {entry.job_id} differs from this line in "
                    f"{', '.join(changed)}; left as it is (`duetime jobs update` or `jobs delete` it)",
                    err=True,
                )
        except ApiError as exc:
            code = cli_api.exit_code(exc)
            if code == 4 or exc.status in (401, 403, 429):  # the same for every line: stop here
                typer.echo(f"duetime: {exc}", err=True)
                if created or present or refused:
                    typer.echo(
                        f"duetime: {where}: {created} created, {present} already present, "
                        f"{len(planned) - created - present - refused} not done: run the import again "
                        "(it creates only what is missing)",
                        err=True,
                    )
                raise typer.Exit(4 if code == 4 else 1) from None
            refused += 1
            typer.echo(f"{where}:{entry.line}: refused: {exc}", err=True)
    typer.echo(f"{created} created, {present} already present" + (f", {refused} refused" if refused else ""))
    if refused:
        raise typer.Exit(1)


def main() -> None:
    """Entry point of the ``duetime`` console script."""
    app()


if __name__ == "__main__":
    main()
    sys.exit(0)
