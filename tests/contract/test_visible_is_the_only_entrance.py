"""Promise 2: every read of memory rows starts from `service/policy/visible.py`.

Walks the source of `service/` and fails on any statement constructor (select, update, delete,
text, exists, session.get) that mentions the memory table outside that module.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
ENTRANCE = SERVICE / "policy" / "visible.py"
CONSTRUCTORS = {"select", "update", "delete", "text", "exists", "sa_select", "sa_update"}


def _mentions_memories(node: ast.AST) -> bool:
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and child.id == "Memory":
            return True
        if isinstance(child, ast.Attribute) and child.attr == "Memory":
            return True
        if (
            isinstance(child, ast.Constant)
            and isinstance(child.value, str)
            and "memories" in child.value.lower()
        ):
            return True
    return False


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute) and call.func.attr in {"get", "select"}:
        # session.get(Memory, ...) and sqlalchemy.select(...): but not scope.select(...), which
        # is the Visible entrance itself.
        base = call.func.value
        if isinstance(base, ast.Name) and base.id in {"scope", "visible", "self"}:
            return None
        return call.func.attr
    return None


def offending_calls(source: str) -> list[int]:
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _callee(node)
        if name is None or (name not in CONSTRUCTORS and name != "get"):
            continue
        if any(_mentions_memories(arg) for arg in node.args):
            lines.append(node.lineno)
    return lines


def test_the_checker_catches_direct_reads() -> None:
    assert offending_calls("select(Memory).where(Memory.id == x)") == [1]
    assert offending_calls("session.get(Memory, (t, i))") == [1]
    assert offending_calls("text('SELECT * FROM memories')") == [1]
    assert offending_calls("delete(Memory)") == [1]
    assert offending_calls("scope.select(Memory)") == []


def test_no_module_but_visible_reads_memory_rows() -> None:
    offenders = {
        str(path.relative_to(SERVICE)): lines
        for path in SERVICE.rglob("*.py")
        if path != ENTRANCE and (lines := offending_calls(path.read_text()))
    }
    assert offenders == {}, f"memory rows read outside policy/visible.py: {offenders}"
