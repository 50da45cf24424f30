"""`memgate erasure plan|execute|proof`: the erasure API from a terminal.

Unlike `memgate tenants`, which acts as the platform admin on the database, erasure is a tenant
admin's act under policy, so the command is a client of the running server: it presents the
bearer token in `MEMGATE_TOKEN` (one holding `manage:erasure`, for a principal with the eraser
role) and every step is the API's own call, checked and audited the same way."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class PlanArguments:
    subjects: list[str] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)
    memory_ids: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    reason: str = ""
    keep_tombstones: bool = True
    rewrite: bool = True


class Refused(Exception):
    """The server answered a problem: `slug: detail`, for one line on stderr."""


async def plan(http: httpx.AsyncClient, token: str, arguments: PlanArguments) -> Any:
    body = {
        "subjects": arguments.subjects,
        "owners": arguments.owners,
        "memory_ids": arguments.memory_ids,
        "names": arguments.names,
        "reason": arguments.reason,
        "keep_tombstones": arguments.keep_tombstones,
        "rewrite": arguments.rewrite,
    }
    return _answer(await http.post("/v1/erasures", json=body, headers=_auth(token)))


async def execute(http: httpx.AsyncClient, token: str, erasure_id: str, version: int) -> Any:
    path = f"/v1/erasures/{_id(erasure_id)}/execute"
    return _answer(await http.post(path, json={"version": version}, headers=_auth(token)))


async def proof(http: httpx.AsyncClient, token: str, erasure_id: str) -> Any:
    path = f"/v1/erasures/{_id(erasure_id)}/proof"
    return _answer(await http.get(path, headers=_auth(token)))


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise Refused(f"malformed-id: '{raw[:64]}' is not an erasure id (a UUID).") from None


def _answer(response: httpx.Response) -> Any:
    if response.is_error:
        try:
            problem = response.json()
            message = f"{problem['type'].rsplit('/', 1)[-1]}: {problem['detail']}"
        except (ValueError, KeyError, TypeError, AttributeError):
            message = f"HTTP {response.status_code}"
        raise Refused(message)
    return response.json()
