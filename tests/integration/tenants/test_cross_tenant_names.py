"""Names that exist only in the other tenant, on the routes that create things (a team, a
space, a principal or an externally mapped principal named like the other tenant's, a memory
with the other tenant's subject and key): the call succeeds exactly as for a made-up name (no
conflict, no supersession across tenants), changes nothing of the other tenant and logs and
audits nothing of it. These probes make things in the caller's tenant, so they run on a world of
their own (this module's), apart from the matrix."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.tenants.probes import CREATING, Probe
from tests.integration.tenants.test_cross_tenant_matrix import probe_once
from tests.integration.tenants.world import World


@pytest.mark.parametrize("probe", CREATING, ids=[probe.id for probe in CREATING])
async def test_a_name_of_another_tenant_creates_like_a_new_name(
    world: World, oracle: AsyncEngine, probe: Probe
) -> None:
    await probe_once(world, oracle, probe)
