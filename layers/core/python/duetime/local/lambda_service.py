"""The local stack's Lambda: your functions by name, Lambda's Invoke API, destinations and the SQS event source.

moto never runs Lambda code, so the local stack brings its own Lambda, just large enough for Lambda tasks:

- **Functions** are registered by name -> ``module:function``: ``duetime local --lambda NAME=module:function``
  (repeatable) and the ``[tool.duetime.local.lambdas]`` table of ``pyproject.toml`` (the one in the current
  directory, else the project's own), ``--lambda`` winning over the table.
- **Invoke API**: an HTTP endpoint on 127.0.0.1 serving ``POST /2015-03-31/functions/NAME/invocations`` as
  Lambda does (``Event`` -> 202 and queued, ``RequestResponse`` -> run and answer, ``DryRun`` -> 204, an
  unknown name -> 404 ``ResourceNotFoundException``). ``AWS_ENDPOINT_URL_LAMBDA`` points boto3 at it, so the
  dispatcher's ``lambda:InvokeFunction`` call is the very one it makes in AWS.
- **Execution**: each invocation runs in a fresh process (:mod:`duetime.local.lambda_child`), killed at the
  function's timeout (the run's ``timeout_seconds`` from the envelope, at most 900 s), up to
  :data:`CONCURRENCY` at once. Its stdout and stderr, between Lambda-style ``START``/``END``/``REPORT``
  lines, become the run's log in S3.
- **Destinations**: an asynchronous invocation's outcome goes to the ``finish`` handler as Lambda's
  destination record (``Success`` or ``RetriesExhausted``: the function's retries are 0, as Duetime asks).
- **SQS event source**: :class:`SqsEventSource` feeds the ``lambda`` queue to the ``dispatcher`` handler as
  Lambda's event source mapping does (batches of up to 10, partial batch failures left to reappear).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from duetime.adapters.aws import clients as aws
from duetime.domain.logs import log_key
from duetime.domain.models import MAX_LAMBDA_TIMEOUT_SECONDS, function_name_of
from duetime.domain.ports import LogStore, RunQueue
from duetime.local import lifeline

#: Invocations running at once (more wait their turn, as with a concurrency limit).
CONCURRENCY = 8
#: A function's timeout when the event carries none (a direct invoke, not a Duetime run).
DEFAULT_TIMEOUT_SECONDS = 60.0
#: Lambda's payload limits: 256 KB for an asynchronous invocation, 6 MB for a synchronous one.
MAX_EVENT_PAYLOAD_BYTES = 256 * 1024
MAX_SYNC_PAYLOAD_BYTES = 6 * 1024 * 1024
#: Times a destination is retried when its handler raises (Lambda retries an async invocation twice).
DESTINATION_ATTEMPTS = 3

ACCOUNT = "000000000000"
REGION = "us-east-1"

_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9_-]{1,64})=(?P<handler>[A-Za-z_][\w.]*:[A-Za-z_]\w*)$")
_HANDLER = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_INVOKE_PATH = re.compile(r"^/2015-03-31/functions/(?P<function>[^/]+)/invocations/?$")


def function_arn(name: str) -> str:
    return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"


# ---- registration ----------------------------------------------------------------------------------------
def parse_function_spec(text: str) -> tuple[str, str]:
    """``NAME=module:function`` -> ``(NAME, "module:function")``.

    Raises:
        ValueError: the text is not of that form (the message says what is expected).
    """
    match = _SPEC.match(text.strip())
    if match is None:
        raise ValueError(
            f"{text!r}: expected NAME=module:function, NAME being 1-64 of A-Z a-z 0-9 _ - "
            "(e.g. hello=examples.lambdas.hello:lambda_handler)"
        )
    return match["name"], match["handler"]


def functions_from_pyproject(path: Path) -> dict[str, str]:
    """The ``[tool.duetime.local.lambdas]`` table of ``path`` (``NAME = "module:function"``); {} if absent.

    Raises:
        ValueError: the table has a malformed entry (naming it).
    """
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    table = data.get("tool", {}).get("duetime", {}).get("local", {}).get("lambdas", {})
    functions: dict[str, str] = {}
    for name, handler in table.items():
        if not isinstance(handler, str):
            raise ValueError(f'{path}: [tool.duetime.local.lambdas] {name}: expected "module:function"')
        functions.update([parse_function_spec(f"{name}={handler}")])
    return functions


def registered_functions(
    cli: dict[str, str], *, cwd: Path, project_root: Path | None
) -> tuple[dict[str, str], list[Path]]:
    """The functions to serve: the pyproject table (``cwd``'s, else the project's) overlaid by ``--lambda``.

    Returns the functions and the directories their modules are imported from (for ``PYTHONPATH``).
    """
    roots = [cwd]
    table: dict[str, str] = {}
    for directory in (cwd, project_root):
        if directory is None:
            continue
        table = functions_from_pyproject(directory / "pyproject.toml")
        if table:
            if directory not in roots:
                roots.append(directory)
            break
    if project_root is not None and project_root not in roots:
        roots.append(project_root)
    return {**table, **cli}, roots


# ---- execution -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Invocation:
    function: str
    handler: str
    event: bytes
    request_id: str
    timeout_seconds: float
    asynchronous: bool


@dataclass(frozen=True)
class InvocationResult:
    ok: bool
    #: the function's response, or Lambda's error object
    response: Any
    log: bytes
    duration_ms: float


def _envelope_ids(event: bytes) -> dict[str, Any] | None:
    """The ``duetime`` section of a Duetime run envelope, or None for any other event."""
    try:
        data = json.loads(event)
    except ValueError:
        return None
    ids = data.get("duetime") if isinstance(data, dict) else None
    if isinstance(ids, dict) and {"run_id", "job_id", "attempt"} <= set(ids):
        return ids
    return None


def timeout_of(event: bytes) -> float:
    """A Duetime run's timeout (at most Lambda's 900 s); DEFAULT_TIMEOUT_SECONDS for other events."""
    ids = _envelope_ids(event)
    if ids is not None and isinstance(ids.get("timeout_seconds"), int | float) and ids["timeout_seconds"] > 0:
        return float(min(ids["timeout_seconds"], MAX_LAMBDA_TIMEOUT_SECONDS))
    return DEFAULT_TIMEOUT_SECONDS


class LocalLambda:
    """Registered functions, the Invoke API (a WSGI app), a pool of invocation processes and destinations.

    Args:
        functions: name -> ``module:function``.
        destination: called with each asynchronous invocation's destination record (the finish handler).
        logs: where a Duetime run's captured output goes (its attempt's log key), before the destination.
        env: extra environment of every function process (the local AWS endpoint and fake credentials).
        python_path: directories the functions' modules are imported from.
        echo: print one line per invocation (the local stack's console).
    """

    def __init__(
        self,
        functions: dict[str, str],
        *,
        destination: Callable[[dict[str, Any]], Any] | None = None,
        logs: LogStore | None = None,
        env: dict[str, str] | None = None,
        python_path: list[Path] | None = None,
        concurrency: int = CONCURRENCY,
        echo: bool = False,
    ) -> None:
        for name, handler in functions.items():
            parse_function_spec(f"{name}={handler}")
        self.functions = dict(functions)
        self.destination = destination
        self.logs = logs
        self.env = dict(env or {})
        self.python_path = [str(p) for p in (python_path or [])]
        self.echo = echo
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="lambda")
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._destination_lock = threading.Lock()
        self._server: Any = None
        self._stopped = False
        self.endpoint = ""

    # ---- Lambda's Invoke API -----------------------------------------------------------------------------
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve the Invoke API on ``host:port`` (0 = a free port) in a thread; returns the endpoint URL."""
        from werkzeug.serving import make_server

        self._server = make_server(host, port, self, threaded=True)
        self.endpoint = f"http://{host}:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, name="lambda-api", daemon=True).start()
        return self.endpoint

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        from werkzeug.wrappers import Request, Response

        request = Request(environ)
        status, headers, body = self.handle(
            request.method,
            request.path,
            request.headers.get("X-Amz-Invocation-Type", "RequestResponse"),
            request.get_data(),
        )
        return Response(body, status=status, headers=headers)(environ, start_response)

    def handle(
        self, method: str, path: str, invocation_type: str, payload: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """One Invoke API request -> (status, headers, body), with Lambda's error codes."""
        match = _INVOKE_PATH.match(path)
        if method != "POST" or match is None:
            return _api_error(
                404, "UnknownOperationException", f"the local Lambda serves Invoke only, not {method} {path}"
            )
        name = function_name_of(unquote(match["function"]))
        handler = self.functions.get(name)
        if handler is None:
            known = ", ".join(sorted(self.functions)) or "none"
            return _api_error(
                404,
                "ResourceNotFoundException",
                f"Function not found: {function_arn(name)} (local functions: {known}; "
                "register one with --lambda NAME=module:function)",
            )
        limit = MAX_EVENT_PAYLOAD_BYTES if invocation_type == "Event" else MAX_SYNC_PAYLOAD_BYTES
        if len(payload) > limit:
            return _api_error(413, "RequestTooLargeException", f"Request must be smaller than {limit} bytes")
        try:
            json.loads(payload or b"null")
        except ValueError:
            return _api_error(400, "InvalidRequestContentException", "Could not parse request body into json")
        request_id = str(uuid.uuid4())
        headers = {"x-amzn-RequestId": request_id, "Content-Type": "application/json"}
        invocation = Invocation(
            name, handler, payload or b"null", request_id, timeout_of(payload), invocation_type == "Event"
        )
        if invocation_type == "DryRun":
            return 204, headers, b""
        if invocation_type == "Event":
            if self._stopped:
                return _api_error(503, "ServiceException", "the local Lambda is stopping")
            self._pool.submit(self._run_async, invocation)
            return 202, headers, b""
        result = self.execute(invocation)
        if not result.ok:
            headers["X-Amz-Function-Error"] = "Unhandled"
        headers["X-Amz-Executed-Version"] = "$LATEST"
        return 200, headers, json.dumps(result.response).encode()

    # ---- execution ---------------------------------------------------------------------------------------
    def execute(self, invocation: Invocation) -> InvocationResult:
        """Run one invocation in a fresh process; kill its process group at the timeout."""
        # imported here: the worker module sets up logging, which the CLI must not do before the stack
        from duetime.services.worker import PASSED_ENV, read_log

        started = time.monotonic()
        child_env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        child_env.update(self.env)
        child_env.update(
            PYTHONPATH=os.pathsep.join([*self.python_path, os.environ.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            ),
            AWS_LAMBDA_FUNCTION_NAME=invocation.function,
            AWS_LAMBDA_FUNCTION_VERSION="$LATEST",
            AWS_LAMBDA_FUNCTION_MEMORY_SIZE="128",
            AWS_LAMBDA_FUNCTION_TIMEOUT=f"{invocation.timeout_seconds:g}",
            AWS_LAMBDA_LOG_GROUP_NAME=f"/aws/lambda/{invocation.function}",
            DUETIME_LAMBDA_REQUEST_ID=invocation.request_id,
            _HANDLER=invocation.handler,
            **lifeline.child_env(),
        )
        with tempfile.TemporaryDirectory(prefix="duetime-lambda-") as tmp, tempfile.TemporaryFile() as out:
            result_file = Path(tmp) / "result.json"
            out.write(f"START RequestId: {invocation.request_id} Version: $LATEST\n".encode())
            out.flush()
            proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [
                    sys.executable,
                    "-u",
                    "-m",
                    "duetime.local.lambda_child",
                    invocation.handler,
                    str(result_file),
                ],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env,
                cwd=self.python_path[0] if self.python_path else None,
                start_new_session=True,
            )
            with self._lock:
                self._procs.add(proc)
            timed_out = False
            try:
                proc.communicate(invocation.event, timeout=invocation.timeout_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            finally:
                with self._lock:
                    self._procs.discard(proc)
            duration_ms = (time.monotonic() - started) * 1000
            ok, response = self._outcome(invocation, proc.returncode, timed_out, result_file)
            if timed_out:
                out.write(f"{_now_iso()} {invocation.request_id} {response['errorMessage']}\n".encode())
            out.write(
                f"END RequestId: {invocation.request_id}\n"
                f"REPORT RequestId: {invocation.request_id}\tDuration: {duration_ms:.2f} ms\n".encode()
            )
            log = read_log(out)
        return InvocationResult(ok, response, log, duration_ms)

    @staticmethod
    def _outcome(
        invocation: Invocation, code: int | None, timed_out: bool, result_file: Path
    ) -> tuple[bool, Any]:
        if timed_out:
            return False, {"errorMessage": f"Task timed out after {invocation.timeout_seconds:.2f} seconds"}
        try:
            outcome = json.loads(result_file.read_text())
        except (OSError, ValueError):
            return False, {
                "errorType": "Runtime.ExitError",
                "errorMessage": f"RequestId: {invocation.request_id} Error: Runtime exited with error: exit status {code}",
            }
        if outcome.get("ok"):
            return True, outcome.get("response")
        return False, outcome.get("error") or {"errorMessage": "unknown error"}

    def _run_async(self, invocation: Invocation) -> None:
        """An ``Event`` invocation: execute, store the log, deliver the destination record."""
        try:
            result = self.execute(invocation)
            ids = _envelope_ids(invocation.event)
            if ids is not None and self.logs is not None:
                try:
                    key = log_key(str(ids["job_id"]), str(ids["run_id"]), int(ids["attempt"]))
                    self.logs.put(key, result.log)
                except Exception as exc:  # noqa: BLE001 - the outcome still goes to the destination
                    print(
                        f"lambda: log upload failed for {invocation.request_id}: {exc!r}",
                        file=sys.stderr,
                        flush=True,
                    )
            record = destination_record(invocation, result)
            if self.echo:
                condition = record["requestContext"]["condition"]
                run = f" run {ids['run_id']} attempt {ids['attempt']}" if ids else ""
                print(
                    f"lambda: {invocation.function}{run} -> {condition} ({result.duration_ms / 1000:.2f} s)",
                    flush=True,
                )
            self._deliver(record)
        except Exception as exc:  # noqa: BLE001 - one invocation's fault must not stop the pool
            print(f"lambda: invocation {invocation.request_id} failed: {exc!r}", file=sys.stderr, flush=True)

    def _deliver(self, record: dict[str, Any]) -> None:
        if self.destination is None or self._stopped:
            return
        for attempt in range(1, DESTINATION_ATTEMPTS + 1):
            try:
                with self._destination_lock:
                    self.destination(record)
                return
            except Exception as exc:  # noqa: BLE001 - retried as Lambda retries an async invocation
                print(f"lambda: destination failed (attempt {attempt}): {exc!r}", file=sys.stderr, flush=True)
                time.sleep(0.5 * attempt)

    def stop(self) -> None:
        """Stop serving, kill running invocations and drop queued ones."""
        self._stopped = True
        if self._server is not None:
            self._server.shutdown()
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            _kill_group(proc)


def destination_record(invocation: Invocation, result: InvocationResult) -> dict[str, Any]:
    """Lambda's destination record for an asynchronous invocation with retries off."""
    event = json.loads(invocation.event)
    record: dict[str, Any] = {
        "version": "1.0",
        "timestamp": _now_iso(),
        "requestContext": {
            "requestId": invocation.request_id,
            "functionArn": f"{function_arn(invocation.function)}:$LATEST",
            "condition": "Success" if result.ok else "RetriesExhausted",
            "approximateInvokeCount": 1,
        },
        "requestPayload": event,
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST"},
        "responsePayload": result.response,
    }
    if not result.ok:
        record["responseContext"]["functionError"] = "Unhandled"
    return record


def _api_error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    headers = {
        "x-amzn-ErrorType": code,
        "Content-Type": "application/json",
        "x-amzn-RequestId": str(uuid.uuid4()),
    }
    return status, headers, json.dumps({"Type": "User", "message": message}).encode()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# ---- the SQS event source mapping ------------------------------------------------------------------------
def sqs_event_record(message: dict[str, Any], *, queue_arn: str, region: str = REGION) -> dict[str, Any]:
    """Lambda's SQS event record for one message of ``receive_message`` (asked with all attributes)."""
    now_ms = str(int(time.time() * 1000))
    attributes = {k: str(v) for k, v in (message.get("Attributes") or {}).items()}
    attributes.setdefault("ApproximateReceiveCount", "1")
    attributes.setdefault("SentTimestamp", now_ms)
    attributes.setdefault("ApproximateFirstReceiveTimestamp", now_ms)
    attributes.setdefault("SenderId", ACCOUNT)
    message_attributes = {
        name: {
            "stringValue": value.get("StringValue"),
            "binaryValue": value.get("BinaryValue"),
            "stringListValues": [],
            "binaryListValues": [],
            "dataType": value.get("DataType", "String"),
        }
        for name, value in (message.get("MessageAttributes") or {}).items()
    }
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "md5OfBody": message.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    }


class SqsEventSource:
    """Lambda's SQS event source mapping with ``ReportBatchItemFailures``: receive up to ``batch_size``
    messages, invoke ``handler`` with them as one event, delete the ones it did not report as failed. Failed
    ones (or all of them, if the handler raised) reappear after the queue's visibility timeout."""

    def __init__(
        self,
        queue_url: str,
        handler: Callable[[dict[str, Any]], Any],
        *,
        batch_size: int = 10,
        wait_seconds: int = 1,
    ) -> None:
        self.queue_url = queue_url
        self.handler = handler
        self.batch_size = batch_size
        self.wait_seconds = wait_seconds
        self._queue_arn = ""

    @property
    def queue_arn(self) -> str:
        if not self._queue_arn:
            attrs = aws.client("sqs").get_queue_attributes(
                QueueUrl=self.queue_url, AttributeNames=["QueueArn"]
            )
            self._queue_arn = str(attrs["Attributes"]["QueueArn"])
        return self._queue_arn

    def poll_once(self) -> int:
        """One receive and, if anything came, one invocation. Returns how many messages were received."""
        sqs = aws.client("sqs")
        out = sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=self.batch_size,
            WaitTimeSeconds=self.wait_seconds,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = out.get("Messages", [])
        if not messages:
            return 0
        event = {"Records": [sqs_event_record(m, queue_arn=self.queue_arn) for m in messages]}
        try:
            response = self.handler(event) or {}
            failed = {f["itemIdentifier"] for f in response.get("batchItemFailures", [])}
        except Exception as exc:  # noqa: BLE001 - as Lambda: the whole batch comes back later
            print(f"lambda event source: handler failed: {exc!r}", file=sys.stderr, flush=True)
            return len(messages)
        done = [m for m in messages if m["MessageId"] not in failed]
        if done:
            sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)],
            )
        return len(messages)

    def run_forever(self, stopping: threading.Event) -> None:
        """Poll until ``stopping`` is set; transient faults back off."""
        failures = 0
        while not stopping.is_set():
            try:
                self.poll_once()
                failures = 0
            except Exception as exc:  # noqa: BLE001 - the poller must outlive transient faults
                failures += 1
                print(f"lambda event source: poll failed: {exc!r}", file=sys.stderr, flush=True)
                stopping.wait(min(10.0, 0.5 * 2 ** min(failures, 5)))


