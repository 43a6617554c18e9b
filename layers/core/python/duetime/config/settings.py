"""Runtime settings, read once from the environment and validated.

Every handler, the worker and the local stack read the same variables (UPPER_SNAKE, prefix ``DUETIME_``).
The CDK app sets them on each function; the local stack writes them for its child processes.

Raises:
    SettingsError: from :func:`get_settings` when a variable is missing or malformed; the message names
        the variable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from duetime.domain.errors import DuetimeError
from duetime.domain.retention import RetentionPolicy

#: Container tiers served by worker fleets, and the Lambda tier served by the dispatcher.
CONTAINER_TIERS: tuple[str, ...] = ("small", "medium", "large")
ALL_TIERS: tuple[str, ...] = ("lambda", *CONTAINER_TIERS)


#: the settings the AWS backend cannot do without (the embedded one, under ``state_dir``, needs none of them)
AWS_BACKEND_FIELDS: tuple[str, ...] = ("jobs_table", "runs_table", "logs_bucket", "queue_urls")


class SettingsError(DuetimeError):
    """A required setting is missing or invalid; the message names the environment variable."""


class Settings(BaseModel):
    """Validated runtime configuration. Durations are in seconds.

    Defaults follow DESIGN.md and [S0]: a 30 s lease renewed every 10 s, a 60 s tick with a lookahead
    that covers one tick period plus the tick's own running time.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the embedded backend's state directory (``DUETIME_STATE_DIR``): set, jobs, runs, queues and
    #: idempotency records live in ``<state_dir>/duetime.sqlite`` and logs under ``<state_dir>/logs``
    #: (``duetime local``'s default); unset, the AWS backend below (all four required)
    state_dir: str | None = None
    jobs_table: str = ""
    runs_table: str = ""
    logs_bucket: str = ""
    #: tier -> SQS queue URL, from ``DUETIME_QUEUE_URLS`` (a JSON object).
    queue_urls: dict[str, str] = Field(default_factory=dict)
    shard_count: int = Field(default=4, ge=1, le=1024)
    tick_period_seconds: float = Field(default=60.0, gt=0)
    #: extra lookahead beyond one tick period (covers the tick's own running time).
    tick_margin_seconds: float = Field(default=15.0, ge=0)
    #: claims a tick makes at once within its shard (threads; each claim is three round trips, so one shard
    #: claims about ``claim_concurrency`` times faster than sequentially); 1 = one after the other
    claim_concurrency: int = Field(default=8, ge=1, le=32)
    #: processes one tick claims its shard with (``DUETIME_TICK_PROCESSES``), each with
    #: ``claim_concurrency`` threads: a process's threads share one core through the GIL, so a tick's CPU
    #: (about 4 ms per claim) bounds a shard at about 250 claims/s per process. Bounded by the vCPUs of a
    #: Lambda function: 1 per 1,769 MB of memory, up to 6 at 10,240 MB ("Memory and computing power",
    #: AWS Lambda Developer Guide, "Configuring Lambda function memory"), and by the due-index keys of a
    #: shard the parts are made of (4, ``adapters.aws.resources.DUE_KEYS_PER_SHARD``: a fifth process would
    #: claim nothing); 1 (the default, and the local stack's): the tick claims in its own process
    tick_processes: int = Field(default=1, ge=1, le=4)
    #: due jobs claimed together, each claim step done for the batch at once (services.claims.claim_batch):
    #: on AWS one SendMessageBatch per 10 messages (SQS's limit, hence the default); the embedded store
    #: does a step for the whole batch in one transaction
    claim_batch_size: int = Field(default=10, ge=1, le=1000)
    lease_seconds: float = Field(default=30.0, gt=0)
    heartbeat_seconds: float = Field(default=10.0, gt=0)
    #: how long a PENDING run may sit past its due time before the sweeper re-sends its message.
    pending_grace_seconds: float = Field(default=60.0, gt=0)
    #: how long a worker's log thread waits for more of its tasks to end, while some still run, so their
    #: final logs go out as one object (a log pack; each attempt records its byte range); 0: only those that
    #: end together. It delays the record of an end, never a start.
    log_pack_window_seconds: float = Field(default=1.0, ge=0, le=10)
    #: above 0 (the AWS stages' ``log_pack_linger_seconds``, 15 by default): a worker records each end at once
    #: and stores the final logs of the ends of this many seconds as one log pack per tenant (or sooner, at
    #: 8 MiB or 1,000 logs, or at its stop), replacing ``log_pack_window_seconds``: fewer PUTs, but a
    #: just-ended run's log is readable only once its pack is stored (its chunks meanwhile, if it streamed
    #: any), and a worker killed within the linger loses the final logs of the runs it ended in it (what
    #: each printed after its last chunk: all of it for one that streamed none; docs/design/log-packs.md).
    #: 0 (the local stacks' default): ends wait for their logs
    log_pack_linger_seconds: float = Field(default=0.0, ge=0, le=60)
    #: seconds between a worker's SIGTERM and SIGKILL when it must stop a task.
    kill_grace_seconds: float = Field(default=10.0, ge=0)
    #: the hot window (domain/retention.py): days a finished run stays in the hot store (DynamoDB's TTL)
    #: before the archive; fractional (0.001 is 86.4 s)
    run_retention_days: float = Field(default=14.0, gt=0)
    #: days a FAILED, TIMED_OUT or dead-lettered run stays hot
    failed_run_retention_days: float = Field(default=90.0, gt=0)
    #: the last N runs of every job stay hot whatever their age
    keep_last_runs: int = Field(default=20, ge=0)
    #: the archive's S3 bucket (AWS); unset there, runs leaving the hot window are not readable by the API
    archive_bucket: str = ""
    #: AWS: the archiver's dead-letter queue: a batch it could not archive, its stream records whole, when
    #: the archive bucket cannot take them (and the stream's on-failure pointers)
    archiver_dlq_url: str | None = None
    #: the timeout-handler state machine; unset = the sweeper applies the same plan in-process.
    timeout_state_machine_arn: str | None = None
    #: Powertools idempotency table for ``Idempotency-Key`` requests; unset = the header is refused.
    idempotency_table: str | None = None
    #: how long a response is replayed for a repeated ``Idempotency-Key``, seconds (Powertools default: 1 h)
    idempotency_ttl_seconds: int = Field(default=3600, ge=60)
    #: per-tenant quotas (stage configuration): ACTIVE or PAUSED jobs, and job submits per minute
    tenant_max_active_jobs: int = Field(default=10_000, ge=1)
    tenant_submits_per_minute: int = Field(default=600, ge=1)
    #: per-tenant limit on RUNNING runs (a soft limit: two starts at the same instant may pass it by one);
    #: unset = no limit and no bookkeeping
    tenant_max_running: int | None = Field(default=None, ge=1)
    # ---- notifications (docs/design/notifications.md) ----
    #: a webhook try's timeout, seconds
    notify_timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    #: the first retry's backoff ceiling and the longest, seconds (equal jitter, doubling)
    notify_backoff_seconds: float = Field(default=5.0, gt=0)
    notify_max_backoff_seconds: float = Field(default=3600.0, gt=0)
    #: how long a delivery is retried before it is dead-lettered, seconds (about a day)
    notify_window_seconds: float = Field(default=86_400.0, gt=0)
    #: webhooks may go to loopback over plain HTTP and to private addresses (the local stack sets it; the
    #: embedded backend allows it anyway)
    notify_allow_private: bool = False
    #: AWS: the notifier's table (events, deliveries, incidents; TTL) and queue (late/overran signals and
    #: delivery retries); the SNS topic name prefix of the tenants' email topics
    notifications_table: str | None = None
    notifications_queue_url: str | None = None
    email_topic_prefix: str = "duetime-email"
    #: AWS: the account the stack runs in; a rule's ``sns_topic_arn`` must name a topic of it (unset: any)
    aws_account_id: str | None = None
    #: the console's sign-in on AWS (``/console/shell``): the OIDC issuer's authorization and token
    #: endpoints and the console's public client (authorization code with PKCE); unset, no shell is served
    console_authorize_url: str | None = Field(default=None, pattern=r"^https?://")
    console_token_url: str | None = Field(default=None, pattern=r"^https?://")
    console_client_id: str | None = None

    @property
    def retention(self) -> RetentionPolicy:
        """The hot window's tiers."""
        return RetentionPolicy(
            hot_days=self.run_retention_days,
            failed_days=self.failed_run_retention_days,
            keep_last=self.keep_last_runs,
        )

    @property
    def webhooks_local(self) -> bool:
        """Whether webhook URLs follow the local stack's rules (loopback HTTP, private addresses)."""
        return self.state_dir is not None or self.notify_allow_private

    @field_validator("queue_urls")
    @classmethod
    def _known_tiers(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = set(value) - set(ALL_TIERS)
        if unknown:
            raise ValueError(f"unknown tiers {sorted(unknown)}; tiers are {list(ALL_TIERS)}")
        return value

    @model_validator(mode="after")
    def _backend_complete(self) -> Settings:
        if self.state_dir is None:
            for name in AWS_BACKEND_FIELDS:
                if not getattr(self, name):
                    # reported as the variable being missing (settings_from_env names it)
                    raise PydanticCustomError("missing", "{field} is required", {"field": name})
        return self

    @property
    def backend(self) -> str:
        """``"sqlite"`` (the embedded backend, under ``state_dir``) or ``"aws"``."""
        return "sqlite" if self.state_dir is not None else "aws"

    @property
    def tick_lookahead_seconds(self) -> float:
        """How far ahead of now a tick (or the API) claims runs: one tick period plus the margin."""
        return self.tick_period_seconds + self.tick_margin_seconds

    @property
    def first_watch_seconds(self) -> float:
        """Seconds after a run's due time (or a retry's wake-up) at which the sweeper first looks at it: the
        sooner of the pending grace and the lease. A start leaves the watch time, and a worker writes
        nothing to a running run's row (so a run that ends sooner never moves in the watchdog index); at
        this first look the sweeper finds a worker that died early in the run (within its lease + one
        sweep), moves a run still running to its lease's end, and leaves a run still PENDING until its
        pending grace has passed before re-sending it."""
        return min(self.pending_grace_seconds, self.lease_seconds)

    def queue_url(self, tier: str) -> str:
        """The queue URL of ``tier``. Raises SettingsError if the stack has no queue for it."""
        try:
            return self.queue_urls[tier]
        except KeyError:
            raise SettingsError(f"no queue configured for tier {tier!r} (DUETIME_QUEUE_URLS)") from None


#: environment variable -> Settings field
ENV_VARS: dict[str, str] = {
    "DUETIME_STATE_DIR": "state_dir",
    "DUETIME_JOBS_TABLE": "jobs_table",
    "DUETIME_RUNS_TABLE": "runs_table",
    "DUETIME_LOGS_BUCKET": "logs_bucket",
    "DUETIME_QUEUE_URLS": "queue_urls",
    "DUETIME_SHARD_COUNT": "shard_count",
    "DUETIME_TICK_PERIOD_SECONDS": "tick_period_seconds",
    "DUETIME_TICK_MARGIN_SECONDS": "tick_margin_seconds",
    "DUETIME_CLAIM_CONCURRENCY": "claim_concurrency",
    "DUETIME_TICK_PROCESSES": "tick_processes",
    "DUETIME_CLAIM_BATCH_SIZE": "claim_batch_size",
    "DUETIME_LEASE_SECONDS": "lease_seconds",
    "DUETIME_HEARTBEAT_SECONDS": "heartbeat_seconds",
    "DUETIME_PENDING_GRACE_SECONDS": "pending_grace_seconds",
    "DUETIME_LOG_PACK_WINDOW_SECONDS": "log_pack_window_seconds",
    "DUETIME_LOG_PACK_LINGER_SECONDS": "log_pack_linger_seconds",
    "DUETIME_KILL_GRACE_SECONDS": "kill_grace_seconds",
    "DUETIME_RUN_RETENTION_DAYS": "run_retention_days",
    "DUETIME_FAILED_RUN_RETENTION_DAYS": "failed_run_retention_days",
    "DUETIME_KEEP_LAST_RUNS": "keep_last_runs",
    "DUETIME_ARCHIVE_BUCKET": "archive_bucket",
    "DUETIME_ARCHIVER_DLQ_URL": "archiver_dlq_url",
    "DUETIME_TIMEOUT_STATE_MACHINE_ARN": "timeout_state_machine_arn",
    "DUETIME_IDEMPOTENCY_TABLE": "idempotency_table",
    "DUETIME_IDEMPOTENCY_TTL_SECONDS": "idempotency_ttl_seconds",
    "DUETIME_TENANT_MAX_ACTIVE_JOBS": "tenant_max_active_jobs",
    "DUETIME_TENANT_SUBMITS_PER_MINUTE": "tenant_submits_per_minute",
    "DUETIME_TENANT_MAX_RUNNING": "tenant_max_running",
    "DUETIME_NOTIFY_TIMEOUT_SECONDS": "notify_timeout_seconds",
    "DUETIME_NOTIFY_BACKOFF_SECONDS": "notify_backoff_seconds",
    "DUETIME_NOTIFY_MAX_BACKOFF_SECONDS": "notify_max_backoff_seconds",
    "DUETIME_NOTIFY_WINDOW_SECONDS": "notify_window_seconds",
    "DUETIME_NOTIFY_ALLOW_PRIVATE": "notify_allow_private",
    "DUETIME_NOTIFICATIONS_TABLE": "notifications_table",
    "DUETIME_NOTIFICATIONS_QUEUE_URL": "notifications_queue_url",
    "DUETIME_EMAIL_TOPIC_PREFIX": "email_topic_prefix",
    "DUETIME_AWS_ACCOUNT_ID": "aws_account_id",
    "DUETIME_CONSOLE_AUTHORIZE_URL": "console_authorize_url",
    "DUETIME_CONSOLE_TOKEN_URL": "console_token_url",
    "DUETIME_CONSOLE_CLIENT_ID": "console_client_id",
}


def settings_from_env(environ: Mapping[str, str]) -> Settings:
    """Build :class:`Settings` from a mapping of environment variables.

    Raises:
        SettingsError: naming the first missing or invalid variable.
    """
    values: dict[str, object] = {}
    for var, field in ENV_VARS.items():
        if var not in environ:
            continue
        raw = environ[var]
        if field == "queue_urls":
            try:
                values[field] = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise SettingsError(f"{var} must be a JSON object of tier -> queue URL: {exc}") from None
        else:
            values[field] = raw
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else str((first.get("ctx") or {}).get("field", "?"))
        var = next((v for v, f in ENV_VARS.items() if f == field), field)
        problem = "is required" if first["type"] == "missing" else first["msg"]
        raise SettingsError(f"{var} {problem}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once from ``os.environ``. Tests call ``get_settings.cache_clear()``."""
    return settings_from_env(os.environ)


def settings_to_env(settings: Settings) -> dict[str, str]:
    """The environment variables that reproduce ``settings`` (for child processes and the CDK app)."""
    env: dict[str, str] = {}
    for var, field in ENV_VARS.items():
        value = getattr(settings, field)
        if value is None:
            continue
        env[var] = json.dumps(value) if isinstance(value, dict) else str(value)
    return env
