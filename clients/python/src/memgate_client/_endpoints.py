"""Every endpoint the client calls, once: method, path, operationId, body shape, query names.

The client's methods go through these entries only, so this table is what the contract test
(tests/contract/test_client_contract.py) holds against openapi.yaml: each (method, path) exists
with this operationId, the body's fields are the request schema's, the query names its
parameters. Method names on `Memgate` / `AsyncMemgate` are the operationIds in snake_case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memgate_client import types as t

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "DELETE", "PUT"})
"""RFC 9110's idempotent methods: repeating one has the effect of sending it once."""


@dataclass(frozen=True)
class Endpoint:
    operation_id: str
    method: str
    path: str
    body: Any = None
    """The TypedDict of the JSON (or form) body, if the operation takes one."""
    query: tuple[str, ...] = ()
    keyed: bool = False
    """Sends an `Idempotency-Key` (one per logical call, the same on each retry)."""
    form: bool = False
    authenticated: bool = True
    reads: bool = False
    """A POST that only reads (search): sending it twice changes nothing."""

    @property
    def retryable(self) -> bool:
        """Safe to send again after a dropped connection or a 502/503/504/429: idempotent by
        method, the token endpoint (it issues a fresh token each time and changes nothing),
        a search (a read sent as POST for its body), or made idempotent by its key. A plain
        POST never is: it may have been applied."""
        return self.method in IDEMPOTENT_METHODS or self.keyed or self.form or self.reads


_AS_OF = ("as_of", "known_at")
_FILTERS = ("subject", "kind", "key", "space_id", *_AS_OF)

ISSUE_TOKEN = Endpoint("issueToken", "POST", "/oauth/token", form=True, authenticated=False)
WRITE_MEMORY = Endpoint("writeMemory", "POST", "/v1/memories", t.MemoryCreate)
WRITE_MEMORY_BATCH = Endpoint(
    "writeMemoryBatch", "POST", "/v1/memories:batch", t.BatchCreate, keyed=True
)
GET_MEMORY = Endpoint("getMemory", "GET", "/v1/memories/{memory_id}", query=_AS_OF)
LIST_MEMORIES = Endpoint(
    "listMemories", "GET", "/v1/memories", query=(*_FILTERS, "cursor", "limit")
)
SEARCH_MEMORIES = Endpoint(
    "searchMemories", "POST", "/v1/memories/search", t.SearchRequest, reads=True
)
COUNT_MEMORIES = Endpoint(
    "countMemories", "GET", "/v1/memories/counts", query=(*_FILTERS, "group_by")
)
GET_MEMORY_HISTORY = Endpoint(
    "getMemoryHistory",
    "GET",
    "/v1/memories/{memory_id}/history",
    query=(*_AS_OF, "cursor", "limit"),
)
REVERT_MEMORY = Endpoint("revertMemory", "POST", "/v1/memories/{memory_id}/revert")
DELETE_MEMORY = Endpoint("deleteMemory", "DELETE", "/v1/memories/{memory_id}")

CREATE_PRINCIPAL = Endpoint("createPrincipal", "POST", "/v1/principals", t.PrincipalCreate)
LIST_PRINCIPALS = Endpoint("listPrincipals", "GET", "/v1/principals")
GET_PRINCIPAL = Endpoint("getPrincipal", "GET", "/v1/principals/{principal_id}")
ALLOW_DELEGATE = Endpoint(
    "allowDelegate", "PUT", "/v1/principals/{principal_id}/delegates/{agent_id}"
)
REVOKE_DELEGATE = Endpoint(
    "revokeDelegate", "DELETE", "/v1/principals/{principal_id}/delegates/{agent_id}"
)
GRANT_TENANT_ROLE = Endpoint("grantTenantRole", "PUT", "/v1/principals/{principal_id}/roles/{role}")
CREATE_CLIENT = Endpoint("createClient", "POST", "/v1/clients", t.ClientCreate)
LIST_CLIENTS = Endpoint("listClients", "GET", "/v1/clients")
GET_CLIENT = Endpoint("getClient", "GET", "/v1/clients/{client_id}")
DISABLE_CLIENT = Endpoint("disableClient", "POST", "/v1/clients/{client_id}/disable")

CREATE_SPACE = Endpoint("createSpace", "POST", "/v1/spaces", t.SpaceCreate)
LIST_SPACES = Endpoint("listSpaces", "GET", "/v1/spaces")
GET_SPACE_ACCESS = Endpoint("getSpaceAccess", "GET", "/v1/spaces/{space_id}/access/{action}")
GRANT_SPACE_ACCESS = Endpoint(
    "grantSpaceAccess", "PUT", "/v1/spaces/{space_id}/grants/{action}/{subject}"
)
REVOKE_SPACE_ACCESS = Endpoint(
    "revokeSpaceAccess", "DELETE", "/v1/spaces/{space_id}/grants/{action}/{subject}"
)
CREATE_TEAM = Endpoint("createTeam", "POST", "/v1/teams", t.TeamCreate)
LIST_TEAMS = Endpoint("listTeams", "GET", "/v1/teams")
ADD_TEAM_MEMBER = Endpoint("addTeamMember", "PUT", "/v1/teams/{team_id}/members/{member}")
REMOVE_TEAM_MEMBER = Endpoint("removeTeamMember", "DELETE", "/v1/teams/{team_id}/members/{member}")

LIST_AUDIT_EVENTS = Endpoint(
    "listAuditEvents",
    "GET",
    "/v1/audit/events",
    query=("since", "until", "actor", "action", "decision", "target", "cursor", "limit"),
)
EXPORT_AUDIT_EVENTS = Endpoint(
    "exportAuditEvents", "GET", "/v1/audit/export", query=("from_seq", "limit")
)
VERIFY_AUDIT_CHAIN = Endpoint(
    "verifyAuditChain",
    "GET",
    "/v1/audit/verify",
    query=("from_seq", "to_seq", "known_seq", "known_hash"),
)
GET_LATEST_CHECKPOINT = Endpoint("getLatestCheckpoint", "GET", "/v1/audit/checkpoints/latest")

START_JOB_RUN = Endpoint("startJobRun", "POST", "/v1/jobs/{name}/runs", t.RunCreate)
GET_JOB_RUN = Endpoint("getJobRun", "GET", "/v1/jobs/runs/{run_id}")
LIST_JOB_RUNS = Endpoint("listJobRuns", "GET", "/v1/jobs/runs", query=("status", "cursor"))

CREATE_TENANT = Endpoint("createTenant", "POST", "/v1/tenants", t.TenantCreate)
LIST_TENANTS = Endpoint("listTenants", "GET", "/v1/tenants", query=("cursor", "limit"))
GET_TENANT = Endpoint("getTenant", "GET", "/v1/tenants/{tenant_id}")
GET_TENANT_LIMITS = Endpoint("getTenantLimits", "GET", "/v1/tenants/{tenant_id}/limits")
SET_TENANT_LIMITS = Endpoint("setTenantLimits", "PUT", "/v1/tenants/{tenant_id}/limits", t.Limits)
SET_CLIENT_LIMITS = Endpoint(
    "setClientLimits", "PUT", "/v1/tenants/{tenant_id}/clients/{client_id}/limits", t.Limits
)

ENDPOINTS: tuple[Endpoint, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Endpoint)
)
"""Every endpoint above (the contract test's table)."""
