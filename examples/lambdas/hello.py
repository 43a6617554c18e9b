"""A demo Lambda task's function: greets, shows what Duetime handed it, and returns a result.

Registered for the local stack in pyproject.toml's ``[tool.duetime.local.lambdas]`` as ``hello``; the demo
job ``demo-lambda`` in ``examples/demo_jobs.json`` runs it. In AWS, deploy it with the handler
``hello.lambda_handler`` and the core layer, retries off (``MaximumRetryAttempts=0``) and Duetime's ``finish``
function as its success and failure destination.
"""

from __future__ import annotations

from typing import Any

from duetime.lambda_target import RunInfo, run_task


@run_task
def lambda_handler(payload: dict[str, Any], run: RunInfo) -> dict[str, Any]:
    name = payload.get("name", "world")
    # anything this function changes should be keyed by run.idempotency_key: a retry reuses it
    print(f"hello, {name}: run {run.run_id}, attempt {run.attempt}, fencing token {run.fencing_token}")
    return {"greeting": f"hello, {name}", "run_id": run.run_id, "attempt": run.attempt}
