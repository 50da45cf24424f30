"""Routes of the policy API: teams and membership, spaces, grants (`manage:policy` and the
role:policy_admin grant), and what a principal may do or who may use a space (`read:policy`)."""

from __future__ import annotations

from litestar import Controller, Request, delete, get, post, put
from litestar.datastructures import State
from litestar.params import FromPath, JSONBody
from litestar.status_codes import HTTP_201_CREATED

from service.audit.trail import trail_of
from service.auth.guards import requires
from service.auth.principal import Principal
from service.auth.scopes import Scope
from service.auth.tokens import VerifiedToken
from service.http.deps import Db, trusted_issuers
from service.http.params import parse_id
from service.policy.guards import requires_policy_admin
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
    TeamCreate,
    TeamList,
    TeamOut,
)
from service.policy.service import PolicyService

AuthedRequest = Request[Principal, VerifiedToken, State]
_MANAGE = [requires(Scope.MANAGE_POLICY), requires_policy_admin]
_READ = [requires(Scope.READ_POLICY)]
_DELEGATES = [requires(Scope.MANAGE_DELEGATES)]


async def _admin(request: AuthedRequest, db: Db) -> PolicyService:
    """The guards have checked the scope and the policy admin grant."""
    return PolicyService(db, request.user, trusted_issuers=trusted_issuers(request))


class TeamController(Controller):
    path = "/v1/teams"
    tags = ["policy"]

    @post("/", status_code=HTTP_201_CREATED, guards=_MANAGE, opt={"action": "policy.team.create"})
    async def create_team(
        self, request: AuthedRequest, data: JSONBody[TeamCreate], db: Db
    ) -> TeamOut:
        """Create a team. Members and grants are added separately."""
        team = await (await _admin(request, db)).create_team(data)
        trail_of(request).add_targets([team.id])
        return team

    @get("/", guards=_MANAGE, opt={"action": "policy.team.list"})
    async def list_teams(self, request: AuthedRequest, db: Db) -> TeamList:
        """The teams of your tenant (first 500)."""
        items = await (await _admin(request, db)).list_teams()
        trail_of(request).count(len(items))
        return TeamList(items=items)

    @put(
        "/{team_id:str}/members/{member:str}",
        status_code=200,
        guards=_MANAGE,
        opt={"action": "policy.team.add_member"},
    )
    async def add_member(
        self, request: AuthedRequest, team_id: FromPath[str], member: FromPath[str], db: Db
    ) -> PolicyChange:
        """Add a member to a team: a principal (its id) or another team (`team:<uuid>`), whose
        members then hold this team's grants too. They gain them on their next request.
        Membership chains may have at most 8 links."""
        service, named = await _admin(request, db), _member(member)
        _name_nested_team(request, named)
        return await service.add_member(parse_id(team_id), named)

    @delete(
        "/{team_id:str}/members/{member:str}",
        status_code=200,
        guards=_MANAGE,
        opt={"action": "policy.team.remove_member"},
    )
    async def remove_member(
        self, request: AuthedRequest, team_id: FromPath[str], member: FromPath[str], db: Db
    ) -> PolicyChange:
        """Remove a member (a principal id or `team:<uuid>`) from a team; its members lose the
        team's grants on their next request."""
        service, named = await _admin(request, db), _member(member)
        _name_nested_team(request, named)
        return await service.remove_member(parse_id(team_id), named)


def _name_nested_team(request: AuthedRequest, member: Member) -> None:
    """The audit row names path ids that are bare UUIDs; `team:<uuid>` is not one."""
    if member.is_team:
        trail_of(request).add_targets([member.id])


def _member(raw: str) -> Member:
    if raw.startswith("team:"):
        return Member(parse_id(raw.removeprefix("team:")), is_team=True)
    return Member(parse_id(raw))


