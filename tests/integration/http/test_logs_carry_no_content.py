"""Logs carry request id, tenant and principal — never memory text, query text or tokens."""

from __future__ import annotations

from tests.fixtures.api import Api
from tests.fixtures.canaries import CANARY_QUERY, CANARY_VALUE, assert_no_canary, captured_logs


async def test_canaries_never_reach_the_logs(api: Api) -> None:
    alice = await api.new_agent("alice")
    with captured_logs() as events:
        await api.remember(alice, key="secret.note", value=f"the code is {CANARY_VALUE}")
        response = await api.search(alice, f"what is {CANARY_QUERY}")
        assert response.status_code == 200
        await api.http.get("/v1/memories/not-a-uuid", headers=alice.headers)
    assert events, "the access log recorded nothing"
    assert_no_canary(repr(events), alice.token, alice.secret, where="the logs")
    requests = [event for event in events if event.get("event") == "request"]
    assert len(requests) == 3
    assert {event["route"] for event in requests} == {
        "/v1/memories",
        "/v1/memories/search",
        "/v1/memories/{memory_id}",
    }
    assert all(event["principal"] == alice.principal_id for event in requests)
    assert all(event["tenant"] == api.tenant_id for event in requests)
    assert len({event["request_id"] for event in requests}) == 3
