"""Links between the docs land: every relative Markdown link in README.md and docs/*.md names a
file of the repository, and a `#fragment` names a heading (or an `<a id>`) of that page, the
way GitHub makes anchors."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    text = FENCE.sub("", page.read_text())
    found = {anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    return frozenset(found | set(re.findall(r'<a id="([^"]+)"></a>', text)))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_lands() -> None:
    broken = []
    for page in pages():
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto: ...
            path, _, fragment = target.partition("#")
            landing = (page.parent / path).resolve() if path else page
            if not landing.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and landing.suffix == ".md" and fragment not in anchors(landing):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_anchor_follows_github() -> None:
    assert anchor(" Principals and clients") == "principals-and-clients"
    assert anchor(" `writeMemory`") == "writememory"
    assert anchor(" The queue: joined, capped, fair") == "the-queue-joined-capped-fair"
    assert anchor(" Derived audiences (`read_requires`)") == "derived-audiences-read_requires"
