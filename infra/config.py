"""Stage configuration: everything that differs between two deployments of Duetime.

A stage is picked with ``-c stage=NAME`` (default ``dev``). Its settings are the defaults below, overlaid by
``context.stages.NAME`` in ``cdk.json`` (where the ``dev`` and ``prod`` presets live), overlaid by
``-c duetime:FIELD=VALUE`` for one top-level field (``-c duetime:shard_count=8``). Several stages can live in
one account: nothing here names a physical resource; CloudFormation names them after the stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from duetime.adapters.aws.resources import jobs_table_definition, runs_table_definition
from duetime.config.settings import CONTAINER_TIERS, Settings

#: Context keys read by :func:`stage_from_context`.
#: EventBridge Scheduler invokes every shard's tick at this period, seconds (``rate(1 minute)``).
TICK_PERIOD_SECONDS = 60
#: Lambda's memory sizes and the vCPUs they come with: 1 vCPU per 1,769 MB, up to 6 vCPUs at 10,240 MB
#: ("Memory and computing power", AWS Lambda Developer Guide, "Configuring Lambda function memory")
LAMBDA_MB_PER_VCPU = 1769
LAMBDA_MAX_MEMORY_MB = 10_240
#: the tick function's memory when it claims in one process (its own 1 vCPU share is plenty for the I/O)
TICK_ONE_PROCESS_MEMORY_MB = 512
STAGE_CONTEXT_KEY = "stage"
STAGES_CONTEXT_KEY = "stages"
OVERRIDE_PREFIX = "duetime:"


#: CloudWatch Logs' retention periods, days -> the name of ``aws_logs.RetentionDays``' member.
def warm_throughput_keys() -> tuple[str, ...]:
    """What a stage's ``warm_throughput`` may name: each table, and each index as ``<table>.<index>``."""
    indexes = [
        f"{table}.{gsi['IndexName']}"
        for table, definition in (
            ("jobs", jobs_table_definition("jobs")),
            ("runs", runs_table_definition("runs")),
        )
        for gsi in definition.get("GlobalSecondaryIndexes", [])
    ]
    return ("jobs", "runs", "idempotency", *indexes)


LOG_RETENTION_DAYS: dict[int, str] = {
    1: "ONE_DAY",
    3: "THREE_DAYS",
    5: "FIVE_DAYS",
    7: "ONE_WEEK",
    14: "TWO_WEEKS",
    30: "ONE_MONTH",
    60: "TWO_MONTHS",
    90: "THREE_MONTHS",
    120: "FOUR_MONTHS",
    150: "FIVE_MONTHS",
    180: "SIX_MONTHS",
    365: "ONE_YEAR",
    400: "THIRTEEN_MONTHS",
    545: "EIGHTEEN_MONTHS",
    731: "TWO_YEARS",
    1096: "THREE_YEARS",
    1827: "FIVE_YEARS",
    2192: "SIX_YEARS",
    2557: "SEVEN_YEARS",
    2922: "EIGHT_YEARS",
    3288: "NINE_YEARS",
    3653: "TEN_YEARS",
}

#: Fargate's valid (cpu units -> memory MiB) pairs.
FARGATE_MEMORY: dict[int, tuple[int, ...]] = {
    256: (512, 1024, 2048),
    512: tuple(range(1024, 4097, 1024)),
    1024: tuple(range(2048, 8193, 1024)),
    2048: tuple(range(4096, 16385, 1024)),
    4096: tuple(range(8192, 30721, 1024)),
    8192: tuple(range(16384, 61441, 4096)),
    16384: tuple(range(32768, 122881, 8192)),
}


