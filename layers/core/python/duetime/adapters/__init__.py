"""Adapters: the ports' implementations (``aws/``: DynamoDB, SQS, S3, Step Functions, Lambda)."""
