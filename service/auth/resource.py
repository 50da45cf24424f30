"""OAuth 2.0 protected resource metadata (RFC 9728): where a client that holds no token learns
which authorization servers issue tokens memgate accepts and which scopes exist.

Two documents, because RFC 9728 §3.3 ties each to the resource it describes: the API as a
whole (`/.well-known/oauth-protected-resource`, resource = the public URL) and the MCP endpoint
(`/.well-known/oauth-protected-resource/mcp`, resource = `<public URL>/mcp`), which MCP clients
look for first. Both name the same servers: one audience covers REST and MCP alike.
"""

from __future__ import annotations

from typing import Any

from service.auth.scopes import ALL_SCOPES
from service.settings import Settings

WELL_KNOWN = "/.well-known/oauth-protected-resource"
MCP_PATH = "/mcp"


def metadata_url(public_url: str, path: str) -> str:
    """The metadata document of the resource a request's `path` belongs to (the one its 401's
    `WWW-Authenticate` names)."""
    if path == MCP_PATH or path.startswith(MCP_PATH + "/"):
        return public_url + WELL_KNOWN + MCP_PATH
    return public_url + WELL_KNOWN


def resource_metadata(settings: Settings, resource_path: str = "") -> dict[str, Any]:
    """The RFC 9728 document for `<public URL><resource_path>`."""
    public_url = settings.server.public_url
    servers = [public_url] if settings.auth.embedded_issuer else []
    servers += sorted(settings.auth.trusted_external_issuers - {public_url})
    return {
        "resource": public_url + resource_path,
        "authorization_servers": servers,
        "scopes_supported": sorted(ALL_SCOPES),
        "bearer_methods_supported": ["header"],
        "resource_name": "memgate",
    }
