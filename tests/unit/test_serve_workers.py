"""`memgate serve --workers N` / MEMGATE_WORKERS: parsing, how many workers start against the
database's connection budget, and what each worker runs with (its metrics port, the one signer)."""

from __future__ import annotations

import signal

import pytest
import uvicorn

from service.__main__ import build_parser
from service.http.server import WorkerServer
from service.http.workers import (
    SPARE_CONNECTIONS,
    WorkersDoNotFit,
    connections_per_worker,
    worker_count,
    worker_settings,
)
from service.settings import AuditSettings, ObservabilitySettings, ServerSettings, Settings


def test_the_workers_flag_is_parsed_and_absent_means_the_setting() -> None:
    assert build_parser().parse_args(["serve", "--workers", "3"]).workers == 3
    assert build_parser().parse_args(["serve", "--workers", "0"]).workers == 0
    assert build_parser().parse_args(["serve"]).workers is None


@pytest.mark.parametrize("raw", ["-1", "two", ""])
def test_a_bad_workers_flag_is_refused(raw: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--workers", raw])
    assert exited.value.code == 2
    assert "not a worker count" in capsys.readouterr().err


def test_the_settings_read_workers_and_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMGATE_WORKERS", raising=False)
    monkeypatch.delenv("MEMGATE_HTTP_PARSER", raising=False)
    default = ServerSettings.from_env()
    assert (default.workers, default.http_parser) == (0, "httptools")
    monkeypatch.setenv("MEMGATE_WORKERS", "4")
    monkeypatch.setenv("MEMGATE_HTTP_PARSER", "H11")
    chosen = ServerSettings.from_env()
    assert (chosen.workers, chosen.http_parser) == (4, "h11")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("MEMGATE_WORKERS", "-2", "MEMGATE_WORKERS"),
        ("MEMGATE_HTTP_PARSER", "picohttp", "MEMGATE_HTTP_PARSER"),
    ],
)
def test_bad_server_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        ServerSettings.from_env()


def _budget_for(workers: int, pool_size: int) -> int:
    return workers * connections_per_worker(pool_size) + SPARE_CONNECTIONS


def test_one_per_core_by_default_lowered_to_what_the_connections_hold() -> None:
    assert worker_count(0, cores=8, pool_size=10, budget=None) == 8
    assert worker_count(0, cores=8, pool_size=10, budget=_budget_for(3, 10)) == 3
    assert worker_count(0, cores=8, pool_size=10, budget=_budget_for(3, 10) - 1) == 2
    assert worker_count(0, cores=2, pool_size=10, budget=_budget_for(8, 10)) == 2
    # Never none: one worker is today's single process, whatever the budget says.
    assert worker_count(0, cores=8, pool_size=10, budget=0) == 1
    # A read replica's sampler takes one more primary connection per worker.
    assert connections_per_worker(10, read_replica=True) == connections_per_worker(10) + 1
    assert worker_count(0, cores=8, pool_size=10, budget=_budget_for(3, 10), read_replica=True) == 2


def test_an_explicit_count_is_kept_or_refused_never_lowered() -> None:
    assert worker_count(3, cores=2, pool_size=10, budget=_budget_for(3, 10)) == 3
    assert worker_count(5, cores=2, pool_size=10, budget=None) == 5
    assert worker_count(1, cores=8, pool_size=50, budget=1) == 1
    with pytest.raises(WorkersDoNotFit) as refused:
        worker_count(4, cores=8, pool_size=10, budget=_budget_for(3, 10))
    message = str(refused.value)
    assert "4 workers" in message
    # 4 x (2 x 10 + 2 for the group commit + 1 for the quota limiter)
    assert "92 database connections" in message
    assert "MEMGATE_WORKERS" in message
    assert "MEMGATE_DB_POOL_SIZE" in message


def test_each_worker_has_its_metrics_port_and_only_the_first_signs_checkpoints() -> None:
    settings = Settings(
        observability=ObservabilitySettings(metrics_port=9464),
        audit=AuditSettings(checkpoint_seconds=300),
    )
    workers = [worker_settings(settings, index) for index in range(3)]
    assert [w.observability.metrics_port for w in workers] == [9464, 9465, 9466]
    assert [w.audit.checkpoint_seconds for w in workers] == [300, 0, 0]
    # Everything else is the parent's.
    assert {w.server for w in workers} == {settings.server}
    assert {w.database for w in workers} == {settings.database}


def test_metrics_off_stays_off_in_every_worker() -> None:
    settings = Settings(observability=ObservabilitySettings(metrics_port=0))
    assert [worker_settings(settings, i).observability.metrics_port for i in range(2)] == [0, 0]


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_stops_gracefully_on_its_parents_sigterm_and_the_groups_sigint(
    first: signal.Signals,
) -> None:
    """Ctrl-C reaches a worker twice: the group's SIGINT and the parent's SIGTERM. uvicorn reads
    SIGINT after another signal as "exit now", which skipped the app's lifespan shutdown (its
    cancelled task logged an ERROR the lifecycle test found in CI); a worker never does."""
    second = signal.SIGINT if first == signal.SIGTERM else signal.SIGTERM
    config = uvicorn.Config(app=lambda *_: None)
    stock, worker = uvicorn.Server(config), WorkerServer(config)
    for server in (stock, worker):
        server.handle_exit(first, None)
        server.handle_exit(second, None)
    assert worker.should_exit
    assert not worker.force_exit
    assert stock.force_exit is (second == signal.SIGINT)  # what the stock server does
