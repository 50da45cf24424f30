"""Jobs: bounded, resumable batches of work that run as a tenant's job principal (docs/jobs.md)."""
