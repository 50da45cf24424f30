"""The client's retry and error rules over a scripted transport (httpx.MockTransport): which
requests go again, with which key, after how long, and what is raised. The network cases
against a real server are in tests/integration/client."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from memgate_client import (
    AsyncMemgate,
    BatchRejected,
    ClientCredentials,
    Memgate,
    MemgateConnectionError,
    MemgateProblem,
    MemoryNotFound,
    NotFound,
    RateLimited,
    RetryPolicy,
    ServiceUnavailable,
    Unauthorized,
    problem_class,
)
from memgate_client.errors import BadGateway, problem_from_response
from memgate_client.types import MemoryCreate, MemoryPage

BASE = "http://memgate.test"
FAST = RetryPolicy(attempts=4, backoff=0.0)
PROBLEM = "https://memgate.dev/problems/"
ITEM: MemoryCreate = {
    "subject": "service:billing",
    "kind": "fact",
    "key": "deploy.window",
    "value": "Fri",
}

Step = Callable[[httpx.Request], httpx.Response]


def problem(status: int, slug: str, headers: dict[str, str] | None = None, **more: Any) -> Step:
    body = {"type": PROBLEM + slug, "title": slug, "status": status, "detail": "d", **more}
    return lambda _request: httpx.Response(
        status, json=body, headers={"content-type": "application/problem+json", **(headers or {})}
    )


def dropped(_request: httpx.Request) -> httpx.Response:
    raise httpx.RemoteProtocolError("Server disconnected without sending a response.")


def answer(status: int, body: Any = None) -> Step:
    return lambda _request: httpx.Response(status, json=body)


class Script:
    """Answers the requests in order, and keeps them."""

    def __init__(self, *steps: Step) -> None:
        self.steps: Iterator[Step] = iter(steps)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return next(self.steps)(request)

    def client(self, retry: RetryPolicy = FAST, **kwargs: Any) -> Memgate:
        http = httpx.Client(transport=httpx.MockTransport(self))
        return Memgate(BASE, token=kwargs.pop("token", "t"), retry=retry, http=http, **kwargs)


def test_a_batch_keeps_its_idempotency_key_across_retries_and_the_next_call_gets_a_new_one() -> (
    None
):
    written = {"items": [], "count": 0}
    script = Script(
        dropped,
        problem(503, "service-unavailable"),
        answer(201, written),
        dropped,
        answer(201, written),
    )
    mg = script.client()
    assert mg.write_memory_batch([ITEM]) == written
    assert mg.write_memory_batch([ITEM]) == written
    keys = [r.headers["idempotency-key"] for r in script.requests]
    assert keys[0] == keys[1] == keys[2] != keys[3] == keys[4]
    assert len(keys[0]) == 32
    assert all(json.loads(r.content) == {"items": [ITEM]} for r in script.requests)
    assert all(r.url.path == "/v1/memories:batch" for r in script.requests)


def test_a_batch_with_its_own_key_sends_that_one() -> None:
    script = Script(answer(201, {"items": [], "count": 0}))
    script.client().write_memory_batch([ITEM], idempotency_key="import-2026-12-02#7")
    assert script.requests[0].headers["idempotency-key"] == "import-2026-12-02#7"


def test_a_batch_waits_for_a_first_call_still_in_flight() -> None:
    replayed = {"items": [], "count": 1}
    script = Script(
        problem(409, "idempotency-key-in-flight", {"retry-after": "0"}, retry_after=0),
        answer(201, replayed),
    )
    assert script.client().write_memory_batch([ITEM]) == replayed
    assert len(script.requests) == 2


def test_a_rejected_batch_names_every_bad_item() -> None:
    errors = [
        {"index": 1, "status": 422, "type": PROBLEM + "value-too-long", "title": "t", "detail": "d"}
    ]
    script = Script(problem(422, "batch-rejected", errors=errors))
    with pytest.raises(BatchRejected) as raised:
        script.client().write_memory_batch([ITEM, ITEM])
    assert raised.value.errors == errors
    assert (raised.value.status, raised.value.slug) == (422, "batch-rejected")
    assert len(script.requests) == 1  # a 422 is an answer, not a failure to retry


@pytest.mark.parametrize("failure", [dropped, problem(503, "service-unavailable")])
def test_a_plain_write_is_never_sent_twice(failure: Step) -> None:
    script = Script(failure, answer(201, {}))
    with pytest.raises((MemgateConnectionError, ServiceUnavailable)):
        script.client().write_memory(**ITEM)
    assert len(script.requests) == 1
    assert "idempotency-key" not in script.requests[0].headers


def test_reads_are_retried_after_drops_and_gateway_errors_then_answer() -> None:
    page: MemoryPage = {"items": [], "next_cursor": None}
    script = Script(dropped, problem(502, "x"), answer(504), answer(200, page))
    assert script.client().list_memories(limit=5) == page
    assert len(script.requests) == 4


def test_retries_are_bounded() -> None:
    script = Script(*[problem(503, "service-unavailable")] * 10)
    with pytest.raises(ServiceUnavailable):
        script.client(RetryPolicy(attempts=3, backoff=0.0)).get_memory("m")
    assert len(script.requests) == 3


def test_retry_after_is_honoured_and_a_long_one_is_raised_at_once() -> None:
    memory = {"id": "m"}
    script = Script(
        problem(429, "rate-limited", {"retry-after": "0.2"}, retry_after=0.2), answer(200, memory)
    )
    began = time.monotonic()
    assert dict(script.client().get_memory("m")) == memory
    assert time.monotonic() - began >= 0.2

    slow = Script(problem(429, "rate-limited", {"retry-after": "120"}, retry_after=120))
    with pytest.raises(RateLimited) as raised:
        slow.client().get_memory("m")
    assert raised.value.retry_after == 120
    assert len(slow.requests) == 1


def test_backoff_is_jittered_below_its_ceiling() -> None:
    policy = RetryPolicy(backoff=0.5, max_backoff=1.0)
    waits = [policy.after_error(sent, retryable=True) for sent in (1, 2, 3) for _ in range(50)]
    assert all(w is not None and 0 <= w <= 1.0 for w in waits)
    assert len(set(waits)) > 100  # drawn, not fixed
    assert policy.after_error(4, retryable=True) is None
    assert policy.after_error(1, retryable=False) is None


def _token(access: str, expires_in: int = 600) -> Step:
    return answer(
        200,
        {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": expires_in,
            "scope": "read:memory",
            "issued_token_type": "x",
        },
    )


def test_a_rejected_token_is_replaced_once_then_the_401_is_raised() -> None:
    rejected = problem(401, "unauthenticated", {"www-authenticate": 'Bearer error="invalid_token"'})
    script = Script(
        _token("one"),
        rejected,
        _token("two"),
        answer(201, {"memory": {}}),
        rejected,
        _token("three"),
        rejected,
    )
    http = httpx.Client(transport=httpx.MockTransport(script))
    mg = Memgate(BASE, credentials=ClientCredentials("id", "s"), retry=FAST, http=http)
    # Refused at authentication, before any work: even a plain write goes again, once.
    assert dict(mg.write_memory(**ITEM)) == {"memory": {}}
    with pytest.raises(Unauthorized):
        mg.get_memory("m")
    sent = [(r.url.path, r.headers.get("authorization")) for r in script.requests]
    assert sent == [
        ("/oauth/token", "Basic aWQ6cw=="),
        ("/v1/memories", "Bearer one"),
        ("/oauth/token", "Basic aWQ6cw=="),
        ("/v1/memories", "Bearer two"),
        ("/v1/memories/m", "Bearer two"),
        ("/oauth/token", "Basic aWQ6cw=="),
        ("/v1/memories/m", "Bearer three"),
    ]


def test_problems_are_looked_up_by_slug_then_status() -> None:
    assert problem_class("memory-not-found", 404) is MemoryNotFound
    assert issubclass(MemoryNotFound, NotFound)
    assert problem_class("space-unknown", 404) is NotFound  # a slug the client has no class for
    assert problem_class("memory-not-found", 410) is MemgateProblem  # the status wins
    proxy = httpx.Response(502, text="<html>bad gateway</html>")
    raised = problem_from_response(proxy)
    assert type(raised) is BadGateway
    assert (raised.status, raised.slug, raised.title) == (502, "about:blank", "Bad Gateway")


async def test_the_async_client_follows_the_same_rules() -> None:
    written = {"items": [], "count": 0}
    script = Script(dropped, answer(201, written), dropped)
    http = httpx.AsyncClient(transport=httpx.MockTransport(script))
    async with AsyncMemgate(BASE, token="t", retry=FAST, http=http) as mg:
        assert await mg.write_memory_batch([ITEM]) == written
        with pytest.raises(MemgateConnectionError):
            await mg.write_memory(**ITEM)
    keys = [r.headers.get("idempotency-key") for r in script.requests]
    assert keys[0] == keys[1]
    assert keys[0] is not None
    assert keys[2] is None
    await http.aclose()
