"""Red-team F3: the token endpoint must not tell which client ids exist or are enabled."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.fixtures.api import Api


def _comparable(response: httpx.Response) -> tuple[int, dict[str, object], str | None]:
    return response.status_code, response.json(), response.headers.get("www-authenticate")


@pytest.mark.parametrize("method", ["post", "basic"])
async def test_existing_disabled_and_unknown_client_ids_fail_alike(api: Api, method: str) -> None:
    other = await api.other_tenant()
    carol = await other.new_agent("carol")  # a live client of another tenant
    dave = await api.new_agent("dave")
    disabled = await api.http.post(
        f"/v1/clients/{dave.client_id}/disable", headers=api.admin.headers
    )
    assert disabled.status_code == 200

    async def attempt(client_id: str) -> httpx.Response:
        form = {"grant_type": "client_credentials"}
        if method == "post":
            form |= {"client_id": client_id, "client_secret": "mgs_wrong"}
            response: httpx.Response = await api.http.post("/oauth/token", data=form)
        else:
            response = await api.http.post("/oauth/token", data=form, auth=(client_id, "mgs_wrong"))
        return response

    live = await attempt(carol.client_id)
    answers = [
        _comparable(live),
        _comparable(await attempt(dave.client_id)),
        _comparable(await attempt(str(uuid.uuid4()))),
        _comparable(await attempt("not-even-a-uuid")),
    ]
    assert live.status_code == 401
    assert live.json()["error"] == "invalid_client"
    assert all(answer == answers[0] for answer in answers), answers
