"""docs/quickstart.md's marked blocks, read and run the way bash would run them.

The quickstart is curl + jq, which the machine running the suite need not have, so its shell
lines are interpreted here: each logical command (continuation lines and multi-line quotes
joined, comments dropped) must be one of the few forms the page uses — a variable from
`memgate token`, `mktemp` or `jq -er PATH "$FILE"`, a call through `api` (curl with the token and
a JSON body) or `curl` (the token endpoint), optionally piped into `jq -er PATH` or redirected
into a file, and `rm -f`. Anything else fails the test naming the line, so the page cannot say
a command the test did not run. Requests go out with the bytes curl would send (the `-d` text as
written, `-d` parts joined by `&`, Basic auth from `-u`); `--fail-with-body` stops at the first
4xx/5xx, as the page promises. `scripts/quickstart` runs the same blocks with real bash and
curl (a contract test compares the two extractions).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "docs" / "quickstart.md"
MARK = "<!-- quickstart: {} -->"
API_DEFINITION = (
    'api() { curl -sS --fail-with-body -H "Authorization: Bearer $TOKEN" '
    "-H 'content-type: application/json' \"$@\"; local rc=$?; echo; return $rc; }"
)
"""The page's `api` helper, word for word (continuation joined): what `_request` imitates."""

_BASE = re.compile(r"^B=\$\{MEMGATE_URL:-(?P<default>\S+)\}$")
_TOKEN_CLI = re.compile(r"^(?P<var>\w+)=\$\(\.venv/bin/memgate token\)$")
_MKTEMP = re.compile(r"^(?P<var>\w+)=\$\(mktemp\)$")
_JQ_FILE = re.compile(r'^(?P<var>\w+)=\$\(jq -er (?P<path>\S+) "\$(?P<file>\w+)"\)$')
_RM = re.compile(r'^rm -f "\$(?P<file>\w+)"$')
_CALL = re.compile(
    r"^(?:(?P<var>\w+)=\$\()?(?P<tool>api|curl) (?P<args>.*?)"
    r"(?: \| jq -er (?P<path>\S+))?(?(var)\))(?: > \"\$(?P<file>\w+)\")?$",
    re.DOTALL,
)
_VARIABLE = re.compile(r"\$\{?(\w+)\}?")


FORMS: dict[str, re.Pattern[str]] = {
    "base": _BASE,
    "token_cli": _TOKEN_CLI,
    "mktemp": _MKTEMP,
    "jq_file": _JQ_FILE,
    "rm": _RM,
    "call": _CALL,
}
"""The command forms the page may use, by the name of the `Session` method that runs each."""


def form(command: str) -> tuple[str, re.Match[str] | None]:
    """Which form `command` is (the `api` definition has no match to act on); an assertion
    naming the line for anything else."""
    if command == API_DEFINITION:
        return "definition", None
    for name, pattern in FORMS.items():
        matched = pattern.fullmatch(command)
        if matched is not None:
            return name, matched
    raise AssertionError(f"the quickstart says a command the test cannot run: {command}")


def print_script(text: str) -> str:
    """What `scripts/quickstart --print` shows for the page: the bash it runs, then each Python
    block's file (a contract test compares the two, so both run the same steps)."""
    script: list[str] = []
    files: list[str] = []
    for number, (kind, body) in enumerate(blocks(text), start=1):
        if kind == "run":
            script.append(body)
        else:
            name = f"$QUICKSTART_DIR/mcp_hello{number}.py"
            script.append(f'MEMGATE_URL=$B TOKEN=$TOKEN .venv/bin/python "{name}"\n')
            files.append(f"# --- {name}\n{body}")
    return "".join(script + files)


