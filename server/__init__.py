"""envforge.server: the environment runtime, episodes, and MCP serving.

This `__init__` is the package's public surface: synth, harness, trainer, the CLI, tests and
benchmarks import from `envforge.server`, never from its modules (ruff's banned-api enforces it).
Env authors need only `tool`, `ToolError` and `Db`; the harness and tests use `Fleet` and the
episode clients. What only some callers need (the MCP client, the HTTP app and its limits, which
pull in uvicorn's protocol classes, stdio serving, replay, synthesis's inline pool) loads on first
use (module `__getattr__`), so `import envforge.server` stays as light as MCP allows: every
trusted env's tools import it.

Subpackages, each importing only those before it: core, sandbox, runtime, transports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .core.arguments import MAX_STRING_CHARS, CheckedArguments, check_arguments
from .core.db import Db
from .core.dbthreads import on_db_thread
from .core.errors import EnvLoadError, EpisodeLimitReached, EpisodeNotFound, LoadProblem, ToolError
from .core.results import render_result
from .core.seed import open_database
from .core.state import (
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
from .core.tooldef import CALL_SIDES, SIDES, CallSide, Side, ToolSpec, on_side, tool
from .runtime.calls import ToolResult, execute
from .runtime.episodes import (
    DEFAULT_EPISODE_BYTES_PER_CLIENT,
    DEFAULT_EPISODE_GROWTH,
    Episode,
    EpisodeStore,
    WriteTracker,
    episode_connector,
)
from .runtime.fleet import Fleet
from .runtime.loader import Environment, load_env
from .runtime.mcp_server import EPISODE_META_KEY, ERROR_META_KEY

if TYPE_CHECKING:
    from .core.envfiles import env_file, env_file_exists, read_env_bytes, read_env_text, replace_file
    from .runtime.inline import InlineConnection, InlinePool, ScratchConnection, ScratchPool, run_inline
    from .sandbox.schema_policy import SchemaViolation, schema_violations
    from .sandbox.static_gate import SEED_IMPORTS, TOOLS_IMPORTS, Violation, check_python, check_sql
    from .transports.client import (
        EnvClients,
        EpisodeClient,
        episode_client,
        http_episode_client,
        user_episode_client,
    )
    from .transports.http_app import build_app
    from .transports.http_front import build_front
    from .transports.http_guard import client_key
    from .transports.http_limits import HTTPLimits, install_log_limiter, serve_http
    from .transports.replays import read_actions, replay
    from .transports.stdio import serve_stdio

# name -> module (inside this package) that defines it, imported on first access
_LAZY = {
    "EnvClients": "transports.client",
    "EpisodeClient": "transports.client",
    "episode_client": "transports.client",
    "http_episode_client": "transports.client",
    "user_episode_client": "transports.client",
    "build_app": "transports.http_app",
    "build_front": "transports.http_front",
    "InlineConnection": "runtime.inline",
    "InlinePool": "runtime.inline",
    "ScratchConnection": "runtime.inline",
    "ScratchPool": "runtime.inline",
    "run_inline": "runtime.inline",
    "read_actions": "transports.replays",
    "replay": "transports.replays",
    "serve_stdio": "transports.stdio",
    "env_file": "core.envfiles",
    "env_file_exists": "core.envfiles",
    "read_env_bytes": "core.envfiles",
    "read_env_text": "core.envfiles",
    "replace_file": "core.envfiles",
    "SchemaViolation": "sandbox.schema_policy",
    "schema_violations": "sandbox.schema_policy",
    "SEED_IMPORTS": "sandbox.static_gate",
    "TOOLS_IMPORTS": "sandbox.static_gate",
    "Violation": "sandbox.static_gate",
    "check_python": "sandbox.static_gate",
    "check_sql": "sandbox.static_gate",
    "HTTPLimits": "transports.http_limits",
    "client_key": "transports.http_guard",
    "install_log_limiter": "transports.http_limits",
    "serve_http": "transports.http_limits",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CALL_SIDES",
    "DEFAULT_EPISODE_BYTES_PER_CLIENT",
    "DEFAULT_EPISODE_GROWTH",
    "EPISODE_META_KEY",
    "ERROR_META_KEY",
    "MAX_STRING_CHARS",
    "SEED_IMPORTS",
    "SIDES",
    "TOOLS_IMPORTS",
    "CallSide",
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
    "Side",
    "State",
    "TableInfo",
    "TableQuery",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "Violation",
    "WriteTracker",
    "build_app",
    "build_front",
    "canonical_json",
    "check_arguments",
    "check_python",
    "check_sql",
    "client_key",
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
    "on_side",
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
    "user_episode_client",
]
