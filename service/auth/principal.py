"""The authenticated caller, built only from a verified token (the tenant never comes from the
request)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from service.tenants.settings import DEFAULT, TenantSettings


@dataclass(frozen=True)
class Principal:
    tenant_id: uuid.UUID
    principal_id: uuid.UUID
    client_id: str
    scopes: frozenset[str]
    token_id: str
    issuer: str
    act: dict[str, Any] | None = None
    actor_id: uuid.UUID | None = None
    """The agent acting for `principal_id` (a delegated token): the call sees only what both
    may see."""
    embedded: bool = False
    """The token came from the embedded issuer, so `client_id` names one of the tenant's
    clients (an external IdP's client ids are its own)."""
    issuer_id: uuid.UUID | None = None
    """The tenant's registration of the IdP the token came from (`tenant_issuers`), if any."""
    tenant_settings: TenantSettings = DEFAULT
    """The caller's tenant's settings, read in the entrance statement."""

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes
