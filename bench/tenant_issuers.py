"""What caching a tenant issuer's verification config saves (docs/tenants.md, External issuers).

    .venv/bin/python -m bench.tenant_issuers [--lookups 2000] [--requests 300]

Starts its own embedded PostgreSQL (or uses DATABASE_URL), registers an IdP for a tenant through
the API (its JWKS served on 127.0.0.1), maps a subject, and measures, one at a time:

- `find`: the directory's lookup of (iss, aud) alone, from the cache and from the database
  (`memgate_tenant_issuer()` on a pooled connection, every time);
- `GET /v1/memories` with the IdP's token end to end (ASGI transport, no sockets), with the
  config cached (`MEMGATE_TENANT_ISSUER_CACHE_SECONDS=5`) and read per request (0).

Prints medians and p95. Bounded: a fixed count of lookups and requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import httpx
from joserfc import jwt
from joserfc.jwk import ECKey

from bench.api import FORM, _settings
from bench.database import bench_database
from service.app import create_app
from service.embeddings.wordllama import WordLlamaEmbedder
from service.identity.service import create_tenant
from service.issuers.directory import TenantIssuerDirectory
from service.runtime import Runtime, build_runtime
from service.settings import Settings

ISSUER = "https://login.bench.test"
AUDIENCE = "memgate-bench"
SUBJECT = "bench-user"


def _serve(document: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(document)))
            self.end_headers()
            self.wfile.write(document)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _stats(name: str, samples: list[float]) -> None:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[round(0.95 * (len(ms) - 1))]
    print(f"{name:<44} median {statistics.median(ms):8.4f} ms  p95 {p95:8.4f} ms  (n={len(ms)})")


async def _runtime(base: Settings, url: str, cache_seconds: float) -> Runtime:
    """Both runtimes share one key-encryption key: the audit pseudonym keys the first one
    sealed must open in the second."""
    auth = replace(
        base.auth, tenant_issuers_allow_loopback=True, tenant_issuer_cache_seconds=cache_seconds
    )
    return await build_runtime(replace(base, auth=auth), url, WordLlamaEmbedder(), owner_url=url)


async def _register(client: httpx.AsyncClient, runtime: Runtime, jwks_url: str) -> None:
    async with runtime.sessionmaker.begin() as session:
        created = await create_tenant(session, "bench")
    auth = (str(created.client_id), created.client_secret)
    token = (await client.post("/oauth/token", data=FORM, auth=auth)).json()["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    body = {"issuer": ISSUER, "audience": AUDIENCE, "jwks_url": jwks_url}
    assert (await client.post("/v1/issuers", json=body, headers=headers)).status_code == 201
    principal = {"display_name": "u", "external_issuer": ISSUER, "external_subject": SUBJECT}
    assert (await client.post("/v1/principals", json=principal, headers=headers)).status_code == 201


async def _lookups(runtime: Runtime, count: int) -> None:
    for cache_seconds, name in (
        (5.0, "find, cached config"),
        (0.0, "find, read from the database"),
    ):
        directory = TenantIssuerDirectory(
            runtime.sessionmaker,
            cache_seconds=cache_seconds,
            jwks_timeout=1.0,
            allow_loopback=True,
            min_refetch=30.0,
        )
        assert await directory.find(ISSUER, AUDIENCE) is not None
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            await directory.find(ISSUER, AUDIENCE)
            samples.append(time.perf_counter() - started)
        _stats(name, samples)


async def _requests(url: str, token_of: Any, jwks_url: str, count: int, lookups: int) -> None:
    registered = False
    base = _settings(url, Path(tempfile.mkdtemp()))
    for cache_seconds in (5.0, 0.0):
        runtime = await _runtime(base, url, cache_seconds)
        try:
            transport = httpx.ASGITransport(app=cast(Any, create_app(runtime)))
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                if not registered:
                    await _register(c, runtime, jwks_url)
                    await _lookups(runtime, lookups)
                    registered = True
                headers = {"Authorization": f"Bearer {token_of()}"}
                first = await c.get("/v1/memories", headers=headers)
                assert first.status_code == 200, first.text
                samples = []
                for _ in range(count):
                    started = time.perf_counter()
                    response = await c.get("/v1/memories", headers=headers)
                    samples.append(time.perf_counter() - started)
                    assert response.status_code == 200, response.text
                _stats(f"GET /v1/memories, cache {cache_seconds:g} s", samples)
        finally:
            await runtime.close()


async def main(lookups: int, requests: int) -> None:
    key = ECKey.generate_key("P-256", parameters={"kid": "k1", "alg": "ES256", "use": "sig"})
    server = _serve(json.dumps({"keys": [key.as_dict(private=False)]}).encode())
    jwks_url = f"http://127.0.0.1:{server.server_address[1]}/jwks"

    def token() -> str:
        now = int(time.time())
        claims: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "sub": SUBJECT}
        claims |= {"scope": "read:memory"}
        claims |= {"iat": now, "exp": now + 600}
        return jwt.encode({"alg": "ES256", "kid": "k1", "typ": "at+jwt"}, claims, key)

    try:
        with bench_database() as url:
            await _requests(url, token, jwks_url, requests, lookups)
    finally:
        server.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(main(args.lookups, args.requests))
