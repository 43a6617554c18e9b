"""One local Lambda invocation, in a process of its own (the local stack's stand-in for a Lambda sandbox).

``python -u -m duetime.local.lambda_child MODULE:FUNCTION RESULT_FILE < event.json``

Imports ``MODULE``, calls ``FUNCTION(event, context)`` and writes ``{"ok": true, "response": ...}`` or
``{"ok": false, "error": {errorMessage, errorType, stackTrace}}`` to ``RESULT_FILE``, with AWS's error types
for import, handler and marshalling failures. Whatever the function prints is the invocation's log (the
parent captures stdout and stderr). A process that dies without a result file (killed at its timeout,
``sys.exit``, a crash) is reported by the parent. Standard library only: a short start-up.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


class LocalContext:
    """The parts of Lambda's context object a function reads, from the variables the parent sets."""

    def __init__(self) -> None:
        self.function_name = os.environ.get("AWS_LAMBDA_FUNCTION_NAME", "local")
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = int(os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"))
        self.aws_request_id = os.environ.get("DUETIME_LAMBDA_REQUEST_ID", "")
        self.log_group_name = f"/aws/lambda/{self.function_name}"
        self.log_stream_name = "local"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:000000000000:function:{self.function_name}"
        self._deadline = time.monotonic() + float(os.environ.get("AWS_LAMBDA_FUNCTION_TIMEOUT", "900"))

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _error(kind: str, message: str, trace: list[str] | None = None) -> dict[str, Any]:
    return {"errorMessage": message, "errorType": kind, "stackTrace": trace or []}


def invoke(spec: str, event: Any, context: LocalContext) -> dict[str, Any]:
    """Run the handler ``spec`` on ``event``; the result file's content."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - reported as Lambda reports it
        print(
            f"[ERROR] Runtime.ImportModuleError: Unable to import module '{module_name}': {exc}",
            file=sys.stderr,
        )
        return {
            "ok": False,
            "error": _error("Runtime.ImportModuleError", f"Unable to import module '{module_name}': {exc}"),
        }
    handler = getattr(module, attr, None)
    if not callable(handler):
        message = f"Handler '{attr}' missing on module '{module_name}'"
        print(f"[ERROR] Runtime.HandlerNotFound: {message}", file=sys.stderr)
        return {"ok": False, "error": _error("Runtime.HandlerNotFound", message)}
    try:
        response = handler(event, context)
    except Exception as exc:  # noqa: BLE001 - the function's error is the invocation's outcome
        frames = traceback.extract_tb(exc.__traceback__)[1:]  # drop this module's own frame
        trace = traceback.format_list(frames)
        print(f"[ERROR] {type(exc).__name__}: {exc}", file=sys.stderr)
        print("Traceback (most recent call last):\n" + "".join(trace), end="", file=sys.stderr, flush=True)
        return {"ok": False, "error": _error(type(exc).__name__, str(exc), trace)}
    try:
        json.dumps(response)
    except (TypeError, ValueError) as exc:
        message = f"Unable to marshal response: {exc}"
        print(f"[ERROR] Runtime.MarshalError: {message}", file=sys.stderr)
        return {"ok": False, "error": _error("Runtime.MarshalError", message)}
    return {"ok": True, "response": response}


def main(argv: list[str]) -> int:
    from duetime.local.lifeline import die_with_parent

    die_with_parent()  # a function still running when `duetime local` is SIGKILLed ends with it
    spec, result_file = argv[1], Path(argv[2])
    event = json.loads(sys.stdin.buffer.read() or b"null")
    outcome = invoke(spec, event, LocalContext())
    sys.stdout.flush()
    result_file.write_text(json.dumps(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
