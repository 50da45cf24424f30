"""Fetching a JWKS whose URL a tenant admin chose: it must not reach the internal network, and
it must not stall token verification for anybody else.

- https only (http only to loopback, when the operator allows loopback for tests and local IdPs);
- the host is resolved here, every address it resolves to must be global (not private,
  loopback, link-local, shared, reserved or multicast; an IPv6 form carrying an IPv4 address,
  NAT64, 6to4, SIIT, IPv4-compatible or IPv4-mapped, is judged as that IPv4 address, and
  site-local, Teredo and local-use NAT64 are refused), and the connection goes to the address
  that was checked (the `Host` header and TLS name stay the hostname), so a DNS answer that
  changes between the check and the connection cannot point it inward;
- no redirects, no proxy from the environment, the whole fetch (resolve, connect, read) within
  one timeout, the body read in chunks and dropped past `max_bytes`;
- only keys memgate verifies with, at sizes that cost what a normal key costs (`usable_keys`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import json
import socket
from typing import Any
from urllib.parse import SplitResult, urlsplit

import httpx
import structlog

from service.auth.tokens import KeyFetcher

_log = structlog.get_logger("memgate.issuers")
MAX_JWKS_BYTES = 256_000
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class UrlRefused(ValueError):
    """The URL may not be fetched (the message says why, for the registering admin)."""


def check_url(url: str, *, allow_loopback: bool, what: str = "jwks_url") -> SplitResult:
    """The parts of a URL a tenant may register: https (or http to loopback when allowed), a
    host, no user info, no fragment; an IP literal must be one we would fetch from."""
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # `port` raises on a bad port
    except ValueError:
        raise UrlRefused(f"{what} is not a URL.") from None
    if not host:
        raise UrlRefused(f"{what} must name a host.")
    if parts.username is not None or parts.password is not None or parts.fragment:
        raise UrlRefused(f"{what} may not carry user info or a fragment.")
    loopback = allow_loopback and host.lower() in LOOPBACK_NAMES
    if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
        raise UrlRefused(f"{what} must be an https:// URL.")
    literal = _literal(host)
    if literal is not None and not _fetchable(literal, allow_loopback=allow_loopback):
        raise UrlRefused(
            f"{what} names an address that is not public (private, loopback, link-local or "
            "reserved); memgate fetches keys only from public addresses."
        )
    return parts


def guarded_jwks_fetcher(
    url: str, *, timeout: float, allow_loopback: bool, max_bytes: int = MAX_JWKS_BYTES
) -> KeyFetcher:
    """A key fetcher for a tenant-registered JWKS URL; every failure is a `ValueError` (the key
    cache keeps its last good keys, or refuses the token)."""

    async def fetch() -> dict[str, Any]:
        try:
            async with asyncio.timeout(timeout):
                return await _fetch(url, timeout, allow_loopback, max_bytes)
        except (TimeoutError, OSError, httpx.HTTPError) as exc:
            raise ValueError(f"JWKS unavailable ({type(exc).__name__})") from None

    return fetch


async def _fetch(
    url: str, io_timeout: float, allow_loopback: bool, max_bytes: int
) -> dict[str, Any]:
    parts = check_url(url, allow_loopback=allow_loopback)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = await _resolve(host, port, allow_loopback)
    pinned = str(address) if address.version == 4 else f"[{address}]"
    target = parts._replace(netloc=f"{pinned}:{port}").geturl()
    headers = {"Accept": "application/json", "Host": parts.netloc}
    async with (
        httpx.AsyncClient(timeout=io_timeout, follow_redirects=False, trust_env=False) as client,
        client.stream("GET", target, headers=headers, extensions={"sni_hostname": host}) as answer,
    ):
        if answer.status_code != 200:
            raise ValueError(f"JWKS answered {answer.status_code}")
        body = bytearray()
        async for chunk in answer.aiter_bytes():
            body += chunk
            if len(body) > max_bytes:
                raise ValueError("JWKS document too large")
    document = json.loads(bytes(body))
    if not isinstance(document, dict):
        # ValueError, as every other bad answer: the key cache treats them alike.
        raise ValueError("JWKS document is not an object")  # noqa: TRY004
    return usable_keys(document)


def usable_keys(document: dict[str, Any]) -> dict[str, Any]:
    """The keys of a tenant's JWKS memgate may verify with, each skipped one logged: RSA with
    a 2048-4096-bit modulus and a public exponent up to 2^32 (a huge exponent made every
    junk-signed token about 50 times dearer to check: red-team F7), EC on P-256 (ES256) and
    OKP on Ed25519 (EdDSA). Nothing else (other curves, symmetric keys) is ever verified with,
    so nothing else is imported."""
    keys = document.get("keys")
    if not isinstance(keys, list):
        raise ValueError("JWKS document has no key list")  # noqa: TRY004 (as above)
    kept = []
    for key in keys:
        refusal = _refusal(key)
        if refusal is None:
            kept.append(key)
        else:
            kty = key.get("kty") if isinstance(key, dict) else None
            _log.warning(
                "tenant_jwks_key_skipped", reason=refusal, kty=kty if kty in _KTYS else None
            )
    return {**document, "keys": kept}


_KTYS = frozenset({"RSA", "EC", "OKP", "oct"})
_CURVES = {"EC": "P-256", "OKP": "Ed25519"}
RSA_MODULUS_BITS = (2048, 4096)
RSA_MAX_EXPONENT = 1 << 32


def _refusal(key: object) -> str | None:
    """Why `key` is not imported (a short fixed code), or None."""
    if not isinstance(key, dict):
        return "kty"
    kty = key.get("kty")
    if kty == "RSA":
        return _rsa_refusal(key)
    if kty in _CURVES:
        return None if key.get("crv") == _CURVES[kty] else "curve"
    return "kty"


def _rsa_refusal(key: dict[str, Any]) -> str | None:
    try:
        n, e = _b64_int(key.get("n")), _b64_int(key.get("e"))
    except ValueError:
        return "rsa-malformed"
    low, high = RSA_MODULUS_BITS
    if not low <= n.bit_length() <= high:
        return "rsa-modulus"
    if not 3 <= e <= RSA_MAX_EXPONENT:
        return "rsa-exponent"
    return None


def _b64_int(value: object) -> int:
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise ValueError("not a base64url integer")
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not a base64url integer") from None
    return int.from_bytes(raw, "big")


async def _resolve(host: str, port: int, allow_loopback: bool) -> Address:
    """The address to connect to: the first one `host` resolves to, once every one of them is
    fetchable (a name with one private answer among public ones is refused)."""
    literal = _literal(host)
    if literal is not None:
        found = [literal]
    else:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        found = [ipaddress.ip_address(info[4][0]) for info in infos]
    if not found or not all(_fetchable(a, allow_loopback=allow_loopback) for a in found):
        raise ValueError("JWKS host resolves to an address that is not public")
    return min(found, key=lambda address: address.version)  # IPv4 first, as most IdPs serve


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


_IPV4_IN_LOW_BITS = (
    ipaddress.IPv6Network("64:ff9b::/96"),  # NAT64 (RFC 6052): the gateway connects inward
    ipaddress.IPv6Network("::ffff:0:0:0/96"),  # SIIT IPv4-translated (RFC 2765)
    ipaddress.IPv6Network("::/96"),  # IPv4-compatible (deprecated, RFC 4291)
)
"""IPv6 forms whose last 32 bits are the IPv4 address a packet ends up at: judged as that
address (red-team F5: `is_global` called them public)."""
_REFUSED_IPV6 = (
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # local-use NAT64 (RFC 8215)
    ipaddress.IPv6Network("2001::/32"),  # Teredo: the client address is obfuscated
    ipaddress.IPv6Network("fec0::/10"),  # site-local (deprecated, still routed inward)
)
"""Refused whatever they carry."""


def _fetchable(address: Address, *, allow_loopback: bool) -> bool:
    if allow_loopback and address.is_loopback:
        return True
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in network for network in _REFUSED_IPV6):
            return False
        inner = _embedded_ipv4(address)
        if inner is not None:
            return _fetchable(inner, allow_loopback=False)
    return address.is_global and not address.is_multicast


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped, NAT64, SIIT, IPv4-compatible or 6to4 address leads to."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in network for network in _IPV4_IN_LOW_BITS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None
