"""`memgate erasure plan|execute|proof`: the API's own calls, from the command's client code,
and the command's refusals."""

from __future__ import annotations

import pytest

from service.__main__ import main
from service.erasure import cli
from tests.fixtures.api import Api
from tests.integration.erasure.support import NAME, filed_person, make_eraser


async def test_plan_execute_and_proof_through_the_command(api: Api) -> None:
    await make_eraser(api)
    person = await filed_person(api)
    token = api.admin.token
    planned = await cli.plan(
        api.http,
        token,
        cli.PlanArguments(
            owners=[person.alice.principal_id], names=[NAME], reason="request 2026-115"
        ),
    )
    assert planned["counts"]["by_owner"] == 5
    assert planned["counts"]["review"] == 1
    receipt = await cli.execute(api.http, token, planned["id"], planned["version"])
    assert receipt["claims"]["counts"]["memories"] == 6  # and the summary built from one
    proof = await cli.proof(api.http, token, planned["id"])
    assert (proof["rows_left"], proof["vectors_left"], proof["owned_left"]) == (0, 0, 0)
    # Executed already: the same receipt again, nothing erased twice.
    assert await cli.execute(api.http, token, planned["id"], planned["version"]) == receipt


async def test_refusals_are_one_line_naming_the_problem(api: Api) -> None:
    with pytest.raises(cli.Refused, match=r"^eraser-role-required: "):
        await cli.proof(api.http, api.admin.token, "01a23b78-879c-7691-b104-e9c9b3a1b3ee")
    with pytest.raises(cli.Refused, match=r"^malformed-id: "):
        await cli.proof(api.http, api.admin.token, "not-an-id")


def test_without_a_token_the_command_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MEMGATE_TOKEN", raising=False)
    assert main(["erasure", "proof", "01a23b78-879c-7691-b104-e9c9b3a1b3ee"]) == 2
    assert "MEMGATE_TOKEN" in capsys.readouterr().err
