"""The Lambda invoker on AWS: ``lambda:InvokeFunction`` with ``InvocationType="Event"``."""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

from duetime.adapters.aws import clients as aws
from duetime.domain.errors import InvokeError


class BotoLambdaInvoker:
    """``lambda:InvokeFunction`` with ``InvocationType="Event"`` through the process's cached client
    (locally, ``AWS_ENDPOINT_URL_LAMBDA`` points it at the local stack's Lambda runtime)."""

    def invoke_event(self, function: str, payload: bytes) -> str:
        try:
            out = aws.client("lambda").invoke(FunctionName=function, InvocationType="Event", Payload=payload)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code") or "ClientError")
            raise InvokeError(f"{code}: {error.get('Message') or exc}", code) from None
        except BotoCoreError as exc:
            raise InvokeError(f"{type(exc).__name__}: {exc}", type(exc).__name__) from None
        return str(out.get("ResponseMetadata", {}).get("RequestId", ""))
