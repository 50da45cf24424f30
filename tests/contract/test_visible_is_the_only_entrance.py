"""Promise 2, the fast lint: outside `service/policy/visible.py`, no code in `service/` may name
the memory table except where a `Visible` is in hand.

The lint walks the syntax tree of every module and flags:

- any use of the mapped class `Memory` (under any import name, or as `models.Memory`) other
  than a type annotation, building a row to insert (`Memory(...)`, which row-level security's
  `WITH CHECK` guards), or a column (`Memory.key`) outside a statement: `select(Memory)`,
  `aliased(Memory)`, `M = Memory`, `Memory.__table__`, `session.get(Memory, ...)`;
- a column of `Memory` inside a statement constructor or one of its clauses
  (`select(func.count()).where(Memory.tenant_id == t)`: the FROM is inferred);
- a string that names the table as SQL does (`FROM memories`, `UPDATE memories`...), wherever
  it is held (a constant handed to `text()` later included);
- raw driver access (`exec_driver_sql`, `driver_connection`, `get_raw_connection`,
  `psycopg.connect`), which no statement check can see into;
- the Visible mark itself, which only Visible may put on a statement.

Code inside a function that takes a `Visible` parameter (the repository's reads) may use
`Memory` freely: the statement check in the test harness (tests/fixtures/entrance.py) holds it
to starting from that Visible. A line may carry `# visible: ok <reason>` (or the line above
it): the lint accepts it and lists it, and `ESCAPES` below must name every one, so a new one
shows in review.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
EXEMPT = {SERVICE / "policy" / "visible.py", SERVICE / "db" / "models.py"}
"""The entrance itself, and the table's definition."""

ESCAPES = {
    ("__main__.py", "cluster admin: creates the database, reads pg_database only"),
    ("__main__.py", "reads the schema version only"),
    ("db/embedded.py", "cluster admin: reads and sets pg_settings only"),
    ("db/embedded.py", "cluster admin: reads one server setting only"),
    ("http/workers.py", "reads server settings and pg_stat_activity only"),
    ("db/session.py", "sets a bound, sends nothing"),
    ("db/driver.py", "listeners see every statement"),
    ("db/roles.py", "cluster admin: creates the app login, reads pg_roles only"),
    (
        "erasure/files.py",
        "maintenance: CHECKPOINT, VACUUM, reads pg_class and server settings only",
    ),
}
"""Every `# visible: ok` in service/, by module and reason."""

STATEMENT_CALLS = {
    "select",
    "sa_select",
    "update",
    "sa_update",
    "delete",
    "insert",
    "exists",
    "text",
    "union",
    "union_all",
    "where",
    "filter",
    "filter_by",
    "join",
    "outerjoin",
    "select_from",
    "values",
    "returning",
    "order_by",
    "group_by",
    "having",
    "execute",
    "scalar",
    "scalars",
    "stream",
    "get",
    "cte",
    "subquery",
    "scalar_subquery",
}
"""Calls that make or shape a statement: a column of `Memory` inside one is a read."""
RAW_DRIVER = {"exec_driver_sql", "driver_connection", "get_raw_connection"}
NOT_COLUMNS = {"__table__", "__mapper__", "metadata", "registry", "__tablename__"}
SQL_NAMES_TABLE = re.compile(
    r'\b(?:from|join|update|into|table|only|copy)\s+(?:"?\w+"?\.)?"?memories\b', re.IGNORECASE
)
ESCAPE = re.compile(r"#\s*visible:\s*ok\b\s*(.*)$")
MARK = "memgate:visible"


@dataclass(frozen=True)
class Finding:
    line: int
    what: str


