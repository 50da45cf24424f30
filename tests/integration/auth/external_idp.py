"""A trusted external IdP for tests: a real JWKS endpoint on 127.0.0.1 with real keys, an app
trusting it, and the claims of its tokens. Shared by the external-issuer, quota and tenant tests
(fixtures are imported by name where they are used)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from joserfc.jwk import ECKey, RSAKey
from litestar.testing import AsyncTestClient

from service.app import create_app
from service.embeddings import Embedder
from service.runtime import build_runtime
from service.settings import ExternalIssuer
from tests.conftest import PUBLIC_URL, make_settings
from tests.fixtures.api import Api
from tests.fixtures.postgres import app_login
from tests.integration.auth.forge import with_overrides

IDP = "https://idp.test"
SUBJECT = "ext-user-1"
ES256_KID = "idp-es256-1"
RS256_KID = "idp-rs256-1"


@dataclass
class FakeIdp:
    """A JWKS endpoint on 127.0.0.1 with real keys; counts every GET of the JWKS."""

    url: str = ""
    keys: list[ECKey | RSAKey] = field(default_factory=list)
    status: int = 200
    hits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def document(self) -> bytes:
        return json.dumps({"keys": [key.as_dict(private=False) for key in self.keys]}).encode()

    @property
    def es256(self) -> ECKey:
        key = self.keys[0]
        assert isinstance(key, ECKey)
        return key

    @property
    def rs256(self) -> RSAKey:
        key = self.keys[1]
        assert isinstance(key, RSAKey)
        return key


def _serve(idp: FakeIdp) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/jwks":
                self.send_error(404)
                return
            with idp.lock:
                idp.hits += 1
                status, body = idp.status, idp.document()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.fixture
def idp() -> Iterator[FakeIdp]:
    state = FakeIdp(
        keys=[
            ECKey.generate_key(
                "P-256", parameters={"kid": ES256_KID, "alg": "ES256", "use": "sig"}
            ),
            RSAKey.generate_key(2048, parameters={"kid": RS256_KID, "alg": "RS256", "use": "sig"}),
        ]
    )
    server = _serve(state)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/jwks"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@asynccontextmanager
async def idp_app(
    database_url: str,
    data_dir: Path,
    embedder: Embedder,
    idp: FakeIdp,
    **auth: object,
) -> AsyncIterator[Api]:
    settings = make_settings(
        database_url,
        data_dir,
        external_issuers=(ExternalIssuer(issuer=IDP, audience="memgate", jwks_url=idp.url),),
        **auth,
    )
    runtime = await build_runtime(
        settings, app_login(database_url), embedder, owner_url=database_url
    )
    try:
        async with AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL) as client:
            yield await Api.bootstrap(client, runtime)
    finally:
        await runtime.close()


@pytest.fixture
async def ext_api(
    database_url: str, tmp_path: Path, embedder: Embedder, idp: FakeIdp
) -> AsyncIterator[Api]:
    async with idp_app(database_url, tmp_path, embedder, idp) as api:
        yield api


def idp_claims(tenant_id: str, **overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": IDP,
        "aud": "memgate",
        "sub": SUBJECT,
        "tenant": tenant_id,
        "scope": "read:memory write:memory",
        "iat": now,
        "exp": now + 300,
    }
    return with_overrides(claims, overrides)
