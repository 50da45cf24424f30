"""Problems of the policy API."""

from __future__ import annotations

from service.problems import Problem


class PolicyAdminRequired(
    Problem, slug="policy-admin-required", status=403, title="Policy admin required"
):
    """Changing policy needs the `manage:policy` scope and the `role:policy_admin` grant in the
    tenant (the bootstrap admin holds it)."""


class TeamNotFound(Problem, slug="team-not-found", status=404, title="Team not found"):
    """No team with this id in your tenant."""


class SpaceUnknown(Problem, slug="space-unknown", status=404, title="Space not found"):
    """No space with this id in your tenant."""


class PolicyNameInvalid(
    Problem, slug="policy-name-invalid", status=422, title="Invalid policy name"
):
    """A subject must be a typed, exact name: user:|agent:|service:|team:<uuid> or
    role:<lowercase word>, naming something that exists in your tenant."""


class PolicyTooDeep(Problem, slug="policy-too-deep", status=422, title="Policy chain too deep"):
    """Membership and sub-space chains may have at most 8 links (and no cycles)."""


class PersonalSpace(Problem, slug="personal-space", status=422, title="Personal space"):
    """Personal spaces belong to their owner alone; they cannot be shared or nested under."""


class LastRoleHolder(Problem, slug="last-role-holder", status=409, title="Last role holder"):
    """The tenant's last policy admin or last auditor cannot be removed, and the last working
    admin client (enabled, holding `manage:policy`) of its policy admins cannot be disabled:
    nobody could manage the tenant's access or read its audit log any more. Give the role (or
    an admin client) to someone else first."""


class PolicyReadSelfOnly(
    Problem, slug="policy-read-self-only", status=403, title="Agents explain only themselves"
):
    """An agent (or a call an agent makes for a user) may read its own permissions only; the
    tenant's access graph is for policy readers who are users or services."""


class AgentPolicyReadOff(
    Problem, slug="agent-policy-read-off", status=403, title="Agents may not read policy here"
):
    """The tenant's settings keep `read:policy` from agents (`agents_may_read_policy` false):
    an agent's token, or one acting for a user, is refused at the policy read routes."""
