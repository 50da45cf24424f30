"""A revoke's and a reinstate's counts hold only rows the caller reads (red-team finding 5):
they came straight from the tenant-wide hide and lift functions, so a derived row in a space the
revoker cannot read showed as one more."""

from __future__ import annotations

from tests.fixtures.api import Api
from tests.integration.jobs.consolidation_support import team_space
from tests.integration.memory.revocation_support import post, reinstate, revoke


async def test_revoke_counts_only_what_the_revoker_can_read(api: Api) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    team = await team_space(api, "refunds", alice)
    granted = await api.http.put(
        f"/v1/spaces/{team}/grants/read/user:{bob.principal_id}", headers=api.admin.headers
    )
    assert granted.status_code == 200, granted.text
    body = {
        "subject": "policy:refunds",
        "kind": "fact",
        "key": "refund",
        "new_key": True,
        "value": "Refunds above 200 EUR need a second signature",
        "space_id": team,
    }
    made = await post(api, alice, "/v1/memories", body)
    assert made.status_code == 201, made.text
    memory_id = made.json()["memory"]["id"]
    # Bob, in his personal space (alice has no grant there), derives a conclusion.
    derived = await post(
        api,
        bob,
        "/v1/memories",
        {
            "subject": "case:4711",
            "kind": "fact",
            "key": "decision",
            "new_key": True,
            "value": "approved without the second signature",
            "derived_from": [memory_id],
        },
    )
    assert derived.status_code == 201, derived.text
    seen = await api.http.get(
        f"/v1/memories/{derived.json()['memory']['id']}", headers=alice.headers
    )
    assert seen.status_code == 404  # alice cannot read bob's row
    revoked = await revoke(api, alice, memory_id, "withdrawn by finance")
    assert revoked["hidden"] == 1, revoked  # only her own row may be counted
    back = await reinstate(api, alice, memory_id, "restored by finance")
    assert back["restored"] == 1, back
