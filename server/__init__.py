"""envforge.server: the environment runtime, episodes, and MCP serving.

This `__init__` is the package's public surface: synth, harness, trainer, the CLI, tests and
benchmarks import from `envforge.server`, never from its modules (ruff's banned-api enforces it).
Env authors need only `tool`, `ToolError` and `Db`; the harness and tests use `Fleet` and the
episode clients. What only some callers need (the MCP client, the HTTP app and its limits, which
pull in uvicorn's protocol classes, stdio serving, replay, synthesis's inline pool) loads on first
use (module `__getattr__`), so `import envforge.server` stays as light as MCP allows: every
trusted env's tools import it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .db import Db
from .dbthreads import on_db_thread
from .episodes import (
    DEFAULT_EPISODE_BYTES_PER_CLIENT,
    DEFAULT_EPISODE_GROWTH,
    Episode,
    EpisodeStore,
    WriteTracker,
    episode_connector,
)
from .errors import EnvLoadError, EpisodeLimitReached, EpisodeNotFound, LoadProblem, ToolError
from .fleet import Fleet
from .loader import Environment, load_env, open_database
from .mcp_server import EPISODE_META_KEY, ERROR_META_KEY
from .runtime import MAX_STRING_CHARS, CheckedArguments, ToolResult, check_arguments, execute, render_result
from .state import (
    ExportedState,
    State,
    TableInfo,
    TableQuery,
    canonical_json,
    export_state,
    freeze,
    is_frozen,
    prefix_digest,
    quote_ident,
    state_hash,
    table_json,
    table_query,
)
from .tooldef import ToolSpec, tool

if TYPE_CHECKING:
    from .client import EnvClients, EpisodeClient, episode_client, http_episode_client
    from .envfiles import env_file, env_file_exists, read_env_bytes, read_env_text, replace_file
    from .http_app import build_app
    from .http_limits import HTTPLimits, install_log_limiter, serve_http
    from .inline import InlineConnection, InlinePool, ScratchConnection, ScratchPool, run_inline
    from .replays import read_actions, replay
    from .schema_policy import SchemaViolation, schema_violations
    from .static_gate import SEED_IMPORTS, TOOLS_IMPORTS, Violation, check_python, check_sql
    from .stdio import serve_stdio

# name -> module (inside this package) that defines it, imported on first access
_LAZY = {
    "EnvClients": "client",
    "EpisodeClient": "client",
    "episode_client": "client",
    "http_episode_client": "client",
    "build_app": "http_app",
    "InlineConnection": "inline",
    "InlinePool": "inline",
    "ScratchConnection": "inline",
    "ScratchPool": "inline",
    "run_inline": "inline",
    "read_actions": "replays",
    "replay": "replays",
    "serve_stdio": "stdio",
    "env_file": "envfiles",
    "env_file_exists": "envfiles",
    "read_env_bytes": "envfiles",
    "read_env_text": "envfiles",
    "replace_file": "envfiles",
    "SchemaViolation": "schema_policy",
    "schema_violations": "schema_policy",
    "SEED_IMPORTS": "static_gate",
    "TOOLS_IMPORTS": "static_gate",
    "Violation": "static_gate",
    "check_python": "static_gate",
    "check_sql": "static_gate",
    "HTTPLimits": "http_limits",
    "install_log_limiter": "http_limits",
    "serve_http": "http_limits",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_EPISODE_BYTES_PER_CLIENT",
    "DEFAULT_EPISODE_GROWTH",
    "EPISODE_META_KEY",
    "ERROR_META_KEY",
    "MAX_STRING_CHARS",
    "SEED_IMPORTS",
    "TOOLS_IMPORTS",
    "CheckedArguments",
    "Db",
    "EnvClients",
    "EnvLoadError",
    "Environment",
    "Episode",
    "EpisodeClient",
    "EpisodeLimitReached",
    "EpisodeNotFound",
    "EpisodeStore",
    "ExportedState",
    "Fleet",
    "HTTPLimits",
    "InlineConnection",
    "InlinePool",
    "LoadProblem",
    "SchemaViolation",
    "ScratchConnection",
    "ScratchPool",
    "State",
    "TableInfo",
    "TableQuery",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "Violation",
    "WriteTracker",
    "build_app",
    "canonical_json",
    "check_arguments",
    "check_python",
    "check_sql",
    "env_file",
    "env_file_exists",
    "episode_client",
    "episode_connector",
    "execute",
    "export_state",
    "freeze",
    "http_episode_client",
    "install_log_limiter",
    "is_frozen",
    "load_env",
    "on_db_thread",
    "open_database",
    "prefix_digest",
    "quote_ident",
    "read_actions",
    "read_env_bytes",
    "read_env_text",
    "render_result",
    "replace_file",
    "replay",
    "run_inline",
    "schema_violations",
    "serve_http",
    "serve_stdio",
    "state_hash",
    "table_json",
    "table_query",
    "tool",
]
