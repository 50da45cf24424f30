"""Wire shapes of the tenant issuer API."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

import msgspec

from service.db.types import NO_NUL

Url = Annotated[str, msgspec.Meta(min_length=8, max_length=500, pattern=NO_NUL)]
Audience = Annotated[str, msgspec.Meta(min_length=1, max_length=500, pattern=NO_NUL)]
Claim = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
"""A claim name: letters, digits and `_ . : -`, at most 64 characters."""


class IssuerCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    issuer: Url
    """The IdP's `iss`, exactly as its tokens carry it (an https URL)."""
    audience: Audience
    """The `aud` its tokens for memgate carry; (issuer, audience) picks your tenant."""
    jwks_url: Url
    """Where its signing keys are published (https)."""
    algorithms: Annotated[list[str], msgspec.Meta(min_length=1, max_length=3)] = msgspec.field(
        default_factory=lambda: ["RS256", "ES256"]
    )
    require_typ: bool = True
    """Tokens must carry `typ: at+jwt` (RFC 9068); turn off for IdPs that send `JWT`."""
    subject_claim: Claim = "sub"
    scope_claim: Claim = "scope"
    client_id_claim: Claim = "client_id"


class IssuerOut(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    issuer: str
    audience: str
    jwks_url: str
    algorithms: list[str]
    require_typ: bool
    subject_claim: str
    scope_claim: str
    client_id_claim: str
    created_at: datetime


class IssuerList(msgspec.Struct, kw_only=True):
    items: list[IssuerOut]
