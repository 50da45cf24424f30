"""The authenticated caller, built only from a verified token (the tenant never comes from the
request)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from service.tenants.settings import DEFAULT, TenantSettings


@dataclass(frozen=True)
class GrantSnapshot:
    """The spaces a principal held each action on at one moment (a job run's enqueue). A
    principal carrying one sees, for each action, only the spaces it holds now that are also
    in the snapshot: a grant removed since stops counting, a grant added since is not used."""

    by_action: tuple[tuple[str, frozenset[uuid.UUID]], ...]

    @classmethod
    def of(cls, spaces: Mapping[str, Iterable[uuid.UUID]]) -> GrantSnapshot:
        return cls(tuple(sorted((action, frozenset(ids)) for action, ids in spaces.items())))

    def spaces(self, action: str) -> frozenset[uuid.UUID]:
        """The snapshot's spaces for `action` (none when the action was not held at all)."""
        return next((ids for name, ids in self.by_action if name == action), frozenset())

    def as_json(self) -> dict[str, list[str]]:
        return {action: sorted(str(i) for i in ids) for action, ids in self.by_action}


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
    agent: bool = False
    """The principal is of kind agent, as the entrance statement read it (agents never review,
    service/policy/visible.py `may_review`)."""
    within: GrantSnapshot | None = None
    """A job principal's grants at enqueue (service/jobs/): its grants count only inside them
    (`Visible` intersects). None for every caller with a token: the grants now."""

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes
