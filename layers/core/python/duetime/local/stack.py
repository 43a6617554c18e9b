"""``duetime local``: the whole system on one machine.

Two backends, the same services and handlers behind the ports:
- ``sqlite`` (the default): the embedded adapter set, state in ``.duetime/`` (``--state-dir``): jobs, runs,
  queues and idempotency records in ``duetime.sqlite``, logs under ``logs/``. Stopping and starting again
  keeps everything.
- ``moto``: the AWS adapters against moto's server on loopback (state in its memory: gone at exit), for the
  AWS adapters' end-to-end and fault tests.

Whatever the backend, a stack holds its state directory (``--state-dir``, default ``.duetime/``: its
``local.json``, the workers' task markers and, on sqlite, the database) through one lock file,
``<state dir>/lock`` (:meth:`LocalStack._lock_state_dir`), taken before anything else starts: a second
stack on the same directory, of either backend, is refused naming the holder's pid
(:class:`StateDirInUseError`), and a stack deletes ``local.json`` at exit only if it is the one it wrote.

Processes and threads:
- moto's server (``--backend moto`` only: a child process, DynamoDB serialised, see
  :mod:`duetime.local.moto_server`);
- the HTTP API (a thread serving ``functions/api`` through :class:`HttpApiAdapter`);
- the clock loop (a thread invoking ``functions/tick`` once per shard and ``functions/sweeper`` every period,
  as EventBridge Scheduler would);
- worker processes (``duetime worker --tier T``, restarted if they die, as a Fargate service would);
- a Lambda of its own for Lambda tasks (:mod:`duetime.local.lambda_service`): registered functions run in
  child processes behind a local Invoke API, the ``lambda`` queue feeds ``functions/dispatcher`` as Lambda's
  SQS event source would, and outcomes reach ``functions/finish`` as Lambda destination records.

It writes ``.duetime/local.json`` (API URL, backend, resource names or the database file, the environment
workers need) and runs until SIGINT/SIGTERM, then stops every process it started.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from duetime.adapters.aws.resources import ResourceNames, create_all
from duetime.adapters.sqlite.db import StateFileError
from duetime.config.settings import CONTAINER_TIERS, Settings, get_settings, settings_to_env
from duetime.local import callcount, lifeline
from duetime.local.api_process import DEFAULT_API_PROCESSES

STATE_DIR = Path(".duetime")
#: how long a worker of the stack told to stop may try to hand its run back after its task ended, seconds
WORKER_STOP_BUDGET_SECONDS = 5.0
STATE_FILE = STATE_DIR / "local.json"
#: how often the local notifier reads the change feed and tries due deliveries, seconds
NOTIFIER_PERIOD_SECONDS = 0.5
#: the backends of ``duetime local``
BACKENDS = ("sqlite", "moto")

#: Fake credentials: moto accepts anything; real ones must never reach it.
LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


class StateDirInUseError(RuntimeError):
    """Another ``duetime local`` holds the state directory (the message says which process)."""


class ApiPortError(RuntimeError):
    """The API's port cannot be listened on (in use, or not allowed); the message names it."""


@dataclass
class LocalOptions:
    #: "sqlite" (durable, under ``state_dir``) or "moto"
    backend: str = "sqlite"
    #: the embedded backend's state directory
    state_dir: Path = STATE_DIR
    #: start empty: the state directory's database and logs are removed first
    reset: bool = False
    api_port: int = 8765
    tick_seconds: float = 60.0
    workers: int = 2
    #: tasks each worker runs at once (``--slots``); 0 = the tier's default (worker.DEFAULT_SLOTS)
    slots: int = 0
    #: processes serving the API (``--api-processes``; api_process.DEFAULT_API_PROCESSES); 0 = a thread of
    #: this process
    api_processes: int = DEFAULT_API_PROCESSES
    demo: bool = True
    shards: int = 4
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    pending_grace_seconds: float = 60.0
    #: the hot window's tiers (domain/retention.py)
    run_retention_days: float = 14.0
    failed_run_retention_days: float = 90.0
    keep_last_runs: int = 20
    #: Settings.log_pack_linger_seconds (0: ends wait for their logs; the AWS stages use 15)
    log_pack_linger_seconds: float = 0.0
    prefix: str = "duetime"
    verbose: bool = False
    #: ``local.json``: in ``state_dir`` (the CLI's ``--state-dir``), whose lock keeps other stacks off it
    state_file: Path = STATE_FILE
    demo_file: Path | None = None
    #: per-tenant quotas (None: the Settings defaults)
    tenant_submits_per_minute: int | None = None
    tenant_max_active_jobs: int | None = None
    tenant_max_running: int | None = None
    #: notifications: the longest wait between a delivery's tries, seconds (tests shorten it)
    notify_max_backoff_seconds: float = 3600.0
    #: bearer token -> tenant; empty = every request is the single tenant `local`
    tenants: dict[str, str] = field(default_factory=dict)
    #: the console shell's OIDC sign-in (authorize URL, token URL, client id), as on AWS: ``--console-oidc``
    console_oidc: tuple[str, str, str] | None = None
    #: reuse a moto server that is already running (its state survives a restart of Duetime's processes)
    aws_endpoint: str | None = None
    #: Lambda functions by name -> ``module:function`` (``--lambda``), over pyproject's [tool.duetime.local.lambdas]
    lambdas: dict[str, str] = field(default_factory=dict)


