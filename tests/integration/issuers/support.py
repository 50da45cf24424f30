"""Loopback IdPs for tenant issuer tests: a real JWKS over HTTP on 127.0.0.1 (optionally slow),
an app that allows loopback JWKS URLs, and helpers to register issuers and sign tokens."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from joserfc.jwk import ECKey
from litestar.testing import AsyncTestClient

from service.app import create_app
from service.embeddings import Embedder
from service.runtime import build_runtime
from tests.conftest import PUBLIC_URL, make_settings
from tests.fixtures.api import Agent, Api
from tests.fixtures.postgres import app_login
from tests.integration.auth.forge import sign, with_overrides


@dataclass
class LoopbackIdp:
    """A JWKS endpoint on 127.0.0.1 with a real ES256 key; counts GETs; may answer late."""

    issuer: str
    key: ECKey = field(
        default_factory=lambda: ECKey.generate_key(
            "P-256", parameters={"kid": "k1", "alg": "ES256", "use": "sig"}
        )
    )
    delay: float = 0.0
    url: str = ""
    hits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def document(self) -> bytes:
        return json.dumps({"keys": [self.key.as_dict(private=False)]}).encode()

    def token(self, audience: str, subject: str, **overrides: Any) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "aud": audience,
            "sub": subject,
            "scope": "read:memory write:memory",
            "iat": now,
            "exp": now + 300,
        }
        return sign(self.key, with_overrides(claims, overrides))


@contextmanager
def serving(idp: LoopbackIdp) -> Iterator[LoopbackIdp]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with idp.lock:
                idp.hits += 1
            time.sleep(idp.delay)
            body = idp.document()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up (the slow case)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    idp.url = f"http://127.0.0.1:{server.server_address[1]}/jwks"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield idp
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@asynccontextmanager
async def issuer_app(
    database_url: str, data_dir: Path, embedder: Embedder, **auth: object
) -> AsyncIterator[Api]:
    """The app as tenant admins use it in tests: loopback JWKS URLs allowed (the operator
    setting), a one-second JWKS timeout."""
    settings = make_settings(
        database_url,
        data_dir,
        **{"tenant_issuers_allow_loopback": True, "tenant_jwks_timeout_seconds": 1.0, **auth},
    )
    runtime = await build_runtime(
        settings, app_login(database_url), embedder, owner_url=database_url
    )
    try:
        async with AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL) as client:
            yield await Api.bootstrap(client, runtime)
    finally:
        await runtime.close()


async def register(api: Api, **fields: Any) -> dict[str, Any]:
    response = await api.http.post("/v1/issuers", json=fields, headers=api.admin.headers)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def mapped(api: Api, issuer: str, subject: str, kind: str = "user") -> dict[str, Any]:
    return await api.new_principal(
        f"{subject} via IdP", kind=kind, external_issuer=issuer, external_subject=subject
    )


def bearer(token: str) -> Agent:
    return Agent("", "", "", token)
