"""Wire shapes of the identity admin API."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

import msgspec

from service.db.types import NO_NUL

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=NO_NUL)]


class PrincipalCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    kind: Literal["user", "agent", "service"] = "user"
    display_name: Name
    external_issuer: Annotated[str, msgspec.Meta(max_length=500, pattern=NO_NUL)] | None = None
    external_subject: (
        Annotated[str, msgspec.Meta(min_length=1, max_length=500, pattern=NO_NUL)] | None
    ) = None


class PrincipalOut(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    kind: str
    display_name: str
    personal_space_id: uuid.UUID | None
    external_issuer: str | None
    external_subject: str | None
    created_at: datetime
    disabled_at: datetime | None


class ClientCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    principal_id: uuid.UUID
    name: Name
    kind: Literal["agent", "admin"] = "agent"
    scopes: Annotated[list[str], msgspec.Meta(min_length=1, max_length=20)]


class ClientOut(msgspec.Struct, kw_only=True):
    client_id: uuid.UUID
    principal_id: uuid.UUID
    name: str
    kind: str
    scopes: list[str]
    created_at: datetime
    disabled_at: datetime | None


class ClientCreated(msgspec.Struct, kw_only=True):
    client: ClientOut
    client_secret: str
    """Shown once; only an argon2id hash is stored."""


class ClientList(msgspec.Struct, kw_only=True):
    items: list[ClientOut]


class PrincipalList(msgspec.Struct, kw_only=True):
    items: list[PrincipalOut]


Role = Literal["auditor", "eraser"]


class RoleGrant(msgspec.Struct, kw_only=True):
    principal_id: uuid.UUID
    role: Role
