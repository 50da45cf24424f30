"""MEMGATE_READ_DATABASE_URL and MEMGATE_READ_REPLICA_MAX_LAG_MS, and which primary position a
routed call requires of the replica (the bound's arithmetic, without a database)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.db.replica import ReadReplica
from service.db.session import create_engine
from service.settings import DatabaseSettings

PRIMARY = "postgresql://memgate_api@primary/memgate"
STANDBY = "postgresql://memgate_api@standby/memgate"


def test_the_replica_is_off_unless_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMGATE_READ_DATABASE_URL", raising=False)
    monkeypatch.delenv("MEMGATE_READ_REPLICA_MAX_LAG_MS", raising=False)
    database = DatabaseSettings.from_env()
    assert (database.read_url, database.read_replica_max_lag_ms) == ("", 250)
    monkeypatch.setenv("DATABASE_URL", PRIMARY)
    monkeypatch.setenv("MEMGATE_READ_DATABASE_URL", f" {STANDBY} ")
    monkeypatch.setenv("MEMGATE_READ_REPLICA_MAX_LAG_MS", "1000")
    database = DatabaseSettings.from_env()
    assert (database.read_url, database.read_replica_max_lag) == (STANDBY, 1.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"read_replica_max_lag_ms": 19}, "between 20 and 60000"),
        ({"read_replica_max_lag_ms": 60_001}, "between 20 and 60000"),
        ({"read_replica_max_lag_ms": -1, "read_url": ""}, "between 20 and 60000"),
        ({"read_url": "mysql://standby/memgate"}, "postgresql:// URL"),
        ({"read_url": PRIMARY}, "is DATABASE_URL"),
    ],
)
def test_bad_replica_settings_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DatabaseSettings(url=PRIMARY, **fields)


@pytest.fixture
async def replica() -> AsyncIterator[ReadReplica]:
    """No sampler runs and nothing connects: the test notes the samples itself."""
    made = ReadReplica(create_engine(STANDBY), create_engine(PRIMARY), max_lag=0.25)
    yield made
    await made.close()


async def test_the_oldest_sample_within_the_bound_is_required(replica: ReadReplica) -> None:
    assert replica.required_lsn() == (None, "no-recent-sample")  # none yet: the primary
    now = time.monotonic()
    replica.note_sample(now - 0.40, "0/100")  # older than the bound: no guarantee
    replica.note_sample(now - 0.20, "0/200")
    replica.note_sample(now - 0.05, "0/300")
    assert replica.required_lsn() == ("0/200", "")


async def test_after_its_own_write_a_process_needs_a_later_sample(replica: ReadReplica) -> None:
    replica.note_sample(time.monotonic() - 0.1, "0/200")
    replica.wrote()
    assert replica.required_lsn() == (None, "own-write")
    replica.note_sample(time.monotonic(), "0/300")
    assert replica.required_lsn() == ("0/300", "")


async def test_samples_too_old_send_reads_to_the_primary(replica: ReadReplica) -> None:
    replica.note_sample(time.monotonic() - 1.0, "0/200")  # the sampler has stalled
    assert replica.required_lsn() == (None, "no-recent-sample")


async def test_a_failed_replica_is_skipped_for_a_while(replica: ReadReplica) -> None:
    replica.note_sample(time.monotonic(), "0/200")
    replica.failed(ConnectionRefusedError())
    assert replica.required_lsn() == (None, "replica-failed-recently")
