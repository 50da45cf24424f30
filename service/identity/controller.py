"""Admin routes for principals and OAuth clients (scope `manage:policy`)."""

from __future__ import annotations

from litestar import Controller, Request, delete, get, post, put
from litestar.datastructures import ResponseHeader, State
from litestar.params import FromPath, JSONBody

from service.auth.principal import Principal
from service.auth.tokens import VerifiedToken
from service.http.deps import CallDep, trusted_issuers
from service.http.params import PathId, parse_id
from service.http.routes import route
from service.identity import operations as ops
from service.identity.schemas import (
    ClientCreate,
    ClientCreated,
    ClientList,
    ClientOut,
    PrincipalCreate,
    PrincipalList,
    PrincipalOut,
    Role,
    RoleGrant,
)
from service.identity.service import IdentityService

AuthedRequest = Request[Principal, VerifiedToken, State]


def _service(request: AuthedRequest, call: CallDep) -> IdentityService:
    return IdentityService(
        call.db,
        request.user.tenant_id,
        trusted_issuers=trusted_issuers(request),
        facts=call.facts,
        agents_may_read_policy=request.user.tenant_settings.agents_may_read_policy,
    )


class PrincipalController(Controller):
    path = "/v1/principals"
    tags = ["admin"]

    @post("/", **route(ops.PRINCIPAL_CREATE))
    async def create_principal(
        self, request: AuthedRequest, data: JSONBody[PrincipalCreate], call: CallDep
    ) -> PrincipalOut:
        """Create a user, agent or service principal in your tenant, with its personal space."""
        return await _service(request, call).create_principal(data)

    @get("/", **route(ops.PRINCIPAL_LIST))
    async def list_principals(self, request: AuthedRequest, call: CallDep) -> PrincipalList:
        """List the principals of your tenant (first 500, oldest first)."""
        items = await _service(request, call).list_principals()
        return PrincipalList(items=items)

    @get("/{principal_id:str}", **route(ops.PRINCIPAL_GET))
    async def get_principal(
        self, request: AuthedRequest, principal_id: PathId, call: CallDep
    ) -> PrincipalOut:
        """Get one principal of your tenant."""
        return await _service(request, call).get_principal(parse_id(principal_id))

    @put(
        "/{principal_id:str}/roles/{role:str}",
        status_code=200,
        **route(ops.ROLE_GRANT),
    )
    async def grant_role(
        self,
        request: AuthedRequest,
        principal_id: PathId,
        role: FromPath[Role],
        call: CallDep,
    ) -> RoleGrant:
        """Grant a tenant role. `auditor` may read, export and verify the audit log (with a
        token holding `read:audit`, which the granting caller needs too). Granting a role
        already held changes nothing."""
        return await _service(request, call).grant_role(request.user, parse_id(principal_id), role)

    @delete(
        "/{principal_id:str}/roles/{role:str}",
        **route(ops.ROLE_REVOKE),
    )
    async def revoke_role(
        self,
        request: AuthedRequest,
        principal_id: PathId,
        role: FromPath[Role],
        call: CallDep,
    ) -> None:
        """Take a tenant role away (at once: the next call of that principal is refused). Not
        from a principal holding admin scopes you lack, nor from the tenant's last auditor."""
        await _service(request, call).revoke_role(request.user, parse_id(principal_id), role)


class ClientController(Controller):
    path = "/v1/clients"
    tags = ["admin"]

    @post(
        "/",
        response_headers=[ResponseHeader(name="Cache-Control", value="no-store")],
        **route(ops.CLIENT_CREATE),
    )
    async def create_client(
        self, request: AuthedRequest, data: JSONBody[ClientCreate], call: CallDep
    ) -> ClientCreated:
        """Register an OAuth client serving one principal. The secret is in this answer only."""
        return await _service(request, call).create_client(request.user, data)

    @get("/", **route(ops.CLIENT_LIST))
    async def list_clients(self, request: AuthedRequest, call: CallDep) -> ClientList:
        """List the clients of your tenant (first 500). Secrets are never shown again."""
        items = await _service(request, call).list_clients()
        return ClientList(items=items)

    @get("/{client_id:str}", **route(ops.CLIENT_GET))
    async def get_client(
        self, request: AuthedRequest, client_id: PathId, call: CallDep
    ) -> ClientOut:
        """Get one client of your tenant."""
        return await _service(request, call).get_client(parse_id(client_id))

    @post(
        "/{client_id:str}/disable",
        status_code=200,
        **route(ops.CLIENT_DISABLE),
    )
    async def disable_client(
        self, request: AuthedRequest, client_id: PathId, call: CallDep
    ) -> ClientOut:
        """Disable a client: new tokens are refused and its live tokens stop working at once.
        Not the last working admin client of the tenant's policy admins (409)."""
        return await _service(request, call).set_client_enabled(
            request.user, parse_id(client_id), enabled=False
        )

    @post("/{client_id:str}/enable", status_code=200, **route(ops.CLIENT_ENABLE))
    async def enable_client(
        self, request: AuthedRequest, client_id: PathId, call: CallDep
    ) -> ClientOut:
        """Re-enable a disabled client: it may get tokens again (its old tokens too, until they
        expire)."""
        return await _service(request, call).set_client_enabled(
            request.user, parse_id(client_id), enabled=True
        )