def _is_task_group(pgid: int) -> bool:
    """Whether a process of process group ``pgid`` is a Duetime task (``DUETIME_RUN_ID`` in its
    environment, as every worker sets it; Linux ``/proc``; elsewhere: False, nothing is killed)."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            # fields after the command name (which may hold spaces and parentheses): state, ppid, pgrp
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            if b"DUETIME_RUN_ID=" in (entry / "environ").read_bytes():
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


@dataclass
class LocalStack:
    """A running local stack; :meth:`stop` tears it down."""

    options: LocalOptions
    api_url: str = ""
    aws_endpoint: str = ""
    env: dict[str, str] = field(default_factory=dict)
    _moto: subprocess.Popen[str] | None = None
    _workers: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _api_server: Any = None
    _api_socket: socket.socket | None = None
    _api_procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _lambda: Any = None
    _lock_fd: int | None = None
    #: this stack's mark in the ``local.json`` it wrote: at exit it deletes only a file bearing it
    _stack_id: str = field(default_factory=lambda: secrets.token_hex(16))
    _signals: list[int] = field(default_factory=list)
    _names: Any = None
    _queue_urls: dict[str, str] = field(default_factory=dict)

    # ---- start ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start every part; raises StateDirInUseError or StateFileError (both naming the file) when the
        state directory cannot be used (another stack of either backend holds it, it cannot be made) or the
        embedded backend's database cannot be."""
        opts = self.options
        self.catch_stop_signals()
        self._lock_state_dir(opts.state_dir.resolve())  # before anything is started or written
        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "INFO" if opts.verbose else "WARNING")
        os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "false" if opts.verbose else "true")
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        # Lambda invokes (the dispatcher -> this stack's own Lambda) are signed: fake credentials only
        os.environ.update(LOCAL_AWS_ENV)
        settings = self._embedded_settings() if opts.backend == "sqlite" else self._moto_settings()
        self.env = {
            **LOCAL_AWS_ENV,
            "POWERTOOLS_LOG_LEVEL": os.environ["POWERTOOLS_LOG_LEVEL"],
            "POWERTOOLS_METRICS_DISABLED": os.environ["POWERTOOLS_METRICS_DISABLED"],
            **settings_to_env(settings),
        }
        if self.aws_endpoint:
            self.env["AWS_ENDPOINT_URL"] = self.aws_endpoint
        os.environ.update(self.env)
        get_settings.cache_clear()
        from duetime.config.deps import default_deps

        default_deps.cache_clear()
        default_deps()  # opens (and migrates) the embedded database now: a bad file fails here, named

        self._start_lambda()
        self._start_api()
        self._write_state()
        print(f"API: {self.api_url}", flush=True)
        print(f"Console: {self.api_url}/console", flush=True)
        if self.aws_endpoint:
            print(f"AWS endpoint: {self.aws_endpoint}", flush=True)
        else:
            print(f"Backend: sqlite, state in {opts.state_dir.resolve()}", flush=True)
        print(f"State: {opts.state_file.resolve()}", flush=True)
        self._reap_leftover_tasks()
        if self.aws_endpoint:  # the clock loop's ticks and sweeps use these from the first due run on
            from duetime.adapters.aws import clients

            clients.warm("dynamodb", "sqs")
        self._start_clock()
        for tier in CONTAINER_TIERS:
            for _ in range(opts.workers):
                self._spawn_worker(tier)
        self._start_supervisor()
        if opts.demo:
            self._submit_demo_jobs()
        print(
            f"Ready: tick every {opts.tick_seconds:g} s over {opts.shards} shards, "
            f"{opts.workers} worker(s) per tier {', '.join(CONTAINER_TIERS)}. Ctrl-C stops.",
            flush=True,
        )

    def _common_settings(self) -> dict[str, Any]:
        opts = self.options
        return {
            "shard_count": opts.shards,
            "tick_period_seconds": opts.tick_seconds,
            "tick_margin_seconds": min(15.0, max(2.0, opts.tick_seconds / 4)),
            "lease_seconds": opts.lease_seconds,
            "heartbeat_seconds": opts.heartbeat_seconds,
            "pending_grace_seconds": opts.pending_grace_seconds,
            "run_retention_days": opts.run_retention_days,
            "failed_run_retention_days": opts.failed_run_retention_days,
            "keep_last_runs": opts.keep_last_runs,
            "log_pack_linger_seconds": opts.log_pack_linger_seconds,
            # webhooks to loopback over plain HTTP are the local stack's (a receiver on this machine)
            "notify_allow_private": True,
            "notify_backoff_seconds": min(5.0, opts.notify_max_backoff_seconds),
            "notify_max_backoff_seconds": opts.notify_max_backoff_seconds,
            **{
                k: v
                for k, v in {
                    "tenant_submits_per_minute": opts.tenant_submits_per_minute,
                    "tenant_max_active_jobs": opts.tenant_max_active_jobs,
                    "tenant_max_running": opts.tenant_max_running,
                }.items()
                if v is not None
            },
            **(
                dict(
                    zip(
                        ("console_authorize_url", "console_token_url", "console_client_id"),
                        opts.console_oidc,
                        strict=True,
                    )
                )
                if opts.console_oidc
                else {}
            ),
        }

    def _embedded_settings(self) -> Settings:
        """Reset the (locked) state directory when asked and point the settings at it."""
        state_dir = self.options.state_dir.resolve()
        if self.options.reset:
            from duetime.config.deps import DATABASE_FILE, LOGS_DIR

            for suffix in ("", "-wal", "-shm", "-writer"):
                (state_dir / f"{DATABASE_FILE}{suffix}").unlink(missing_ok=True)
            shutil.rmtree(state_dir / LOGS_DIR, ignore_errors=True)
            print(f"reset: {state_dir} starts empty", flush=True)
        callcount.install_from_env()
        return Settings(
            state_dir=str(state_dir),
            # one SQLite writer at a time: claims in parallel would only take turns; a batch of claims
            # is one transaction per step (3 commits for 250 claims instead of 750)
            claim_concurrency=1,
            claim_batch_size=250,
            **self._common_settings(),
        )

    def _lock_state_dir(self, state_dir: Path) -> None:
        """Hold ``state_dir/lock`` (flock) for the life of this stack, whatever its backend; it records our
        pid. The descriptor is not inherited by the stack's children (``os.open``: close-on-exec), so the
        lock ends with this process, SIGKILL included.

        Raises:
            StateDirInUseError: another process holds it (its pid is named).
            StateFileError: the directory or its lock file cannot be made or opened (a parent that does not
                exist or is not writable, a read-only file system); the message names the path.
        """
        path = state_dir / "lock"
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StateFileError(
                f"state directory {state_dir} cannot be used: {exc.strerror or exc}; give a --state-dir "
                "this user can write"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StateDirInUseError(
                f"{state_dir} is in use by process {holder} (another `duetime local`); stop it, or give this "
                "one its own --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _moto_settings(self) -> Settings:
        opts = self.options
        self._start_moto()
        names = ResourceNames.for_prefix(opts.prefix)
        os.environ["AWS_ENDPOINT_URL"] = self.aws_endpoint
        from duetime.adapters.aws import clients as aws

        callcount.install_from_env()  # bench/: count this process's AWS calls (each worker installs its own)
        aws.reset_clients()
        queue_urls = create_all(names)
        self._enable_step_functions()
        from duetime.adapters.aws.stepfunctions import create_state_machine

        self._names, self._queue_urls = names, queue_urls
        return Settings(
            jobs_table=names.jobs_table,
            runs_table=names.runs_table,
            logs_bucket=names.logs_bucket,
            queue_urls=queue_urls,
            # moto's server serialises DynamoDB, so concurrent claims gain little (43.6 vs 34.7 claims/s)
            # and take DynamoDB turns from the workers: `make bench`, a burst of 1,000 due at one second,
            # p50 lag 23 s claiming one at a time against 59 s with 8 at once. AWS has no such lock.
            claim_concurrency=1,
            timeout_state_machine_arn=create_state_machine(f"{opts.prefix}-timeout-handler"),
            idempotency_table=names.idempotency_table,
            **self._common_settings(),
        )

    def _start_moto(self) -> None:
        if self.options.aws_endpoint:
            self.aws_endpoint = self.options.aws_endpoint.rstrip("/")
            return
        self._moto = subprocess.Popen(
            [sys.executable, "-m", "duetime.local.moto_server", "--host", "127.0.0.1", "--port", "0"],
            env={**os.environ, **lifeline.child_env()},
            stdout=subprocess.PIPE,
            stderr=None if self.options.verbose else subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # Ctrl-C reaches only this process, which stops moto last
        )
        assert self._moto.stdout is not None
        line = self._moto.stdout.readline().strip()
        if not line.startswith("PORT "):
            self._moto.kill()
            raise RuntimeError(f"moto server did not start (said {line!r})")
        self.aws_endpoint = f"http://127.0.0.1:{int(line.split()[1])}"

    def _enable_step_functions(self) -> None:
        """moto executes state machines only when told to (also when reusing a server it did not start)."""
        request = urllib.request.Request(
            f"{self.aws_endpoint}/moto-api/config",
            data=json.dumps({"stepfunctions": {"execute_state_machine": True}}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    def _start_lambda(self) -> None:
        """The local Lambda (functions, Invoke API, destinations) and the dispatcher's SQS event source."""
        from duetime.config.deps import default_deps
        from duetime.local.lambda_runtime import handler, project_root
        from duetime.local.lambda_service import (
            LocalLambda,
            QueueEventSource,
            SqsEventSource,
            registered_functions,
        )

        functions, roots = registered_functions(
            self.options.lambdas, cwd=Path.cwd(), project_root=project_root()
        )
        self._lambda = LocalLambda(
            functions,
            destination=handler("finish"),
            logs=default_deps().logs,
            env={**LOCAL_AWS_ENV, **({"AWS_ENDPOINT_URL": self.aws_endpoint} if self.aws_endpoint else {})},
            python_path=roots,
            echo=True,
        )
        endpoint = self._lambda.serve()
        self.env["AWS_ENDPOINT_URL_LAMBDA"] = os.environ["AWS_ENDPOINT_URL_LAMBDA"] = endpoint
        listed = ", ".join(f"{name} ({target})" for name, target in sorted(functions.items())) or "none"
        print(f"Lambda: {endpoint}, functions: {listed}", flush=True)
        source: SqsEventSource
        if self.aws_endpoint:
            source = SqsEventSource(self._queue_urls["lambda"], handler("dispatcher"))
        else:
            source = QueueEventSource(default_deps().queues, "lambda", handler("dispatcher"))
        self._thread(lambda: source.run_forever(self._stopping), "lambda-event-source")

    def _start_api(self) -> None:
        if self.options.tenants:
            names = ", ".join(sorted(set(self.options.tenants.values())))
            print(f"Tenants: {names} (Authorization: Bearer <token>)", flush=True)
        if self.options.api_processes <= 0:
            self._start_api_thread()
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", self.options.api_port))
        except OSError as exc:
            sock.close()
            raise ApiPortError(
                f"cannot listen on 127.0.0.1:{self.options.api_port} for the API ({exc.strerror}); "
                "stop the program using it or choose another --api-port (0 = any free port)"
            ) from None
        sock.listen(1024)
        # non-blocking: the API processes all wait on it and one takes each connection (the others' accept
        # finds nothing and they wait again); each accepted connection is blocking
        sock.setblocking(False)
        self._api_socket = sock
        self.api_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        for _ in range(self.options.api_processes):
            self._spawn_api_process()
        self._wait_for_api()

    def _spawn_api_process(self) -> None:
        from duetime.local.api_process import TENANTS_ENV

        assert self._api_socket is not None
        fd = self._api_socket.fileno()
        verbose = ["--verbose"] if self.options.verbose else []
        proc = subprocess.Popen(
            [sys.executable, "-m", "duetime.local.api_process", "--fd", str(fd), *verbose],
            env={
                **os.environ,
                **self.env,
                **lifeline.child_env(),
                TENANTS_ENV: json.dumps(self.options.tenants),
            },
            pass_fds=(fd,),
            start_new_session=True,
        )
        self._api_procs.append(proc)

    def _wait_for_api(self, timeout: float = 60.0) -> None:
        """Until the API answers ``GET /healthz`` at all (its processes import the handler first)."""
        deadline = time.monotonic() + timeout
        while True:
            dead = [p for p in self._api_procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"an API process exited with {dead[0].returncode} while starting")
            try:
                with urllib.request.urlopen(f"{self.api_url}/healthz", timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # it answers (401 without a token when tenants are configured)
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the API at {self.api_url} did not answer within {timeout:g} s")
            time.sleep(0.1)

    def _start_api_thread(self) -> None:
        from duetime.local.http_adapter import HttpApiAdapter, make_api_server
        from duetime.local.lambda_runtime import handler

        app = HttpApiAdapter(handler("api", concurrency=4), tenants=self.options.tenants)
        try:
            self._api_server = make_api_server("127.0.0.1", self.options.api_port, app)
        except SystemExit:  # werkzeug's answer to a port it cannot bind (it printed why)
            raise ApiPortError(
                f"cannot listen on 127.0.0.1:{self.options.api_port} for the API; stop the program using it "
                "or choose another --api-port (0 = any free port)"
            ) from None
        self.api_url = f"http://127.0.0.1:{self._api_server.server_port}"
        import logging

        logging.getLogger("werkzeug").setLevel(logging.INFO if self.options.verbose else logging.WARNING)
        self._thread(self._api_server.serve_forever, "api")

    def _write_state(self) -> None:
        path = self.options.state_file
        path.parent.mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {
            "api_url": self.api_url,
            "backend": self.options.backend,
            "pid": os.getpid(),
            "stack_id": self._stack_id,
            "env": self.env,
        }
        if not self.aws_endpoint:
            from duetime.config.deps import DATABASE_FILE, LOGS_DIR

            state_dir = self.options.state_dir.resolve()
            state.update(database=str(state_dir / DATABASE_FILE), logs=str(state_dir / LOGS_DIR))
        else:
            state.update(self._moto_state())
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(path)

    def _moto_state(self) -> dict[str, Any]:
        names, queue_urls = self._names, self._queue_urls
        return {
            "aws_endpoint": self.aws_endpoint,
            "region": LOCAL_AWS_ENV["AWS_DEFAULT_REGION"],
            "tables": {"jobs": names.jobs_table, "runs": names.runs_table},
            "bucket": names.logs_bucket,
            "state_machines": {"timeout_handler": self.env.get("DUETIME_TIMEOUT_STATE_MACHINE_ARN")},
            "queues": queue_urls,
            "queue_names": names.queues,
            "dead_letter_queues": names.dead_letter_queues,
        }

    def _thread(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _start_clock(self) -> None:
        from duetime.local.lambda_runtime import handler

        tick, sweeper = handler("tick"), handler("sweeper")
        period = self.options.tick_seconds

        def loop() -> None:
            next_at = time.monotonic()
            while not self._stopping.is_set():
                for shard in range(self.options.shards):
                    try:
                        result = tick({"shard": shard})
                        if result.get("claimed"):
                            print(f"tick: shard {shard} claimed {result['claimed']} run(s)", flush=True)
                    except Exception as exc:  # noqa: BLE001 - the loop must survive a failed invocation
                        print(f"tick: shard {shard} failed: {exc!r}", file=sys.stderr, flush=True)
                try:
                    sweeper({})
                except Exception as exc:  # noqa: BLE001
                    print(f"sweeper failed: {exc!r}", file=sys.stderr, flush=True)
                self._archive_expired()
                next_at = max(next_at + period, time.monotonic())  # a long tick skips missed periods
                self._stopping.wait(max(0.0, next_at - time.monotonic()))

        self._thread(loop, "clock")
        self._start_notifier()

    def _archive_expired(self) -> None:
        """The local archiver (services/archiver.py): the embedded store has no TTL, so the clock loop moves
        the finished runs past their tier's retention to the archive under the state directory. (The moto
        backend has no TTL either and is not archived: its state is gone when it stops.)"""
        from duetime.config.deps import default_deps
        from duetime.services import archiver

        deps = default_deps()
        if deps.settings.backend != "sqlite":
            return
        try:
            while archiver.archive_expired(deps, deps.store) >= archiver.LOCAL_BATCH:  # type: ignore[arg-type]
                pass
        except Exception as exc:  # noqa: BLE001 - the loop must survive a failed pass
            print(f"archiver failed: {exc!r}", file=sys.stderr, flush=True)

    def _start_notifier(self) -> None:
        """The notifier (docs/design/notifications.md), off the clock loop's thread so a slow receiver never
        delays a tick: every ``NOTIFIER_PERIOD_SECONDS`` it reads the change feed (the embedded store's
        outbox) and tries the deliveries that are due."""
        from duetime.config.deps import default_deps
        from duetime.services import notifier

        deps = default_deps()
        if deps.notify is None or deps.notify.feed is None:
            return

        def loop() -> None:
            while not self._stopping.is_set():
                try:
                    while notifier.process_changes(deps) and not self._stopping.is_set():
                        pass
                    notifier.deliver_due(deps)
                except Exception as exc:  # noqa: BLE001 - the loop must survive a failed pass
                    print(f"notifier failed: {exc!r}", file=sys.stderr, flush=True)
                self._stopping.wait(NOTIFIER_PERIOD_SECONDS)

        self._thread(loop, "notifier")

    def _spawn_worker(self, tier: str) -> None:
        from duetime.services.worker import STOP_BUDGET_ENV

        slots = ["--slots", str(self.options.slots)] if self.options.slots > 0 else []
        proc = subprocess.Popen(
            [sys.executable, "-m", "duetime", "worker", "--tier", tier, *slots],
            env={
                **os.environ,
                **self.env,
                **lifeline.child_env(),
                "DUETIME_WORKER_ECHO": "1",
                "DUETIME_WORKER_STATE_DIR": str(self._worker_dir()),
                # a stopped worker that cannot hand its run back (this stack's moto server died with it)
                # exits this long after its task, well within stop()'s 10 s and a SIGKILLed stack's
                STOP_BUDGET_ENV: str(WORKER_STOP_BUDGET_SECONDS),
            },
            start_new_session=True,
        )
        self._workers.append((tier, proc))

    def _worker_dir(self) -> Path:
        path = self.options.state_file.parent / "workers"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _reap_task_of(self, pid: int) -> None:
        """A dead worker's tasks die with it, as in a Fargate task whose container exits: every slot's
        marker (``<pid>.task``, ``<pid>.<slot>.task``) names a process group to kill."""
        for marker in self._worker_dir().glob(f"{pid}.*task"):
            if not re.fullmatch(rf"{pid}(\.\d+)?\.task", marker.name):
                continue
            try:
                pgid = int(marker.read_text())
            except (OSError, ValueError):
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            marker.unlink(missing_ok=True)

    def _reap_leftover_tasks(self) -> int:
        """Kill the tasks a stack killed as a whole left behind (SIGKILL of the stack, its API processes
        and its workers at once: nobody was left to kill the tasks, which run in sessions of their own),
        before this stack's workers start: otherwise a lost attempt's retry would run beside it. Every
        marker under the workers directory names a process group; it is killed only if a process in it
        is a Duetime task (its environment has ``DUETIME_RUN_ID``), so a process group id reused since
        is left alone. Returns how many groups were killed."""
        killed = 0
        for marker in self._worker_dir().glob("*.task"):
            try:
                pgid = int(marker.read_text())
            except (OSError, ValueError):
                pgid = 0
            if pgid > 1 and _is_task_group(pgid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                    killed += 1
            marker.unlink(missing_ok=True)
        if killed:
            print(f"killed {killed} task(s) left running by a stack that was killed", flush=True)
        return killed

    def _start_supervisor(self) -> None:
        def loop() -> None:
            # this thread must outlive the stack: the workers it spawns follow it (PR_SET_PDEATHSIG is tied
            # to the spawning thread), so one failed restart is reported and tried again a second later
            while not self._stopping.wait(1.0):
                for api_proc in list(self._api_procs):
                    if api_proc.poll() is None or self._stopping.is_set():
                        continue
                    try:
                        print(
                            f"API process {api_proc.pid} exited with {api_proc.returncode}; restarting",
                            flush=True,
                        )
                        self._spawn_api_process()
                        self._api_procs.remove(api_proc)
                    except Exception as exc:  # noqa: BLE001 - keep supervising
                        print(f"restarting an API process failed: {exc!r}", file=sys.stderr, flush=True)
                for tier, proc in list(self._workers):
                    if proc.poll() is None or self._stopping.is_set():
                        continue
                    try:
                        self._reap_task_of(proc.pid)
                        print(
                            f"worker {proc.pid} ({tier}) exited with {proc.returncode}; restarting",
                            flush=True,
                        )
                        self._spawn_worker(tier)
                        self._workers.remove((tier, proc))
                    except Exception as exc:  # noqa: BLE001 - keep supervising
                        print(f"restarting a {tier} worker failed: {exc!r}", file=sys.stderr, flush=True)

        self._thread(loop, "supervisor")

    def _submit_demo_jobs(self) -> None:
        from duetime.local.lambda_runtime import project_root

        path = self.options.demo_file or project_root() / "examples" / "demo_jobs.json"
        if not path.is_file():
            print(f"demo: {path} not found; no demo jobs", flush=True)
            return
        # "{now+20s}" in a demo expression becomes the UTC wall time 20 seconds from now
        text = re.sub(
            r"\{now\+(\d+)s\}",
            lambda m: (datetime.now(UTC) + timedelta(seconds=int(m.group(1)))).strftime("%Y-%m-%dT%H:%M:%S"),
            path.read_text(),
        )
        headers = {"Content-Type": "application/json"}
        if self.options.tenants:
            # the demo jobs belong to tenant 'local' if it is one (a start without --tenant made them its own,
            # so a later start with tenants keeps reaching them), else to the first tenant by name (whatever
            # the order of the flags); the API answers 401 without a token
            token, tenant = min(
                self.options.tenants.items(), key=lambda item: (item[1] != "local", item[1], item[0])
            )
            headers["Authorization"] = f"Bearer {token}"
            print(f"demo: the demo jobs are submitted as tenant {tenant!r}", flush=True)
        for body in json.loads(text):
            # a demo job's id is its name: a restart of a durable stack finds it instead of adding another
            body.setdefault("job_id", body.get("name"))
            request = urllib.request.Request(
                f"{self.api_url}/jobs", data=json.dumps(body).encode(), method="POST", headers=headers
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    job = json.loads(response.read())
                print(
                    f"demo: job {job['job_id']} {job['name']!r} next fire {job['next_fire_at'] or 'none left'}",
                    flush=True,
                )
            except urllib.error.HTTPError as exc:
                if exc.code == 409:
                    print(
                        f"demo: job {body['job_id']} {self._demo_job_kept(body['job_id'], headers)}",
                        flush=True,
                    )
                    continue
                print(f"demo: {body.get('name')!r} rejected: {exc.read().decode()}", flush=True)

    def _demo_job_kept(self, job_id: str, headers: dict[str, str]) -> str:
        """What to say of a demo job whose id is taken: kept from an earlier start (its tenant's, as now), or
        another tenant's (job ids are global: a start without --tenant makes the tenant 'local')."""
        request = urllib.request.Request(f"{self.api_url}/jobs/{job_id}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                job = json.loads(response.read())
            return (
                f"kept from an earlier start ({job['state']}, next fire {job['next_fire_at'] or 'none left'})"
            )
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return (
                "belongs to another tenant (jobs made by a start without --tenant belong to tenant 'local': "
                "add --tenant local:TOKEN to reach them)"
            )

    # ---- stop ----------------------------------------------------------------------------------------
    def catch_stop_signals(self) -> None:
        """From now on SIGINT and SIGTERM are recorded, for :meth:`wait` (:meth:`start` calls it first, so a
        signal that lands while the stack starts, after it said Ready included, is not lost)."""

        def on_signal(signum: int, _frame: Any) -> None:
            self._signals.append(signum)

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, on_signal)
            signal.signal(signal.SIGTERM, on_signal)

    def wait(self) -> None:
        """Block until SIGINT or SIGTERM, then stop.

        The handler only records the signal (a list append: no lock, no I/O; ``threading.Event.set`` takes a
        non-reentrant lock that a second signal, landing inside the first handler, would wait on forever).
        Signals during :meth:`stop` are recorded and ignored: the stop already under way finishes.
        """
        self.catch_stop_signals()
        while not self._signals:
            time.sleep(0.5)
        print("stopping...", flush=True)
        self.stop()

    def stop(self) -> None:
        """Stop workers (SIGTERM, then SIGKILL after 10 s), the API, the clock loop and moto's server."""
        self._stopping.set()
        for _, proc in self._workers:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for _, proc in self._workers:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        if self._api_server is not None:
            self._api_server.shutdown()
        for api_proc in self._api_procs:
            if api_proc.poll() is None:
                api_proc.terminate()
        for api_proc in self._api_procs:
            try:
                api_proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                api_proc.kill()
                api_proc.wait()
        if self._api_socket is not None:
            self._api_socket.close()
            self._api_socket = None
        if self._lambda is not None:
            self._lambda.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        for _, proc in self._workers:
            self._reap_task_of(proc.pid)
        if self._moto is not None and self._moto.poll() is None:
            self._moto.terminate()
            try:
                self._moto.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._moto.kill()
                self._moto.wait()
        with contextlib.suppress(OSError, ValueError, AttributeError):
            # only the state file this stack wrote (never another stack's): it points at ports now closed
            if json.loads(self.options.state_file.read_text()).get("stack_id") == self._stack_id:
                self.options.state_file.unlink()
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None
