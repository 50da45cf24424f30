"""The client against a hostile or broken server (or a MITM on plain HTTP), over a scripted
transport: redirects are never followed (they carried the token form, `subject_token`
included, to another origin), ids never choose the route, iterators stop on a cursor handed
twice or an export that does not move forward, and a success that is not what memgate sends
is a `MemgateError`, not a bare JSONDecodeError or KeyError. Each script refuses to answer more
than LIMIT requests, so a client that loops fails instead of hanging."""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import parse_qs

import httpx
import pytest
from memgate_client import (
    AsyncMemgate,
    ClientCredentials,
    Memgate,
    RetryPolicy,
    TokenExchange,
    UnexpectedAnswer,
    UnsafePathId,
)

BASE = "https://memgate.test"
LIMIT = 20
TOKEN = {"access_token": "t", "token_type": "Bearer", "expires_in": 600, "scope": ""}
TENANT = "0b6c1c3e-5f43-4d3e-9a57-6f1b2f0e6a11"
Handler = Callable[[httpx.Request], httpx.Response]


class Server:
    """Answers tokens itself and the rest with `handler`; records every request."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        assert len(self.seen) <= LIMIT, f"the client sent more than {LIMIT} requests"
        if request.url.path == "/oauth/token" and request.url.host == "memgate.test":
            return httpx.Response(200, json=TOKEN)
        return self.handler(request)


def _client(server: Server, *, follow_redirects: bool = False) -> Memgate:
    http = httpx.Client(transport=httpx.MockTransport(server), follow_redirects=follow_redirects)
    return Memgate(
        BASE,
        credentials=ClientCredentials("c", "s"),
        http=http,
        retry=RetryPolicy(attempts=2, backoff=0.0),
    )


def test_a_redirect_from_the_token_endpoint_never_carries_the_users_token_elsewhere() -> None:
    """The caller's own httpx client follows redirects: memgate-client still does not."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "evil.test":
            return httpx.Response(200, json=TOKEN)
        form = parse_qs(request.content.decode())
        if form.get("grant_type") == ["client_credentials"]:
            return httpx.Response(200, json={**TOKEN, "access_token": "USER-TOKEN"})
        return httpx.Response(307, headers={"location": "https://evil.test/collect"})

    seen: list[httpx.Request] = []

    def recording(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    mg = Memgate(
        BASE,
        credentials=TokenExchange("agent", "agent-secret", ClientCredentials("user", "u-secret")),
        http=httpx.Client(transport=httpx.MockTransport(recording), follow_redirects=True),
        retry=RetryPolicy(attempts=1),
    )
    with pytest.raises(UnexpectedAnswer, match=re.escape("307 to 'https://evil.test/collect'")):
        mg.list_memories()
    assert [r.url.host for r in seen] == ["memgate.test", "memgate.test"]
    assert b"USER-TOKEN" in seen[1].content  # sent to memgate only


async def test_an_api_redirect_is_refused_by_both_clients_and_its_body_not_resent() -> None:
    server = Server(lambda _r: httpx.Response(308, headers={"location": "https://evil.test/m"}))
    memory = {"subject": "s", "kind": "fact", "key": "k", "value": "secret plan"}
    with pytest.raises(UnexpectedAnswer, match="redirects are never followed"):
        _client(server, follow_redirects=True).write_memory(**memory)  # type: ignore[arg-type]
    async_mg = AsyncMemgate(
        BASE,
        credentials=ClientCredentials("c", "s"),
        http=httpx.AsyncClient(transport=httpx.MockTransport(server), follow_redirects=True),
    )
    with pytest.raises(UnexpectedAnswer):
        await async_mg.get_memory("m1")
    assert {r.url.host for r in server.seen} == {"memgate.test"}


@pytest.mark.parametrize("bad", ["..", ".", ""])
def test_an_id_that_would_change_the_path_is_refused_before_sending(bad: str) -> None:
    server = Server(lambda _r: httpx.Response(200, json={"request_burst": 1}))
    mg = _client(server)
    calls: list[Callable[[], object]] = [
        lambda: mg.set_client_limits(TENANT, bad, request_burst=1),
        lambda: mg.get_memory(bad),
        lambda: mg.revoke_delegate(TENANT, bad),
        lambda: mg.remove_team_member(TENANT, bad),
    ]
    for call in calls:
        with pytest.raises(UnsafePathId):
            call()
    assert server.seen == []
    mg.get_memory("..a")  # dots inside an id are just characters
    assert server.seen[-1].url.path == "/v1/memories/..a"


def test_a_page_cursor_handed_twice_stops_the_iterator() -> None:
    pages = iter([{"items": [], "next_cursor": "a"}, {"items": [], "next_cursor": "b"}])

    def handler(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=next(pages, {"items": [], "next_cursor": "a"}))

    with pytest.raises(UnexpectedAnswer, match="cursor 'a' twice"):
        list(_client(Server(handler)).iter_memories())


def test_an_audit_export_that_does_not_move_forward_stops() -> None:
    server = Server(
        lambda _r: httpx.Response(
            200,
            content=b"",
            headers={"content-type": "application/x-ndjson", "audit-next-seq": "1"},
        )
    )
    with pytest.raises(UnexpectedAnswer, match="from 1 continues at 1"):
        list(_client(server).iter_audit_export(from_seq=1))


def test_a_success_that_is_not_json_is_an_unexpected_answer() -> None:
    portal = Server(
        lambda _r: httpx.Response(
            200, content=b"<html>wifi</html>", headers={"content-type": "text/html"}
        )
    )
    with pytest.raises(UnexpectedAnswer, match="200 with text/html, not JSON"):
        _client(portal).list_memories()


@pytest.mark.parametrize(
    "answer", [{"token_type": "Bearer"}, {"access_token": 1, "expires_in": 600}, ["t"]]
)
def test_a_token_answer_without_its_fields_is_an_unexpected_answer(answer: object) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answer)

    mg = Memgate(
        BASE,
        credentials=ClientCredentials("c", "s"),
        http=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    with pytest.raises(UnexpectedAnswer, match="no access_token and expires_in"):
        mg.list_memories()
