"""The runtime: loading an env folder, episodes, one tool call, the fleet, the MCP server, and
synthesis's inline connections. It imports the core and the sandbox; the transports import it.
"""
