"""The mem0, Zep and memgate JSONL mappings (docs/import-export.md), on the fixture files."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from service.memory.schemas import MemoryCreate
from service.transfer.formats import BadRecord, Format, Skipped, records
from service.transfer.run import export_record

FIXTURES = Path(__file__).parents[2] / "fixtures" / "transfer"
NOW = datetime(2026, 12, 2, tzinfo=UTC)


def mapped(name: str, fmt: Format) -> tuple[list[dict[str, Any]], list[str]]:
    bodies: list[dict[str, Any]] = []
    skipped: list[str] = []
    for line in (FIXTURES / name).read_text().splitlines():
        for one in records(json.loads(line), fmt, NOW):
            if isinstance(one, Skipped):
                skipped.append(one.reason)
            else:
                bodies.append(one)
    # Every body is exactly a body of POST /v1/memories.
    for body in bodies:
        msgspec.convert(body, MemoryCreate, strict=False)
    return bodies, skipped


def test_mem0_memories_become_facts_of_their_user_or_agent() -> None:
    bodies, skipped = mapped("mem0_export.jsonl", "mem0")
    assert [(b["subject"], b["kind"], b["key"], b["value"]) for b in bodies] == [
        (
            "user:alex",
            "fact",
            "mem0.3c90c3cc-0d44-4b50-8888-8dd25736052a",
            "Prefers vegetarian food",
        ),
        ("user:alex", "fact", "mem0.5f2a0b7e-1c3d-4e5f-8a9b-0c1d2e3f4a5b", "Allergic to peanuts"),
        (
            "agent:ops-bot",
            "fact",
            "mem0.6a7b8c9d-0e1f-4a2b-9c3d-4e5f6a7b8c9d",
            "Deploys the billing service on Fridays",
        ),
    ]
    assert skipped == ["empty memory"]
    first = bodies[0]
    assert first["metadata"]["food"] == "preference"
    assert first["metadata"]["mem0"]["hash"] == "2d5c1b0f"
    assert first["metadata"]["mem0"]["categories"] == ["food"]
    assert first["source"] == "import:mem0"
    assert datetime.fromisoformat(first["valid_from"]) == datetime(
        2024, 7, 20, 8, 35, 42, 123456, tzinfo=UTC
    )


def test_zep_facts_messages_and_episodes() -> None:
    bodies, skipped = mapped("zep_export.jsonl", "zep")
    assert [(b["subject"], b["kind"], b["value"]) for b in bodies] == [
        ("user:alex", "fact", "Alex works at Acme as a data engineer"),
        ("user:alex", "episode", "Alex: I moved to Porto last month."),
        ("user:alex", "episode", "assistant: Noted, Porto it is."),
        ("session:planning", "episode", "Quarterly planning notes: ship the importer"),
    ]
    assert skipped == ["a Zep fact no longer valid (invalid_at or expired_at set)"]
    fact = bodies[0]
    assert fact["key"] == "zep.fact.a3f1c9e2-7b4d-4f8a-9c2e-1d2f3b4a5c6d"
    assert fact["metadata"]["zep"]["name"] == "WORKS_AT"
    assert fact["valid_from"].startswith("2024-05-01T00:00:00")
    message = bodies[1]
    assert message["metadata"] == {
        "channel": "chat",
        "zep": {
            "uuid": "c5f3e1a4-9d6f-4b0c-9e4a-3f4b5d6c7e8f",
            "role": "Alex",
            "role_type": "user",
            "session_id": "onboarding-1",
            "user_id": "alex",
            "created_at": "2024-05-21T09:00:00Z",
        },
    }


def test_a_memgate_record_keeps_its_expiry_as_a_ttl_and_drops_job_outputs() -> None:
    line = {"subject": "s", "kind": "fact", "key": "k", "value": "v"}
    soon = (NOW + timedelta(seconds=90)).isoformat()
    [body] = records({**line, "expires_at": soon}, "memgate", NOW)
    assert isinstance(body, dict)
    assert body["ttl_seconds"] == 90
    past = (NOW - timedelta(seconds=1)).isoformat()
    assert list(records({**line, "expires_at": past}, "memgate", NOW)) == [Skipped("expired")]
    [job] = records({**line, "source": "memgate:consolidation"}, "memgate", NOW)
    assert isinstance(job, Skipped)


@pytest.mark.parametrize(
    ("line", "fmt"),
    [
        ({"memory": "no id"}, "mem0"),
        ({"subject": "s", "kind": "fact", "key": "k"}, "memgate"),
        ({"uuid": "u"}, "zep"),
        ({"uuid": "u", "fact": "f", "valid_at": "yesterday"}, "zep"),
    ],
)
def test_a_line_that_is_no_record_is_refused(line: dict[str, Any], fmt: Format) -> None:
    with pytest.raises(BadRecord):
        list(records(line, fmt, NOW))


def test_an_exported_memory_reads_back_as_the_same_write() -> None:
    memory = {
        "id": "01a2-id",
        "space_id": "space-1",
        "subject": "service:billing",
        "kind": "decision",
        "key": "deploy.window",
        "value": "Fridays",
        "status": "live",
        "valid_from": "2026-01-01T00:00:00Z",
        "expires_at": None,
        "metadata": {"team": "ops", "memgate.provenance": {"id": "older"}},
        "version": 3,
        "provenance": {
            "writer_id": "w",
            "client_id": "c",
            "source": "runbook",
            "recorded_at": "2026-01-02T00:00:00Z",
            "derived_from": [],
        },
    }
    line = export_record(memory)
    assert line["metadata"]["memgate.provenance"]["id"] == "01a2-id"
    assert line["metadata"]["team"] == "ops"
    [body] = records(line, "memgate", NOW)
    assert isinstance(body, dict)
    assert {k: body[k] for k in ("subject", "kind", "key", "value", "source")} == {
        "subject": "service:billing",
        "kind": "decision",
        "key": "deploy.window",
        "value": "Fridays",
        "source": "runbook",
    }
