"""Property-based fuzz over every tool of every bundled env (and the bank fixture).

Wrong types, missing and extra fields and oversized strings must be refused with `isError`;
SQL metacharacters and arbitrary unicode must never corrupt state; after any call the state is
unchanged unless a write tool reported success, and the MCP server still answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client

from envforge.server import EPISODE_META_KEY, MAX_STRING_CHARS, Fleet, load_env

from support.paths import BANK_DIR, bundled_env_dirs

SQL_NASTIES = ["' OR '1'='1", '"; DROP TABLE x; --', "%_\\", "NULL", "0x00", "\x00", "'); DELETE FROM t; --"]
MUST_FAIL = ("wrong_type", "missing", "extra", "huge")

_CASES = [(d, name) for d in [BANK_DIR, *bundled_env_dirs()] for name in load_env(d).tools]
_FLEETS: dict[Path, Fleet] = {}


def _fleet(env_dir: Path) -> Fleet:
    if env_dir not in _FLEETS:
        _FLEETS[env_dir] = Fleet([load_env(env_dir)], max_episodes=64)
    return _FLEETS[env_dir]


def _value(schema: dict[str, Any], text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"] or schema["anyOf"]
        return _value(options[0], text)
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(-(2**40), 2**40)
    if kind == "number":
        return st.floats(-1e9, 1e9, allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(_value(schema.get("items", {"type": "string"}), text), max_size=4)
    if kind == "object":
        return st.dictionaries(st.text(max_size=5), st.integers(), max_size=2)
    return text


def _wrong(schema: dict[str, Any]) -> Any:
    return 12345 if schema.get("type") == "object" else {"nested": [1, "x"]}


@st.composite
def fuzzed_call(draw: st.DrawFn, input_schema: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    props: dict[str, dict[str, Any]] = input_schema.get("properties", {})
    required = input_schema.get("required", [])
    kinds = ["metachar", "unicode", "extra", "huge"]
    if props:
        kinds.append("wrong_type")
    if required:
        kinds.append("missing")
    kind = draw(st.sampled_from(kinds))
    text = {
        "metachar": st.sampled_from(SQL_NASTIES),
        "unicode": st.text(min_size=1, max_size=30),
    }.get(kind, st.sampled_from(["x", "1", "A-1"]))
    args = {name: draw(_value(schema, text)) for name, schema in props.items()}
    if kind == "wrong_type":
        name = draw(st.sampled_from(sorted(props)))
        args[name] = _wrong(props[name])
    elif kind == "missing":
        del args[draw(st.sampled_from(sorted(required)))]
    elif kind == "extra":
        args[draw(st.sampled_from(["zzz_extra", "__proto__", "; DROP"]))] = draw(st.integers())
    elif kind == "huge":
        big = "A" * (MAX_STRING_CHARS + 1)
        strings = [n for n, s in props.items() if s.get("type") == "string"]
        if strings:
            args[draw(st.sampled_from(strings))] = big
        else:
            args["zzz_huge"] = big  # no string parameter: an oversized extra must still be refused
    return kind, args


@pytest.mark.parametrize(("env_dir", "tool_name"), _CASES, ids=[f"{d.name}.{t}" for d, t in _CASES])
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
async def test_fuzzed_calls_fail_cleanly_and_keep_state(
    env_dir: Path, tool_name: str, data: st.DataObject
) -> None:
    fleet = _fleet(env_dir)
    env = next(iter(fleet.envs.values()))
    spec = env.tools[tool_name]
    kind, args = data.draw(fuzzed_call(spec.input_schema), label="call")
    episode = await fleet.create_episode(env.name)
    try:
        before = (await fleet.export(episode.id))[1]
        async with Client(fleet.mcp(env.name).server) as client:
            result = await client.call_tool(tool_name, args, meta={EPISODE_META_KEY: episode.id})
            text = result.content[0].text
            if kind in MUST_FAIL:
                assert result.is_error, f"{kind} call was accepted: {json.dumps(args)[:200]} -> {text[:200]}"
            after = (await fleet.export(episode.id))[1]
            if result.is_error or spec.read_only:
                assert after == before, f"state changed by {'a failed' if result.is_error else 'a read'} call"
            assert text if result.is_error else True
            assert (await client.list_tools()).tools  # the server still answers
    finally:
        await fleet.close_episode(episode.id)
