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


class JobQueueFull(Problem, slug="job-queue-full", status=429, title="Too many pending job runs"):
    """The tenant has as many runs queued or running as it may (`MEMGATE_JOBS_MAX_PENDING`);
    nothing was queued. Retry after `retry_after` seconds (also in `Retry-After`)."""

    def __init__(self, detail: str, *, retry_after: int) -> None:
        super().__init__(detail, retry_after=retry_after)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}
