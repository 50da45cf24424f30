"""Tenants, principals and OAuth clients: who exists and how they get tokens."""
