"""A tool parameter's JSON schema as the short type a reader expects: `string`, `"a" | "b" | null`.

`inspect` shows these; pydantic writes an optional enum as `anyOf: [{enum}, {type: null}]`, which
a naive `type` lookup reads as `any`.
"""

from __future__ import annotations

import json
from typing import Any


def schema_type(schema: dict[str, Any]) -> str:
    """The type of one JSON schema, with enum values spelled out and unions joined by `|`."""
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False)
    if "enum" in schema:
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            parts = [schema_type(s) for s in schema[key] if isinstance(s, dict)]
            return " | ".join(dict.fromkeys(parts)) or "any"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"list[{schema_type(schema['items'])}]"
    return str(kind) if kind else "any"


def parameter_lines(input_schema: dict[str, Any], required: set[str]) -> list[str]:
    """One line per parameter: `name: type — description`, `name?` when it may be left out."""
    lines = []
    for name, prop in (input_schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        mark = "" if name in required else "?"
        about = str(prop.get("description") or "").strip()
        lines.append(f"{name}{mark}: {schema_type(prop)}" + (f" — {about}" if about else ""))
    return lines
