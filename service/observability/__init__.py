"""Logging (structlog) and, later, tracing and metrics."""
