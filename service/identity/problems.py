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


class JobPrincipalReserved(
    Problem, slug="job-principal-reserved", status=422, title="Job principal is reserved"
):
    """The tenant's job principal (service/jobs/principals.py) acts only inside job runs,
    with the grants a run took at enqueue: it gets no client, no token and no delegation,
    which would let a holder use its grants without a run's limits. Nothing was changed."""


class ExternalSubjectTaken(
    Problem, slug="external-subject-taken", status=409, title="External subject already mapped"
):
    """Another principal already maps this external issuer and subject."""


class ExternalIssuerUntrusted(
    Problem,
    slug="external-issuer-untrusted",
    status=422,
    title="External issuer not trusted",
):
    """A principal was to be mapped (or approved for admin scopes) with an `external_issuer`
    that is not one of the identity providers this deployment trusts: no token could ever
    authenticate as it."""


def untrusted_issuer(trusted: int) -> ExternalIssuerUntrusted:
    """The refusal, naming the field and how many issuers are trusted, never which."""
    return ExternalIssuerUntrusted(
        "external_issuer must be the `iss` of one of the "
        f"{trusted} external identity providers this deployment trusts "
        "(MEMGATE_EXTERNAL_ISSUERS; ask its operator for them) or of one your tenant "
        "registered (GET /v1/issuers), given together with external_subject: a mapping to any "
        "other issuer could never log in. Nothing was changed."
    )
