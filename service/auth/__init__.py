"""Identity: token verification, the embedded authorization server, principals and guards."""
