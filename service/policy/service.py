"""Teams, spaces and grants: every change writes Casbin lines and recompiles the tenant's
grants in the caller's transaction (services never commit; the request commits with its audit
row), and answers the new policy version."""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import cast

from sqlalchemy import delete, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal as Caller
from service.auth.resolver import admin_credentials_live
from service.auth.scopes import ADMIN_SCOPES, Scope
from service.calls import Facts
from service.db.base import uuid7
from service.db.models import Delegation, Principal, Space, SpaceGrant, Team, Tenant
from service.identity.problems import PrincipalNotFound, untrusted_issuer
from service.issuers.repository import issuer_registered
from service.jobs.principals import refuse_job_principal
from service.policy.compile import CASBIN_MAX_HIERARCHY, apply_changes, lock_policy
from service.policy.powers import (
    admin_powers,
    holds_role,
    working_auditors,
    working_policy_admins,
)
from service.policy.problems import (
    LastRoleHolder,
    PersonalSpace,
    PolicyAdminRequired,
    PolicyNameInvalid,
    PolicyReadSelfOnly,
    PolicyTooDeep,
    SpaceUnknown,
    TeamNotFound,
)
from service.policy.rules import (
    EXTERNAL_ADMIN,
    MAX_CHAIN,
    NAME,
    POLICY_ADMIN,
    Rule,
    add_rules,
    longest_chain,
    principal_name,
    remove_rule,
    space_name,
)
from service.policy.schemas import (
    Member,
    Permission,
    Permissions,
    PolicyAction,
    PolicyChange,
    Reason,
    SpaceAccess,
    SpaceCreate,
    SpaceCreated,
    SpaceOut,
    SpaceSettingsOut,
    TeamCreate,
    TeamOut,
)
from service.policy.space_settings import SpaceSettings, to_stored
from service.policy.space_settings import stored as stored_space_settings
from service.problems import InsufficientScope, NotAuthenticated

# Why a principal holds each grant: for every role it reaches, ONE membership chain (a
# shortest one, ties broken by name), so the answer stays as small as the closure however the
# teams are nested (red-team: listing every path grew as width^7 with eight layers of teams).
_EXPLAIN = text(
    """
    WITH RECURSIVE
    reach(role, depth) AS (
        SELECT CAST(:name AS text), 0
      UNION
        SELECT g.v1, r.depth + 1 FROM reach r
          JOIN casbin_rule g ON g.tenant_id = :tenant AND g.ptype = 'g' AND g.v0 = r.role
         WHERE r.depth < :max_depth
    ),
    nearest AS (SELECT role, min(depth) AS depth FROM reach GROUP BY role),
    parent AS (
        SELECT n.role, min(g.v0) AS via
          FROM nearest n
          JOIN casbin_rule g ON g.tenant_id = :tenant AND g.ptype = 'g' AND g.v1 = n.role
          JOIN nearest m ON m.role = g.v0 AND m.depth = n.depth - 1
         GROUP BY n.role
    ),
    roles(role, path) AS (
        SELECT CAST(:name AS text), ARRAY[CAST(:name AS text)]
      UNION ALL
        SELECT p.role, r.path || p.role FROM roles r JOIN parent p ON p.via = r.role
    ),
    ancestors(space_id, obj, path, depth) AS (
        SELECT s.id, 'space:' || s.id::text, ARRAY['space:' || s.id::text], 0
          FROM spaces s WHERE s.tenant_id = :tenant
      UNION ALL
        SELECT a.space_id, e.v1, a.path || e.v1, a.depth + 1 FROM ancestors a
          JOIN casbin_rule e ON e.tenant_id = :tenant AND e.ptype = 'g2' AND e.v0 = a.obj
         WHERE a.depth < :max_depth AND NOT e.v1 = ANY(a.path)
    )
    SELECT a.space_id, p.v3 AS action, r.path AS via_subjects, a.path AS via_spaces
      FROM roles r
      JOIN casbin_rule p ON p.tenant_id = :tenant AND p.ptype = 'p' AND p.v0 = r.role
      JOIN ancestors a ON a.obj = p.v2
     ORDER BY a.space_id, p.v3, cardinality(r.path), cardinality(a.path)
    """
)


