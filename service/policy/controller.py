"""Routes of the policy API: teams and membership, spaces, grants (`manage:policy` and the
role:policy_admin grant), and what a principal may do or who may use a space (`read:policy`)."""

from __future__ import annotations

from litestar import Controller, Request, delete, get, post, put
from litestar.datastructures import State
from litestar.params import FromPath, JSONBody

from service.auth.principal import Principal
from service.auth.tokens import VerifiedToken
from service.http.deps import CallDep, trusted_issuers
from service.http.params import PathId, parse_id
from service.http.routes import route
from service.policy import operations as ops
from service.policy.schemas import (
    Member,
    Permissions,
    PolicyAction,
    PolicyChange,
    PolicyRole,
    SpaceAccess,
    SpaceCreate,
    SpaceCreated,
    SpaceList,
    SpaceSettingsOut,
    TeamCreate,
    TeamList,
    TeamOut,
)
from service.policy.service import PolicyService
from service.policy.space_settings import SpaceSettings

AuthedRequest = Request[Principal, VerifiedToken, State]


def _policy(request: AuthedRequest, call: CallDep) -> PolicyService:
    """The operation's declaration has checked the scope (and, to manage, the admin grant)."""
    return PolicyService(
        call.db, request.user, trusted_issuers=trusted_issuers(request), facts=call.facts
    )


class TeamController(Controller):
    path = "/v1/teams"
    tags = ["policy"]

    @post("/", **route(ops.TEAM_CREATE))
    async def create_team(
        self, request: AuthedRequest, data: JSONBody[TeamCreate], call: CallDep
    ) -> TeamOut:
        """Create a team. Members and grants are added separately."""
        return await _policy(request, call).create_team(data)

    @get("/", **route(ops.TEAM_LIST))
    async def list_teams(self, request: AuthedRequest, call: CallDep) -> TeamList:
        """The teams of your tenant (first 500)."""
        items = await _policy(request, call).list_teams()
        return TeamList(items=items)

    @put(
        "/{team_id:str}/members/{member:str}",
        status_code=200,
        **route(ops.TEAM_ADD_MEMBER),
    )
    async def add_member(
        self, request: AuthedRequest, team_id: PathId, member: FromPath[str], call: CallDep
    ) -> PolicyChange:
        """Add a member to a team: a principal (its id) or another team (`team:<uuid>`), whose
        members then hold this team's grants too. They gain them on their next request.
        Membership chains may have at most 8 links."""
        service, named = _policy(request, call), _member(member)
        return await service.add_member(parse_id(team_id), named)

    @delete(
        "/{team_id:str}/members/{member:str}",
        status_code=200,
        **route(ops.TEAM_REMOVE_MEMBER),
    )
    async def remove_member(
        self, request: AuthedRequest, team_id: PathId, member: FromPath[str], call: CallDep
    ) -> PolicyChange:
        """Remove a member (a principal id or `team:<uuid>`) from a team; its members lose the
        team's grants on their next request."""
        service, named = _policy(request, call), _member(member)
        return await service.remove_member(parse_id(team_id), named)


def _member(raw: str) -> Member:
    if raw.startswith("team:"):
        return Member(parse_id(raw.removeprefix("team:")), is_team=True)
    return Member(parse_id(raw))


