"""The policy operations: teams, spaces, grants, roles, delegates, and explaining access."""

from __future__ import annotations

from service.auth.scopes import Scope
from service.identity.problems import (
    ExternalIssuerUntrusted,
    JobPrincipalReserved,
    PrincipalNotFound,
)
from service.operations import family, operation
from service.policy.guards import agents_may_read_policy, requires_policy_admin
from service.policy.problems import (
    AgentPolicyReadOff,
    LastRoleHolder,
    PersonalSpace,
    PolicyAdminRequired,
    PolicyNameInvalid,
    PolicyReadSelfOnly,
    PolicyTooDeep,
    SpaceUnknown,
    TeamNotFound,
)

managed = family(Scope.MANAGE_POLICY, PolicyAdminRequired, check=requires_policy_admin)
"""Managing policy (and principals and clients, which is managing access): the scope and
role:policy_admin."""


TEAM_CREATE = managed(
    "policy.team.create", "createTeam", "Create a team", PolicyNameInvalid, success=201
)
TEAM_LIST = managed(
    "policy.team.list", "listTeams", "List the teams of your tenant", read_only=True
)
TEAM_ADD_MEMBER = managed(
    "policy.team.add_member",
    "addTeamMember",
    "Add a principal or team to a team",
    TeamNotFound,
    PrincipalNotFound,
    PolicyTooDeep,
)
TEAM_REMOVE_MEMBER = managed(
    "policy.team.remove_member",
    "removeTeamMember",
    "Remove a principal or team from a team",
    TeamNotFound,
    PrincipalNotFound,
    LastRoleHolder,
)
SPACE_CREATE = managed(
    "policy.space.create",
    "createSpace",
    "Create a team or tenant-wide space",
    SpaceUnknown,
    PersonalSpace,
    PolicyNameInvalid,
    PolicyTooDeep,
    success=201,
)
SPACE_LIST = managed(
    "policy.space.list", "listSpaces", "List the spaces of your tenant", read_only=True
)
SPACE_SETTINGS = managed(
    "policy.space.settings",
    "setSpaceSettings",
    "Set a space's write gate, evidence gate and consolidation policy",
    SpaceUnknown,
)
GRANT = managed(
    "policy.grant",
    "grantSpaceAccess",
    "Grant read, write or delete on a space",
    PolicyNameInvalid,
    SpaceUnknown,
    PrincipalNotFound,
    TeamNotFound,
    PersonalSpace,
)
REVOKE = managed(
    "policy.revoke",
    "revokeSpaceAccess",
    "Revoke a grant on a space",
    PolicyNameInvalid,
    SpaceUnknown,
    PrincipalNotFound,
    TeamNotFound,
    PersonalSpace,
    LastRoleHolder,
)
SPACE_ACCESS = operation(
    "policy.space.access",
    "getSpaceAccess",
    "Who may act in a space",
    Scope.READ_POLICY,
    SpaceUnknown,
    PolicyReadSelfOnly,
    AgentPolicyReadOff,
    check=agents_may_read_policy,
    read_only=True,
)
ROLE_ADD_MEMBER = managed(
    "policy.role.add_member",
    "addRoleMember",
    "Give a principal a policy role",
    PrincipalNotFound,
    # Approving external_admin: the principal must be mapped to a trusted IdP.
    PolicyNameInvalid,
    ExternalIssuerUntrusted,
    PolicyTooDeep,
)
ROLE_REMOVE_MEMBER = managed(
    "policy.role.remove_member",
    "removeRoleMember",
    "Take a policy role from a principal",
    PrincipalNotFound,
    PolicyNameInvalid,
    LastRoleHolder,
)
DELEGATE_ALLOW = operation(
    "policy.delegate.allow",
    "allowDelegate",
    "Allow an agent to act for a user",
    Scope.MANAGE_DELEGATES,
    PrincipalNotFound,
    JobPrincipalReserved,
    PolicyNameInvalid,
    PolicyAdminRequired,
    PolicyReadSelfOnly,
    success=204,
)
DELEGATE_REVOKE = operation(
    "policy.delegate.revoke",
    "revokeDelegate",
    "Stop an agent acting for a user",
    Scope.MANAGE_DELEGATES,
    PrincipalNotFound,
    PolicyNameInvalid,
    PolicyAdminRequired,
    PolicyReadSelfOnly,
    success=204,
)
PERMISSIONS = operation(
    "policy.permissions",
    "explainPermissions",
    "What a principal may do, and why",
    Scope.READ_POLICY,
    PrincipalNotFound,
    PolicyReadSelfOnly,
    AgentPolicyReadOff,
    check=agents_may_read_policy,
    read_only=True,
)
