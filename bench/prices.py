"""AWS list prices used by the cost benchmark: us-east-1, on-demand, USD, no free tier, no discounts.

Kept in this one file with their date and source. They were taken from AWS's public pricing pages (this
machine has no network to re-check them); change them here when AWS changes its prices, and the README's
figures with the next ``make bench``.
"""

from __future__ import annotations

#: when these prices were taken from the pages below
PRICES_DATE = "2025-11 (DynamoDB on-demand after the 2024-11-01 50 % reduction)"
REGION = "us-east-1"

#: price per unit, USD; unit; source
PRICES: dict[str, tuple[float, str, str]] = {
    "dynamodb_wru": (
        0.625 / 1e6,
        "write request unit (on-demand, Standard table class)",
        "https://aws.amazon.com/dynamodb/pricing/on-demand/",
    ),
    "dynamodb_rru": (
        0.125 / 1e6,
        "read request unit (on-demand, Standard table class)",
        "https://aws.amazon.com/dynamodb/pricing/on-demand/",
    ),
    "dynamodb_wcu_hour": (
        0.00065,
        "provisioned write capacity unit-hour (Standard table class)",
        "https://aws.amazon.com/dynamodb/pricing/provisioned/",
    ),
    "dynamodb_rcu_hour": (
        0.00013,
        "provisioned read capacity unit-hour (Standard table class)",
        "https://aws.amazon.com/dynamodb/pricing/provisioned/",
    ),
    "sqs_request": (
        0.40 / 1e6,
        "standard queue request (each 64 KB chunk of payload is one request; after the first 1M/month)",
        "https://aws.amazon.com/sqs/pricing/",
    ),
    "lambda_request": (0.20 / 1e6, "Lambda invocation", "https://aws.amazon.com/lambda/pricing/"),
    "lambda_gb_second_arm64": (
        0.0000133334,
        "Lambda GB-second, arm64 (first 7.5 billion GB-s/month tier)",
        "https://aws.amazon.com/lambda/pricing/",
    ),
    "sfn_transition": (
        0.025 / 1e3,
        "Step Functions Standard state transition",
        "https://aws.amazon.com/step-functions/pricing/",
    ),
    "s3_put": (0.005 / 1e3, "S3 Standard PUT/COPY/POST/LIST request", "https://aws.amazon.com/s3/pricing/"),
    "s3_get": (0.0004 / 1e3, "S3 Standard GET/SELECT request", "https://aws.amazon.com/s3/pricing/"),
    "apigw_http_request": (
        1.00 / 1e6,
        "API Gateway HTTP API request (first 300M/month; per 512 KB)",
        "https://aws.amazon.com/api-gateway/pricing/",
    ),
    "dynamodb_storage_gb_month": (
        0.25,
        "DynamoDB Standard table class storage, per GB-month (each item + 100 bytes of overhead)",
        "https://aws.amazon.com/dynamodb/pricing/on-demand/",
    ),
    "s3_storage_gb_month": (
        0.023,
        "S3 Standard storage, per GB-month (first 50 TB)",
        "https://aws.amazon.com/s3/pricing/",
    ),
    "s3_ia_storage_gb_month": (
        0.0125,
        "S3 Standard-Infrequent Access storage, per GB-month (each object billed as at least 128 KB)",
        "https://aws.amazon.com/s3/pricing/",
    ),
    "s3_glacier_ir_storage_gb_month": (
        0.004,
        "S3 Glacier Instant Retrieval storage, per GB-month (at least 128 KB and 90 days per object)",
        "https://aws.amazon.com/s3/pricing/",
    ),
    "s3express_put": (
        0.00113 / 1e3,
        "S3 Express One Zone PUT request (directory bucket; the S3 FAQ's worked example)",
        "https://aws.amazon.com/s3/pricing/",
    ),
    "s3express_get": (0.00003 / 1e3, "S3 Express One Zone GET request", "https://aws.amazon.com/s3/pricing/"),
    "s3express_upload_gb": (
        0.0032,
        "S3 Express One Zone data upload, per GB (charged here on every byte: the FAQ's example does)",
        "https://aws.amazon.com/s3/pricing/",
    ),
    "s3express_storage_gb_month": (
        0.11,
        "S3 Express One Zone storage, per GB-month",
        "https://aws.amazon.com/s3/pricing/",
    ),
    "eventbridge_scheduler_invocation": (
        1.00 / 1e6,
        "EventBridge Scheduler invocation (after the 14M/month free tier)",
        "https://aws.amazon.com/eventbridge/pricing/",
    ),
}

#: Lambda memory assumed for the tick, sweeper and API functions (MB), for GB-seconds
LAMBDA_MEMORY_MB = 512


def price(name: str) -> float:
    """USD per unit of ``name`` (a key of :data:`PRICES`)."""
    return PRICES[name][0]
