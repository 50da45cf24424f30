"""Problems of the tenant issuer API."""

from __future__ import annotations

from service.problems import Problem


class IssuerNotFound(Problem, slug="issuer-not-found", status=404, title="Issuer not found"):
    """No issuer with this id in your tenant."""


class IssuerTaken(Problem, slug="issuer-taken", status=409, title="Issuer already registered"):
    """This (issuer, audience) pair is registered already: in your tenant or in another one,
    the answer is the same (GET /v1/issuers lists yours). Or your tenant registered this issuer
    with another audience: a tenant registers an issuer once (the detail names it)."""


class IssuerReserved(Problem, slug="issuer-reserved", status=422, title="Issuer reserved"):
    """The issuer is memgate's own or one the operator trusts for every tenant."""


class IssuerInvalid(Problem, slug="issuer-invalid", status=422, title="Invalid issuer"):
    """A field of the registration is not allowed (the detail names it and what is)."""


class IssuerLimit(Problem, slug="issuer-limit", status=409, title="Too many issuers"):
    """The tenant has registered the most issuers allowed; delete one first."""
