"""Red-team F7: the keys memgate takes from a tenant's JWKS. An RSA key with a huge public
exponent made every junk-signed token ~50 times dearer to verify; keys memgate never verifies
with (other curves, symmetric keys) have no business in the set either."""

from __future__ import annotations

import base64
import secrets
from typing import Any

import structlog
from joserfc.jwk import ECKey, KeySet, OKPKey, RSAKey

from service.issuers.jwks import usable_keys


def _b64(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _rsa(kid: str, n_bits: int, e: int) -> dict[str, Any]:
    """Only the sizes matter to the filter: n need not be a real modulus."""
    n = secrets.randbits(n_bits) | (1 << (n_bits - 1)) | 1
    return {"kty": "RSA", "kid": kid, "n": _b64(n), "e": _b64(e)}


def test_only_keys_memgate_verifies_with_cheaply_are_kept() -> None:
    good_rsa = RSAKey.generate_key(2048, parameters={"kid": "rsa"}).as_dict(private=False)
    good_ec = ECKey.generate_key("P-256", parameters={"kid": "ec"}).as_dict(private=False)
    good_ed = OKPKey.generate_key("Ed25519", parameters={"kid": "ed"}).as_dict(private=False)
    bad = [
        _rsa("huge-e", 3072, secrets.randbits(3071) | (1 << 3070) | 1),
        _rsa("e-just-over", 2048, (1 << 32) + 1),
        _rsa("short-n", 1024, 65537),
        _rsa("long-n", 8192, 65537),
        {"kty": "RSA", "kid": "junk", "n": "!!", "e": "AQAB"},
        ECKey.generate_key("P-384", parameters={"kid": "p384"}).as_dict(private=False),
        ECKey.generate_key("secp256k1", parameters={"kid": "k1"}).as_dict(private=False),
        OKPKey.generate_key("Ed448", parameters={"kid": "ed448"}).as_dict(private=False),
        OKPKey.generate_key("X25519", parameters={"kid": "x"}).as_dict(private=False),
        {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
        "not a key",
    ]
    document = {"keys": [good_rsa, *bad, good_ec, good_ed]}
    with structlog.testing.capture_logs() as logs:
        kept = usable_keys(document)
    assert [key["kid"] for key in kept["keys"]] == ["rsa", "ec", "ed"]
    assert len(KeySet.import_key_set(kept).keys) == 3  # type: ignore[arg-type]
    skipped = [e for e in logs if e["event"] == "tenant_jwks_key_skipped"]
    assert len(skipped) == len(bad)
    assert {e["reason"] for e in skipped} >= {"rsa-exponent", "rsa-modulus", "curve", "kty"}


def test_the_largest_allowed_sizes_are_kept() -> None:
    kept = usable_keys({"keys": [_rsa("max", 4096, 1 << 32), _rsa("min", 2048, 3)]})
    assert [key["kid"] for key in kept["keys"]] == ["max", "min"]


def test_a_document_without_a_key_list_is_refused() -> None:
    for document in ({}, {"keys": "x"}):
        try:
            usable_keys(document)
        except ValueError:
            continue
        raise AssertionError(document)
