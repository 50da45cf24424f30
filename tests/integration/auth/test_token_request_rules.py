"""RFC 6749 request rules at the token endpoint (red-team round 2): a form body, each parameter
once, one client authentication method, and a malformed Basic header is a 401, never a 500."""

from __future__ import annotations

import base64

import pytest

from tests.fixtures.api import Api
from tests.integration.auth.forge import assert_oauth_error

FORM = "application/x-www-form-urlencoded"


@pytest.mark.parametrize("header", [b"Basic /w==", b"Basic \xe9\xe9\xe9\xe9", b"Basic Zm9v"])
async def test_malformed_basic_header_is_invalid_client(api: Api, header: bytes) -> None:
    response = await api.http.post(
        "/oauth/token",
        content=b"grant_type=client_credentials",
        headers={b"Authorization": header, b"Content-Type": FORM.encode()},
    )
    assert_oauth_error(response, 401, "invalid_client")


async def test_repeated_parameters_are_refused(api: Api) -> None:
    alice = await api.new_agent("alice")
    response = await api.http.post(
        "/oauth/token",
        content=b"grant_type=client_credentials&scope=read:memory&scope=write:memory",
        headers={"Content-Type": FORM},
        auth=(alice.client_id, alice.secret),
    )
    assert_oauth_error(response, 400, "invalid_request")
    assert "scope" in response.json()["error_description"]


async def test_two_authentication_methods_are_refused(api: Api) -> None:
    alice = await api.new_agent("alice")
    response = await api.http.post(
        "/oauth/token",
        data={
            "grant_type": "client_credentials",
            "client_id": alice.client_id,
            "client_secret": alice.secret,
        },
        auth=(alice.client_id, "mgs_wrong"),
    )
    assert_oauth_error(response, 400, "invalid_request")


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b'{"grant_type": "client_credentials"}', "application/json"),
        (
            b'--x\r\nContent-Disposition: form-data; name="grant_type"\r\n\r\n'
            b"client_credentials\r\n--x--\r\n",
            "multipart/form-data; boundary=x",
        ),
        (b"--x--", "multipart/form-data"),
    ],
    ids=["json", "multipart", "multipart-no-boundary"],
)
async def test_only_form_bodies_are_accepted(api: Api, content: bytes, content_type: str) -> None:
    alice = await api.new_agent("alice")
    response = await api.http.post(
        "/oauth/token",
        content=content,
        headers={"Content-Type": content_type},
        auth=(alice.client_id, alice.secret),
    )
    assert_oauth_error(response, 400, "invalid_request")


def _tabbed_basic(client_id: str, secret: str, *, split: bool) -> bytes:
    """`Basic<TAB>token`, optionally with a space inside the token: parsers disagree on it."""
    token = base64.b64encode(f"{client_id}:{secret}".encode())
    return b"Basic\t" + (token[:4] + b" " + token[4:] if split else token)


async def test_whitespace_variants_of_basic_are_parsed_like_authlib(api: Api) -> None:
    """Red-team round 3: a tab after `Basic` skipped the checks and reached authlib raw: a 500
    for undecodable bytes, and a second authentication method slipping past the one-method rule.
    """
    undecodable = b"Basic\t" + base64.b64encode(b"\xff\xfe\xfd:xyz")
    response = await api.http.post(
        "/oauth/token",
        content=b"grant_type=client_credentials",
        headers={b"Authorization": undecodable, b"Content-Type": FORM.encode()},
    )
    assert_oauth_error(response, 401, "invalid_client")

    alice = await api.new_agent("alice")
    form = (
        f"grant_type=client_credentials&client_id={alice.client_id}&client_secret=mgs_wrong"
    ).encode()
    for split in (True, False):
        header = _tabbed_basic(alice.client_id, alice.secret, split=split)
        both = await api.http.post(
            "/oauth/token",
            content=form,
            headers={b"Authorization": header, b"Content-Type": FORM.encode()},
        )
        assert_oauth_error(both, 400, "invalid_request")
    alone = await api.http.post(
        "/oauth/token",
        content=b"grant_type=client_credentials",
        headers={
            b"Authorization": _tabbed_basic(alice.client_id, alice.secret, split=False),
            b"Content-Type": FORM.encode(),
        },
    )
    assert alone.status_code == 200, alone.text


async def test_an_unsupported_grant_type_says_which_one_is(api: Api) -> None:
    response = await api.http.post("/oauth/token", data={"grant_type": "password"})
    assert_oauth_error(response, 400, "unsupported_grant_type")
    assert "client_credentials" in response.json()["detail"]