def blocks(text: str) -> list[tuple[str, str]]:
    """(kind, body) of every marked block in page order: kind `run` (bash) or `python`."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        marked = re.fullmatch(r"<!-- quickstart: (run|python) -->", line.strip())
        if marked is None:
            continue
        assert lines[i + 1].startswith("```"), f"line {i + 2}: a marked block starts here"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        found.append((marked.group(1), "\n".join(lines[i + 2 : end]) + "\n"))
    return found


def commands(script: str) -> list[str]:
    """The logical commands of a bash block: a backslash-newline and a newline inside quotes
    continue the command (bash keeps the newline inside quotes: so do we); `#` at the start of
    a word outside quotes starts a comment."""
    found: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(script):
        char = script[i]
        if char in "'\"":
            i = _quoted(script, i, current)
        elif char == "\\" and script[i + 1 : i + 2] == "\n":
            # A continuation: the next line's indentation is one space, as bash splits words.
            i += 2
            while i < len(script) and script[i] in " \t":
                i += 1
            if current and current[-1] not in " \t":
                current.append(" ")
        elif char == "#" and (not current or current[-1] in " \t"):
            end = script.find("\n", i)
            i = len(script) if end < 0 else end
        elif char == "\n":
            _flush(found, current)
            i += 1
        else:
            current.append(char)
            i += 1
    _flush(found, current)
    return found


def _quoted(script: str, start: int, current: list[str]) -> int:
    """Copy the quoted word starting at `start` (a backslash escapes inside double quotes);
    answers the index after its closing quote."""
    quote = script[start]
    current.append(quote)
    i = start + 1
    while i < len(script):
        char = script[i]
        current.append(char)
        if char == "\\" and quote == '"' and i + 1 < len(script):
            current.append(script[i + 1])
            i += 2
            continue
        if char == quote:
            return i + 1
        i += 1
    raise AssertionError(f"a quote is left open: {script[start : start + 60]!r}")


def _flush(found: list[str], current: list[str]) -> None:
    command = "".join(current).strip()
    if command:
        found.append(command)
    current.clear()


def single_quoted(command: str) -> list[str]:
    """The single-quoted words of `command` (bash expands nothing in them)."""
    return re.findall(r"'([^']*)'", re.sub(r'"(?:\\.|[^"\\])*"', '""', command))


@dataclass
class Answer:
    command: str
    status: int
    text: str


@dataclass
class Session:
    """One bash session's state: variables, files, and what each command answered."""

    base_url: str
    run_cli: Callable[[list[str]], str]
    """Runs `memgate ARGS` against the server; answers stdout (fails on a non-zero exit)."""
    variables: dict[str, str] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    answers: list[Answer] = field(default_factory=list)

    def expand(self, word: str) -> str:
        def value(match: re.Match[str]) -> str:
            name = match.group(1)
            assert name in self.variables, f"${name} is used before it is set"
            return self.variables[name]

        return _VARIABLE.sub(value, word)

    def run(self, command: str) -> None:
        name, matched = form(command)
        if matched is not None:
            getattr(self, f"_{name}")(matched)

    def _base(self, matched: re.Match[str]) -> None:
        # The page's default is the README's address; the test's server has its own port.
        self.variables["B"] = self.base_url

    def _token_cli(self, matched: re.Match[str]) -> None:
        self.variables[matched["var"]] = self.run_cli(["token"]).strip()

    def _mktemp(self, matched: re.Match[str]) -> None:
        handle, name = tempfile.mkstemp()
        os.close(handle)
        self.files[matched["var"]] = Path(name)
        self.variables[matched["var"]] = name

    def _jq_file(self, matched: re.Match[str]) -> None:
        text = self.files[matched["file"]].read_text()
        self.variables[matched["var"]] = jq(json.loads(text), matched["path"])

    def _rm(self, matched: re.Match[str]) -> None:
        self.files[matched["file"]].unlink(missing_ok=True)

    def _call(self, matched: re.Match[str]) -> None:
        command = matched.group(0)
        assert all("$" not in word for word in single_quoted(command)), command
        response = _request(
            matched["tool"], [self.expand(w) for w in shlex.split(matched["args"])], self.variables
        )
        self.answers.append(Answer(command, response.status_code, response.text))
        assert response.status_code < 400, f"{command}\n→ {response.status_code} {response.text}"
        if matched["path"] is not None:
            self.variables[matched["var"]] = jq(response.json(), matched["path"])
        elif matched["var"] is not None:
            self.variables[matched["var"]] = response.text
        if matched["file"] is not None:
            # `api` echoes a newline after the body; the file holds both, as with bash.
            self.files[matched["file"]].write_text(response.text + "\n")


def jq(document: Any, path: str) -> str:
    """`jq -er PATH` for the paths the page uses (`.a.b`): the raw string, an error on null."""
    assert re.fullmatch(r"(\.\w+)+", path), f"jq path {path!r} is not a plain member path"
    value = document
    for member in path.lstrip(".").split("."):
        value = value.get(member) if isinstance(value, dict) else None
    assert value not in (None, False), f"jq -e {path}: null in {document}"
    return value if isinstance(value, str) else str(value)


def _request(tool: str, words: list[str], variables: dict[str, str]) -> httpx.Response:
    method: str | None = None
    data: list[str] = []
    auth: tuple[str, str] | None = None
    headers: dict[str, str] = {}
    url: str | None = None
    if tool == "api":
        headers = {
            "Authorization": f"Bearer {variables['TOKEN']}",
            "content-type": "application/json",
        }
    flags = iter(words)
    for word in flags:
        if word in ("-sS", "--fail-with-body"):
            continue
        if word == "-X":
            method = next(flags)
        elif word == "-d":
            data.append(next(flags))
        elif word == "-u":
            user, _, password = next(flags).partition(":")
            auth = (user, password)
        elif word.startswith("http"):
            url = word
        else:
            raise AssertionError(f"a curl option the test does not imitate: {word}")
    assert url is not None, words
    if data and "content-type" not in headers:
        headers["content-type"] = "application/x-www-form-urlencoded"  # curl -d's default
    return httpx.request(
        method or ("POST" if data else "GET"),
        url,
        content="&".join(data).encode() if data else None,
        headers=headers,
        auth=auth,
        timeout=30,
    )


def run_python(code: str, env: dict[str, str]) -> str:
    """A marked Python block, run as the page says (`.venv/bin/python mcp_hello.py`)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(code)
    try:
        done = subprocess.run(  # noqa: S603 (our own interpreter, the page's code)
            [sys.executable, script.name],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.unlink(script.name)
    assert done.returncode == 0, done.stderr
    return done.stdout


def header(token: str) -> dict[str, Any]:
    """A JWT's protected header, unverified."""
    return _segment(token, 0)


def claims(token: str) -> dict[str, Any]:
    """A JWT's payload, unverified (the server verified it; the test reads what it says)."""
    return _segment(token, 1)


def _segment(token: str, index: int) -> dict[str, Any]:
    payload = token.split(".")[index]
    decoded: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return decoded


def every_command(text: str) -> Iterator[str]:
    for kind, body in blocks(text):
        if kind == "run":
            yield from commands(body)
