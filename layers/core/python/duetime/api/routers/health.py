"""``/healthz``: liveness."""

from __future__ import annotations

from duetime.api.routers import new_router

router = new_router()


@router.get("/healthz", tags=["health"])
def healthz() -> dict[str, str]:
    """Check the API answers.

    Always `{"status": "ok"}`; calls nothing.
    """
    return {"status": "ok"}
