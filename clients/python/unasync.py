"""Write `_sync.py` from `_async.py`: the sync client is the async one with the awaits taken out.

    python clients/python/unasync.py          # rewrite src/memgate_client/_sync.py
    python clients/python/unasync.py --check  # exit 1 if it is not what this would write

One source for both clients, so they cannot drift apart (tests/unit/client checks it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent / "src" / "memgate_client"

# Order matters: longer names first.
REPLACEMENTS: tuple[tuple[str, str], ...] = (
    ("The asynchronous client", "The synchronous client"),
    ("import asyncio\n", "import threading\n"),
    (
        "from collections.abc import AsyncIterator, Callable, Mapping, Sequence",
        "from collections.abc import Callable, Iterator, Mapping, Sequence",
    ),
    ("AsyncIterator", "Iterator"),
    ("httpx.AsyncClient", "httpx.Client"),
    ("AsyncMemgate", "Memgate"),
    ("_AsyncTokens", "_Tokens"),
    ("asyncio.Lock()", "threading.Lock()"),
    ("await asyncio.sleep(", "time.sleep("),
    ("__aenter__", "__enter__"),
    ("__aexit__", "__exit__"),
    ("aclose", "close"),
    ("asynchronously", "synchronously"),
    ("async with AsyncMemgate", "with Memgate"),
)
PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\basync def ", "def "),
    (r"\basync with ", "with "),
    (r"\basync for ", "for "),
    (r"\bawait ", ""),
)


def _ruff() -> str:
    beside = Path(sys.executable).with_name("ruff")
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        raise SystemExit("ruff is needed to format the generated file (pip install ruff)")
    return found


def unasync(source: str) -> str:
    for old, new in REPLACEMENTS:
        source = source.replace(old, new)
    for pattern, new in PATTERNS:
        source = re.sub(pattern, new, source)
    # Lines that lost their `await` may fit on fewer lines now: format as the repo does.
    formatted = subprocess.run(  # noqa: S603 (the repo's own formatter)
        [_ruff(), "format", "--stdin-filename", str(PACKAGE / "_sync.py"), "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
    )
    return formatted.stdout


def main() -> int:
    wanted = unasync((PACKAGE / "_async.py").read_text())
    target = PACKAGE / "_sync.py"
    if "--check" in sys.argv[1:]:
        return 0 if target.exists() and target.read_text() == wanted else 1
    target.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
