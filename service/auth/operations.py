"""The public operations of the embedded issuer: the token endpoint and its discovery."""

from __future__ import annotations

from service.auth.problems import (
    OAuthInvalidClient,
    OAuthInvalidGrant,
    OAuthInvalidRequest,
    OAuthInvalidScope,
    OAuthOverloaded,
    OAuthTooManyFailures,
    OAuthUnauthorizedClient,
    OAuthUnsupportedGrantType,
)
from service.auth.scopes import Scope
from service.operations import operation
from service.problems import BodyTooLarge, InvalidRequest
from service.quotas.problems import RateLimited

TOKEN = operation(
    "auth.token",
    "issueToken",
    "Get an access token (client credentials or token exchange)",
    None,
    OAuthInvalidRequest,
    OAuthInvalidClient,
    OAuthInvalidGrant,
    OAuthUnauthorizedClient,
    OAuthUnsupportedGrantType,
    OAuthInvalidScope,
    OAuthTooManyFailures,
    OAuthOverloaded,
    RateLimited,
    InvalidRequest,
    BodyTooLarge,
    # Its form is checked by the endpoint itself (RFC 6749 errors): no JSON validation, no ids.
    takes_input=False,
)
# No input of their own, but a query parameter they do not take is refused (422).
JWKS = operation(
    "auth.jwks",
    "getJwks",
    "The embedded issuer's public signing keys",
    None,
    InvalidRequest,
    takes_input=False,
)
METADATA = operation(
    "auth.metadata",
    "getAuthorizationServerMetadata",
    "Authorization server metadata (RFC 8414)",
    None,
    InvalidRequest,
    takes_input=False,
)
RESOURCE_METADATA = operation(
    "auth.resource_metadata",
    "getProtectedResourceMetadata",
    "Protected resource metadata of the API (RFC 9728)",
    None,
    takes_input=False,
)
MCP_RESOURCE_METADATA = operation(
    "auth.mcp_resource_metadata",
    "getMcpProtectedResourceMetadata",
    "Protected resource metadata of the MCP endpoint (RFC 9728)",
    None,
    takes_input=False,
)

KEYS_ROTATE = operation(
    "keys.rotate",
    "rotateSigningKeys",
    "A platform job (`memgate jobs run keys.rotate`): promote the published next token "
    "signing key, as the tables' owner",
    Scope.RUN_JOBS,
)
