"""What the agent reads of a tool's return value: strings as they are, everything else as JSON.

τ²-bench's rendering, so ported domains read identically; the same in-process and in a
confined env's worker.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from pydantic import BaseModel


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


# `json.dumps(value, default=_json_default)` builds an encoder per call; one is enough.
_ENCODER = json.JSONEncoder(default=_json_default)


def render_result(value: Any) -> str:
    """Strings pass through unchanged; scalars become `str(x)`; anything else JSON (key order kept)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return _ENCODER.encode(value)
