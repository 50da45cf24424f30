"""Problems of the job runner API."""

from __future__ import annotations

from service.problems import Problem


class UnknownJob(Problem, slug="unknown-job", status=404, title="Unknown job"):
    """No job has this name; the detail lists the jobs there are."""


class RunNotFound(Problem, slug="job-run-not-found", status=404, title="Job run not found"):
    """No run with this id in your tenant (another tenant's id answers the same)."""


class JobGrantsMissing(
    Problem, slug="job-grants-missing", status=403, title="Job principal lacks grants"
):
    """The tenant's job principal does not hold what the job needs (at enqueue and now): the
    run ends `refused` and nothing was done. The detail names the grant to add."""
