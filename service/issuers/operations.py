"""The tenant issuer operations: a tenant admin registers the IdPs its users and agents log in
with. They are the policy-admin family (`manage:policy` and role:policy_admin): which IdP may
speak for the tenant's principals is a decision about access, like registering a client."""

from __future__ import annotations

from service.issuers.problems import (
    IssuerInvalid,
    IssuerLimit,
    IssuerNotFound,
    IssuerReserved,
    IssuerTaken,
)
from service.policy.operations import managed
from service.policy.problems import LastRoleHolder

ISSUER_CREATE = managed(
    "issuer.create",
    "createIssuer",
    "Register an external identity provider for your tenant",
    IssuerInvalid,
    IssuerReserved,
    IssuerTaken,
    IssuerLimit,
    success=201,
)
ISSUER_LIST = managed(
    "issuer.list", "listIssuers", "List your tenant's external identity providers", read_only=True
)
ISSUER_GET = managed(
    "issuer.get", "getIssuer", "Get one external identity provider", IssuerNotFound, read_only=True
)
ISSUER_DELETE = managed(
    "issuer.delete",
    "deleteIssuer",
    "Delete an external identity provider (its tokens stop at once)",
    IssuerNotFound,
    LastRoleHolder,
    success=204,
)
