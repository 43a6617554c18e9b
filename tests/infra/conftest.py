"""Infra tests: the CDK app synthesized once per session (per xdist worker) and shared by every test.

They need the ``cdk`` extra (aws-cdk-lib, constructs, cdk-nag, cfn-lint); without it every test that needs
``aws_cdk`` is skipped with that reason. Synthesis is offline: an environment-agnostic stack, no AWS
credentials, no docker (bundling of the layer is skipped; the template does not depend on it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# jsii (aws-cdk-lib's runtime) prints a banner on Node versions it has not tested or no longer supports
os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "18,20,21,22,23")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

CDK_MISSING = (
    "aws_cdk is not importable: install the cdk extra (pip install -e '.[cdk]') to run the infra tests"
)
#: context for test apps: no asset bundling (the layer's pip install; the template does not change), and no
#: CDK built-in CloudFormation validation at synth (it leaves the template unchanged too, costs seconds per
#: process, and cfn-lint, a superset, runs on the template in test_nag_and_lint)
NO_BUNDLING = {"aws:cdk:bundling-stacks": [], "@aws-cdk/core:validateAgainstDefaultRules": False}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "infra: synthesizes the CDK app in infra/ (needs the cdk extra: pip install -e '.[cdk]')"
    )


def require_cdk() -> Any:
    """Skip the calling test (or module) when aws_cdk is not importable."""
    return pytest.importorskip("aws_cdk", reason=CDK_MISSING)


@dataclass
class Synthesized:
    """One synthesized Duetime stack: the app, the stack, its template and the stage it was built for."""

    app: Any
    stack: Any
    template: Any  # aws_cdk.assertions.Template
    config: Any  # infra.config.StageConfig
    outdir: Path

    @property
    def resources(self) -> dict[str, Any]:
        return dict(self.template.to_json()["Resources"])

    def of_type(self, kind: str) -> dict[str, Any]:
        return {k: v for k, v in self.resources.items() if v["Type"] == kind}


def synthesize(outdir: Path, context: dict[str, Any] | None = None) -> Synthesized:
    """Build the app for ``context`` (over cdk.json) and synthesize its stack's template."""
    require_cdk()
    from aws_cdk.assertions import Template

    from infra.app import build_app
    from infra.stack import DuetimeStack

    app = build_app({**NO_BUNDLING, **(context or {})}, outdir=str(outdir), nag=False)
    stack = next(c for c in app.node.children if isinstance(c, DuetimeStack))
    return Synthesized(app, stack, Template.from_stack(stack), stack.config, outdir)


@pytest.fixture(scope="session")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The ``dev`` stage, as ``cdk synth -c stage=dev`` would build it (once per session)."""
    return synthesize(tmp_path_factory.mktemp("cdk-dev"), {"stage": "dev"})


def cfn_lint(synth: Synthesized) -> subprocess.CompletedProcess[str] | None:
    """cfn-lint on ``synth``'s template (None: cfn-lint, which comes with the cdk extra, is not installed).
    W3005 is ignored: CDK writes DependsOn next to a Ref to the same resource; harmless, not ours to change."""
    template = synth.outdir / "template.json"
    template.write_text(json.dumps(synth.template.to_json()))
    found = shutil.which("cfn-lint", path=str(Path(sys.executable).parent))
    if found is None:
        return None
    return subprocess.run(
        [found, "--ignore-checks", "W3005", "--", str(template)], capture_output=True, text=True, check=False
    )
