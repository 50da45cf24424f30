from __future__ import annotations

from tests.fixtures.api import Api


async def test_agent_remembers_and_recalls(api: Api) -> None:
    alice = await api.new_agent("alice")
    written = await api.remember(alice, key="deploy.window", value="deploys happen friday 10-12")
    response = await api.search(alice, "when do we deploy", k=5)
    assert response.status_code == 200, response.text
    hits = response.json()["hits"]
    assert [hit["memory"]["id"] for hit in hits] == [written["id"]]
    provenance = hits[0]["memory"]["provenance"]
    assert provenance["writer_id"] == alice.principal_id
    assert provenance["client_id"] == alice.client_id
    assert provenance["embedding_model"] == "wordllama/l2_supercat@256"
