"""How a fleet is reached: the HTTP app with its guard and connection limits, stdio, the MCP
episode clients, and replays. It imports the rest of the server; nothing of the server imports it.
"""
