"""The ``duetime`` command: ``duetime local`` (the embedded stack) and ``duetime worker`` (a worker process)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Duetime: a distributed job scheduler.")


@app.command()
def local(
    api_port: Annotated[int, typer.Option(help="HTTP port of the API (0 = any free port)")] = 8765,
    tick_seconds: Annotated[float, typer.Option(min=0.2, help="clock loop period, seconds")] = 60.0,
    workers: Annotated[int, typer.Option(min=0, help="worker processes per container tier")] = 2,
    demo: Annotated[bool, typer.Option("--demo/--no-demo", help="submit the demo jobs in examples/")] = True,
    shards: Annotated[int, typer.Option(min=1, max=64, help="shards of the jobs table")] = 4,
    lease_seconds: Annotated[float, typer.Option(min=1, help="run lease length, seconds")] = 30.0,
    heartbeat_seconds: Annotated[float, typer.Option(min=0.2, help="heartbeat interval, seconds")] = 10.0,
    pending_grace_seconds: Annotated[
        float, typer.Option(min=1, help="a PENDING run this late is re-sent by the sweeper, seconds")
    ] = 60.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="handler logs and EMF metrics")] = False,
    aws_endpoint: Annotated[
        str | None,
        typer.Option(
            help="use this already-running moto server (kept running on exit) instead of starting one"
        ),
    ] = None,
) -> None:
    """Run the whole stack on this machine against moto's server on 127.0.0.1, until Ctrl-C."""
    from duetime.local.stack import LocalOptions, LocalStack

    if heartbeat_seconds >= lease_seconds:
        raise typer.BadParameter("must be shorter than --lease-seconds", param_hint="--heartbeat-seconds")
    stack = LocalStack(
        LocalOptions(
            api_port=api_port,
            tick_seconds=tick_seconds,
            workers=workers,
            demo=demo,
            shards=shards,
            lease_seconds=lease_seconds,
            heartbeat_seconds=heartbeat_seconds,
            pending_grace_seconds=pending_grace_seconds,
            verbose=verbose,
            aws_endpoint=aws_endpoint,
        )
    )
    try:
        stack.start()
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
) -> None:
    """Pull runs of one tier from its queue and execute them (a Fargate task in AWS)."""
    from duetime.settings import CONTAINER_TIERS, SettingsError, get_settings

    if tier not in CONTAINER_TIERS:
        raise typer.BadParameter(f"must be one of {', '.join(CONTAINER_TIERS)}", param_hint="--tier")
    if "DUETIME_JOBS_TABLE" not in os.environ and config.is_file():
        _load_local_env(config)
    try:
        get_settings()
    except SettingsError as exc:
        typer.echo(f"duetime worker: {exc} (is `duetime local` running? see {config})", err=True)
        raise typer.Exit(2) from None

    from duetime.deps import default_deps
    from duetime.worker import Worker

    w = Worker(default_deps(), tier)
    signal.signal(signal.SIGTERM, lambda *_: w.stop())
    signal.signal(signal.SIGINT, lambda *_: w.stop())
    w.run_forever()


def main() -> None:
    """Entry point of the ``duetime`` console script."""
    app()


if __name__ == "__main__":
    main()
    sys.exit(0)
