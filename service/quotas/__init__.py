"""Quotas and rate limits per tenant and per client, held across replicas in PostgreSQL."""
