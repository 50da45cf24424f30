"""How `serve`'s modes are chosen (`--no-migrate` or MEMGATE_MIGRATE=0) and what
`memgate healthcheck` probes (the container's HEALTHCHECK)."""

from __future__ import annotations

import socket

import pytest

from service.__main__ import _local_url, build_parser, main
from service.settings import ServerSettings, Settings


def test_no_migrate_is_the_flag_or_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert build_parser().parse_args(["serve"]).migrate is None  # MEMGATE_MIGRATE decides
    assert build_parser().parse_args(["serve", "--no-migrate"]).migrate is False
    monkeypatch.delenv("MEMGATE_MIGRATE", raising=False)
    assert ServerSettings.from_env().migrate is True
    monkeypatch.setenv("MEMGATE_MIGRATE", "0")
    assert ServerSettings.from_env().migrate is False


@pytest.mark.parametrize(
    ("server", "probed"),
    [
        (ServerSettings(host="0.0.0.0", port=8080), "http://127.0.0.1:8080"),  # noqa: S104
        (ServerSettings(host="::", port=8080, allow_plain_http=True), "http://127.0.0.1:8080"),
        (ServerSettings(host="::1", port=8443, tls="self-signed"), "https://[::1]:8443"),
        (ServerSettings(host="10.0.0.7", port=80, allow_plain_http=True), "http://10.0.0.7:80"),
        (ServerSettings(host="fd00::7", port=80, allow_plain_http=True), "http://[fd00::7]:80"),
    ],
)
def test_healthcheck_probes_this_machines_listener(server: ServerSettings, probed: str) -> None:
    assert _local_url(Settings(server=server)) == probed


def test_healthcheck_without_a_server_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the probe: nothing listens
    monkeypatch.setenv("MEMGATE_HOST", "127.0.0.1")
    monkeypatch.setenv("MEMGATE_PORT", str(port))
    monkeypatch.delenv("MEMGATE_TLS", raising=False)
    monkeypatch.delenv("MEMGATE_TLS_CERT_FILE", raising=False)
    monkeypatch.delenv("MEMGATE_TLS_KEY_FILE", raising=False)
    assert main(["healthcheck"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"memgate healthcheck: http://127.0.0.1:{port}/healthz: ConnectError"
