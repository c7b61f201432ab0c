"""envforge.server: the environment runtime, episodes, and MCP serving.

Env authors need only `tool`, `ToolError` and `Db`; the harness and tests use `Fleet`.
"""

from .db import Db
from .episodes import Episode, EpisodeStore
from .errors import EnvLoadError, EpisodeLimitReached, EpisodeNotFound, LoadProblem, ToolError
from .fleet import Fleet
from .loader import Environment, load_env
from .mcp_server import EPISODE_META_KEY
from .runtime import ToolResult, execute, render_result
from .state import State, canonical_json, state_hash
from .tooldef import ToolSpec, tool

__all__ = [
    "EPISODE_META_KEY",
    "Db",
    "EnvLoadError",
    "Environment",
    "Episode",
    "EpisodeLimitReached",
    "EpisodeNotFound",
    "EpisodeStore",
    "Fleet",
    "LoadProblem",
    "State",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "canonical_json",
    "execute",
    "load_env",
    "render_result",
    "state_hash",
    "tool",
]
