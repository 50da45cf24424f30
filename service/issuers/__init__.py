"""External identity providers a tenant registers for its own users and agents."""
