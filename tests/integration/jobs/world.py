"""The issue's leak scenario with real data: two teams, private notes that share the team
fact's subject and key, a private note filed under the team's service subject, a team row
derived from a private note, and a row of one team derived from the other's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tests.fixtures.api import Agent, Api
from tests.integration.jobs.consolidation_support import (
    JobPrincipal,
    grant,
    job_principal,
    service_subject,
    team_space,
)

SUBJECT = "service:search"
PRIVATE = {
    "alice": "PRIVATE alice is interviewing with another company about the search role",
    "bob": "Heard from my manager that search will be merged into platform in Q1",
    "bob-derived": "PRIVATE bob's reorg planning notes for the search team",
    "carol": "PRIVATE carol says the search cluster budget is being cut",
}
"""Text only its writer may ever read back (each marked by words no team text uses)."""
MARKERS = ("interviewing", "merged into platform", "reorg planning", "budget is being cut")
TEAM_FACT = "The search team owns query serving and ships on Tuesdays"
PLATFORM_FACT = "Platform runs the search cluster on three nodes"
BRIDGE_FACT = "Search depends on the platform cluster for its index"


@dataclass
class World:
    api: Api
    alice: Agent
    bob: Agent
    carol: Agent
    erin: Agent
    """In both teams."""
    search: str
    platform: str
    job: JobPrincipal
    rows: dict[str, dict[str, Any]]
    """Every memory written, by name."""

    @property
    def members(self) -> dict[str, Agent]:
        return {"alice": self.alice, "bob": self.bob, "carol": self.carol, "erin": self.erin}


async def build(api: Api) -> World:
    """The world, its job a stand-in service principal holding read, write and delete."""
    job = await job_principal(api)
    return await build_for(api, job, service_subject(job), ("read", "write", "delete"))


async def build_for(
    api: Api, job: JobPrincipal, job_subject: str, job_actions: Sequence[str], *starters: str
) -> World:
    """The world with `job_subject` granted `job_actions` on both team spaces, and each of
    `starters` (policy subjects who start runs through the API) granted read there."""
    alice, bob = await api.new_agent("alice"), await api.new_agent("bob")
    carol, erin = await api.new_agent("carol"), await api.new_agent("erin")
    search = await team_space(api, "search", alice, bob, erin)
    platform = await team_space(api, "platform", carol, erin)
    for space in (search, platform):
        await grant(api, space, job_subject, *job_actions)
        for starter in starters:
            await grant(api, space, starter, "read")
    rows: dict[str, dict[str, Any]] = {}

    async def note(name: str, agent: Agent, key: str, value: str, **fields: Any) -> None:
        rows[name] = await api.remember(agent, subject=SUBJECT, key=key, value=value, **fields)

    await note("team", alice, "ownership", TEAM_FACT, space_id=search)
    # Same subject and key as the team fact, in Alice's personal space.
    await note("alice", alice, "ownership", PRIVATE["alice"])
    # Filed under the team's service subject, in Bob's personal space.
    await note("bob", bob, "reorg", PRIVATE["bob"])
    # In the team space, but derived from Bob's note: readable by Bob alone.
    await note(
        "bob-derived",
        bob,
        "reorg.plans",
        PRIVATE["bob-derived"],
        space_id=search,
        derived_from=[rows["bob"]["id"]],
    )
    await note("platform", carol, "cluster", PLATFORM_FACT, space_id=platform)
    await note("carol", carol, "cluster", PRIVATE["carol"])
    # In the search space, derived from the platform fact: readers of both spaces only.
    await note(
        "bridge",
        erin,
        "cluster.dependency",
        BRIDGE_FACT,
        space_id=search,
        derived_from=[rows["platform"]["id"]],
    )
    return World(api, alice, bob, carol, erin, search, platform, job, rows)