def fargate_memory_ok(cpu: int, memory_mib: int) -> bool:
    """Whether Fargate accepts ``cpu`` units with ``memory_mib``."""
    return memory_mib in FARGATE_MEMORY.get(cpu, ())


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkerTierConfig(Frozen):
    """One container tier's Fargate service: task size and autoscaling bounds."""

    cpu: int = Field(description="Fargate CPU units (1024 = 1 vCPU)")
    memory_mib: int
    min_tasks: int = Field(ge=0, le=1000)
    max_tasks: int = Field(ge=1, le=1000)
    #: tasks one worker runs at once (its ``--slots``): they share the Fargate task's CPU and memory, so the
    #: smaller the task size, the fewer (``duetime local``'s workers, with a whole machine, default to more:
    #: duetime.services.worker.DEFAULT_SLOTS); 1 unless the stage says: a task may need the whole container
    slots: int = Field(default=1, ge=1, le=64)
    #: alarm when the oldest message is older than this: delay (<= 900 s) + wait + the run's own duration,
    #: because a worker keeps its message in flight until the run finishes.
    queue_age_alarm_seconds: int = Field(default=4500, ge=60)

    @model_validator(mode="after")
    def _valid(self) -> WorkerTierConfig:
        if not fargate_memory_ok(self.cpu, self.memory_mib):
            raise ValueError(f"Fargate does not accept cpu={self.cpu} with memory_mib={self.memory_mib}")
        if self.min_tasks > self.max_tasks:
            raise ValueError(f"min_tasks {self.min_tasks} > max_tasks {self.max_tasks}")
        return self


def _default_tiers() -> dict[str, WorkerTierConfig]:
    return {
        "small": WorkerTierConfig(cpu=256, memory_mib=512, min_tasks=1, max_tasks=10, slots=4),
        "medium": WorkerTierConfig(cpu=1024, memory_mib=2048, min_tasks=0, max_tasks=5, slots=2),
        "large": WorkerTierConfig(cpu=4096, memory_mib=8192, min_tasks=0, max_tasks=2, slots=1),
    }


class AlarmConfig(Frozen):
    """Alarm thresholds. Lag is start - due of a run (metric ``ScheduleLag``, seconds)."""

    schedule_lag_p99_seconds: float = Field(default=5.0, gt=0)
    #: the lambda tier's queue: delay (<= 900 s) + dispatcher time; older means the dispatcher is stuck.
    lambda_queue_age_seconds: int = Field(default=1200, ge=60)
    #: any message in a dead-letter queue is a run SQS gave up delivering.
    dlq_depth: int = Field(default=1, ge=1)
    #: ``RunDeadLettered`` (runs that exhausted their attempts) per 5 minutes.
    dead_letters_per_5_minutes: int = Field(default=1, ge=1)
    #: 5xx answers of the HTTP API per 5 minutes.
    api_5xx_per_5_minutes: int = Field(default=5, ge=1)
    #: errors of the tick and sweeper functions per 5 minutes.
    function_errors_per_5_minutes: int = Field(default=1, ge=1)


class WarmThroughputConfig(Frozen):
    """A table's or index's warm throughput: the units per second DynamoDB serves at once, without waiting
    to split partitions (a new on-demand table starts at 12,000 reads and 4,000 writes a second and serves
    up to double its previous peak; a top-of-the-hour burst above that is throttled while it splits).
    Values can only rise: lower ones fail the deployment (hence the bounds). Source: DynamoDB Developer
    Guide, "Understanding DynamoDB warm throughput"."""

    read_units_per_second: int | None = Field(default=None, ge=12_000)
    write_units_per_second: int | None = Field(default=None, ge=4_000)


class LifecycleConfig(Frozen):
    """An S3 lifecycle: objects move Standard -> Standard-IA -> Glacier Instant Retrieval (both read at once
    by a GET, so the API serves them as before) and optionally expire; days after each object's creation.

    S3's rules (Amazon S3 User Guide, "Transitioning objects using Amazon S3 Lifecycle"): an object goes to
    Standard-IA no sooner than 30 days after creation and stays there at least 30 days before a later
    transition; lifecycle transitions skip objects under 128 KB (hence small logs ride in the archive objects).
    Glacier Instant Retrieval bills at least 90 days per object, so an expiry soon after it costs that anyway.
    """

    infrequent_access_days: int = Field(default=30, ge=30)
    glacier_instant_retrieval_days: int = Field(default=90, ge=60)
    #: None: kept until deleted
    expiration_days: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> LifecycleConfig:
        if self.glacier_instant_retrieval_days < self.infrequent_access_days + 30:
            raise ValueError(
                "glacier_instant_retrieval_days must be at least 30 days after infrequent_access_days"
            )
        if self.expiration_days is not None and self.expiration_days <= self.glacier_instant_retrieval_days:
            raise ValueError("expiration_days must come after glacier_instant_retrieval_days")
        return self