class PolicyService:
    def __init__(
        self,
        session: AsyncSession,
        caller: Caller,
        *,
        trusted_issuers: frozenset[str] = frozenset(),
        facts: Facts | None = None,
    ):
        """`trusted_issuers`: the `iss` of the configured external issuers
        (`AuthSettings.trusted_external_issuers`): only mappings to them can be approved for
        admin scopes or count as working admins. None by default.
        `facts`: where the call's audit facts are noted (none for bootstrap and internal
        checks, which are not calls of their own)."""
        self._facts = facts or Facts()
        self._session = session
        self._caller = caller
        self._tenant_id = caller.tenant_id
        self._trusted_issuers = trusted_issuers

    async def require_policy_admin(self) -> None:
        """The caller reaches role:policy_admin: one lookup in the compiled closure."""
        if not await holds_role(
            self._session, self._tenant_id, self._caller.principal_id, POLICY_ADMIN
        ):
            raise PolicyAdminRequired(
                "Changing policy needs 'manage:policy' and the role:policy_admin grant in "
                "your tenant; ask a policy admin to add you to it."
            )

    async def lock_and_recheck(self) -> None:
        """Take the tenant's policy lock, then check the caller again. The route guard and
        authentication ran before the lock; a concurrent change may since have taken the
        caller's admin grant or disabled its client (two admins removing each other, or
        disabling each other's clients, both passed them). Under the lock each statement reads
        what the other committed, so the second change is refused."""
        await lock_policy(self._session, self._tenant_id)
        if not await admin_credentials_live(self._session, self._caller):
            raise NotAuthenticated(
                "Your client or principal was disabled while this request waited for your "
                "tenant's policy lock; nothing was changed.",
                error="invalid_token",
            )
        await self.require_policy_admin()

    # teams ------------------------------------------------------------------------------

    async def create_team(self, data: TeamCreate) -> TeamOut:
        team = Team(tenant_id=self._tenant_id, id=uuid7(), name=data.name)
        self._session.add(team)
        await self._session.flush()
        self._facts.add_targets([team.id])
        return _team_out(team)

    async def list_teams(self) -> list[TeamOut]:
        rows = await self._session.scalars(
            select(Team).where(Team.tenant_id == self._tenant_id).order_by(Team.id).limit(500)
        )
        items = [_team_out(team) for team in rows]
        self._facts.count(len(items))
        return items

    async def add_member(self, team_id: uuid.UUID, member: Member) -> PolicyChange:
        team = await self._team(team_id)
        name = await self._member_name(member)
        if name == f"team:{team.id}":
            raise PolicyTooDeep("A team cannot be a member of itself; nothing was changed.")
        self._name_nested_team(member)
        return await self._change(add=[Rule("g", name, f"team:{team.id}")])

    async def remove_member(self, team_id: uuid.UUID, member: Member) -> PolicyChange:
        team = await self._team(team_id)
        name = await self._member_name(member)
        self._name_nested_team(member)
        return await self._change(remove=[Rule("g", name, f"team:{team.id}")])

    def _name_nested_team(self, member: Member) -> None:
        """The audit row names path ids that are bare UUIDs; `team:<uuid>` is not one."""
        if member.is_team:
            self._facts.add_targets([member.id])

    # spaces -----------------------------------------------------------------------------

    async def create_space(self, data: SpaceCreate) -> SpaceCreated:
        if data.parent_id is not None:
            self._not_personal(await self._space(data.parent_id))
        space = Space(
            tenant_id=self._tenant_id,
            id=uuid7(),
            kind=data.kind,
            name=data.name,
            parent_id=data.parent_id,
        )
        self._session.add(space)
        await self._session.flush()
        rules = []
        if data.parent_id is not None:
            rules.append(Rule("g2", space_name(space.id), space_name(data.parent_id)))
        change = await self._change(add=rules)
        self._facts.add_targets([space.id])
        return SpaceCreated(space=_space_out(space), policy_version=change.policy_version)

    async def list_spaces(self) -> list[SpaceOut]:
        rows = await self._session.scalars(
            select(Space).where(Space.tenant_id == self._tenant_id).order_by(Space.id).limit(1000)
        )
        items = [_space_out(space) for space in rows]
        self._facts.count(len(items))
        return items

    async def set_space_settings(
        self, space_id: uuid.UUID, settings: SpaceSettings
    ) -> SpaceSettingsOut:
        """Replace the space's settings (fields left out take their defaults). Any space of
        the tenant, personal ones included: the gates decide how writes are checked, not who
        may read, so they share nothing."""
        space = await self._space(space_id)
        for partner in settings.consolidation.with_spaces:
            # An id of another tenant answers as one that does not exist (promise 1).
            if await self._session.get(Space, (self._tenant_id, partner)) is None:
                raise SpaceUnknown(
                    f"No space {partner} in your tenant (consolidation.with_spaces). Nothing "
                    "was changed."
                )
        space.settings = to_stored(settings)
        await self._session.flush()
        self._facts.add_targets([space.id])
        return SpaceSettingsOut(space_id=space.id, settings=stored_space_settings(space.settings))

    # grants -----------------------------------------------------------------------------

    async def grant(self, space_id: uuid.UUID, action: PolicyAction, subject: str) -> PolicyChange:
        self._not_personal(await self._space(space_id))
        await self._check_subject(subject)
        return await self._change(add=[Rule("p", subject, space_name(space_id), action)])

    async def revoke(self, space_id: uuid.UUID, action: PolicyAction, subject: str) -> PolicyChange:
        self._not_personal(await self._space(space_id))
        await self._check_subject(subject)
        return await self._change(remove=[Rule("p", subject, space_name(space_id), action)])

    # roles ------------------------------------------------------------------------------

    async def set_role(self, principal_id: uuid.UUID, role: str, member: bool) -> PolicyChange:
        rule = Rule("g", await self._principal_name(principal_id), f"role:{role}")
        if rule.target == EXTERNAL_ADMIN:
            await self._approve_external_admin(principal_id, member)
        if member:
            return await self._change(add=[rule])
        if principal_id == self._caller.principal_id:
            raise PolicyNameInvalid(
                "You cannot take your own policy role away (ask another policy admin)."
            )
        # Under the policy lock, like the change itself: the powers and the admin check read
        # what concurrent changes committed.
        await self.lock_and_recheck()
        await self.require_not_outranked(principal_id)
        return await self._change(remove=[rule])

    async def set_tenant_role(
        self, principal_id: uuid.UUID, role: str, *, member: bool
    ) -> PolicyChange:
        """A tenant role of the identity API (`auditor`, through /v1/principals/{id}/roles,
        which checks the granter's scope first): a `g` line to role:<role>, compiled like any
        membership. A caller may drop its own, unlike a policy role; never from a principal
        that outranks it, nor the tenant's last holder (409)."""
        rule = Rule("g", await self._principal_name(principal_id), f"role:{role}")
        if member:
            return await self._change(add=[rule])
        # Under the policy lock, like the change itself: the powers and the admin check read
        # what concurrent changes committed.
        await self.lock_and_recheck()
        await self.require_not_outranked(principal_id)
        return await self._change(remove=[rule])

    async def _approve_external_admin(self, principal_id: uuid.UUID, member: bool) -> None:
        """Letting a principal's IdP tokens carry admin scopes hands out every admin scope the
        IdP may put in them, so only a caller holding all of them decides, either way."""
        lacking = ADMIN_SCOPES - self._caller.scopes
        if lacking:
            raise InsufficientScope(
                "Approving (or withdrawing) admin scopes from an external IdP needs every admin "
                f"scope; your token lacks {', '.join(sorted(lacking))}.",
                required_scope=sorted(lacking)[0],
            )
        if not member:
            return
        row = await self._session.get(Principal, (self._tenant_id, principal_id))
        if row is None or row.external_subject is None or row.kind == "agent":
            raise PolicyNameInvalid(
                f"Principal {principal_id} is not a user or service mapped to an external IdP "
                "subject: only such a mapping can be approved for admin scopes."
            )
        if row.external_issuer not in self._trusted_issuers and not await issuer_registered(
            self._session, self._tenant_id, row.external_issuer
        ):
            # Mapped while its issuer was trusted, since taken out of the configuration: its
            # IdP's tokens are no longer verified, so an approval would be a dead admin.
            raise untrusted_issuer(len(self._trusted_issuers))

    async def require_not_outranked(self, principal_id: uuid.UUID) -> None:
        """Nobody removes a role from a principal whose admin powers exceed their own (a lower
        admin could otherwise lock out the tenant owner)."""
        powers = await admin_powers(self._session, self._tenant_id, principal_id)
        outranking = powers - self._caller.scopes
        if outranking:
            raise InsufficientScope(
                f"Principal {principal_id} holds admin scopes your token lacks "
                f"({', '.join(sorted(outranking))}); only a caller holding all of them may take "
                "its roles away.",
                required_scope=sorted(outranking)[0],
            )

    # delegation -------------------------------------------------------------------------

    async def set_delegate(self, user_id: uuid.UUID, agent_id: uuid.UUID, *, allowed: bool) -> None:
        """Allow (or stop) an agent acting for a user through token exchange. The user decides
        for itself; anyone else needs to be a policy admin with `manage:policy`."""
        caller = self._caller
        if caller.principal_id != user_id or caller.actor_id is not None:
            if not caller.has_scope(Scope.MANAGE_POLICY):
                raise InsufficientScope(
                    "Only the user itself, or a policy admin with 'manage:policy', decides who "
                    "may act for a user.",
                    required_scope=str(Scope.MANAGE_POLICY),
                )
            await self.require_policy_admin()
        user = await self._session.get(Principal, (self._tenant_id, user_id))
        agent = await self._session.get(Principal, (self._tenant_id, agent_id))
        if user is None or agent is None:
            missing = user_id if user is None else agent_id
            raise PrincipalNotFound(f"No principal {missing} in your tenant.")
        if agent.kind == "user" or user_id == agent_id:
            raise PolicyNameInvalid("Only an agent or service principal can act for a user.")
        if allowed:  # revoking one is always allowed (there should be none to revoke)
            refuse_job_principal(self._tenant_id, agent_id, "act for a user")
            refuse_job_principal(self._tenant_id, user_id, "be acted for")
        if allowed:
            await self._session.execute(
                insert(Delegation)
                .values(tenant_id=self._tenant_id, user_id=user_id, agent_id=agent_id)
                .on_conflict_do_nothing()
            )
        else:
            await self._session.execute(
                delete(Delegation).where(
                    Delegation.tenant_id == self._tenant_id,
                    Delegation.user_id == user_id,
                    Delegation.agent_id == agent_id,
                )
            )

    # read:policy ------------------------------------------------------------------------

    async def permissions(self, principal_id: uuid.UUID) -> Permissions:
        """What the principal may do, and each chain of rules behind it."""
        if await self._caller_is_agent() and principal_id != self._acting_id():
            raise PolicyReadSelfOnly(
                "Agents may explain only their own permissions: ask for "
                f"/v1/principals/{self._acting_id()}/permissions."
            )
        name = await self._principal_name(principal_id)
        params = {"tenant": self._tenant_id, "name": name, "max_depth": CASBIN_MAX_HIERARCHY}
        rows = (await self._session.execute(_EXPLAIN, params)).all()
        reasons: dict[tuple[uuid.UUID, str], list[Reason]] = defaultdict(list)
        for space_id, action, via_subjects, via_spaces in rows:
            reasons[(space_id, action)].append(
                Reason(via_subjects=list(via_subjects), via_spaces=list(via_spaces))
            )
        self._facts.count(len(reasons))
        return Permissions(
            principal_id=principal_id,
            policy_version=await self._version(),
            permissions=[
                Permission(space_id=space_id, action=cast(PolicyAction, action), reasons=found)
                for (space_id, action), found in reasons.items()
            ],
        )

    async def access(self, space_id: uuid.UUID, action: PolicyAction) -> SpaceAccess:
        """Who may `action` in the space (from the compiled grants)."""
        if await self._caller_is_agent():
            raise PolicyReadSelfOnly(
                "Agents may not list who uses a space; ask for your own permissions at "
                f"/v1/principals/{self._acting_id()}/permissions."
            )
        await self._space(space_id)
        rows = await self._session.scalars(
            select(SpaceGrant.principal_id)
            .where(
                SpaceGrant.tenant_id == self._tenant_id,
                SpaceGrant.space_id == space_id,
                SpaceGrant.action == action,
            )
            .order_by(SpaceGrant.principal_id)
        )
        principal_ids = list(rows)
        self._facts.count(len(principal_ids))
        return SpaceAccess(
            space_id=space_id,
            action=action,
            policy_version=await self._version(),
            principal_ids=principal_ids,
        )

    # internals --------------------------------------------------------------------------

    def _acting_id(self) -> uuid.UUID:
        """Who really makes the call: the agent of a delegated token, else the caller."""
        return self._caller.actor_id or self._caller.principal_id

    async def _caller_is_agent(self) -> bool:
        """An agent, or an agent acting for a user (the tenant's graph is not for either)."""
        if self._caller.actor_id is not None:
            return True
        row = await self._session.get(Principal, (self._tenant_id, self._caller.principal_id))
        return row is None or row.kind == "agent"

    async def _change(
        self, *, add: list[Rule] | None = None, remove: list[Rule] | None = None
    ) -> PolicyChange:
        add, remove = add or [], remove or []
        await self.lock_and_recheck()
        # Only a removed membership can take a role away; count the auditors before it, so a
        # tenant that has none already can still change its teams.
        removes_members = any(rule.ptype == "g" for rule in remove)
        auditors = await self._working_auditors() if removes_members else 0
        await add_rules(self._session, self._tenant_id, add)
        for rule in remove:
            await remove_rule(self._session, self._tenant_id, rule)
        for ptype in {rule.ptype for rule in add} & {"g", "g2"}:
            if await longest_chain(self._session, self._tenant_id, ptype) > MAX_CHAIN:
                raise PolicyTooDeep(
                    f"That change makes a {'membership' if ptype == 'g' else 'sub-space'} "
                    f"chain longer than {MAX_CHAIN} links (or a cycle); nothing was changed."
                )
        version = await apply_changes(self._session, self._tenant_id, add + remove)
        if removes_members:
            # Read from the closure just rebuilt; a refusal rolls the whole change back.
            await self._keep_role_holders(had_auditors=auditors > 0)
        return PolicyChange(policy_version=version)

    async def _keep_role_holders(self, *, had_auditors: bool) -> None:
        if not await working_policy_admins(self._session, self._tenant_id, self._trusted_issuers):
            raise LastRoleHolder(
                "That change would leave your tenant without a working policy admin (an "
                "enabled user or service in role:policy_admin with an enabled admin client "
                "holding manage:policy); nothing was changed. Add another policy admin first."
            )
        if had_auditors and not await self._working_auditors():
            raise LastRoleHolder(
                "That change would leave your tenant without a working auditor (an enabled "
                "user or service in role:auditor with an enabled admin client holding "
                "read:audit), and nobody could read its audit log; nothing was changed. Grant "
                "the auditor role to someone with such a client first."
            )

    async def _working_auditors(self) -> int:
        return await working_auditors(self._session, self._tenant_id, self._trusted_issuers)

    async def _version(self) -> int:
        version = await self._session.scalar(
            select(Tenant.policy_version).where(Tenant.tenant_id == self._tenant_id)
        )
        return int(version or 0)

    async def _team(self, team_id: uuid.UUID) -> Team:
        team = await self._session.get(Team, (self._tenant_id, team_id))
        if team is None:
            raise TeamNotFound(f"No team {team_id} in your tenant.")
        return team

    async def _space(self, space_id: uuid.UUID) -> Space:
        space = await self._session.get(Space, (self._tenant_id, space_id))
        if space is None:
            raise SpaceUnknown(f"No space {space_id} in your tenant.")
        return space

    @staticmethod
    def _not_personal(space: Space) -> None:
        """A personal space is its owner's alone (docs/design.md, "Parts"): no policy change may
        share it, hang sub-spaces under it, or take the owner's grants away."""
        if space.kind == "personal":
            raise PersonalSpace(
                f"Space {space.id} is a personal space: only its owner uses it. Share through a "
                "team or tenant space instead."
            )

    async def _member_name(self, member: Member) -> str:
        """A principal of this tenant, or a team of it (cycles fail the chain check)."""
        if not member.is_team:
            return await self._principal_name(member.id)
        return f"team:{(await self._team(member.id)).id}"

    async def _principal_name(self, principal_id: uuid.UUID) -> str:
        row = await self._session.get(Principal, (self._tenant_id, principal_id))
        if row is None:
            raise PrincipalNotFound(f"No principal {principal_id} in your tenant.")
        return principal_name(row.kind, row.id)

    async def _check_subject(self, subject: str) -> None:
        """A typed, exact name of something in this tenant (roles are just names)."""
        if not NAME.fullmatch(subject) or subject.startswith("space:"):
            raise PolicyNameInvalid(
                f"'{subject[:100]}' is not a subject: use user:|agent:|service:|team:<uuid> "
                "or role:<lowercase word>."
            )
        kind, _, raw_id = subject.partition(":")
        if kind == "role":
            return
        if kind == "team":
            await self._team(uuid.UUID(raw_id))
            return
        if await self._principal_name(uuid.UUID(raw_id)) != subject:
            raise PolicyNameInvalid(f"Principal {raw_id} is not a {kind}.")


def _team_out(team: Team) -> TeamOut:
    return TeamOut(id=team.id, name=team.name, subject=f"team:{team.id}")


def _space_out(space: Space) -> SpaceOut:
    return SpaceOut(
        id=space.id,
        name=space.name,
        kind=space.kind,
        parent_id=space.parent_id,
        owner_id=space.owner_id,
        settings=stored_space_settings(space.settings),
    )