class QueueEventSource(SqsEventSource):
    """The same event source over any :class:`~duetime.domain.ports.RunQueue` (the embedded backend's
    queue): deliveries become SQS event records (receive count, a message id per delivery), and the ones the
    handler did not report as failed are deleted."""

    def __init__(
        self,
        queues: RunQueue,
        tier: str,
        handler: Callable[[dict[str, Any]], Any],
        *,
        batch_size: int = 10,
        wait_seconds: int = 1,
    ) -> None:
        super().__init__("", handler, batch_size=batch_size, wait_seconds=wait_seconds)
        self.queues = queues
        self.tier = tier
        self._queue_arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:duetime-{tier}"

    def poll_once(self) -> int:
        received = self.queues.receive(
            self.tier, max_messages=self.batch_size, wait_seconds=self.wait_seconds
        )
        if not received:
            return 0
        by_id = {hashlib.sha256(r.receipt_handle.encode()).hexdigest()[:32]: r for r in received}
        records = [
            sqs_event_record(
                {
                    "MessageId": message_id,
                    "ReceiptHandle": r.receipt_handle,
                    "Body": r.body,
                    "MD5OfBody": hashlib.md5(r.body.encode(), usedforsecurity=False).hexdigest(),
                    "Attributes": {"ApproximateReceiveCount": r.receive_count},
                },
                queue_arn=self.queue_arn,
            )
            for message_id, r in by_id.items()
        ]
        try:
            response = self.handler({"Records": records}) or {}
            failed = {f["itemIdentifier"] for f in response.get("batchItemFailures", [])}
        except Exception as exc:  # noqa: BLE001 - as Lambda: the whole batch comes back later
            print(f"lambda event source: handler failed: {exc!r}", file=sys.stderr, flush=True)
            return len(received)
        for message_id, r in by_id.items():
            if message_id not in failed:
                self.queues.delete(self.tier, r.receipt_handle)
        return len(received)


__all__ = [
    "Invocation",
    "QueueEventSource",
    "LocalLambda",
    "SqsEventSource",
    "destination_record",
    "functions_from_pyproject",
    "parse_function_spec",
    "registered_functions",
    "sqs_event_record",
    "timeout_of",
]