class SpaceController(Controller):
    path = "/v1/spaces"
    tags = ["policy"]

    @post("/", status_code=HTTP_201_CREATED, guards=_MANAGE, opt={"action": "policy.space.create"})
    async def create_space(
        self, request: AuthedRequest, data: JSONBody[SpaceCreate], db: Db
    ) -> SpaceCreated:
        """Create a team or tenant-wide space, optionally under a parent (a sub-space inherits
        its parent's grants). Nobody may use it until it is granted."""
        created = await (await _admin(request, db)).create_space(data)
        trail_of(request).add_targets([created.space.id])
        return created

    @get("/", guards=_MANAGE, opt={"action": "policy.space.list"})
    async def list_spaces(self, request: AuthedRequest, db: Db) -> SpaceList:
        """The spaces of your tenant, personal ones included (first 1000)."""
        items = await (await _admin(request, db)).list_spaces()
        trail_of(request).count(len(items))
        return SpaceList(items=items)

    @put(
        "/{space_id:str}/grants/{action:str}/{subject:str}",
        status_code=200,
        guards=_MANAGE,
        opt={"action": "policy.grant"},
    )
    async def grant(
        self,
        request: AuthedRequest,
        space_id: FromPath[str],
        action: FromPath[PolicyAction],
        subject: FromPath[str],
        db: Db,
    ) -> PolicyChange:
        """Let `subject` (user:|agent:|service:|team:<id> or role:<name>) `action` in the
        space and its sub-spaces. Granting what is granted changes nothing but the version."""
        return await (await _admin(request, db)).grant(parse_id(space_id), action, subject)

    @delete(
        "/{space_id:str}/grants/{action:str}/{subject:str}",
        status_code=200,
        guards=_MANAGE,
        opt={"action": "policy.revoke"},
    )
    async def revoke(
        self,
        request: AuthedRequest,
        space_id: FromPath[str],
        action: FromPath[PolicyAction],
        subject: FromPath[str],
        db: Db,
    ) -> PolicyChange:
        """Take a grant away; it stops working on the very next request."""
        return await (await _admin(request, db)).revoke(parse_id(space_id), action, subject)

    @get(
        "/{space_id:str}/access/{action:str}",
        guards=_READ,
        opt={"action": "policy.space.access"},
    )
    async def access(
        self,
        request: AuthedRequest,
        space_id: FromPath[str],
        action: FromPath[PolicyAction],
        db: Db,
    ) -> SpaceAccess:
        """Who may `action` in this space (needs `read:policy`, and a user or service caller)."""
        result = await PolicyService(db, request.user).access(parse_id(space_id), action)
        trail_of(request).count(len(result.principal_ids))
        return result


class RoleController(Controller):
    path = "/v1/roles"
    tags = ["policy"]

    @put(
        "/{role:str}/members/{principal_id:str}",
        status_code=200,
        guards=_MANAGE,
        opt={"action": "policy.role.add_member"},
    )
    async def add_role_member(
        self,
        request: AuthedRequest,
        role: FromPath[PolicyRole],
        principal_id: FromPath[str],
        db: Db,
    ) -> PolicyChange:
        """Give a principal a policy role (`policy_admin`: may change the tenant's policy and
        manage principals and clients, with `manage:policy`; `external_admin`: its external
        IdP tokens keep admin scopes, which only a caller holding every admin scope grants)."""
        return await (await _admin(request, db)).set_role(parse_id(principal_id), role, True)

    @delete(
        "/{role:str}/members/{principal_id:str}",
        status_code=200,
        guards=_MANAGE,
        opt={"action": "policy.role.remove_member"},
    )
    async def remove_role_member(
        self,
        request: AuthedRequest,
        role: FromPath[PolicyRole],
        principal_id: FromPath[str],
        db: Db,
    ) -> PolicyChange:
        """Take a policy role away (not your own, nor from a principal holding admin scopes
        you lack, nor the tenant's last policy admin)."""
        return await (await _admin(request, db)).set_role(parse_id(principal_id), role, False)


class PermissionController(Controller):
    path = "/v1/principals"
    tags = ["policy"]

    @put(
        "/{principal_id:str}/delegates/{agent_id:str}",
        status_code=204,
        guards=_DELEGATES,
        opt={"action": "policy.delegate.allow"},
    )
    async def allow_delegate(
        self, request: AuthedRequest, principal_id: FromPath[str], agent_id: FromPath[str], db: Db
    ) -> None:
        """Let an agent act for this user through token exchange (RFC 8693); needs
        `manage:delegates`. The user decides for itself; anyone else also needs `manage:policy`
        and the policy admin grant."""
        await PolicyService(db, request.user).set_delegate(
            parse_id(principal_id), parse_id(agent_id), allowed=True
        )

    @delete(
        "/{principal_id:str}/delegates/{agent_id:str}",
        status_code=204,
        guards=_DELEGATES,
        opt={"action": "policy.delegate.revoke"},
    )
    async def revoke_delegate(
        self, request: AuthedRequest, principal_id: FromPath[str], agent_id: FromPath[str], db: Db
    ) -> None:
        """Stop an agent acting for this user (needs `manage:delegates`): its exchanged tokens
        fail on the next request."""
        await PolicyService(db, request.user).set_delegate(
            parse_id(principal_id), parse_id(agent_id), allowed=False
        )

    @get(
        "/{principal_id:str}/permissions",
        guards=_READ,
        opt={"action": "policy.permissions"},
    )
    async def permissions(
        self, request: AuthedRequest, principal_id: FromPath[str], db: Db
    ) -> Permissions:
        """What this principal may do in your tenant, and the chain of rules behind each grant
        (needs `read:policy`; an agent may ask about itself only)."""
        result = await PolicyService(db, request.user).permissions(parse_id(principal_id))
        trail_of(request).count(len(result.permissions))
        return result
