"""Statically: every problem a memory route's service method can raise is declared by its
operation (service/memory/operations.py), so openapi.yaml lists it.

The walk reads the source: each `MemoryController` handler bound with `**route(ops.X)` and the
`MemoryService` method it calls; from there every `raise` of a Problem class (directly, through
a helper that returns one, or through a parameter such as `_read_budget(problem)`, bound at the
call), following calls to `self` methods and to functions of the service and repository
modules. The embedding provider is a protocol: what its `embed` raises is listed here. The
runtime check (tests/conftest.py) covers what this walk cannot see (other modules, guards).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from service.embeddings.base import EmbeddingFailed, EmbeddingInvalid
from service.jobs.registry import JOBS
from service.memory import controller, repository, review, service
from service.memory import operations as ops
from service.operations import Operation
from service.problems import Problem

EXTERNAL: dict[str, set[type[Problem]]] = {"embed": {EmbeddingFailed, EmbeddingInvalid}}
"""Calls into protocols the walk cannot read: what they may raise."""


def _tree(module: ModuleType) -> ast.Module:
    return ast.parse(Path(inspect.getfile(module)).read_text())


def _functions(module: ModuleType) -> dict[str, ast.AST]:
    found: dict[str, ast.AST] = {}
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.setdefault(node.name, node)
    return found


SERVICE = _functions(review) | _functions(service)
"""The memory service's functions, and the review service's (its routes' `_review(call)`)."""
REPOSITORY = _functions(repository)


def _problem(module: ModuleType, name: str) -> type[Problem] | None:
    for where in (module, review):
        found = getattr(where, name, None)
        if isinstance(found, type) and issubclass(found, Problem):
            return found
    return None


def _returned_problem(node: ast.AST) -> type[Problem] | None:
    returns = getattr(node, "returns", None)
    return _problem(service, returns.id) if isinstance(returns, ast.Name) else None


def _bindings(function: ast.AST, call: ast.Call) -> dict[str, type[Problem]]:
    """Parameters bound to a Problem class at this call (or by their default)."""
    args = getattr(function, "args", None)
    if args is None:
        return {}
    names = [a.arg for a in args.args if a.arg != "self"]
    bound: dict[str, type[Problem]] = {}
    for name, default in zip(names[len(names) - len(args.defaults) :], args.defaults, strict=True):
        if isinstance(default, ast.Name) and (kind := _problem(service, default.id)):
            bound[name] = kind
    for name, value in zip(names, call.args, strict=False):
        if isinstance(value, ast.Name) and (kind := _problem(service, value.id)):
            bound[name] = kind
    return bound


def _callee(call: ast.Call) -> tuple[dict[str, ast.AST], str] | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id in SERVICE:
        return SERVICE, func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        if func.value.id == "self" and func.attr in SERVICE:
            return SERVICE, func.attr
        if func.value.id == "repository" and func.attr in REPOSITORY:
            return REPOSITORY, func.attr
    return None


def _catches_every_problem(node: ast.Try) -> bool:
    return any(
        isinstance(handler.type, ast.Name) and handler.type.id == "Problem"
        for handler in node.handlers
    )


def _uncaught(node: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk`, but not into the body of a `try` that catches every Problem (a batch
    collects its items' problems there and answers them inside its own `batch-rejected`)."""
    yield node
    if isinstance(node, ast.Try) and _catches_every_problem(node):
        children: list[ast.AST] = [*node.handlers, *node.orelse, *node.finalbody]
    else:
        children = list(ast.iter_child_nodes(node))
    for child in children:
        yield from _uncaught(child)


def raised(node: ast.AST, bound: dict[str, type[Problem]], seen: set[Any]) -> set[type[Problem]]:
    problems: set[type[Problem]] = set()
    for child in _uncaught(node):
        if isinstance(child, ast.Raise) and isinstance(child.exc, ast.Call):
            func = child.exc.func
            if isinstance(func, ast.Name):
                kind = bound.get(func.id) or _problem(service, func.id)
                if kind is None and func.id in SERVICE:
                    kind = _returned_problem(SERVICE[func.id])
                if kind is not None:
                    problems.add(kind)
        if not isinstance(child, ast.Call):
            continue
        if isinstance(child.func, ast.Attribute) and child.func.attr in EXTERNAL:
            problems |= EXTERNAL[child.func.attr]
        target = _callee(child)
        if target is None:
            continue
        functions, name = target
        binding = _bindings(functions[name], child)
        key = (id(functions), name, tuple(sorted((k, v.slug) for k, v in binding.items())))
        if key not in seen:
            seen.add(key)
            problems |= raised(functions[name], binding, seen)
    return problems


def _routes() -> list[tuple[Operation, str]]:
    """(operation, service method) of every MemoryController handler."""
    found: list[tuple[Operation, str]] = []
    for node in ast.walk(_tree(controller)):
        if not isinstance(node, ast.AsyncFunctionDef):
            continue
        operation = None
        for decorator in node.decorator_list:
            for keyword in getattr(decorator, "keywords", []):
                value = keyword.value
                if keyword.arg is None and isinstance(value, ast.Call) and value.args:
                    operation = getattr(ops, ast.unparse(value.args[0]).split(".")[-1])
        calls = [
            c.func.attr
            for c in ast.walk(node)
            if isinstance(c, ast.Call)
            and isinstance(c.func, ast.Attribute)
            and isinstance(c.func.value, ast.Call)
            and ast.unparse(c.func.value.func) in {"_service", "_review"}
        ]
        if operation is not None:
            assert len(calls) == 1, node.name
            found.append((operation, calls[0]))
    return found


ROUTES = _routes()


def test_every_memory_operation_has_a_route() -> None:
    """Every memory operation but the jobs' (their batches are calls the runner opens, never a
    route: service/jobs/registry.py)."""
    jobs = set(JOBS)
    assert {op.name for op, _ in ROUTES} == {
        op.name for op in vars(ops).values() if isinstance(op, Operation) and op.name not in jobs
    }


@pytest.mark.parametrize(("operation", "method"), ROUTES, ids=[op.name for op, _ in ROUTES])
def test_what_the_service_raises_is_declared(operation: Operation, method: str) -> None:
    can_raise = raised(SERVICE[method], {}, set())
    assert can_raise, f"{method}: the walk found nothing (is it still reading the source?)"
    undeclared = {kind.slug for kind in can_raise} - {p.slug for p in operation.all_problems()}
    assert not undeclared, f"{operation.name} can raise {sorted(undeclared)} undeclared"


def test_the_walk_sees_through_helpers_and_bound_parameters() -> None:
    """The walk itself: a list can raise `read-too-broad` (the budget's default), a search
    `search-too-broad` (bound at the call) and the embedder's problems, a write the metadata
    check's `invalid-request` (a helper that returns the problem)."""
    slugs = {m: {k.slug for k in raised(SERVICE[m], {}, set())} for m in ("list_page", "search")}
    assert "read-too-broad" in slugs["list_page"]
    assert "search-too-broad" not in slugs["list_page"]
    assert {"search-too-broad", "embedding-invalid", "k-out-of-range"} <= slugs["search"]
    assert "invalid-request" in {k.slug for k in raised(SERVICE["write"], {}, set())}
