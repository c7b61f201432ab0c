"""The server's core: what every other part stands on, and all a confined worker may load.

Errors, the `@tool` definition and its spec, the manifest, state export and hashing, the `Db`
handle and the SQLite threads, the SQL guard with its functions and heap bound, env files. It
imports nothing of the sandbox, the runtime or the transports. Import names from
`envforge.server`, not from here: this `__init__` stays empty so that the sandbox's worker can
load single modules of it cheaply.
"""
