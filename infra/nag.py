"""cdk-nag (v3, CDK's ``Validations`` API): the AwsSolutions pack and acknowledgements with reasons.

Every acknowledgement names one rule (or one finding of it, ``AwsSolutions-IAM5[Resource::...]``) on one
construct, next to the code that causes it, with the reason it is acceptable. Nothing is acknowledged
stack-wide.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, CfnResource, Stack, Validations
from constructs import IConstruct


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge ``rule`` on ``scope`` and everything under it, for ``reason`` (required, non-empty)."""
    if len(reason.strip()) < 10:
        raise ValueError(f"{rule}: an acknowledgement needs a real reason")
    Validations.of(scope).acknowledge(Acknowledgment(id=rule, reason=reason))


def add_aws_solutions_checks(scope: IConstruct) -> None:
    """Run the AwsSolutions pack on ``scope`` (an App or Stage) during synthesis: an unacknowledged finding
    fails the synthesis. Acknowledgements are also written to the template (``Metadata.cdk_nag``)."""
    from cdk_nag import AwsSolutionsChecks

    Validations.of(scope).add_plugins(AwsSolutionsChecks(scope, write_suppressions_to_cloud_formation=True))


def arn_finding(resource: IConstruct, suffix: str) -> str:
    """The IAM5 finding id for a wildcard under ``resource``'s ARN: ``Resource::<LogicalId.Arn><suffix>``.

    Args:
        resource: an L2 construct (its default child is the CloudFormation resource) or an L1 resource.
        suffix: what follows the ARN in the policy, e.g. ``/logs/*`` or ``:*``.
    """
    cfn = resource if isinstance(resource, CfnResource) else resource.node.default_child
    if not isinstance(cfn, CfnResource):
        raise TypeError(f"{resource.node.path} has no CloudFormation resource")
    stack = Stack.of(cfn)
    logical_id = stack.resolve(stack.get_logical_id(cfn))
    return f"AwsSolutions-IAM5[Resource::<{logical_id}.Arn>{suffix}]"
