"""MCP at `/mcp`: the memory operations as MCP tools, an adapter like `http/`.

Each tool is bound to a declared operation (service/operations.py) and runs as one call of it
(service/calls.py): the same bearer token, scope, `Visible` predicate and audit row as the REST
route, committed before the tool result is sent. See docs/mcp.md.
"""

from service.mcp.tools import TOOLS, Tool, check_every_tool_is_an_operation

__all__ = ["TOOLS", "Tool", "check_every_tool_is_an_operation"]
