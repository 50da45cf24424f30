"""Problems of the erasure API."""

from __future__ import annotations

from service.problems import Problem


class EraserRoleRequired(
    Problem, slug="eraser-role-required", status=403, title="Eraser role required"
):
    """Erasure needs the eraser role as well as `manage:erasure`. A tenant admin holding
    `manage:erasure` grants it with PUT /v1/principals/{principal_id}/roles/eraser."""


class ErasureNotFound(Problem, slug="erasure-not-found", status=404, title="Erasure not found"):
    """No erasure plan with this id in your tenant."""


class ErasureCriteriaEmpty(
    Problem, slug="erasure-criteria-empty", status=422, title="Erasure criteria empty"
):
    """A plan needs at least one subject, owner principal or memory id (names alone only
    find mentions, which are for review, never erased by the plan). Nothing changed."""


class ErasurePlanStale(
    Problem, slug="erasure-plan-stale", status=409, title="Erasure plan is stale"
):
    """The data the plan reaches changed since it was made, or `version` is not the plan's
    current version: ask for a fresh plan (POST /v1/erasures/{id}/plan) and review it again.
    Nothing was erased."""


class ContentErased(Problem, slug="content-erased", status=409, title="Content was erased"):
    """The value, normalized, equals a memory that was erased from this space: its content hash
    is kept as a tombstone so the same text is not learned again there. Nothing was written."""
