"""SQS adapter: run wake-up messages on per-tier delay queues.

A message is only a wake-up; the run row is the source of truth ([S0] outbox). Lost messages are re-sent
by the sweeper; duplicates fail the conditional start and are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from duetime.adapters.aws import clients as aws
from duetime.domain.errors import QueueSendError
from duetime.domain.lifecycle import MAX_MESSAGE_DELAY_SECONDS
from duetime.domain.models import RunMessage
from duetime.domain.ports import ReceivedMessage

#: most entries in one SendMessageBatch (an SQS limit)
SEND_BATCH_MAX = 10


class SqsQueues:
    """Send, receive and delete run messages on the tier queues.

    Args:
        queue_urls: tier -> queue URL.
    """

    def __init__(self, queue_urls: dict[str, str]) -> None:
        self.queue_urls = dict(queue_urls)

    @property
    def _sqs(self) -> Any:
        return aws.client("sqs")

    def send_request(self, tier: str, message: RunMessage, *, delay: int = 0) -> dict[str, Any]:
        """``message`` as SendMessage parameters for ``tier``'s queue (also a Step Functions step's input).

        Its tenant is the message group: on a standard queue that makes SQS fair queues keep one tenant's
        burst from delaying other tenants' runs (the local stack's moto server emulates this).
        """
        return {
            "QueueUrl": self.queue_urls[tier],
            "MessageBody": message.body(),
            "DelaySeconds": max(0, min(MAX_MESSAGE_DELAY_SECONDS, int(delay))),
            "MessageGroupId": (message.tenant or "")[:128],
        }

    def send(self, tier: str, message: RunMessage, *, delay: int = 0) -> None:
        """Send ``message`` to ``tier``'s queue, delivered after ``delay`` seconds (0..900)."""
        request = self.send_request(tier, message, delay=delay)
        if not message.tenant:
            del request["MessageGroupId"]
        self._sqs.send_message(**request)

    def send_batch(self, tier: str, messages: Sequence[tuple[RunMessage, int]]) -> None:
        """Send each ``(message, delay seconds)`` as :meth:`send` would, with SendMessageBatch: up to
        :data:`SEND_BATCH_MAX` entries a request (SQS's limit; a run message is well under 1 KB, far below
        the 256 KB a batch may hold). One request costs what one SendMessage does, for up to 10 messages.
        Entries SQS failed through no fault of the request (``SenderFault: false``: throttling, an internal
        error) are sent once more.

        Raises:
            QueueSendError: some entries were not sent, after every request was tried; its ``unsent`` lists
                them (the rest were sent).
        """
        unsent: list[tuple[RunMessage, int]] = []
        first: str | None = None
        for start in range(0, len(messages), SEND_BATCH_MAX):
            chunk = list(messages[start : start + SEND_BATCH_MAX])
            for attempt in range(2):
                try:
                    failed = self._send_chunk(tier, chunk)
                except Exception as exc:  # noqa: BLE001 - the next chunks are still tried
                    first = first or repr(exc)
                    unsent += chunk
                    break
                retry = [chunk[i] for i, (_, sender_fault, _) in failed.items() if not sender_fault]
                if attempt == 0 and retry:
                    unsent += [chunk[i] for i, (_, sender_fault, _) in failed.items() if sender_fault]
                    chunk = retry
                    continue
                unsent += [chunk[i] for i in failed]
                if failed:
                    first = first or next(f"{code}: {text}" for code, _, text in failed.values())
                break
        if unsent:
            raise QueueSendError(
                f"{len(unsent)} of {len(messages)} messages not sent to {tier}: {first}", unsent
            )

    def _send_chunk(self, tier: str, chunk: list[tuple[RunMessage, int]]) -> dict[int, tuple[str, bool, str]]:
        """One SendMessageBatch of ``chunk`` (at most 10); the failed entries by index: (code, sender
        fault, message)."""
        entries = []
        for i, (message, delay) in enumerate(chunk):
            request = self.send_request(tier, message, delay=delay)
            entry = {"Id": str(i), **{k: v for k, v in request.items() if k != "QueueUrl"}}
            if not message.tenant:
                del entry["MessageGroupId"]
            entries.append(entry)
        out = self._sqs.send_message_batch(QueueUrl=self.queue_urls[tier], Entries=entries)
        return {
            int(f["Id"]): (str(f.get("Code", "")), bool(f.get("SenderFault")), str(f.get("Message", "")))
            for f in out.get("Failed") or []
        }

    def receive(
        self,
        tier: str,
        *,
        max_messages: int = 1,
        wait_seconds: int = 1,
        visibility_seconds: int | None = None,
    ) -> list[ReceivedMessage]:
        """Long-poll ``tier``'s queue. Bodies that are not run messages come back with ``message=None``."""
        kwargs: dict[str, Any] = {
            "QueueUrl": self.queue_urls[tier],
            "MaxNumberOfMessages": max_messages,
            "WaitTimeSeconds": wait_seconds,
            "MessageSystemAttributeNames": ["ApproximateReceiveCount"],
        }
        if visibility_seconds is not None:
            kwargs["VisibilityTimeout"] = visibility_seconds
        out = self._sqs.receive_message(**kwargs)
        received = []
        for raw in out.get("Messages", []):
            try:
                message: RunMessage | None = RunMessage.model_validate_json(raw["Body"])
            except ValueError:
                message = None
            count = int(raw.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
            received.append(ReceivedMessage(message, raw["ReceiptHandle"], raw["Body"], count))
        return received

    def delete(self, tier: str, receipt_handle: str) -> None:
        """Delete a received message (an expired receipt handle is ignored: someone else has it now)."""
        try:
            self._sqs.delete_message(QueueUrl=self.queue_urls[tier], ReceiptHandle=receipt_handle)
        except self._sqs.exceptions.ReceiptHandleIsInvalid:
            pass

    def delete_batch(self, tier: str, receipt_handles: Sequence[str]) -> None:
        """Delete several received messages with DeleteMessageBatch, SEND_BATCH_MAX (SQS's limit) a
        request; handles SQS calls invalid (expired: someone else has the message now) are ignored.

        Raises:
            QueueSendError: some deliveries were not deleted, after every request was tried (its ``unsent``
                lists their handles); they come back after their visibility timeout.
        """
        undeleted: list[str] = []
        first: str | None = None
        handles = list(receipt_handles)
        for start in range(0, len(handles), SEND_BATCH_MAX):
            chunk = handles[start : start + SEND_BATCH_MAX]
            try:
                out = self._sqs.delete_message_batch(
                    QueueUrl=self.queue_urls[tier],
                    Entries=[{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(chunk)],
                )
            except Exception as exc:  # noqa: BLE001 - the next chunks are still tried
                first = first or repr(exc)
                undeleted += chunk
                continue
            for failure in out.get("Failed") or []:
                if failure.get("Code") == "ReceiptHandleIsInvalid":
                    continue
                undeleted.append(chunk[int(failure["Id"])])
                first = first or f"{failure.get('Code')}: {failure.get('Message', '')}"
        if undeleted:
            raise QueueSendError(
                f"{len(undeleted)} of {len(handles)} messages not deleted from {tier}: {first}", undeleted
            )

    def extend_visibility(self, tier: str, receipt_handle: str, seconds: int) -> None:
        """Keep a message hidden for ``seconds`` more (while its run is being worked)."""
        try:
            self._sqs.change_message_visibility(
                QueueUrl=self.queue_urls[tier], ReceiptHandle=receipt_handle, VisibilityTimeout=seconds
            )
        except Exception:  # noqa: BLE001 - best effort: the run row, not the message, is the truth
            pass
