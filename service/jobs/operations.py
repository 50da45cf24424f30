"""The job runner's operations: start a run of a job, list the runs, read one (`run:jobs`).

Who may start a run: a holder of `run:jobs` in the tenant, an admin scope (never issued to
agents). The run itself runs as the tenant's job principal (service/jobs/principals.py), not
as the caller: the caller chooses what runs, policy decides what the job may touch.
"""

from __future__ import annotations

from service.auth.scopes import Scope
from service.jobs.problems import JobQueueFull, RunNotFound, UnknownJob
from service.memory.problems import SpaceNotFound
from service.operations import operation
from service.problems import BadCursor

START = operation(
    "jobs.start",
    "startJobRun",
    "Queue a run of a job in your tenant (it runs as the tenant's job principal)",
    Scope.RUN_JOBS,
    UnknownJob,
    SpaceNotFound,
    JobQueueFull,
    success=202,
)
LIST = operation(
    "jobs.list",
    "listJobRuns",
    "Your tenant's job runs, newest first: status, counts, errors",
    Scope.RUN_JOBS,
    BadCursor,
    read_only=True,
)
GET = operation(
    "jobs.get",
    "getJobRun",
    "One job run: status, cursor, counts, error",
    Scope.RUN_JOBS,
    RunNotFound,
    read_only=True,
)
