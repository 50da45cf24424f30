"""Wire shapes of the policy API."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from service.db.types import NO_NUL
from service.policy.space_settings import SpaceSettings

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=NO_NUL)]
PolicyAction = Literal["read", "write", "delete", "review"]
PolicyRole = Literal["policy_admin", "external_admin"]


@dataclass(frozen=True)
class Member:
    """A team member as the path names it: a principal id, or `team:<uuid>` for a team."""

    id: uuid.UUID
    is_team: bool = False


class TeamCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: Name


class TeamOut(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    name: str
    subject: str
    """The team's name in policy rules (`team:<id>`)."""


class TeamList(msgspec.Struct, kw_only=True):
    items: list[TeamOut]


class SpaceCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: Name
    kind: Literal["team", "tenant"] = "team"
    parent_id: uuid.UUID | None = None
    """A sub-space inherits every grant on its parent (chains of at most 8)."""


class SpaceOut(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    name: str
    kind: str
    parent_id: uuid.UUID | None
    owner_id: uuid.UUID | None
    settings: SpaceSettings
    """The space's gates on writes (defaults filled in)."""


class SpaceSettingsOut(msgspec.Struct, kw_only=True):
    space_id: uuid.UUID
    settings: SpaceSettings
    """The settings now in force (defaults filled in): the very next write sees them."""


class SpaceList(msgspec.Struct, kw_only=True):
    items: list[SpaceOut]


class PolicyChange(msgspec.Struct, kw_only=True):
    policy_version: int
    """The tenant's policy version after the change; the very next request sees it."""


class SpaceCreated(msgspec.Struct, kw_only=True):
    space: SpaceOut
    policy_version: int


class Reason(msgspec.Struct, kw_only=True):
    via_subjects: list[str]
    """The principal, then each team or role it reaches, up to the subject of the rule."""
    via_spaces: list[str]
    """The space, then each parent, up to the space the rule names."""


class Permission(msgspec.Struct, kw_only=True):
    space_id: uuid.UUID
    action: PolicyAction
    reasons: list[Reason]


class Permissions(msgspec.Struct, kw_only=True):
    principal_id: uuid.UUID
    policy_version: int
    permissions: list[Permission]


class SpaceAccess(msgspec.Struct, kw_only=True):
    space_id: uuid.UUID
    action: PolicyAction
    policy_version: int
    principal_ids: list[uuid.UUID]
