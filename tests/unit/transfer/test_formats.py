"""The mem0, Zep and memgate JSONL mappings (docs/import-export.md), on the fixture files."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import msgspec
import pytest

from service.memory.schemas import MemoryCreate
from service.transfer.client import Credentials, Server, TransferFailed
from service.transfer.formats import BadRecord, Format, Skipped, records
from service.transfer.run import ImportRun, _save, export_record

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


def _mem0(memory_id: str, user_id: str, text: str) -> dict[str, Any]:
    return {"id": memory_id, "memory": text, "user_id": user_id}


def _one(line: dict[str, Any], fmt: Format) -> dict[str, Any]:
    [body] = records(line, fmt, NOW)
    assert isinstance(body, dict)
    return body


def test_ids_that_had_to_be_changed_do_not_collide() -> None:
    """`note 1` and `note_1` are two mem0 records: the key of an id that had characters
    replaced (or was cut) ends with a hash of the original id, so neither supersedes the
    other; an id that fits stays as it was."""
    one, two = (
        _one(_mem0("note 1", "u1", "first"), "mem0"),
        _one(_mem0("note_1", "u1", "b"), "mem0"),
    )
    assert two["key"] == "mem0.note_1"
    assert one["key"].startswith("mem0.note_1.")
    assert one["key"] != two["key"]
    assert one == _one(_mem0("note 1", "u1", "first"), "mem0")  # the same record, the same key


def test_long_ids_sharing_a_prefix_do_not_collide() -> None:
    prefix = "f" * 195
    keys = {
        _one({"uuid": prefix + tail, "fact": "a fact", "user_id": "u"}, "zep")["key"]
        for tail in ("-aaaa", "-bbbb")
    }
    assert len(keys) == 2
    assert all(len(key) <= 200 for key in keys)


def test_two_users_are_two_subjects() -> None:
    one = _one(_mem0("m1", "alice smith", "alice's"), "mem0")
    two = _one(_mem0("m2", "alice_smith", "the other alice's"), "mem0")
    assert two["subject"] == "user:alice_smith"
    assert one["subject"] != two["subject"]
    long_users = [_one(_mem0("m", "u" * 300 + tail, "x"), "mem0")["subject"] for tail in "ab"]
    assert len(set(long_users)) == 2
    assert all(len(s) <= 200 for s in long_users)


def test_the_state_file_is_the_owners_only_and_follows_no_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    state = tmp_path / "run.state"
    (tmp_path / "run.state.tmp").symlink_to(victim)  # the name an older version wrote through
    old = os.umask(0o022)
    try:
        _save(state, {"position": 1})
        _save(state, {"position": 2})
    finally:
        os.umask(old)
    assert json.loads(state.read_text()) == {"position": 2}
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run.state",
        "run.state.tmp",
        "victim.txt",
    ]


def test_a_deeply_nested_line_is_a_bad_line_not_a_crash(tmp_path: Path) -> None:
    source = tmp_path / "deep.jsonl"
    source.write_text('{"subject": "s", "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    run = ImportRun(
        Server("http://127.0.0.1:9", Credentials("c", "s")), source, "memgate", tmp_path / "st"
    )
    with pytest.raises(TransferFailed, match=r"deep.jsonl:1: not a memgate record"):
        run.run()


class _Recorder:
    """The batch route as the import sees it: records what it is sent, answers 201 (a
    replay for a key it has answered), or 422 `max_items` for a batch above `largest`."""

    def __init__(self, largest: int) -> None:
        self.largest, self.sent, self.answered = largest, list[tuple[str, int]](), set[str]()
        self.url = "http://memgate.test"

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        items, key = kwargs["json"]["items"], kwargs["headers"]["Idempotency-Key"]
        self.sent.append((key, len(items)))
        if len(items) > self.largest:
            body = {"type": "invalid-request", "max_items": self.largest}
            return httpx.Response(422, json=body, headers={"content-type": "application/json"})
        replayed = {"Idempotent-Replayed": "true"} if key in self.answered else {}
        self.answered.add(key)
        return httpx.Response(201, json={"count": len(items)}, headers=replayed)


def _lines(path: Path, n: int) -> None:
    path.write_text(
        "".join(
            json.dumps({"subject": "s", "kind": "fact", "key": f"k{i}", "value": "v"}) + "\n"
            for i in range(n)
        )
    )


def test_a_split_batch_in_flight_is_cut_the_same_way_on_resume(tmp_path: Path) -> None:
    """Batches of 5 the server takes 3 of: split 3 + 2. Stopped while the 2 were out, the
    re-run sends exactly those 2 again under their key (replayed), then batches of 3."""
    source, state = tmp_path / "in.jsonl", tmp_path / "in.state"
    _lines(source, 9)
    server = _Recorder(largest=3)
    first = ImportRun(cast(Server, server), source, "memgate", state, batch_size=5)
    first.run()
    assert [n for _, n in server.sent] == [5, 3, 2, 3, 1]
    # As a kill leaves it: the state as it stood while the batch of 2 was out.
    tail_key = server.sent[2][0]
    run_id = tail_key.split("-")[1]
    saved = {
        "run": run_id,
        "input": str(source),
        "size": source.stat().st_size,
        "format": "memgate",
        "position": {
            "offset": len(source.read_bytes().splitlines(keepends=True)[0]) * 3,
            "line": 4,
            "done": 0,
        },
        "in_flight": tail_key,
        "in_flight_until": {
            "offset": len(source.read_bytes().splitlines(keepends=True)[0]) * 5,
            "line": 6,
            "done": 0,
        },
        "imported": 3,
        "replayed": 0,
        "skipped": 0,
        "rejected": 0,
        "batch_size": 3,
    }
    _save(state, saved)
    server.sent.clear()
    done = ImportRun(cast(Server, server), source, "memgate", state, batch_size=5).run()
    assert server.sent[0] == (tail_key, 2)
    assert [n for _, n in server.sent] == [2, 3, 1]
    assert (done["imported"], done["replayed"]) == (9, 2 + 3 + 1)
