"""cdk-nag (AwsSolutions, v3 Validations API) and cfn-lint on the synthesized template."""

from __future__ import annotations

import pytest

from tests.infra.conftest import CDK_MISSING, NO_BUNDLING, Synthesized, cfn_lint

pytest.importorskip("aws_cdk", reason=CDK_MISSING)

from aws_cdk import App, Stack, Validations  # noqa: E402
from aws_cdk import aws_s3 as s3  # noqa: E402
from cdk_nag import AwsSolutionsChecks  # noqa: E402

from infra.nag import acknowledge  # noqa: E402

# one xdist group: with `--dist loadgroup` the CDK app is synthesized by one worker only
pytestmark = [pytest.mark.infra, pytest.mark.xdist_group("cdk")]


def findings(scope: object) -> list[tuple[str, list[str]]]:
    report = AwsSolutionsChecks().validate_scope(scope)
    return [(v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations]


def test_cdk_nag_has_no_unacknowledged_findings(dev: Synthesized) -> None:
    assert findings(dev.stack) == []


def test_every_acknowledgement_names_a_rule_and_gives_a_reason(dev: Synthesized) -> None:
    acknowledged = [
        (construct.node.path, rule, reason)
        for construct in dev.stack.node.find_all()
        for entry in construct.node.metadata
        if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY
        for rule, reason in entry.data.items()
    ]

    ours = [a for a in acknowledged if "AwsSolutions-" in a[1]]
    assert ours, "expected acknowledged AwsSolutions findings (X-Ray, ECR auth, DLQs...)"
    for path, rule, reason in acknowledged:
        assert isinstance(reason, str) and len(reason.strip()) >= 10, (path, rule)
    assert not [a for a in ours if a[0] == dev.stack.node.path], "nothing is acknowledged stack-wide"


def test_cdk_nag_reports_what_is_not_acknowledged() -> None:
    app = App(context=NO_BUNDLING)
    stack = Stack(app, "Control")
    s3.Bucket(stack, "Plain")
    acknowledged = s3.Bucket(stack, "Acknowledged", enforce_ssl=True)
    acknowledge(acknowledged, "AwsSolutions-S1", "a control bucket that is logged elsewhere")

    assert sorted(findings(stack)) == [
        ("AwsSolutions-S1", ["Control/Plain/Resource"]),
        ("AwsSolutions-S10", ["Control/Plain/Resource"]),
    ]


def test_an_acknowledgement_needs_a_reason() -> None:
    app = App(context=NO_BUNDLING)
    bucket = s3.Bucket(Stack(app, "NoReason"), "B")

    with pytest.raises(ValueError, match="reason"):
        acknowledge(bucket, "AwsSolutions-S1", " ")


def test_cfn_lint_finds_no_errors_in_the_template(dev: Synthesized) -> None:
    result = cfn_lint(dev)
    if result is None:
        pytest.skip("cfn-lint is not installed (it comes with the cdk extra)")

    assert result.returncode == 0, result.stdout + result.stderr
