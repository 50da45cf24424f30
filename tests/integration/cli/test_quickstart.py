"""docs/quickstart.md works: a real `memgate serve` on a fresh data directory, then every block
the page marks, in page order — its shell lines through the interpreter in `quickstart.py`
(the requests curl would send), its Python MCP client as a real process — and the answers are
what the page says they are."""

from __future__ import annotations

import json
import stat

import httpx

from tests.integration.cli.quickstart import (
    QUICKSTART,
    Session,
    blocks,
    claims,
    commands,
    header,
    run_python,
)
from tests.integration.cli.test_embedded_lifecycle import Server, server

__all__ = ["server"]  # the fixture, used by name

MEMORY_SCOPES = {"read:memory", "write:memory", "delete:memory"}


def test_the_quickstart_runs_as_written(server: Server) -> None:
    server.env["MEMGATE_WORKERS"] = "1"  # one process starts faster; the page needs no more
    server.start()

    def memgate(args: list[str]) -> str:
        done = server.run(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    shell = Session(base_url=server.url, run_cli=memgate)
    printed: list[str] = []
    agent_file_modes: list[int] = []
    for kind, body in blocks(QUICKSTART.read_text()):
        if kind == "python":
            env = {**server.env, "MEMGATE_URL": server.url, "TOKEN": shell.variables["TOKEN"]}
            printed += run_python(body, env).splitlines()
            continue
        for command in commands(body):
            shell.run(command)
            if "AGENT" in shell.files and shell.files["AGENT"].exists():
                agent_file_modes.append(stat.S_IMODE(shell.files["AGENT"].stat().st_mode))

    answers = {answer.command: answer for answer in shell.answers}
    memory_id = shell.variables["MEMORY_ID"]
    statuses = [(a.command.split(" -d")[0].split("$(")[-1], a.status) for a in shell.answers]
    assert statuses == [
        ("api $B/v1/principals", 201),
        ("api $B/v1/clients", 201),
        ('curl -sS --fail-with-body $B/oauth/token -u "$CLIENT_ID:$CLIENT_SECRET"', 200),
        ("api $B/v1/memories", 201),
        ("api $B/v1/memories/search", 200),
        ("api $B/v1/memories/$MEMORY_ID", 200),
        ("api -X DELETE $B/v1/memories/$MEMORY_ID", 204),
        ("api $B/v1/memories/search", 200),
    ]

    # The agent's token: alice's, the three memory scopes, no admin scope.
    token = claims(shell.variables["TOKEN"])
    assert header(shell.variables["TOKEN"]) | {"kid": "-"} == {
        "alg": "ES256",
        "typ": "at+jwt",
        "kid": "-",
    }
    assert {"tenant", "sub", "client_id", "scope", "jti", "exp", "iat"} <= set(token)
    assert token["exp"] - token["iat"] == 600  # ten minutes
    assert token["sub"] == shell.variables["USER_ID"]
    assert token["client_id"] == shell.variables["CLIENT_ID"]
    assert set(token["scope"].split()) == MEMORY_SCOPES

    # The secret's file was private while it existed, and is gone at the end.
    assert agent_file_modes
    assert set(agent_file_modes) == {0o600}
    assert not shell.files["AGENT"].exists()

    # Learn, recall, forget.
    first_search, second_search = (
        json.loads(a.text) for a in shell.answers if a.command.endswith('"k": 5}\'')
    )
    written = json.loads(
        next(a.text for a in shell.answers if "api $B/v1/memories -d" in a.command)
    )
    assert written["memory"]["version"] == 1
    assert written["memory"]["space_id"] == json.loads(shell.answers[0].text)["personal_space_id"]
    assert written["memory"]["provenance"]["embedding_model"].startswith("wordllama/")
    assert [hit["memory"]["id"] for hit in first_search["hits"]] == [memory_id]
    assert {"score", "lexical_score", "fused_score"} <= set(first_search["hits"][0])
    got = json.loads(answers["api $B/v1/memories/$MEMORY_ID"].text)
    assert got["value"] == "Billing deploys on Fridays 10:00-12:00 UTC"
    assert (got["version"], got["status"]) == (1, "live")
    assert got["provenance"]["writer_id"] == shell.variables["USER_ID"]
    assert answers["api -X DELETE $B/v1/memories/$MEMORY_ID"].text == ""
    assert second_search["hits"] == []
    gone = httpx.get(
        f"{server.url}/v1/memories/{memory_id}",
        headers={"Authorization": f"Bearer {shell.variables['TOKEN']}"},
        timeout=10,
    )
    assert gone.status_code == 404  # as the page says
    assert gone.json()["type"].endswith("/memory-not-found")

    # MCP: the same agent token lists the tools, remembers and recalls what it remembered.
    tools, remembered, *recalled = printed
    assert tools == (
        "tools: remember, remember_many, recall, get_memory, memory_history, revert_memory, "
        "list_memories, count_memories, forget, list_proposals, approve, reject, revoke, "
        "reinstate, request_consolidation"
    )
    assert remembered.startswith("remembered deploy.freeze version 1 ")
    mcp_memory = remembered.rsplit(" ", 1)[1]
    assert recalled == [f"recalled {mcp_memory} No billing deploys during the December freeze"]