def _default_log_lifecycle() -> LifecycleConfig:
    return LifecycleConfig(expiration_days=365)


class ConsoleConfig(Frozen):
    """The web console's sign-in on AWS (``infra/constructs/console.py``): the static shell at
    ``/console/shell`` signs people in with the authorization code flow and PKCE, and every page it loads
    carries the access token through the stage's JWT authorizer.

    ``sign_in: cognito`` creates a Cognito user pool (no self sign-up, MFA required), an app client without
    a secret and the hosted UI at ``https://<domain_prefix>.auth.<region>.amazoncognito.com``; the pool is
    then the JWT authorizer's issuer and the client its audience (the stage's ``jwt_issuer`` and
    ``jwt_audience`` stay unset). ``sign_in: oidc`` uses any OIDC issuer: the stage's ``jwt_issuer``, with
    its ``authorize_url``, ``token_url`` and a public ``client_id`` (which must be in ``jwt_audience``)."""

    sign_in: Literal["cognito", "oidc"] = "cognito"
    #: cognito: the hosted UI's domain prefix (unique in the region)
    domain_prefix: str | None = Field(default=None, pattern=r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
    #: oidc: the issuer's endpoints and the console's public client
    authorize_url: str | None = Field(default=None, pattern=r"^https://")
    token_url: str | None = Field(default=None, pattern=r"^https://")
    client_id: str | None = None
    #: more sign-in callback URLs than the API's own ``/console/shell`` (a custom domain)
    callback_urls: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _valid(self) -> ConsoleConfig:
        if self.sign_in == "cognito" and not self.domain_prefix:
            raise ValueError("console sign_in 'cognito' needs domain_prefix (the hosted UI's domain)")
        if self.sign_in == "oidc" and not (self.authorize_url and self.token_url and self.client_id):
            raise ValueError("console sign_in 'oidc' needs authorize_url, token_url and client_id")
        return self


class StageConfig(Frozen):
    """The settings of one deployment (one CloudFormation stack)."""

    name: str = Field(default="dev", pattern=r"^[A-Za-z][A-Za-z0-9-]{0,31}$")
    #: optional fixed account/region; left out, the stack is environment-agnostic (synth needs no AWS).
    account: str | None = Field(default=None, pattern=r"^\d{12}$")
    region: str | None = None
    #: shards of the jobs table: one EventBridge Scheduler schedule (and tick) per shard.
    shard_count: int = Field(default=4, ge=1, le=1024)
    #: processes each tick claims its shard with (``DUETIME_TICK_PROCESSES``): above 1, the tick function
    #: gets the memory of that many vCPUs (:attr:`tick_memory_mb`); at most 4, a shard's due-index keys
    #: (``DUE_KEYS_PER_SHARD``: each process claims its own keys; Lambda itself gives up to 6 vCPUs)
    tick_processes: int = Field(default=1, ge=1, le=4)
    #: the hot window (``DUETIME_RUN_RETENTION_DAYS``): days a finished run stays in the runs table before
    #: DynamoDB's TTL sends it to the archive (``duetime.domain.retention``); fractional
    retention_days: float = Field(default=14.0, gt=0, le=3650)
    #: days a FAILED, TIMED_OUT or dead-lettered run stays hot (``DUETIME_FAILED_RUN_RETENTION_DAYS``)
    failed_run_retention_days: float = Field(default=90.0, gt=0, le=3650)
    #: the last N runs of every job stay hot whatever their age (``DUETIME_KEEP_LAST_RUNS``)
    keep_last_runs: int = Field(default=20, ge=0, le=1000)
    #: seconds a worker gathers the final logs of the runs it ends into one log pack, recording each end at
    #: once (``DUETIME_LOG_PACK_LINGER_SECONDS``): one S3 PUT for the ends of that long instead of one per
    #: moment; a worker killed within it loses the final logs of the runs it ended in it (what a run printed
    #: after its last chunk; all of it for one shorter than 5 s), and a just-ended run's log is readable once
    #: its pack lands. 0: every end waits for
    #: its log (``log_pack_window_seconds``, 1 s)
    log_pack_linger_seconds: float = Field(default=15.0, ge=0, le=60)
    #: the run archive's bucket (``archive/runs/``): kept until deleted by default
    archive_lifecycle: LifecycleConfig = Field(default_factory=LifecycleConfig)
    #: the run logs' bucket: must outlive the longest hot tier (a hot run's log is read from there, and so
    #: is an archived run's log over 128 KB, until this expiry); a directory bucket (``log_storage``
    #: ``express``) has no transitions and only expires
    log_lifecycle: LifecycleConfig = Field(default_factory=_default_log_lifecycle)
    #: days Athena's query results are kept (the workgroup's result location in the archive bucket)
    athena_results_days: int = Field(default=30, ge=1)
    #: CloudWatch Logs retention of functions, workers, API access logs and VPC flow logs.
    log_retention_days: int = Field(default=30)
    #: keep tables (RETAIN + deletion protection) when the stack is deleted.
    retain_data: bool = True
    alarms: AlarmConfig = Field(default_factory=AlarmConfig)
    alarm_email: str | None = Field(default=None, description="subscribed to the alarm topic when set")
    workers: dict[str, WorkerTierConfig] = Field(default_factory=_default_tiers)
    #: minutes a container tier must be completely idle (nothing visible, nothing in flight) before it
    #: scales back to its minimum; autoscaling therefore never stops a worker that is running a task.
    scale_in_idle_minutes: int = Field(default=15, ge=1, le=1440)
    #: NAT gateways for the workers' private subnets (1 = cheapest; one per AZ for AZ-independent egress).
    nat_gateways: int = Field(default=1, ge=1, le=2)
    authorizer: Literal["iam", "jwt"] = "iam"
    jwt_issuer: str | None = None
    jwt_audience: tuple[str, ...] = ()
    #: the web console's sign-in (None: the API serves no console shell; IAM-only stages can have none)
    console: ConsoleConfig | None = None
    api_rate_limit: float = Field(default=100.0, gt=0, description="steady requests/s for the whole API")
    api_burst_limit: int = Field(default=200, ge=1)
    #: where run logs live: ``standard`` (an S3 general purpose bucket, multi-AZ) or ``express`` (an S3
    #: Express One Zone directory bucket in ``log_zone``: PUTs at $0.00113 per 1,000 instead of $0.005, storage
    #: at $0.11 per GB-month instead of $0.023, one Availability Zone; `bench cost` prices both)
    log_storage: Literal["standard", "express"] = "standard"
    #: the Availability Zone ID of the express logs bucket (``use1-az4``: an AZ ID, not a name, see "Regions
    #: and Zones for directory buckets", Amazon S3 User Guide); put the workers' subnets' AZ first
    log_zone: str | None = Field(default=None, pattern=r"^[a-z]{2,4}[0-9]-az[0-9]{1,2}$")
    #: warm throughput per table (``jobs``, ``runs``, ``idempotency``) or index (``runs.watchdog``): size it
    #: to the expected peak (``python -m bench model`` gives the write units per second of each at 12K
    #: starts/s); empty: DynamoDB's defaults
    warm_throughput: dict[str, WarmThroughputConfig] = Field(default_factory=dict)

    @property
    def tick_memory_mb(self) -> int:
        """The tick function's memory, MB: 512 for one process; else ``tick_processes`` vCPUs' worth
        (1,769 MB each, capped at Lambda's 10,240 MB: 6 vCPUs), so each process has a core of its own."""
        if self.tick_processes == 1:
            return TICK_ONE_PROCESS_MEMORY_MB
        return min(LAMBDA_MAX_MEMORY_MB, self.tick_processes * LAMBDA_MB_PER_VCPU)

    @property
    def log_retention(self) -> str:
        """``aws_logs.RetentionDays`` member name of ``log_retention_days``."""
        return LOG_RETENTION_DAYS[self.log_retention_days]

    @model_validator(mode="after")
    def _valid(self) -> StageConfig:
        if self.log_retention_days not in LOG_RETENTION_DAYS:
            raise ValueError(f"log_retention_days must be one of {sorted(LOG_RETENTION_DAYS)}")
        missing = set(CONTAINER_TIERS) - set(self.workers)
        unknown = set(self.workers) - set(CONTAINER_TIERS)
        if missing or unknown:
            raise ValueError(f"workers must configure exactly the tiers {list(CONTAINER_TIERS)}")
        unknown_warm = set(self.warm_throughput) - set(warm_throughput_keys())
        if unknown_warm:
            raise ValueError(
                f"warm_throughput names no table or index {sorted(unknown_warm)}: {warm_throughput_keys()}"
            )
        if self.log_storage == "express" and self.log_zone is None:
            raise ValueError(
                "log_storage 'express' needs log_zone (an Availability Zone ID such as use1-az4)"
            )
        cognito = self.console is not None and self.console.sign_in == "cognito"
        if self.console is not None and self.authorizer != "jwt":
            raise ValueError(
                "console needs authorizer 'jwt' (a browser cannot sign IAM requests: see the README's "
                "answer for IAM-only deployments)"
            )
        if cognito and (self.jwt_issuer or self.jwt_audience):
            raise ValueError(
                "console sign_in 'cognito' makes its user pool the issuer: leave jwt_issuer unset"
            )
        if self.authorizer == "jwt" and not cognito and (not self.jwt_issuer or not self.jwt_audience):
            raise ValueError("authorizer 'jwt' needs jwt_issuer and jwt_audience")
        expiry = self.log_lifecycle.expiration_days
        if expiry is not None and expiry < max(self.retention_days, self.failed_run_retention_days):
            raise ValueError(
                "log_lifecycle.expiration_days must be at least the longest hot window "
                "(retention_days, failed_run_retention_days): a hot run's log would be gone"
            )
        if (
            self.console is not None
            and self.console.sign_in == "oidc"
            and self.console.client_id not in self.jwt_audience
        ):
            raise ValueError("console client_id must be one of jwt_audience (the authorizer checks it)")
        # the same bounds the handlers enforce at run time: fail at synth, not at the first invocation
        Settings.model_validate(
            {
                "jobs_table": "-",
                "runs_table": "-",
                "logs_bucket": "-",
                "queue_urls": {"small": "-"},
                "shard_count": self.shard_count,
                "tick_processes": self.tick_processes,
                "run_retention_days": self.retention_days,
                "failed_run_retention_days": self.failed_run_retention_days,
                "keep_last_runs": self.keep_last_runs,
            }
        )
        return self


def _merge(base: dict[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``overlay`` over ``base``, recursively for nested objects (so a preset can change one tier)."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def stage_from_context(get: Any) -> StageConfig:
    """The stage selected by the CDK context.

    Args:
        get: ``node.try_get_context``-like callable: key -> value or None.
    """
    name = str(get(STAGE_CONTEXT_KEY) or "dev")
    presets = get(STAGES_CONTEXT_KEY) or {}
    values: dict[str, Any] = StageConfig(name=name).model_dump()
    values = _merge(values, presets.get(name, {}))
    for field in StageConfig.model_fields:
        override = get(OVERRIDE_PREFIX + field)
        if override is not None:
            values[field] = override
    values["name"] = name
    return StageConfig.model_validate(values)
