"""Admin routes for principals and OAuth clients (scope `manage:policy`)."""

from __future__ import annotations

from litestar import Controller, Request, delete, get, post, put
from litestar.datastructures import ResponseHeader, State
from litestar.params import FromPath, JSONBody
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from service.audit.trail import trail_of
from service.auth.guards import requires
from service.auth.principal import Principal
from service.auth.scopes import Scope
from service.auth.tokens import VerifiedToken
from service.http.deps import Db, trusted_issuers
from service.http.params import parse_id
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
from service.policy.guards import requires_policy_admin

AuthedRequest = Request[Principal, VerifiedToken, State]
_ADMIN = [requires(Scope.MANAGE_POLICY), requires_policy_admin]
"""Managing principals and clients is managing access: the scope and the policy admin grant."""


def _service(request: AuthedRequest, db: Db) -> IdentityService:
    return IdentityService(db, request.user.tenant_id, trusted_issuers=trusted_issuers(request))


class PrincipalController(Controller):
    path = "/v1/principals"
    tags = ["admin"]

    @post("/", status_code=HTTP_201_CREATED, guards=_ADMIN, opt={"action": "principal.create"})
    async def create_principal(
        self, request: AuthedRequest, data: JSONBody[PrincipalCreate], db: Db
    ) -> PrincipalOut:
        """Create a user, agent or service principal in your tenant, with its personal space."""
        created = await _service(request, db).create_principal(data)
        trail_of(request).add_targets([created.id])
        return created

    @get("/", guards=_ADMIN, opt={"action": "principal.list"})
    async def list_principals(self, request: AuthedRequest, db: Db) -> PrincipalList:
        """List the principals of your tenant (first 500, oldest first)."""
        items = await _service(request, db).list_principals()
        trail_of(request).count(len(items))
        return PrincipalList(items=items)

    @get("/{principal_id:str}", guards=_ADMIN, opt={"action": "principal.get"})
    async def get_principal(
        self, request: AuthedRequest, principal_id: FromPath[str], db: Db
    ) -> PrincipalOut:
        """Get one principal of your tenant."""
        return await _service(request, db).get_principal(parse_id(principal_id))

    @put(
        "/{principal_id:str}/roles/{role:str}",
        status_code=200,
        guards=_ADMIN,
        opt={"action": "principal.role.grant"},
    )
    async def grant_role(
        self, request: AuthedRequest, principal_id: FromPath[str], role: FromPath[Role], db: Db
    ) -> RoleGrant:
        """Grant a tenant role. `auditor` may read, export and verify the audit log (with a
        token holding `read:audit`, which the granting caller needs too). Granting a role
        already held changes nothing."""
        return await _service(request, db).grant_role(request.user, parse_id(principal_id), role)

    @delete(
        "/{principal_id:str}/roles/{role:str}",
        status_code=HTTP_204_NO_CONTENT,
        guards=_ADMIN,
        opt={"action": "principal.role.revoke"},
    )
    async def revoke_role(
        self, request: AuthedRequest, principal_id: FromPath[str], role: FromPath[Role], db: Db
    ) -> None:
        """Take a tenant role away (at once: the next call of that principal is refused). Not
        from a principal holding admin scopes you lack, nor from the tenant's last auditor."""
        await _service(request, db).revoke_role(request.user, parse_id(principal_id), role)


class ClientController(Controller):
    path = "/v1/clients"
    tags = ["admin"]

    @post(
        "/",
        status_code=HTTP_201_CREATED,
        guards=_ADMIN,
        response_headers=[ResponseHeader(name="Cache-Control", value="no-store")],
        opt={"action": "client.create"},
    )
    async def create_client(
        self, request: AuthedRequest, data: JSONBody[ClientCreate], db: Db
    ) -> ClientCreated:
        """Register an OAuth client serving one principal. The secret is in this answer only."""
        created = await _service(request, db).create_client(request.user, data)
        trail_of(request).add_targets([created.client.client_id])
        return created

    @get("/", guards=_ADMIN, opt={"action": "client.list"})
    async def list_clients(self, request: AuthedRequest, db: Db) -> ClientList:
        """List the clients of your tenant (first 500). Secrets are never shown again."""
        items = await _service(request, db).list_clients()
        trail_of(request).count(len(items))
        return ClientList(items=items)

    @get("/{client_id:str}", guards=_ADMIN, opt={"action": "client.get"})
    async def get_client(
        self, request: AuthedRequest, client_id: FromPath[str], db: Db
    ) -> ClientOut:
        """Get one client of your tenant."""
        return await _service(request, db).get_client(parse_id(client_id))

    @post(
        "/{client_id:str}/disable",
        status_code=200,
        guards=_ADMIN,
        opt={"action": "client.disable"},
    )
    async def disable_client(
        self, request: AuthedRequest, client_id: FromPath[str], db: Db
    ) -> ClientOut:
        """Disable a client: new tokens are refused and its live tokens stop working at once.
        Not the last working admin client of the tenant's policy admins (409)."""
        return await _service(request, db).set_client_enabled(
            request.user, parse_id(client_id), enabled=False
        )

    @post(
        "/{client_id:str}/enable", status_code=200, guards=_ADMIN, opt={"action": "client.enable"}
    )
    async def enable_client(
        self, request: AuthedRequest, client_id: FromPath[str], db: Db
    ) -> ClientOut:
        """Re-enable a disabled client: it may get tokens again (its old tokens too, until they
        expire)."""
        return await _service(request, db).set_client_enabled(
            request.user, parse_id(client_id), enabled=True
        )
