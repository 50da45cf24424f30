"""MCP authorization discovery: a 401 names the RFC 9728 protected-resource metadata in its
`WWW-Authenticate` header, and that document names the issuers and scopes (over real HTTP)."""

from __future__ import annotations

import httpx

from service.auth.scopes import ALL_SCOPES
from service.runtime import Runtime
from tests.conftest import PUBLIC_URL, TRUSTED_TEST_ISSUER
from tests.integration.mcp.support import serving


async def test_no_token_is_401_naming_the_protected_resource_metadata(runtime: Runtime) -> None:
    async with serving(runtime) as base, httpx.AsyncClient(base_url=base) as http:
        refused = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        bad = await http.post("/mcp", json={}, headers={"Authorization": "Bearer not.a.jwt"})
        rest = await http.get("/v1/memories")
        mcp_document = await http.get("/.well-known/oauth-protected-resource/mcp")
        api_document = await http.get("/.well-known/oauth-protected-resource")
    mcp_metadata = f"{PUBLIC_URL}/.well-known/oauth-protected-resource/mcp"
    assert refused.status_code == 401
    assert refused.json()["type"].endswith("/unauthenticated")
    assert refused.headers["www-authenticate"] == (
        f'Bearer realm="memgate", resource_metadata="{mcp_metadata}"'
    )
    assert bad.status_code == 401
    assert bad.headers["www-authenticate"] == (
        f'Bearer realm="memgate", resource_metadata="{mcp_metadata}", error="invalid_token"'
    )
    assert rest.status_code == 401
    assert (
        f'resource_metadata="{PUBLIC_URL}/.well-known/oauth-protected-resource"'
        in rest.headers["www-authenticate"]
    )
    expected = {
        "authorization_servers": [PUBLIC_URL, TRUSTED_TEST_ISSUER],
        "scopes_supported": sorted(ALL_SCOPES),
        "bearer_methods_supported": ["header"],
        "resource_name": "memgate",
    }
    assert mcp_document.status_code == 200
    assert mcp_document.json() == {"resource": f"{PUBLIC_URL}/mcp", **expected}
    assert api_document.json() == {"resource": PUBLIC_URL, **expected}
    assert "www-authenticate" not in mcp_document.headers
