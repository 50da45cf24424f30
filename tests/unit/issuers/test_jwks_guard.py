"""The guard on tenant-chosen JWKS URLs: what it refuses before and at fetch time, against a
real HTTP server on loopback (allowed only with the operator's loopback setting)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from service.issuers.jwks import UrlRefused, check_url, guarded_jwks_fetcher

BIG = 300_000


@pytest.fixture
def server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "http://169.254.169.254/latest/meta-data")
                self.end_headers()
                return
            body = b'{"keys": []}' if self.path == "/jwks" else b" " * BIG
            if self.path == "/host":
                body = json.dumps({"keys": [], "host": self.headers["Host"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize(
    "url",
    [
        "http://jwks.example.com/keys",
        "ftp://jwks.example.com/keys",
        "https://10.1.2.3/keys",
        "https://192.168.0.1/keys",
        "https://169.254.169.254/latest",
        "https://100.64.0.1/keys",
        "https://[fd00::1]/keys",
        "https://[::ffff:127.0.0.1]/keys",
        "https://127.0.0.1/keys",
        "https://0.0.0.0/keys",
        "https://u:p@jwks.example.com/keys",
        "https://jwks.example.com/keys#frag",
        "https:///keys",
        "https://jwks.example.com:99999/keys",
    ],
)
def test_urls_that_are_never_fetched(url: str) -> None:
    with pytest.raises(UrlRefused):
        check_url(url, allow_loopback=False)


def test_public_https_and_loopback_when_allowed() -> None:
    assert check_url("https://jwks.example.com/keys", allow_loopback=False).hostname == (
        "jwks.example.com"
    )
    assert check_url("http://127.0.0.1:8081/jwks", allow_loopback=True).port == 8081
    assert check_url("http://localhost/jwks", allow_loopback=True).hostname == "localhost"
    with pytest.raises(UrlRefused):
        check_url("http://10.0.0.1/jwks", allow_loopback=True)


async def test_a_name_resolving_to_loopback_is_refused_at_fetch_time() -> None:
    """`localhost` passes the syntax check as a name; its address is what is refused."""
    fetch = guarded_jwks_fetcher("https://localhost/jwks", timeout=1.0, allow_loopback=False)
    with pytest.raises(ValueError, match="not public"):
        await fetch()


async def test_fetches_with_the_hostname_and_refuses_redirects_and_big_bodies(
    server: str,
) -> None:
    fetched = await guarded_jwks_fetcher(f"{server}/jwks", timeout=1.0, allow_loopback=True)()
    assert fetched == {"keys": []}
    named = server.replace("127.0.0.1", "localhost")
    host = await guarded_jwks_fetcher(f"{named}/host", timeout=1.0, allow_loopback=True)()
    assert host == {"keys": [], "host": named.removeprefix("http://")}
    with pytest.raises(ValueError, match="302"):
        await guarded_jwks_fetcher(f"{server}/redirect", timeout=1.0, allow_loopback=True)()
    with pytest.raises(ValueError, match="too large"):
        await guarded_jwks_fetcher(f"{server}/big", timeout=1.0, allow_loopback=True)()


# Red-team F5: IPv6 forms that carry an inward IPv4 address (or point inward themselves).
INWARD_IPV6 = [
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b::a00:7",  # NAT64 of 10.0.0.7
    "64:ff9b:1::a00:7",  # local-use NAT64 (RFC 8215)
    "::ffff:0:a00:7",  # SIIT-translated 10.0.0.7
    "2002:a00:7::",  # 6to4 of 10.0.0.7
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "::7f00:1",  # IPv4-compatible 127.0.0.1
    "::a00:7",  # IPv4-compatible 10.0.0.7
    "fec0::1",  # site-local
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo: the client address is hidden
]


@pytest.mark.parametrize("address", INWARD_IPV6)
def test_ipv6_forms_pointing_inward_are_refused_as_literals(address: str) -> None:
    with pytest.raises(UrlRefused):
        check_url(f"https://[{address}]/keys", allow_loopback=False)


@pytest.mark.parametrize("address", INWARD_IPV6)
async def test_ipv6_forms_pointing_inward_are_refused_in_dns_answers(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A public name whose AAAA answer is such a form is refused before any connection."""

    async def answer(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", answer)
    fetch = guarded_jwks_fetcher("https://jwks.example.com/keys", timeout=1.0, allow_loopback=False)
    with pytest.raises(ValueError, match="not public"):
        await fetch()


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::808:808",  # NAT64 of 8.8.8.8
        "2002:808:808::1",  # 6to4 of 8.8.8.8
        "2606:4700:4700::1111",  # plain global IPv6
    ],
)
def test_ipv6_forms_of_public_addresses_stay_allowed(address: str) -> None:
    assert check_url(f"https://[{address}]/keys", allow_loopback=False).hostname == address
