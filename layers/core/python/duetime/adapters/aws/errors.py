"""AWS SDK errors in Duetime's terms: the one place that reads botocore error codes outside a single call.

Each adapter translates the failures it expects from its own calls (a failed condition becomes the
transition's error or None). What is left, a refusal for capacity after the SDK's own retries, is
translated here for whoever answers a caller (the API: 503 with Retry-After).
"""

from __future__ import annotations

from botocore.exceptions import ClientError

from duetime.domain.errors import DuetimeError, ThrottledError

#: the SDK's error class for a refused call (what an adapter lets through when it is not expected)
SdkError = ClientError

#: Error codes of AWS capacity refusals (after the SDK's own retries), answered as 503 + Retry-After.
#: Duetime's own list (botocore keeps its list private), from AWS's error code documentation: the common
#: errors of the AWS APIs (Throttling, ThrottlingException, TooManyRequestsException, LimitExceededException,
#: RequestLimitExceeded), DynamoDB's "Error handling with DynamoDB" (ProvisionedThroughputExceededException,
#: ThrottlingException, RequestLimitExceeded, TransactionInProgressException), SQS's API errors
#: (RequestThrottled, ThrottlingException) and S3's (SlowDown); plus the rest of what botocore's standard retry
#: mode retries as throttling, so that none of it is a 500. tests/unit/test_api_errors.py warns when botocore's
#: list grows a code this tuple lacks.
THROTTLING_CODES: tuple[str, ...] = (
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
)


def translate(exc: ClientError) -> DuetimeError | None:
    """``exc`` as a Duetime error: :class:`ThrottledError` for a capacity refusal (its code is in
    :data:`THROTTLING_CODES`), else None (a fault Duetime has no name for: a server error)."""
    code = exc.response.get("Error", {}).get("Code", "")
    if code in THROTTLING_CODES:
        return ThrottledError(f"AWS throttled {exc.operation_name} ({code})")
    return None
