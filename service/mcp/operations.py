"""The MCP endpoint itself, as an operation: the HTTP exchanges that carry no tool call."""

from __future__ import annotations

from service.operations import operation

EXCHANGE = operation(
    "mcp.exchange",
    "mcpExchange",
    "An MCP message over streamable HTTP (initialize, tools/list, notifications)",
    None,
    authenticated=True,
)
"""Any valid bearer token may talk MCP: each tool checks its own operation's scope, so a token
with only `write:memory` can still list the tools and remember."""
