"""The `memgate` command's surface: help for every command, `--version`, `--scope` repeated,
and `memgate token` failing with a message a person can act on (never a traceback)."""

from __future__ import annotations

import json
import socket
from importlib.metadata import version
from pathlib import Path

import pytest

from service.__main__ import build_parser, main


def test_every_command_and_option_has_help() -> None:
    import argparse

    pending = [("memgate", build_parser())]
    seen = 0
    while pending:
        name, parser = pending.pop()
        assert parser.description, f"{name} has no description"
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    pending.append((f"{name} {sub_name}", sub))
            elif not isinstance(action, argparse._HelpAction):
                assert action.help, f"{name} {action.dest} has no help"
        seen += 1
    assert seen >= 10  # memgate, serve, migrate, revision, keys, token, audit (+2), openapi


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"memgate {version('memgate')}"


def test_repeated_scope_accumulates() -> None:
    args = build_parser().parse_args(
        ["token", "--scope", "read:memory", "--scope", "write:memory delete:memory"]
    )
    assert args.scope == ["read:memory", "write:memory delete:memory"]


def test_token_without_a_data_dir_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("MEMGATE_DATA_DIR", str(tmp_path / "nowhere"))
    assert main(["token"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert str(tmp_path / "nowhere" / "admin-client.json") in err
    assert "memgate serve" in err


def test_token_without_a_server_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "admin-client.json").write_text(json.dumps({"tenant_id": "t", "client_id": "c"}))
    (tmp_path / "admin-client.secret").write_text("s\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free once closed: nothing listens there
    monkeypatch.setenv("MEMGATE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MEMGATE_PORT", str(port))
    monkeypatch.setenv("MEMGATE_HOST", "127.0.0.1")
    monkeypatch.delenv("MEMGATE_PUBLIC_URL", raising=False)
    assert main(["token"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"http://127.0.0.1:{port}" in err
    assert "is memgate serve running" in err


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://memgate_api:S3CRET%pw-7Qz@127.0.0.1:1/memgate",
        "postgresql://memgate_api:S3CRET%pw-7Qz@[127.0.0.1:1/memgate",
    ],
    ids=["percent-in-password", "unclosed-bracket"],
)
def test_serve_no_migrate_never_prints_a_database_url_libpq_cannot_parse(
    url: str, tmp_path: Path
) -> None:
    """libpq's parse error quoted the password, and escaped `_check_schema_at_head` (it caught
    OperationalError only) as a traceback into the pod's log."""
    from service.__main__ import _check_schema_at_head
    from service.settings import Settings

    with pytest.raises(SystemExit) as refused:
        _check_schema_at_head(Settings(), url)
    message = str(refused.value.code)
    assert message.startswith("memgate serve --no-migrate: DATABASE_URL cannot be used (")
    assert "S3CRET" not in message
    assert refused.value.__context__ is None or refused.value.__suppress_context__
