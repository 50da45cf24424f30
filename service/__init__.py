"""memgate: a multi-tenant memory service for AI agents."""
