"""The web console on AWS: sign-in for its static shell, served by the API itself.

API Gateway's JWT authorizer reads a header, never a cookie, so a browser cannot simply navigate to the
console's pages. The API serves a **static shell** instead, ``GET /console/shell`` and the assets under
``/console/static/`` without authorization (routes of their own, :meth:`Api.add_public_routes`): HTML and
JavaScript that hold no data. The shell signs the user in with the authorization code flow and PKCE, keeps the
access token in memory, and loads each console page with htmx carrying ``Authorization: Bearer <token>``,
through the same JWT authorizer as the JSON API; the handler takes the tenant from the token as for any call.

Why from the API and not S3 + CloudFront with OAC: the shell and the pages then share one origin, so the
Content-Security-Policy stays ``'self'``, there is no CORS to open, no second domain or certificate, and the
shell ships in the same Lambda layer as the pages it loads (one deployment, never out of step). It costs one
Lambda invocation per shell load (the assets are cacheable for a day).

``sign_in: cognito`` (:class:`infra.config.ConsoleConfig`) creates the user pool (no self sign-up, MFA
required, threat protection enforced), a public app client (authorization code grant only, no secret, the
shell's URL as its callback) and the hosted UI's domain; the pool becomes the JWT authorizer's issuer and
the client its audience. ``sign_in: oidc`` adds no resource: the stage's ``jwt_issuer`` signs people in.
"""

from __future__ import annotations

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_cognito as cognito
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.config import ConsoleConfig, StageConfig
from infra.nag import acknowledge

#: the shell's path on the API (the sign-in's callback)
SHELL_PATH = "/console/shell"


class ConsoleSignIn(Construct):
    """Who signs in to the console: ``issuer`` and ``audience`` for the API's JWT authorizer, and the
    endpoints and client the shell uses (:meth:`configure`)."""

    def __init__(self, scope: Construct, id: str, *, config: StageConfig, console: ConsoleConfig) -> None:
        super().__init__(scope, id)
        self.console = console
        self.user_pool: cognito.UserPool | None = None
        self.client: cognito.UserPoolClient | None = None
        self.domain: cognito.UserPoolDomain | None = None
        if console.sign_in == "oidc":
            self.issuer = str(config.jwt_issuer)
            self.audience = list(config.jwt_audience)
            self.authorize_url = str(console.authorize_url)
            self.token_url = str(console.token_url)
            self.client_id = str(console.client_id)
            return
        pool = cognito.UserPool(
            self,
            "Users",
            self_sign_up_enabled=False,  # an administrator invites each user
            sign_in_aliases=cognito.SignInAliases(email=True),
            mfa=cognito.Mfa.REQUIRED,
            mfa_second_factor=cognito.MfaSecondFactor(otp=True, sms=False),
            password_policy=cognito.PasswordPolicy(
                min_length=12,
                require_lowercase=True,
                require_uppercase=True,
                require_digits=True,
                require_symbols=True,
            ),
            account_recovery=cognito.AccountRecovery.EMAIL_ONLY,
            feature_plan=cognito.FeaturePlan.PLUS,
            standard_threat_protection_mode=cognito.StandardThreatProtectionMode.FULL_FUNCTION,
            removal_policy=RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY,
            deletion_protection=config.retain_data,
        )
        # the deprecated AdvancedSecurityMode is what cdk-nag reads; the Plus plan's threat protection is
        # its replacement (set above), and CloudFormation refuses both at once
        acknowledge(
            pool,
            "AwsSolutions-COG3",
            "threat protection is enforced through the Plus feature plan (StandardThreatProtectionMode "
            "FULL_FUNCTION), the replacement of the AdvancedSecurityMode property this rule reads",
        )
        self.domain = pool.add_domain(
            "HostedUi", cognito_domain=cognito.CognitoDomainOptions(domain_prefix=str(console.domain_prefix))
        )
        self.user_pool = pool
        # the tokens' ``iss`` (the ProviderURL attribute lacks the scheme)
        self.issuer = f"https://cognito-idp.{Aws.REGION}.{Aws.URL_SUFFIX}/{pool.user_pool_id}"
        self.authorize_url = self.domain.base_url() + "/oauth2/authorize"
        self.token_url = self.domain.base_url() + "/oauth2/token"

    def add_client(self, api_url: str) -> None:
        """The console's public app client (Cognito), calling back to the shell at ``api_url`` (the stage's
        URL, ending in ``/``) and the stage's own ``callback_urls``."""
        if self.user_pool is None:
            return
        shell = api_url + SHELL_PATH.lstrip("/")
        self.client = self.user_pool.add_client(
            "Console",
            generate_secret=False,  # a browser cannot keep a secret: PKCE instead
            auth_flows=cognito.AuthFlow(user_srp=True),
            o_auth=cognito.OAuthSettings(
                flows=cognito.OAuthFlows(authorization_code_grant=True),
                scopes=[cognito.OAuthScope.OPENID, cognito.OAuthScope.EMAIL],
                callback_urls=[shell, *self.console.callback_urls],
                logout_urls=[shell, *self.console.callback_urls],
            ),
            supported_identity_providers=[cognito.UserPoolClientIdentityProvider.COGNITO],
            prevent_user_existence_errors=True,
            access_token_validity=Duration.hours(1),
            id_token_validity=Duration.hours(1),
            refresh_token_validity=Duration.days(1),
            enable_token_revocation=True,
        )
        self.client_id = self.client.user_pool_client_id
        self.audience = [self.client_id]

    def configure(self, handler: lambda_.Function) -> None:
        """Tell the API function where the shell signs people in (``DUETIME_CONSOLE_*``)."""
        handler.add_environment("DUETIME_CONSOLE_AUTHORIZE_URL", self.authorize_url)
        handler.add_environment("DUETIME_CONSOLE_TOKEN_URL", self.token_url)
        handler.add_environment("DUETIME_CONSOLE_CLIENT_ID", self.client_id)
