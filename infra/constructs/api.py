"""API: an API Gateway HTTP API in front of the ``api`` function (DESIGN.md section 8).

Every route (``ANY /{proxy+}``; the Powertools resolver routes inside the function) requires IAM (SigV4)
authorization by default, or a JWT authorizer when the stage says ``authorizer: jwt``. The handler reads the
tenant from the authorizer context (the IAM caller's ARN, or the token's ``tenant``/``sub`` claim). The
``$default`` stage is throttled and writes JSON access logs to its own log group.
"""

from __future__ import annotations

import json

import jsii
from aws_cdk import Aws, RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_apigatewayv2_authorizers as authorizers
from aws_cdk import aws_apigatewayv2_integrations as integrations
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.config import StageConfig
from infra.constructs.console import SHELL_PATH, ConsoleSignIn
from infra.nag import acknowledge

#: One JSON object per request: who called what, the answer, and why a call failed before the function.
ACCESS_LOG_FIELDS = {
    "requestId": "$context.requestId",
    "requestTime": "$context.requestTime",
    "ip": "$context.identity.sourceIp",
    "caller": "$context.identity.caller",
    "userArn": "$context.identity.userArn",
    "jwtSub": "$context.authorizer.claims.sub",
    "method": "$context.httpMethod",
    "path": "$context.path",
    "routeKey": "$context.routeKey",
    "status": "$context.status",
    "protocol": "$context.protocol",
    "responseLength": "$context.responseLength",
    "latencyMs": "$context.responseLatency",
    "integrationStatus": "$context.integrationStatus",
    "integrationError": "$context.integrationErrorMessage",
    "authorizerError": "$context.authorizer.error",
    "error": "$context.error.message",
}


@jsii.implements(apigwv2.IAccessLogSettings)
class AccessLogSettings:
    """``IAccessLogSettings`` is a jsii interface, not a struct: Python needs a class to pass one."""

    def __init__(self, destination: apigwv2.IAccessLogDestination, format: apigw.AccessLogFormat) -> None:
        self._destination = destination
        self._format = format

    @property
    def destination(self) -> apigwv2.IAccessLogDestination:
        return self._destination

    @property
    def format(self) -> apigw.AccessLogFormat:
        return self._format


class Api(Construct):
    """The HTTP API; ``url`` is its endpoint.

    Args:
        sign_in: the console's sign-in (``infra/constructs/console.py``): its issuer and audience make the JWT
            authorizer, and the console's static shell and assets get routes without authorization.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: StageConfig,
        handler: lambda_.IFunction,
        sign_in: ConsoleSignIn | None = None,
    ) -> None:
        super().__init__(scope, id)
        self.http_api = apigwv2.HttpApi(
            self,
            "HttpApi",
            api_name=Aws.STACK_NAME,  # resolved by CloudFormation: one name per stage
            description=f"Duetime API ({config.name})",
            create_default_stage=False,
        )
        if sign_in is not None:
            sign_in.add_client(self.http_api.api_endpoint + "/")
            authorizer: apigwv2.IHttpRouteAuthorizer = authorizers.HttpJwtAuthorizer(
                "Jwt", jwt_issuer=sign_in.issuer, jwt_audience=sign_in.audience
            )
        elif config.authorizer == "jwt":
            authorizer = authorizers.HttpJwtAuthorizer(
                "Jwt", jwt_issuer=str(config.jwt_issuer), jwt_audience=list(config.jwt_audience)
            )
        else:
            authorizer = authorizers.HttpIamAuthorizer()
        integration = integrations.HttpLambdaIntegration("Handler", handler)
        self.http_api.add_routes(
            path="/{proxy+}", methods=[apigwv2.HttpMethod.ANY], integration=integration, authorizer=authorizer
        )
        if sign_in is not None:
            self._add_console_shell(integration)
        self.access_logs = logs.LogGroup(
            self,
            "AccessLogs",
            retention=logs.RetentionDays[config.log_retention],
            removal_policy=RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY,
        )
        self.stage = apigwv2.HttpStage(
            self,
            "DefaultStage",
            http_api=self.http_api,
            auto_deploy=True,
            throttle=apigwv2.ThrottleSettings(
                rate_limit=config.api_rate_limit, burst_limit=config.api_burst_limit
            ),
            access_log_settings=AccessLogSettings(
                destination=apigwv2.LogGroupLogDestination(self.access_logs),
                format=apigw.AccessLogFormat.custom(json.dumps(ACCESS_LOG_FIELDS)),
            ),
        )

    def _add_console_shell(self, integration: integrations.HttpLambdaIntegration) -> None:
        """``GET /console/shell`` and ``GET /console/static/{name}`` without authorization: the static shell
        and its assets, which hold no data (every page the shell loads goes through the authorizer)."""
        for path in (SHELL_PATH, "/console/static/{name}"):
            for route in self.http_api.add_routes(
                path=path,
                methods=[apigwv2.HttpMethod.GET],
                integration=integration,
                authorizer=apigwv2.HttpNoneAuthorizer(),
            ):
                acknowledge(
                    route,
                    "AwsSolutions-APIG4",
                    "the console's static shell and its assets (no data): signing in happens in the page; "
                    "every data call it makes carries the JWT through the authorizer",
                )

    @property
    def url(self) -> str:
        return str(self.stage.url)
