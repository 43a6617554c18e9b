"""The CDK app: stage config -> stack -> cdk-nag -> synth.

``cdk synth|deploy -c stage=NAME`` runs it (``cdk.json``: ``python -m infra.app``). It also runs on its own,
with no CDK CLI, no AWS credentials and no docker: ``python -m infra.app [-c key=value ...]`` reads
``cdk.json``'s context itself and writes ``cdk.out/`` (that is ``make synth``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aws_cdk import App

from infra.config import stage_from_context
from infra.nag import add_aws_solutions_checks
from infra.stack import DuetimeStack, stack_id

REPO_ROOT = Path(__file__).resolve().parents[1]
CDK_JSON = REPO_ROOT / "cdk.json"


def cdk_json_context(path: Path = CDK_JSON) -> dict[str, Any]:
    """The ``context`` of ``cdk.json`` (feature flags and stage presets)."""
    return dict(json.loads(path.read_text()).get("context", {}))


def parse_context_args(argv: Sequence[str]) -> dict[str, Any]:
    """``-c key=value`` pairs, like the CDK CLI's (values that parse as JSON are JSON)."""
    out: dict[str, Any] = {}
    args = list(argv)
    while args:
        flag = args.pop(0)
        if flag not in ("-c", "--context") or not args or "=" not in args[0]:
            raise SystemExit(f"usage: python -m infra.app [-c key=value ...] (got {flag!r})")
        key, raw = args.pop(0).split("=", 1)
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def build_app(
    context: Mapping[str, Any] | None = None, *, outdir: str | None = None, nag: bool = True
) -> App:
    """The app with the Duetime stack of the stage that ``context`` selects, cdk-nag attached.

    Context precedence: the CDK CLI's (``-c`` and ``cdk.json`` when the CLI runs us) over ``context`` over
    ``cdk.json``.
    """
    merged = {**cdk_json_context(), **(context or {})}
    if outdir is None and "CDK_OUTDIR" not in os.environ:
        outdir = str(REPO_ROOT / "cdk.out")
    app = App(context=merged, outdir=outdir)
    config = stage_from_context(app.node.try_get_context)
    DuetimeStack(app, stack_id(config), config=config)
    if nag:
        add_aws_solutions_checks(app)
    return app


def main(argv: Sequence[str] = ()) -> None:
    app = build_app(parse_context_args(argv))
    try:
        assembly = app.synth()
    except RuntimeError as exc:
        if "ValidationFailed" not in str(exc):
            raise
        # cdk-nag printed each unacknowledged finding above, with the rule to acknowledge
        raise SystemExit(
            f"synth failed: unacknowledged cdk-nag findings (see {app.outdir}/validation-report.json)"
        ) from None
    if "CDK_OUTDIR" not in os.environ:  # run by hand or by make, not by the CDK CLI
        for stack in assembly.stacks:
            print(
                f"{stack.stack_name}: {assembly.directory}/{stack.template_file} (cdk-nag AwsSolutions: clean)"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
