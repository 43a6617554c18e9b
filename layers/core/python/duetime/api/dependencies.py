"""The services' dependencies, as a route parameter (``deps: ServiceDeps``) resolved by Powertools' ``Depends``.

Tests swap them without monkeypatching: ``app.dependency_overrides[service_deps] = lambda: test_deps``.
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Depends

from duetime.config.deps import Deps, default_deps


def service_deps() -> Deps:
    """The process's dependencies, from the environment (cached: built once per execution environment)."""
    return default_deps()


#: A route parameter holding the services' dependencies (settings, store, queues, logs, clock).
ServiceDeps = Annotated[Deps, Depends(service_deps)]
