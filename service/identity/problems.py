"""Problems of the identity admin API."""

from __future__ import annotations

from service.problems import Problem


class PrincipalNotFound(
    Problem, slug="principal-not-found", status=404, title="Principal not found"
):
    """No principal with this id in your tenant."""


class ClientNotFound(Problem, slug="client-not-found", status=404, title="Client not found"):
    """No client with this id in your tenant."""


class ScopeNotAllowed(Problem, slug="scope-not-allowed", status=422, title="Scope not allowed"):
    """A client was registered with a scope it may never hold (an admin scope or admin client
    for an agent principal), an unknown scope, or a scope the caller's own token lacks."""


class ExternalSubjectTaken(
    Problem, slug="external-subject-taken", status=409, title="External subject already mapped"
):
    """Another principal already maps this external issuer and subject."""
