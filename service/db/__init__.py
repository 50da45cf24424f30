"""Database layer: declarative models, engine/session factory, embedded PostgreSQL."""
