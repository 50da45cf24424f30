"""Review item 1: the token endpoint's limits. Failed client authentications are limited per
client id and per source, token requests in flight are bounded, and a database that does not
answer in time is a 503: each past-the-limit answer is a problem with RFC 6749 members and
Retry-After, audited, and costs no argon2 work. Floods are bounded in count and time."""

from __future__ import annotations

import asyncio
import collections
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.runtime import Runtime
from service.settings import Settings
from tests.conftest import make_settings
from tests.fixtures.api import Api
from tests.integration.auth.throttling import (
    FLOOD_SECONDS,
    FORM,
    assert_retry_later,
    concurrent_client,
    wrong_secret,
)


@pytest.fixture
def settings(database_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    """The limits a test names with `@pytest.mark.limits(...)`."""
    marker = request.node.get_closest_marker("limits")
    return make_settings(database_url, tmp_path, **(marker.kwargs if marker else {}))


# Five failures at once, coming back one per 2 s; default shares of the in-flight bound (four
# attempts of one client id at once, eight of one source).
@pytest.mark.limits(token_failure_burst=5, token_failures_per_minute=30.0)
async def test_failed_authentications_are_limited_per_client_id_and_source(
    api: Api, owner_engine: AsyncEngine
) -> None:
    victim = await api.new_agent("victim")
    share = api.runtime.settings.auth.token_max_in_flight_per_client
    assert share == 4  # the default, which the counts below follow
    async with concurrent_client(api.runtime) as http, asyncio.timeout(FLOOD_SECONDS):
        answers = await asyncio.gather(*(wrong_secret(http, victim.client_id) for _ in range(30)))
        statuses = [answer.status_code for answer in answers]
        # The client id's share is checked (401); the rest are turned away as busy before any
        # argon2 work, not as failures: none of them had failed yet (red-team finding 4).
        assert statuses.count(401) == share, statuses
        assert statuses.count(503) == 30 - share, statuses
        for answer in answers:
            if answer.status_code == 503:
                assert_retry_later(answer, 503, "oauth-overloaded")
        # Those failures counted when they settled; one attempt later the allowance is spent.
        later = [await wrong_secret(http, victim.client_id) for _ in range(3)]
        assert [answer.status_code for answer in later] == [401, 429, 429]
        for answer in later[1:]:
            assert_retry_later(answer, 429, "oauth-too-many-failures")
        # Random client ids from the same source are limited by the source's allowance.
        unknown = await asyncio.gather(*(wrong_secret(http, str(uuid.uuid4())) for _ in range(3)))
    assert {answer.status_code for answer in unknown} == {429}
    # The right secret from elsewhere is refused too while the client id's allowance is spent
    # (the price of a per-client limit), and works once it comes back (one per 2 s here).
    right = await api.token_response(victim.client_id, victim.secret)
    assert_retry_later(right, 429, "oauth-too-many-failures")
    await asyncio.sleep(2.2)
    assert (await api.token_response(victim.client_id, victim.secret)).status_code == 200
    # Every refusal is audited like any other call.
    async with owner_engine.connect() as conn:
        audited = await conn.scalars(
            text("SELECT reason FROM audit_events WHERE route = '/oauth/token' AND status >= 429")
        )
        reasons = collections.Counter(audited.all())
    assert reasons == {"oauth-overloaded": 30 - share, "oauth-too-many-failures": 2 + 3 + 1}


# A failure allowance too large to matter: the in-flight bound alone is under test.
@pytest.mark.limits(token_max_in_flight=4, token_failure_burst=1000)
async def test_token_requests_past_the_in_flight_bound_answer_503(api: Api) -> None:
    async with concurrent_client(api.runtime) as http, asyncio.timeout(FLOOD_SECONDS):
        answers = await asyncio.gather(*(wrong_secret(http, str(uuid.uuid4())) for _ in range(12)))
    statuses = [answer.status_code for answer in answers]
    # Four are worked on; the other eight are turned away at once, before any database or
    # argon2 work.
    assert statuses.count(401) == 4, statuses
    assert statuses.count(503) == 8, statuses
    for answer in answers:
        if answer.status_code == 503:
            assert_retry_later(answer, 503, "oauth-overloaded")


@pytest.mark.limits(token_db_wait_seconds=0.3)
async def test_a_database_that_does_not_answer_is_503_never_500(api: Api, runtime: Runtime) -> None:
    """Every pool connection is taken: the token request gives up after its wait and answers
    503 with Retry-After (its audit row is written once connections come back)."""
    victim = await api.new_agent("victim")
    async with concurrent_client(runtime) as http:
        held = [
            await runtime.engine.connect() for _ in range(2 * runtime.settings.database.pool_size)
        ]
        request = asyncio.create_task(
            http.post("/oauth/token", data=FORM, auth=(victim.client_id, victim.secret))
        )
        await asyncio.sleep(runtime.settings.auth.token_db_wait_seconds + 0.5)
        for conn in held:
            await conn.close()
        async with asyncio.timeout(FLOOD_SECONDS):
            answer = await request
    assert_retry_later(answer, 503, "oauth-overloaded")
    assert "pool" not in answer.text.lower()
