"""`memgate audit verify` on malformed inputs: a verdict naming the file and what is wrong with
it, exit status 2, never a traceback (red-team finding 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from service.audit.independent import run

GOOD_CHECKPOINT = json.dumps({"jws": "a.b.c"})
GOOD_KEYS = json.dumps({"keys": []})


def _files(tmp_path: Path, checkpoint: str | None, keys: str | None) -> list[str]:
    export = tmp_path / "export.ndjson"
    export.write_text("")
    args = [str(export)]
    for name, content in (("checkpoint.json", checkpoint), ("keys.json", keys)):
        path = tmp_path / name
        if content is not None:
            path.write_text(content)
        args.append(str(path))
    return args


CASES = [
    ("{}", GOOD_KEYS, "--checkpoint", "no 'jws'"),
    ('{"jws": 5}', GOOD_KEYS, "--checkpoint", "no 'jws'"),
    ("[]", GOOD_KEYS, "--checkpoint", "not a JSON object"),
    ("not json", GOOD_KEYS, "--checkpoint", "not JSON"),
    (None, GOOD_KEYS, "--checkpoint", "cannot be read"),
    (GOOD_CHECKPOINT, "{}", "--keys", "no 'keys' list"),
    (GOOD_CHECKPOINT, "[]", "--keys", "not a JSON object"),
    (GOOD_CHECKPOINT, '{"keys": [1]}', "--keys", "not a JWKS"),
    (GOOD_CHECKPOINT, "\xff{", "--keys", "not JSON"),
    (GOOD_CHECKPOINT, None, "--keys", "cannot be read"),
]


@pytest.mark.parametrize(("checkpoint", "keys", "named", "says"), CASES)
def test_a_malformed_checkpoint_or_key_file_is_a_verdict(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    checkpoint: str | None,
    keys: str | None,
    named: str,
    says: str,
) -> None:
    export, checkpoint_path, keys_path = _files(tmp_path, checkpoint, keys)
    assert run(export, checkpoint_path, keys_path) == 2
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["ok"] is False
    assert verdict["reason"] == "unreadable_input"
    assert verdict["file"] == named
    assert verdict["path"] == (checkpoint_path if named == "--checkpoint" else keys_path)
    assert says in verdict["detail"]


def test_a_missing_export_is_a_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nowhere.ndjson")
    assert run(missing, None, None) == 2
    verdict = json.loads(capsys.readouterr().out)
    assert (verdict["ok"], verdict["reason"], verdict["file"]) == (
        False,
        "unreadable_input",
        "export",
    )
    assert verdict["path"] == missing


def test_the_command_prints_no_traceback(tmp_path: Path) -> None:
    export, checkpoint_path, keys_path = _files(tmp_path, "{}", "[]")
    command = [sys.executable, "-m", "service", "audit", "verify", export]
    command += ["--checkpoint", checkpoint_path, "--keys", keys_path]
    outcome = subprocess.run(  # noqa: S603
        command,
        capture_output=True,
        text=True,
        check=False,
    )
    assert outcome.returncode == 2
    assert "Traceback" not in outcome.stderr
    assert json.loads(outcome.stdout)["file"] == "--checkpoint"


def test_a_line_nested_too_deep_is_a_malformed_row(tmp_path: Path) -> None:
    """Red-team round 2, F4: `[` * 200000 crashed the parser with a RecursionError traceback."""
    export = tmp_path / "deep.ndjson"
    export.write_text("[" * 200_000 + "]" * 200_000 + "\n")
    outcome = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "service", "audit", "verify", str(export)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "Traceback" not in outcome.stderr
    verdict = json.loads(outcome.stdout)
    assert (verdict["ok"], verdict["reason"], verdict["first_bad_seq"]) == (
        False,
        "malformed_row",
        1,
    )
    assert outcome.returncode == 1
