"""The byte scan of the proof: every needle found once per file that holds it, across chunk
boundaries and inside another needle's match; a budget that runs out says so."""

from __future__ import annotations

from pathlib import Path

from service.erasure.files import scan

VALUE = b"Alice Liddell owns the retry runbook"
NAME = b"Alice Liddell"


def test_a_needle_across_a_chunk_boundary_and_one_inside_another(tmp_path: Path) -> None:
    heap = tmp_path / "16384"
    heap.write_bytes(b"\0" * ((8 << 20) - 5) + VALUE + b"\0" * 64)
    (tmp_path / "16384.1").write_bytes(b"\0" * 10 + NAME)  # the relation's second segment
    other = tmp_path / "16390"
    other.write_bytes(b"nothing here")
    result = scan([("memories", heap), ("memory_recalls", other)], [VALUE, NAME, b"absent"])
    assert result == {
        "files": 3,
        "found": [1, 2, 0],
        "relations": ["memories"],
        "complete": True,
    }


def test_a_spent_budget_leaves_the_scan_incomplete(tmp_path: Path) -> None:
    first, second = tmp_path / "1", tmp_path / "2"
    first.write_bytes(b"x" * 100)
    second.write_bytes(VALUE)
    result = scan([("a", first), ("b", second)], [VALUE], budget=50)
    assert result["complete"] is False
    assert result["found"] == [0]
    assert result["files"] == 1


def test_a_missing_file_holds_nothing(tmp_path: Path) -> None:
    result = scan([("gone", tmp_path / "rewritten")], [VALUE])
    assert result == {"files": 0, "found": [0], "relations": [], "complete": True}
