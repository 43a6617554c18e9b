"""The HTTP API behind API Gateway (``functions/api/handler.py`` builds the app and includes the routers).

- :mod:`~duetime.api.resolver`: the resolver subclass and :func:`~duetime.api.resolver.create_app`;
- :mod:`~duetime.api.strict_json`: request bodies as strict JSON, with a nesting limit;
- :mod:`~duetime.api.tenancy` and :mod:`~duetime.api.dependencies`: the caller's tenant and the services'
  dependencies, as ``Depends`` route parameters (tests override them with ``app.dependency_overrides``);
- :mod:`~duetime.api.errors`: the error shape and one exception handler per domain error;
- :mod:`~duetime.api.responses` and :mod:`~duetime.api.idempotent`: OpenAPI response entries, and
  ``Idempotency-Key`` replays;
- :mod:`~duetime.api.routers`: one router per resource (jobs, runs, dead letters, schedules, health).

The request and response models stay in :mod:`duetime.domain.api_models`.
"""
