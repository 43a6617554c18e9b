"""The runtime environment of every Duetime process in AWS (functions and workers).

Built through ``duetime.config.settings`` itself: a :class:`~duetime.config.settings.Settings` is validated with the stack's
resource names (CloudFormation tokens) and the stage's values, then turned into variables by
``settings_to_env``, so the names are exactly the ones the code reads and every value passes the code's own
validation at synth time. ``DUETIME_QUEUE_URLS`` is rendered by CloudFormation (``Fn::Join``) so that the
URLs, unknown until deploy, end up inside a real JSON object.
"""

from __future__ import annotations

from aws_cdk import Stack
from constructs import Construct

from duetime.config.settings import Settings, settings_to_env
from infra.config import TICK_PERIOD_SECONDS, StageConfig
from infra.constructs.archive import Archive
from infra.constructs.notifications import Notifications
from infra.constructs.queues import TierQueues
from infra.constructs.storage import Storage

QUEUE_URLS_VAR = "DUETIME_QUEUE_URLS"


def runtime_environment(
    scope: Construct,
    *,
    config: StageConfig,
    storage: Storage,
    queues: TierQueues,
    archive: Archive | None = None,
    timeout_state_machine_arn: str | None = None,
    notifications: Notifications | None = None,
) -> dict[str, str]:
    """Every ``DUETIME_*`` variable (``settings.ENV_VARS``) for this stack and stage."""
    values: dict[str, object] = {
        "jobs_table": storage.jobs.table_name,
        "runs_table": storage.runs.table_name,
        "logs_bucket": storage.logs_bucket_name,
        "queue_urls": queues.urls,
        "shard_count": config.shard_count,
        "tick_processes": config.tick_processes,  # read by the tick alone
        "tick_period_seconds": TICK_PERIOD_SECONDS,
        "run_retention_days": config.retention_days,
        "failed_run_retention_days": config.failed_run_retention_days,
        "keep_last_runs": config.keep_last_runs,
        "log_pack_linger_seconds": config.log_pack_linger_seconds,  # the workers; the API tells pending logs by it
    }
    if archive is not None:  # run history past the hot window (issue 19)
        values["archive_bucket"] = archive.bucket.bucket_name
        values["archiver_dlq_url"] = archive.dead_letter_queue.queue_url
    if "idempotency_table" in Settings.model_fields:  # Powertools idempotency of Idempotency-Key requests
        values["idempotency_table"] = storage.idempotency.table_name
    if (
        timeout_state_machine_arn is not None
    ):  # the sweeper hands stuck attempts to it (duetime.services.timeouts)
        values["timeout_state_machine_arn"] = timeout_state_machine_arn
    if notifications is not None:  # the notifier's ports (the API, the sweeper and the notifier use them)
        values["notifications_table"] = notifications.table.table_name
        values["notifications_queue_url"] = notifications.queue.queue_url
        values["email_topic_prefix"] = notifications.email_topic_prefix
        values["aws_account_id"] = Stack.of(scope).account  # sns_topic_arn rules must name its topics
    settings = Settings.model_validate(values)
    env = settings_to_env(settings)
    env[QUEUE_URLS_VAR] = Stack.of(scope).to_json_string(queues.urls)
    return env
