"""The seed policy of a new tenant, from policies/bootstrap_policy.csv."""

from __future__ import annotations

import os
from pathlib import Path

from service.policy.rules import NAME, Rule

POLICIES_DIR = Path(
    os.environ.get("MEMGATE_POLICIES_DIR") or Path(__file__).resolve().parents[2] / "policies"
)
"""The repository's policies/ folder; an installed image points MEMGATE_POLICIES_DIR at its copy
(read once, like the migrations folder)."""


def bootstrap_rules(admin: str, path: Path | None = None) -> list[Rule]:
    """The seed lines with `{admin}` filled in; every name must be a typed, exact name."""
    rules: list[Rule] = []
    source = path or POLICIES_DIR / "bootstrap_policy.csv"
    for raw in source.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = [field.strip().replace("{admin}", admin) for field in line.split(",")]
        if fields[0] == "g" and len(fields) == 3:
            rule = Rule("g", fields[1], fields[2])
        elif fields[0] == "p" and len(fields) == 4:
            rule = Rule("p", fields[1], fields[2], fields[3])
        else:
            raise ValueError(f"{source}: not a seed line: {raw!r}")
        if not (NAME.fullmatch(rule.subject) and NAME.fullmatch(rule.target)):
            raise ValueError(f"{source}: names must be typed and exact: {raw!r}")
        rules.append(rule)
    return rules
