"""Tenants as a product: lifecycle, the platform admin, per-tenant settings."""
