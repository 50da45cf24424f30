"""memgate-client: a typed client (sync `Memgate`, async `AsyncMemgate`) for memgate's API.

    from memgate_client import ClientCredentials, Memgate

    with Memgate("https://memgate.example", credentials=ClientCredentials(id, secret)) as mg:
        written = mg.write_memory(subject="service:billing", kind="fact",
                                  key="deploy.window", value="Fridays 10:00-12:00 UTC")
        hits = mg.search_memories(query="when can billing deploy?", k=5)["hits"]

It never imports the server; openapi.yaml is its contract (tests/contract/test_client_contract.py).
"""

from memgate_client._async import AsyncMemgate
from memgate_client._sync import Memgate
from memgate_client.credentials import ClientCredentials, Credentials, TokenExchange
from memgate_client.errors import (
    BadRequest,
    BatchRejected,
    Conflict,
    Forbidden,
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    InsufficientScope,
    InvalidClient,
    InvalidGrant,
    InvalidRequest,
    KeyChoiceRequired,
    MemgateConnectionError,
    MemgateError,
    MemgateProblem,
    MemoryNotFound,
    NotFound,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    TokenRefused,
    Unauthorized,
    UnexpectedAnswer,
    Unprocessable,
    UnsafePathId,
    problem_class,
)
from memgate_client.retry import NO_RETRIES, RetryPolicy

__all__ = [
    "NO_RETRIES",
    "AsyncMemgate",
    "BadRequest",
    "BatchRejected",
    "ClientCredentials",
    "Conflict",
    "Credentials",
    "Forbidden",
    "IdempotencyKeyInFlight",
    "IdempotencyKeyReused",
    "InsufficientScope",
    "InvalidClient",
    "InvalidGrant",
    "InvalidRequest",
    "KeyChoiceRequired",
    "Memgate",
    "MemgateConnectionError",
    "MemgateError",
    "MemgateProblem",
    "MemoryNotFound",
    "NotFound",
    "RateLimited",
    "RetryPolicy",
    "ServerError",
    "ServiceUnavailable",
    "TokenExchange",
    "TokenRefused",
    "Unauthorized",
    "UnexpectedAnswer",
    "Unprocessable",
    "UnsafePathId",
    "problem_class",
]
