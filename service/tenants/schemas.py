"""Wire shapes of the tenant (platform) API."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec

from service.identity.schemas import Name
from service.quotas.schemas import Limits


class TenantCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: Name
    settings: dict[str, Any] | None = None
    """Per-tenant settings (docs/tenants.md, Settings); validated, unknown keys refused."""


class TenantUpdate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: Name | None = None
    settings: dict[str, Any] | None = None
    """Merged key by key into the current settings; a null value resets that key."""


class TenantOut(msgspec.Struct, kw_only=True):
    tenant_id: uuid.UUID
    name: str
    is_platform: bool
    created_at: datetime
    updated_at: datetime
    disabled_at: datetime | None
    settings: dict[str, Any]


class TenantAdmin(msgspec.Struct, kw_only=True):
    principal_id: uuid.UUID
    client_id: uuid.UUID
    client_secret: str
    """Shown once; only an argon2id hash is stored."""


class TenantCreated(msgspec.Struct, kw_only=True):
    tenant: TenantOut
    admin: TenantAdmin


class TenantPage(msgspec.Struct, kw_only=True):
    items: list[TenantOut]
    next_cursor: str | None


class DeletionCounts(msgspec.Struct, kw_only=True):
    memories: int
    spaces: int
    principals: int
    clients: int
    policy_rules: int
    audit_rows: int


class DeletionPlan(msgspec.Struct, kw_only=True):
    """What a deletion erases (every row of the tenant; its audit chain too when asked) and how
    to confirm it."""

    tenant_id: uuid.UUID
    disabled: bool
    """A tenant is deleted only once disabled (POST /v1/tenants/{id}/disable first)."""
    removes: DeletionCounts
    keeps: list[str]
    confirm: str | None
    """Pass as `?confirm=` within `expires_at` to carry the plan out; None while the tenant is
    still enabled."""
    expires_at: datetime | None
    deleted: bool = False
    erasure_id: uuid.UUID | None = None
    """Once deleted: the erasure that did it (its proof: GET /v1/tenants/{id}/proof)."""
    receipt: str | None = None
    """Once deleted: the erasure's signed, content-free receipt (a compact JWS made with the
    audit checkpoint key, GET /v1/audit/keys)."""


class TenantUsage(msgspec.Struct, kw_only=True):
    memories: int
    """Live memories (neither superseded nor revoked)."""
    bytes: int
    """UTF-8 bytes of their values."""


class TenantLimits(msgspec.Struct, kw_only=True):
    """A tenant's quotas as the platform admin set them, and what it holds now."""

    tenant: Limits
    clients: dict[str, Limits]
    """Per-client limits, by client id."""
    usage: TenantUsage
