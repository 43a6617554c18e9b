"""The local Lambda runtime serves API events one at a time: Powertools keeps the request being served on a
class attribute that every copy of the API module shares."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver
from aws_lambda_powertools.event_handler.api_gateway import BaseRouter

from duetime.local import lambda_runtime


def test_two_resolvers_share_the_current_event() -> None:
    # the reason for the lock: a second app (another module copy) sees the first one's request
    from tests.helpers import http_event

    first, second = APIGatewayHttpResolver(), APIGatewayHttpResolver()
    first.resolve(http_event("GET", "/x"), None)
    assert second.current_event is BaseRouter.current_event is first.current_event


@pytest.mark.parametrize(("role", "most_at_once"), [("api", 1), ("tick", 2)])
def test_api_events_never_overlap_other_roles_do(
    monkeypatch: pytest.MonkeyPatch, role: str, most_at_once: int
) -> None:
    active, peak, lock = [0], [0], threading.Lock()

    def fake(_event: dict[str, Any], _context: Any) -> None:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1

    monkeypatch.setattr(lambda_runtime, "load_module", lambda _role, _i: SimpleNamespace(lambda_handler=fake))
    invoke = lambda_runtime.handler(role, concurrency=2)
    threads = [threading.Thread(target=invoke, args=({},)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == most_at_once
