"""The console's sign-in in the CDK app (infra/constructs/console.py): a Cognito user pool, a public app client
with the authorization code flow and the hosted UI, the pool as the API's JWT issuer, the static shell's
routes without authorization and every other route behind the JWT authorizer; cdk-nag and cfn-lint clean."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from infra.config import StageConfig
from tests.infra.conftest import CDK_MISSING, Synthesized, cfn_lint, synthesize

pytest.importorskip("aws_cdk", reason=CDK_MISSING)

from aws_cdk.assertions import Match  # noqa: E402

from tests.infra.test_nag_and_lint import findings  # noqa: E402

pytestmark = [pytest.mark.infra, pytest.mark.xdist_group("cdk")]

COGNITO = {"stage": "dev", "duetime:authorizer": "jwt", "duetime:console": {"domain_prefix": "duetime-dev-1"}}
OIDC = {
    "stage": "dev",
    "duetime:authorizer": "jwt",
    "duetime:jwt_issuer": "https://login.example.com/",
    "duetime:jwt_audience": ["console-client"],
    "duetime:console": {
        "sign_in": "oidc",
        "authorize_url": "https://login.example.com/authorize",
        "token_url": "https://login.example.com/token",
        "client_id": "console-client",
    },
}


@pytest.fixture(scope="module")
def with_cognito(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    return synthesize(tmp_path_factory.mktemp("cdk-console"), COGNITO)


def one(synth: Synthesized, kind: str) -> tuple[str, dict[str, Any]]:
    found = synth.of_type(kind)
    assert len(found) == 1, (kind, list(found))
    return next(iter(found.items()))


def routes(synth: Synthesized) -> dict[str, dict[str, Any]]:
    return {
        r["Properties"]["RouteKey"]: r["Properties"]
        for r in synth.of_type("AWS::ApiGatewayV2::Route").values()
    }


def test_the_user_pool_admits_invited_users_with_mfa_only(with_cognito: Synthesized) -> None:
    _, pool = one(with_cognito, "AWS::Cognito::UserPool")
    props = pool["Properties"]
    assert props["AdminCreateUserConfig"]["AllowAdminCreateUserOnly"] is True
    assert props["MfaConfiguration"] == "ON"
    assert props["Policies"]["PasswordPolicy"]["MinimumLength"] == 12
    assert props["UserPoolTier"] == "PLUS"
    _, domain = one(with_cognito, "AWS::Cognito::UserPoolDomain")
    assert domain["Properties"]["Domain"] == "duetime-dev-1"


def test_the_console_client_is_public_with_the_code_flow_calling_back_to_the_shell(
    with_cognito: Synthesized,
) -> None:
    _, client = one(with_cognito, "AWS::Cognito::UserPoolClient")
    props = client["Properties"]
    assert props["GenerateSecret"] is False
    assert props["AllowedOAuthFlows"] == ["code"]
    assert props["AllowedOAuthFlowsUserPoolClient"] is True
    assert sorted(props["AllowedOAuthScopes"]) == ["email", "openid"]
    assert props["SupportedIdentityProviders"] == ["COGNITO"]
    (callback,) = props["CallbackURLs"]
    api_id = next(iter(with_cognito.of_type("AWS::ApiGatewayV2::Api")))
    assert callback["Fn::Join"][1] == [{"Fn::GetAtt": [api_id, "ApiEndpoint"]}, "/console/shell"]


def test_the_api_authorizes_jwts_of_the_pool_for_the_client_and_leaves_only_the_shell_open(
    with_cognito: Synthesized,
) -> None:
    pool_id, _ = one(with_cognito, "AWS::Cognito::UserPool")
    client_id, _ = one(with_cognito, "AWS::Cognito::UserPoolClient")
    _, authorizer = one(with_cognito, "AWS::ApiGatewayV2::Authorizer")
    props = authorizer["Properties"]
    assert props["AuthorizerType"] == "JWT"
    assert props["IdentitySource"] == ["$request.header.Authorization"]
    assert props["JwtConfiguration"]["Audience"] == [{"Ref": client_id}]
    issuer = props["JwtConfiguration"]["Issuer"]["Fn::Join"][1]
    assert {"Ref": pool_id} in issuer and "https://cognito-idp." in issuer
    found = routes(with_cognito)
    assert found["ANY /{proxy+}"]["AuthorizationType"] == "JWT"
    assert found["GET /console/shell"]["AuthorizationType"] == "NONE"
    assert found["GET /console/static/{name}"]["AuthorizationType"] == "NONE"
    assert len(found) == 3


def test_the_api_function_knows_the_hosted_ui_and_the_client(with_cognito: Synthesized) -> None:
    client_id, _ = one(with_cognito, "AWS::Cognito::UserPoolClient")
    with_cognito.template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Environment": {
                "Variables": Match.object_like(
                    {
                        "DUETIME_CONSOLE_CLIENT_ID": {"Ref": client_id},
                        "DUETIME_CONSOLE_AUTHORIZE_URL": Match.any_value(),
                        "DUETIME_CONSOLE_TOKEN_URL": Match.any_value(),
                    }
                )
            }
        },
    )
    outputs = with_cognito.template.to_json()["Outputs"]
    assert "ConsoleUrl" in outputs and "ConsoleUserPoolId" in outputs


def test_cdk_nag_and_cfn_lint_are_clean_with_the_console(with_cognito: Synthesized) -> None:
    assert findings(with_cognito.stack) == []
    result = cfn_lint(with_cognito)
    assert result is not None, "cfn-lint comes with the cdk extra"
    assert result.returncode == 0, result.stdout + result.stderr


def test_any_oidc_issuer_signs_in_without_a_user_pool(tmp_path: Path) -> None:
    synth = synthesize(tmp_path, OIDC)
    assert synth.of_type("AWS::Cognito::UserPool") == {}
    _, authorizer = one(synth, "AWS::ApiGatewayV2::Authorizer")
    assert authorizer["Properties"]["JwtConfiguration"] == {
        "Audience": ["console-client"],
        "Issuer": "https://login.example.com/",
    }
    assert routes(synth)["GET /console/shell"]["AuthorizationType"] == "NONE"
    synth.template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Environment": {
                "Variables": Match.object_like(
                    {
                        "DUETIME_CONSOLE_CLIENT_ID": "console-client",
                        "DUETIME_CONSOLE_AUTHORIZE_URL": "https://login.example.com/authorize",
                    }
                )
            }
        },
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"console": {"domain_prefix": "d"}}, "console needs authorizer 'jwt'"),
        ({"authorizer": "jwt", "console": {}}, "domain_prefix"),
        (
            {
                "authorizer": "jwt",
                "jwt_issuer": "https://x",
                "jwt_audience": ["a"],
                "console": {"domain_prefix": "d"},
            },
            "leave jwt_issuer unset",
        ),
        ({"authorizer": "jwt", "console": {"sign_in": "oidc"}}, "authorize_url"),
        (
            {
                "authorizer": "jwt",
                "jwt_issuer": "https://x",
                "jwt_audience": ["a"],
                "console": {
                    "sign_in": "oidc",
                    "authorize_url": "https://x/a",
                    "token_url": "https://x/t",
                    "client_id": "other",
                },
            },
            "client_id must be one of jwt_audience",
        ),
    ],
)
def test_a_console_stage_needs_a_jwt_authorizer_and_a_complete_sign_in(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        StageConfig.model_validate(values)