class SpaceController(Controller):
    path = "/v1/spaces"
    tags = ["policy"]

    @post("/", **route(ops.SPACE_CREATE))
    async def create_space(
        self, request: AuthedRequest, data: JSONBody[SpaceCreate], call: CallDep
    ) -> SpaceCreated:
        """Create a team or tenant-wide space, optionally under a parent (a sub-space inherits
        its parent's grants). Nobody may use it until it is granted."""
        return await _policy(request, call).create_space(data)

    @get("/", **route(ops.SPACE_LIST))
    async def list_spaces(self, request: AuthedRequest, call: CallDep) -> SpaceList:
        """The spaces of your tenant, personal ones included (first 1000)."""
        items = await _policy(request, call).list_spaces()
        return SpaceList(items=items)

    @put("/{space_id:str}/settings", status_code=200, **route(ops.SPACE_SETTINGS))
    async def set_settings(
        self,
        request: AuthedRequest,
        space_id: PathId,
        data: JSONBody[SpaceSettings],
        call: CallDep,
    ) -> SpaceSettingsOut:
        """Replace the space's settings: `write_gate` (default on) and `evidence_gate`
        (default off); a field left out takes its default. The very next write sees them."""
        return await _policy(request, call).set_space_settings(parse_id(space_id), data)

    @put(
        "/{space_id:str}/grants/{action:str}/{subject:str}",
        status_code=200,
        **route(ops.GRANT),
    )
    async def grant(
        self,
        request: AuthedRequest,
        space_id: PathId,
        action: FromPath[PolicyAction],
        subject: FromPath[str],
        call: CallDep,
    ) -> PolicyChange:
        """Let `subject` (user:|agent:|service:|team:<id> or role:<name>) `action` in the
        space and its sub-spaces. Granting what is granted changes nothing but the version."""
        return await _policy(request, call).grant(parse_id(space_id), action, subject)

    @delete(
        "/{space_id:str}/grants/{action:str}/{subject:str}",
        status_code=200,
        **route(ops.REVOKE),
    )
    async def revoke(
        self,
        request: AuthedRequest,
        space_id: PathId,
        action: FromPath[PolicyAction],
        subject: FromPath[str],
        call: CallDep,
    ) -> PolicyChange:
        """Take a grant away; it stops working on the very next request."""
        return await _policy(request, call).revoke(parse_id(space_id), action, subject)

    @get(
        "/{space_id:str}/access/{action:str}",
        **route(ops.SPACE_ACCESS),
    )
    async def access(
        self,
        request: AuthedRequest,
        space_id: PathId,
        action: FromPath[PolicyAction],
        call: CallDep,
    ) -> SpaceAccess:
        """Who may `action` in this space (needs `read:policy`, and a user or service caller)."""
        return await _policy(request, call).access(parse_id(space_id), action)


class RoleController(Controller):
    path = "/v1/roles"
    tags = ["policy"]

    @put(
        "/{role:str}/members/{principal_id:str}",
        status_code=200,
        **route(ops.ROLE_ADD_MEMBER),
    )
    async def add_role_member(
        self,
        request: AuthedRequest,
        role: FromPath[PolicyRole],
        principal_id: PathId,
        call: CallDep,
    ) -> PolicyChange:
        """Give a principal a policy role (`policy_admin`: may change the tenant's policy and
        manage principals and clients, with `manage:policy`; `external_admin`: its external
        IdP tokens keep admin scopes, which only a caller holding every admin scope grants)."""
        return await _policy(request, call).set_role(parse_id(principal_id), role, True)

    @delete(
        "/{role:str}/members/{principal_id:str}",
        status_code=200,
        **route(ops.ROLE_REMOVE_MEMBER),
    )
    async def remove_role_member(
        self,
        request: AuthedRequest,
        role: FromPath[PolicyRole],
        principal_id: PathId,
        call: CallDep,
    ) -> PolicyChange:
        """Take a policy role away (not your own, nor from a principal holding admin scopes
        you lack, nor the tenant's last policy admin)."""
        return await _policy(request, call).set_role(parse_id(principal_id), role, False)


class PermissionController(Controller):
    path = "/v1/principals"
    tags = ["policy"]

    @put(
        "/{principal_id:str}/delegates/{agent_id:str}",
        **route(ops.DELEGATE_ALLOW),
    )
    async def allow_delegate(
        self,
        request: AuthedRequest,
        principal_id: PathId,
        agent_id: PathId,
        call: CallDep,
    ) -> None:
        """Let an agent act for this user through token exchange (RFC 8693); needs
        `manage:delegates`. The user decides for itself; anyone else also needs `manage:policy`
        and the policy admin grant."""
        await _policy(request, call).set_delegate(
            parse_id(principal_id), parse_id(agent_id), allowed=True
        )

    @delete(
        "/{principal_id:str}/delegates/{agent_id:str}",
        **route(ops.DELEGATE_REVOKE),
    )
    async def revoke_delegate(
        self,
        request: AuthedRequest,
        principal_id: PathId,
        agent_id: PathId,
        call: CallDep,
    ) -> None:
        """Stop an agent acting for this user (needs `manage:delegates`): its exchanged tokens
        fail on the next request."""
        await _policy(request, call).set_delegate(
            parse_id(principal_id), parse_id(agent_id), allowed=False
        )

    @get(
        "/{principal_id:str}/permissions",
        **route(ops.PERMISSIONS),
    )
    async def permissions(
        self, request: AuthedRequest, principal_id: PathId, call: CallDep
    ) -> Permissions:
        """What this principal may do in your tenant, and the chain of rules behind each grant
        (needs `read:policy`; an agent may ask about itself only)."""
        return await _policy(request, call).permissions(parse_id(principal_id))
