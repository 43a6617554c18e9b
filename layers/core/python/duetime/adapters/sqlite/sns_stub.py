"""The local stack's SNS: every publish and email subscription is appended to a JSON-lines file (nothing
leaves the machine)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()


class RecordingSns:
    """:class:`~duetime.domain.ports.SnsPublisher` that records: one JSON object per line in ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _write(self, record: dict[str, Any]) -> None:
        with _LOCK, self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    def publish(self, topic_arn: str, *, subject: str, message: str, attributes: Mapping[str, str]) -> None:
        self._write(
            {"topic_arn": topic_arn, "subject": subject, "message": message, "attributes": dict(attributes)}
        )

    def publish_email(self, tenant: str, address: str, *, subject: str, message: str) -> None:
        self._write({"email": address, "tenant": tenant, "subject": subject, "message": message})

    def subscribe_email(self, tenant: str, address: str) -> None:
        self._write({"subscribe": address, "tenant": tenant})

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line]
