"""The ``log_storage: express`` stage: run logs in an S3 Express One Zone directory bucket."""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.conftest import CDK_MISSING, Synthesized, cfn_lint, synthesize
from tests.infra.test_nag_and_lint import findings
from tests.infra.test_stack import as_list, identity_statements, ref_id

pytest.importorskip("aws_cdk", reason=CDK_MISSING)

pytestmark = [pytest.mark.infra, pytest.mark.xdist_group("cdk")]


@pytest.fixture(scope="module")
def express(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    return synthesize(
        tmp_path_factory.mktemp("cdk-express"),
        {"stage": "ci", "duetime:log_storage": "express", "duetime:log_zone": "use1-az4"},
    )


def _log_statements(synth: Synthesized) -> list[dict[str, Any]]:
    """The S3 statements of the logs (not of the run archive, a general purpose bucket in every stage)."""
    archive = synth.stack.resolve(synth.stack.get_logical_id(synth.stack.archive.bucket.node.default_child))
    return [
        s
        for _, s in identity_statements(synth)
        if any(a.startswith(("s3:", "s3express:")) for a in as_list(s["Action"]))
        and archive not in str(s["Resource"])
    ]


def test_the_logs_are_a_single_zone_directory_bucket_expiring_by_the_log_lifecycle(
    express: Synthesized,
) -> None:
    [(lid, bucket)] = express.of_type("AWS::S3Express::DirectoryBucket").items()
    props = bucket["Properties"]
    assert (props["DataRedundancy"], props["LocationName"]) == ("SingleAvailabilityZone", "use1-az4")
    [rule] = props["LifecycleConfiguration"]["Rules"]
    assert (rule["Status"], rule["ExpirationInDays"]) == (
        "Enabled",
        express.config.log_lifecycle.expiration_days,
    )
    assert bucket["DeletionPolicy"] == "Retain"
    # no general purpose bucket is left for logs: only the run archive and its access-log bucket
    general = {
        express.stack.resolve(express.stack.get_logical_id(b.node.default_child))
        for b in (express.stack.archive.bucket, express.stack.storage.access_logs_bucket)
    }
    assert set(express.of_type("AWS::S3::Bucket")) == general
    # and every process is told the directory bucket's name
    envs = [
        r["Properties"]["Environment"]["Variables"] for r in express.of_type("AWS::Lambda::Function").values()
    ]
    assert envs and all(ref_id(e["DUETIME_LOGS_BUCKET"]) == lid for e in envs if "DUETIME_LOGS_BUCKET" in e)


def test_log_access_is_create_session_on_the_bucket_read_only_for_readers(express: Synthesized) -> None:
    statements = _log_statements(express)
    # no object-level S3 action: a directory bucket authorizes through its sessions
    assert {a for s in statements for a in as_list(s["Action"])} == {"s3express:CreateSession"}
    modes = sorted(
        str(s.get("Condition", {}).get("StringEquals", {}).get("s3express:SessionMode")) for s in statements
    )
    # readers (the API, the finish function reading a log) read only; writers (workers, dispatcher) write
    assert "ReadOnly" in modes and "None" in modes
    for s in statements:
        [resource] = as_list(s["Resource"])
        assert "Fn::GetAtt" in resource and resource["Fn::GetAtt"][1] == "Arn"


def test_the_workers_vpc_reaches_the_directory_bucket_through_a_gateway_endpoint(
    express: Synthesized,
) -> None:
    services = [
        str(e["Properties"]["ServiceName"]) for e in express.of_type("AWS::EC2::VPCEndpoint").values()
    ]
    assert any("s3express" in s for s in services), services


def test_the_express_stage_is_nag_and_lint_clean(express: Synthesized) -> None:
    assert findings(express.stack) == []
    result = cfn_lint(express)
    assert result is not None and result.returncode == 0, result and (result.stdout + result.stderr)


def test_express_without_a_zone_is_refused_at_synth() -> None:
    from infra.config import StageConfig

    with pytest.raises(ValueError, match="log_zone"):
        StageConfig(log_storage="express")
