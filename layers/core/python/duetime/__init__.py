"""Duetime: a distributed job scheduler for AWS (core library, shipped as a Lambda layer)."""

__version__ = "0.1.0"
