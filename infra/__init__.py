"""Duetime's CDK app: ``infra/app.py`` (entry point), ``infra/stack.py`` (composition), ``infra/constructs/``."""