def _escapes(source: str) -> dict[int, str]:
    found: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and (match := ESCAPE.search(token.string)):
            found[token.start[0]] = match.group(1).strip()
    return found


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _is_visible(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value.split(".")[-1] == "Visible"
    return (isinstance(annotation, ast.Name) and annotation.id == "Visible") or (
        isinstance(annotation, ast.Attribute) and annotation.attr == "Visible"
    )


def _takes_visible(node: ast.AST) -> bool:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return False
    arguments = node.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    return any(_is_visible(argument.annotation) for argument in every)


def _in_annotation(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.arg) and parent.annotation is child:
            return True
        if isinstance(parent, ast.AnnAssign) and parent.annotation is child:
            return True
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef) and parent.returns is child:
            return True
        child, parent = parent, parents.get(parent)
    return False


def _ancestors(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[ast.AST]:
    chain = []
    while (node := parents.get(node)) is not None:  # type: ignore[assignment]
        chain.append(node)
    return chain


def _call_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _memory_names(tree: ast.AST) -> set[str]:
    names = {"Memory"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names |= {
                alias.asname for alias in node.names if alias.name == "Memory" and alias.asname
            }
    return names


def _docstrings(tree: ast.AST) -> set[ast.AST]:
    found: set[ast.AST] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for statement in body:
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    found.add(statement.value)
    return found


def _memory_use(node: ast.AST, parents: dict[ast.AST, ast.AST], names: set[str]) -> str | None:
    """What a reference to the mapped class does, or None if it is no reference or harmless."""
    is_reference = (
        isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load)
    ) or (isinstance(node, ast.Attribute) and node.attr == "Memory")
    if not is_reference or _in_annotation(node, parents):
        return None
    parent = parents.get(node)
    if isinstance(parent, ast.Call) and parent.func is node:
        return None  # a row to insert
    if isinstance(parent, ast.Attribute) and parent.value is node:
        if parent.attr in NOT_COLUMNS:
            return f"Memory.{parent.attr}"
        statement = any(
            isinstance(above, ast.Call) and _call_name(above) in STATEMENT_CALLS
            for above in _ancestors(parent, parents)
        )
        return f"Memory.{parent.attr} inside a statement" if statement else None
    return "Memory"


def _raw_driver(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and node.attr in RAW_DRIVER:
        return node.attr
    if (
        isinstance(node, ast.Attribute)
        and node.attr == "connect"
        and isinstance(node.value, ast.Name | ast.Attribute)
        and (node.value.id if isinstance(node.value, ast.Name) else node.value.attr)
        in {"psycopg", "Connection", "AsyncConnection"}
    ):
        return "psycopg connect"
    return None


def lint(source: str) -> tuple[list[Finding], list[tuple[int, str]]]:
    """(findings, accepted escapes as (line, reason)) for one module's source."""
    tree = ast.parse(source)
    parents = _parents(tree)
    names = _memory_names(tree)
    docstrings = _docstrings(tree)
    escapes = _escapes(source)
    allowed = {inner for node in ast.walk(tree) if _takes_visible(node) for inner in ast.walk(node)}
    findings: list[Finding] = []
    used: dict[int, str] = {}
    for node in ast.walk(tree):
        what = _raw_driver(node) or _forged_mark(node)
        if what is None and node not in allowed:
            what = _memory_use(node, parents, names) or _sql_text(node, docstrings)
        if what is None:
            continue
        line = getattr(node, "lineno", 0)
        escape = next((n for n in (line, line - 1) if n in escapes), None)
        if escape is not None and escapes[escape]:
            used[escape] = escapes[escape]
        else:
            findings.append(Finding(line, what))
    return sorted(set(findings), key=lambda f: f.line), sorted(used.items())


def _sql_text(node: ast.AST, docstrings: set[ast.AST]) -> str | None:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node not in docstrings
        and SQL_NAMES_TABLE.search(node.value)
    ):
        return "SQL naming the memory table"
    return None


def _forged_mark(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name | ast.Attribute) and (
        getattr(node, "id", None) == "VISIBLE_MARK" or getattr(node, "attr", None) == "VISIBLE_MARK"
    ):
        return "the Visible mark"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and MARK in node.value:
        return "the Visible mark"
    return None


def _lines(source: str) -> list[int]:
    return [finding.line for finding in lint(source)[0]]


PLANTED = {
    "select": "select(Memory).where(Memory.id == x)",
    "count-select-from": "select(func.count()).select_from(Memory)",
    "count-from-where": "select(func.count()).where(Memory.tenant_id == t)",
    "literal-from-where": "select(literal(1)).where(Memory.id == i)",
    "renamed-import": "from service.db.models import Memory as M\nselect(M)",
    "assigned-alias": "M = Memory\nselect(M)",
    "aliased": "row = aliased(Memory)",
    "module-attribute": "sa.update(models.Memory).values(value='x')",
    "table-select": "Memory.__table__.select()",
    "table-keyword": "sa.delete(table=Memory.__table__)",
    "text-constant": "_SQL = 'SELECT value FROM memories'\ntext(_SQL)",
    "text-inline": "text('select * from public.memories')",
    "exec-driver-sql": "conn.exec_driver_sql(query)",
    "driver-connection": "raw = (await conn.get_raw_connection()).driver_connection",
    "raw-psycopg": "psycopg.connect(url)",
    "session-get": "session.get(Memory, (t, i))",
    "join": "select(Space.id).join(Memory, Memory.space_id == Space.id)",
    "subquery": "select(Space).where(Space.id.in_(select(Memory.space_id)))",
    "cte": "rows = select(Memory.id).cte('rows')",
    "relationship": "memories = relationship(Memory)",
    "scope-named-receiver": "def f(scope):\n    return scope.select(Memory)",
    "forged-mark": "select(x).prefix_with('/* memgate:visible */')",
    "forged-mark-name": "select(x).prefix_with(VISIBLE_MARK)",
    "insert-from-select": "insert(Other).from_select(['id'], select(Memory.id))",
}


def test_the_lint_flags_every_planted_shape() -> None:
    missed = {name for name, source in PLANTED.items() if not _lines(source)}
    assert missed == set()


ALLOWED = {
    "visible-parameter": (
        "async def get(session, scope: Visible, i):\n"
        "    return await session.scalar(scope.select(Memory).where(Memory.id == i))"
    ),
    "visible-string-annotation": "def f(scope: 'Visible'):\n    return select(Memory)",
    "annotations": "def to_out(row: Memory) -> Memory | None:\n    x: list[Memory] = []",
    "row-to-insert": "row = Memory(tenant_id=t, id=i, value=v)",
    "filter-columns": "pairs = ((Memory.subject, s), (Memory.kind, k))",
    "route-path": "path = '/v1/memories/search'",
    "prose": "detail = 'This search covers more memories than one search may rank.'",
    "docstring": 'def f():\n    """Select from memories, through Visible."""',
    "escaped": "psycopg.connect(url)  # visible: ok cluster admin only",
    "escaped-above": "# visible: ok cluster admin only\npsycopg.connect(url)",
}


def test_the_lint_accepts_what_reads_nothing() -> None:
    flagged = {name: _lines(source) for name, source in ALLOWED.items()}
    assert {name: lines for name, lines in flagged.items() if lines} == {}


def test_an_escape_needs_a_reason_and_is_listed() -> None:
    assert _lines("psycopg.connect(url)  # visible: ok") == [1]
    findings, escapes = lint("x = 1\nselect(Memory)  # visible: ok a migration backfill")
    assert findings == []
    assert escapes == [(2, "a migration backfill")]


def test_no_module_but_visible_names_memory_rows() -> None:
    offenders: dict[str, list[Finding]] = {}
    escapes: set[tuple[str, str]] = set()
    for path in sorted(SERVICE.rglob("*.py")):
        if path in EXEMPT:
            continue
        name = str(path.relative_to(SERVICE))
        findings, accepted = lint(path.read_text())
        if findings:
            offenders[name] = findings
        escapes |= {(name, reason) for _, reason in accepted}
    assert offenders == {}, f"memory rows named outside policy/visible.py: {offenders}"
    assert escapes == ESCAPES, "a `# visible: ok` escape was added or removed: update ESCAPES"
