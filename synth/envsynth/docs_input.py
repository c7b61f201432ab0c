"""Tool documents in four formats, normalised into one `ToolDoc` list.

Accepted inputs: OpenAI function-calling JSON (a list of `{"type": "function", "function": {...}}`
or bare `{name, description, parameters}`), an MCP `tools/list` result (`{"tools": [...]}` with
`inputSchema`), an OpenAPI 3 document (JSON, or YAML when pyyaml is installed; one tool per
operation, named by `operationId`), and markdown (one `## tool_name` section per tool with a
`Parameters:` bullet list, see `parse_markdown`; or a README's `Tools` heading listing the tools
as items with `Input:` sub-bullets, as the reference MCP servers write theirs,
`parse_markdown_tool_list`). A directory is read file by file and merged. The
pipeline compares the generated env against exactly these docs, so every format must yield the same
three things: name, description, parameters JSON schema.

A live MCP server's list (`introspect_mcp`) is read under bounds, since the URL is anyone's
server: connecting takes at most `CONNECT_TIMEOUT_S`, every read of the socket at most
`READ_TIMEOUT_S`, and the whole exchange (initialize, every `tools/list` page) at most
`DOCUMENT_TIMEOUT_S` and `MAX_DOCUMENT_BYTES` of response bodies, whatever the server sends: a
server that sent keep-alive bytes forever held `synth env URL` for ever.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from envforge.server import env_file, read_env_text

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object")


class DocsError(ValueError):
    """The documents cannot be read as any supported format, or a tool is ill-formed."""


class ToolDoc(BaseModel):
    """One documented tool: the surface the generated env must implement exactly."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @field_validator("name")
    @classmethod
    def _valid(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"tool name {v!r} is not a Python identifier")
        return v

    @property
    def properties(self) -> dict[str, dict[str, Any]]:
        return dict(self.parameters.get("properties") or {})

    @property
    def required(self) -> list[str]:
        return list(self.parameters.get("required") or [])


def _object_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    schema = dict(schema or {})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


def parse_openai(data: Any) -> list[ToolDoc]:
    items = data.get("tools", data.get("functions")) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise DocsError("OpenAI tools must be a JSON list")
    out = []
    for item in items:
        fn = item.get("function", item) if isinstance(item, dict) else None
        if not isinstance(fn, dict) or "name" not in fn:
            raise DocsError(f"not an OpenAI function schema: {str(item)[:80]}")
        out.append(
            ToolDoc(
                name=fn["name"],
                description=fn.get("description", ""),
                parameters=_object_schema(fn.get("parameters")),
            )
        )
    return out


def parse_mcp(data: Any) -> list[ToolDoc]:
    items = data.get("result", data).get("tools") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise DocsError("an MCP tools/list result needs a 'tools' list")
    return [
        ToolDoc(
            name=t["name"],
            description=t.get("description") or "",
            parameters=_object_schema(t.get("inputSchema") or t.get("input_schema")),
        )
        for t in items
    ]


MAX_REF_HOPS = 20
"""Most `$ref`s followed in a row from a schema to what it finally names: a real spec's deepest
chain is a handful; a longer one is refused rather than followed (each hop may fan out)."""
MAX_SCHEMA_DEPTH = 200
"""Deepest nesting of the inlined schema (objects and lists): far beyond a real spec's, and well
inside Python's recursion limit, so a hostile document fails in one line, not a traceback."""
MAX_RESOLVED_NODES = 500_000
"""Most values the inlined schemas of one document may hold: a few refs that each name another
twice ("billion laughs") would otherwise expand exponentially within `MAX_REF_HOPS`."""


class _Resolver:
    """Inline local `$ref`s (`#/components/...`), so each tool schema stands alone.

    The bound that matters is hops, the refs followed along one path (`MAX_REF_HOPS`), not how
    deep the schema nests: real specs (OpenAI's) nest objects in arrays in objects twenty levels
    down through two or three refs, and counting every level refused them. A ref already on the
    path is a cycle and refused by name; nesting and the total size have their own bounds."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.nodes = 0

    def target(self, ref: str) -> Any:
        node: Any = self.doc
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise DocsError(f"OpenAPI $ref {ref!r} names nothing in the document")
        return node

    def __call__(self, schema: Any, path: tuple[str, ...] = (), depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > MAX_RESOLVED_NODES:
            raise DocsError(
                f"OpenAPI $refs expand past {MAX_RESOLVED_NODES:,} values (refs naming refs many times)"
            )
        if depth > MAX_SCHEMA_DEPTH:
            raise DocsError(f"an OpenAPI schema nests more than {MAX_SCHEMA_DEPTH} levels deep")
        if isinstance(schema, dict):
            ref = schema.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/"):
                if ref in path:
                    raise DocsError(
                        f"OpenAPI $ref {ref!r} refers to itself (a cycle: {' -> '.join((*path, ref))})"
                    )
                if len(path) >= MAX_REF_HOPS:
                    chain = " -> ".join(path[:3])
                    raise DocsError(f"OpenAPI $ref chain is longer than {MAX_REF_HOPS} hops ({chain} -> ...)")
                return self(self.target(ref), (*path, ref), depth)
            return {k: self(v, path, depth + 1) for k, v in schema.items()}
        if isinstance(schema, list):
            return [self(v, path, depth + 1) for v in schema]
        return schema


def _merged(schema: Any) -> dict[str, Any]:
    """A request body's object with its `allOf` parts folded in: their properties and required
    names are the body's (Box's sign request is a base schema and its own fields in `allOf`; read
    without them, the tool required `signers` and had no parameters)."""
    if not isinstance(schema, dict):
        return {}
    out = {k: v for k, v in schema.items() if k != "allOf"}
    props = dict(out.get("properties") or {})
    required = list(out.get("required") or [])
    for part in schema.get("allOf") or []:
        part = _merged(part)
        props.update(part.get("properties") or {})
        required += [r for r in part.get("required") or [] if r not in required]
    if props:
        out["properties"] = props
    if required:
        out["required"] = required
    return out


def parse_openapi(doc: dict[str, Any]) -> list[ToolDoc]:
    """One tool per operation: path/query parameters and JSON body properties become its parameters."""
    out = []
    _resolve = _Resolver(doc)
    for path, ops in (doc.get("paths") or {}).items():
        shared = ops.get("parameters", [])
        for method, op in ops.items():
            if method not in ("get", "post", "put", "patch", "delete") or not isinstance(op, dict):
                continue
            name = op.get("operationId")
            if not name:
                raise DocsError(f"{method.upper()} {path} has no operationId (it names the tool)")
            props: dict[str, Any] = {}
            required: list[str] = []
            for p in [*shared, *op.get("parameters", [])]:
                p = _resolve(p)
                schema = dict(p.get("schema") or {"type": "string"})
                if p.get("description"):
                    schema["description"] = p["description"]
                props[p["name"]] = schema
                if p.get("required"):
                    required.append(p["name"])
            body = ((op.get("requestBody") or {}).get("content") or {}).get("application/json")
            if body:
                schema = _merged(_resolve(body.get("schema") or {}))
                props.update(schema.get("properties") or {})
                required.extend(schema.get("required") or [])
            params: dict[str, Any] = {"type": "object", "properties": props}
            if required:
                params["required"] = required
            desc = " ".join(x for x in (op.get("summary"), op.get("description")) if x)
            out.append(ToolDoc(name=name, description=desc, parameters=params))
    if not out:
        raise DocsError("the OpenAPI document has no operations")
    return out


_HEADING = re.compile(r"^##\s+`?([A-Za-z_][A-Za-z0-9_]*)`?\s*$")
_PARAM = re.compile(
    r"^\s*[-*]\s+`?(?P<name>[A-Za-z_]\w*)`?\s*\((?P<meta>[^)]*)\)\s*(?::|—|-)?\s*(?P<desc>.*)$"
)
_ENUM = re.compile(r"one of\s*:?\s*(?P<vals>.+?)(?:\.\s|\.$|$)", re.IGNORECASE)


_TOOLS_HEADING = re.compile(r"^#{2,4}\s+(?:available\s+)?tools\s*$", re.IGNORECASE)
_ANY_HEADING = re.compile(r"^(#{1,6})\s")
_LIST_TOOL = re.compile(r"^(?:\d+\.|[-*])\s+(?:`(?P<a>[A-Za-z_]\w*)`|\*\*(?P<b>[A-Za-z_]\w*)\*\*)\s*$")
_LIST_INPUT = re.compile(r"^(?P<kind>required\s+|optional\s+)?inputs?\s*:\s*(?P<rest>.*)$", re.IGNORECASE)
_LIST_PARAM = re.compile(r"^`(?P<name>[A-Za-z_]\w*)`\s*\((?P<meta>[^)]*)\)\s*(?::\s*(?P<desc>.*))?$")


def _list_param(text: str) -> tuple[str, dict[str, Any], bool] | None:
    """A parameter bullet, ``name`` in backticks, then ``(type[, optional]): description``:
    (name, schema, required), else None."""
    m = _LIST_PARAM.match(text.strip())
    if not m:
        return None
    meta = [x.strip().lower() for x in m.group("meta").split(",")]
    kind = meta[0].split("|")[0].strip()
    schema: dict[str, Any]
    if kind.endswith("[]") or kind.startswith("array"):
        item = kind[:-2] if kind.endswith("[]") else kind.removeprefix("array").strip()
        item = item.removeprefix("of").strip()
        item = item.rstrip("s") if item.rstrip("s") in JSON_TYPES else item
        schema = {"type": "array", "items": {"type": item if item in JSON_TYPES else "string"}}
    else:
        schema = {"type": kind if kind in JSON_TYPES else "string"}
    if m.group("desc"):
        schema["description"] = m.group("desc").strip()
    return m.group("name"), schema, "optional" not in meta


def _add_param(tool: dict[str, Any], param: tuple[str, dict[str, Any], bool], optional: bool) -> None:
    name, schema, required = param
    tool["props"][name] = schema
    if required and not optional:
        tool["required"].append(name)


def parse_markdown_tool_list(text: str) -> list[ToolDoc]:
    """The tool list of a README, as the reference MCP servers write theirs: under a ``Tools``
    heading, one item per tool (``1. `name``` or ``- **name**``), its sub-bullets the description
    and an ``Input:`` / ``Inputs:`` (or ``Required inputs:`` / ``Optional inputs:``) bullet naming
    the parameters (inline, or as sub-bullets
    ``- `name` (type, optional): description``; deeper bullets, the fields of an object, are left
    to the description of their parameter). Empty when the text has no such list."""
    out: list[dict[str, Any]] = []
    level = 0
    current: dict[str, Any] | None = None
    input_indent: int | None = None
    optional = False
    for line in text.splitlines():
        heading = _ANY_HEADING.match(line)
        if heading:
            if level and len(heading.group(1)) <= level:
                level, current = 0, None
            if _TOOLS_HEADING.match(line):
                level, current = len(heading.group(1)), None
            continue
        if not level or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        item = _LIST_TOOL.match(line) if indent == 0 else None
        if item:
            current = {"name": item.group("a") or item.group("b"), "desc": [], "props": {}, "required": []}
            out.append(current)
            input_indent = None
            continue
        bullet = line.strip()
        if current is None or not bullet.startswith(("- ", "* ")):
            continue
        bullet = bullet[2:].strip()
        if input_indent is not None and indent > input_indent:
            param = _list_param(bullet) if indent <= input_indent + 2 else None
            if param:
                _add_param(current, param, optional)
            continue
        input_indent = None
        inputs = _LIST_INPUT.match(bullet)
        if inputs:
            input_indent = indent
            optional = (inputs.group("kind") or "").strip().lower() == "optional"
            param = _list_param(inputs.group("rest")) if inputs.group("rest") else None
            if param:
                _add_param(current, param, optional)
        else:
            current["desc"].append(bullet)
    docs = []
    for c in out:
        params: dict[str, Any] = {"type": "object", "properties": c["props"]}
        if c["required"]:
            params["required"] = c["required"]
        docs.append(ToolDoc(name=c["name"], description=" ".join(c["desc"]), parameters=params))
    return docs


def parse_markdown(text: str) -> list[ToolDoc]:
    """Markdown docs: `## tool_name`, a description, then `Parameters:` bullets.

    A bullet reads ``- name (type, required): description``; ``type`` is a JSON type (``array of
    string`` for lists), ``optional`` may replace ``required``, and ``one of: a, b, c`` in the
    description makes an enum. Free text outside this shape is kept as description only.
    A README whose ``Tools`` heading lists the tools as items is read by
    `parse_markdown_tool_list` instead: there, ``## Overview`` or ``## Installation`` are sections,
    not tools.
    """
    listed = parse_markdown_tool_list(text)
    if listed:
        return listed
    out: list[ToolDoc] = []
    current: dict[str, Any] | None = None
    in_params = False
    for line in text.splitlines():
        m = _HEADING.match(line)
        if m:
            current = {"name": m.group(1), "desc": [], "props": {}, "required": []}
            out.append(current)  # type: ignore[arg-type]
            in_params = False
            continue
        if current is None:
            continue
        if line.strip().lower().rstrip(":") in ("parameters", "**parameters**", "### parameters"):
            in_params = True
            continue
        p = _PARAM.match(line) if in_params else None
        if p:
            meta = [x.strip().lower() for x in p.group("meta").split(",")]
            kind = meta[0] if meta else "string"
            schema: dict[str, Any]
            if kind.startswith("array"):
                item = kind.split("of")[-1].strip() if "of" in kind else "string"
                schema = {"type": "array", "items": {"type": item if item in JSON_TYPES else "string"}}
            else:
                schema = {"type": kind if kind in JSON_TYPES else "string"}
            desc = p.group("desc").strip()
            e = _ENUM.search(desc)
            if e and schema["type"] == "string":
                schema["enum"] = [v.strip(" `'\"") for v in e.group("vals").split(",") if v.strip(" `'\"")]
            if desc:
                schema["description"] = desc
            current["props"][p.group("name")] = schema
            if "required" in meta:
                current["required"].append(p.group("name"))
        elif not in_params and line.strip():
            current["desc"].append(line.strip())
    docs = []
    for c in out:
        params: dict[str, Any] = {"type": "object", "properties": c["props"]}  # type: ignore[index]
        if c["required"]:  # type: ignore[index]
            params["required"] = c["required"]  # type: ignore[index]
        docs.append(ToolDoc(name=c["name"], description=" ".join(c["desc"]), parameters=params))  # type: ignore[index]
    if not docs:
        raise DocsError("no '## tool_name' sections found in the markdown")
    return docs


def parse_data(data: Any) -> list[ToolDoc]:
    """Detect the JSON shape: OpenAPI, MCP tools/list, or OpenAI function list."""
    if isinstance(data, dict) and "openapi" in data:
        return parse_openapi(data)
    if isinstance(data, dict) and ("tools" in data or "result" in data) and _looks_mcp(data):
        return parse_mcp(data)
    return parse_openai(data)


def _looks_mcp(data: dict[str, Any]) -> bool:
    tools = data.get("result", data).get("tools")
    return isinstance(tools, list) and all(isinstance(t, dict) and "function" not in t for t in tools)


def load_docs_file(path: Path, text: str | None = None) -> list[ToolDoc]:
    """The tools documented in one file, by its suffix (`text`: its contents, already read)."""
    if text is None:
        text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    if suffix in (".md", ".markdown", ".txt"):
        return parse_markdown(text)
    if suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:  # pragma: no cover - pyyaml is optional
            raise DocsError(f"{path}: YAML needs pyyaml installed") from exc
        return parse_data(yaml.safe_load(text))
    try:
        return parse_data(json.loads(text))
    except json.JSONDecodeError as exc:
        raise DocsError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc


DOC_SUFFIXES = (".json", ".yaml", ".yml", ".md", ".markdown")


def load_docs(path: str | Path) -> list[ToolDoc]:
    """Every tool documented at `path` (a file, or a folder of files merged), names unique."""
    path = Path(path)
    if path.is_dir():  # a docs/ folder of an env: each file read as an env file is (envfiles)
        names = sorted(p.name for p in path.iterdir() if p.suffix.lower() in DOC_SUFFIXES)
        files: list[tuple[Path, str | None]] = [(path / name, read_env_text(path, name)) for name in names]
    else:
        files = [(path, None)]
    if not files:
        raise DocsError(f"{path}: no tool documents ({', '.join(DOC_SUFFIXES)})")
    docs: dict[str, ToolDoc] = {}
    for f, text in files:
        for d in load_docs_file(f, text):
            if d.name in docs:
                raise DocsError(f"{f}: tool {d.name!r} is documented twice")
            docs[d.name] = d
    return list(docs.values())


def load_doc_set(docs_dir: str | Path, src: str | Path) -> list[ToolDoc]:
    """`load_docs(src)` for one doc set of `synth envs DOCS_DIR`, whose children are data as an env
    folder's files are: `src` (a child, or its `docs/`) must lie inside DOCS_DIR's real path, so a
    child or a `docs` that is a link to a host folder does not send that folder to the model."""
    docs_dir = Path(docs_dir)
    try:
        env_file(docs_dir, os.path.relpath(src, docs_dir))
    except OSError:
        raise DocsError(f"{src}: leads out of {docs_dir} (a link); refused") from None
    return load_docs(src)


CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
DOCUMENT_TIMEOUT_S = 60.0
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
_BOUNDS = (
    f" (connect at most {CONNECT_TIMEOUT_S:g} s, each read at most {READ_TIMEOUT_S:g} s, "
    f"the whole list at most {DOCUMENT_TIMEOUT_S:g} s and {MAX_DOCUMENT_BYTES:,} bytes)"
)


class _ByteCap:
    """Counts the response bytes of one introspection and stops the stream past the cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.seen = 0
        self.exceeded = False

    def count(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        if self.seen > self.cap:
            self.exceeded = True
            raise DocsError(f"the server sent more than {self.cap:,} bytes")


def _capped_client(cap: _ByteCap) -> Any:
    """An HTTP client with connect and per-read timeouts whose response bodies count against `cap`."""
    import httpx2

    class CappedStream(httpx2.AsyncByteStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self.inner:
                cap.count(chunk)
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class CappedTransport(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request: Any) -> Any:
            response = await self.inner.handle_async_request(request)
            response.stream = CappedStream(response.stream)
            return response

        async def aclose(self) -> None:
            await self.inner.aclose()

    timeout = httpx2.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    return httpx2.AsyncClient(transport=CappedTransport(), timeout=timeout)


async def introspect_mcp(url: Any) -> list[ToolDoc]:
    """The tools a live MCP server lists (streamable HTTP URL, or an in-process server object).

    A URL is read under the bounds in the module docstring; past any of them, `DocsError` in one
    line naming the URL and the bound."""
    import anyio
    from mcp import Client

    if not isinstance(url, str):
        async with Client(url) as client:
            tools = (await client.list_tools()).tools
        return _docs_of(tools)
    from mcp.client.streamable_http import streamable_http_client

    cap = _ByteCap(MAX_DOCUMENT_BYTES)
    try:
        with anyio.fail_after(DOCUMENT_TIMEOUT_S):
            async with _capped_client(cap) as http:
                transport = streamable_http_client(url, http_client=http, max_sse_event_size=cap.cap)
                async with Client(transport, read_timeout_seconds=READ_TIMEOUT_S) as client:
                    tools = (await client.list_tools()).tools
    except DocsError as exc:
        raise DocsError(f"{url}: {exc}") from None
    except TimeoutError:
        raise DocsError(f"{url}: no complete tool list within {DOCUMENT_TIMEOUT_S:g} s{_BOUNDS}") from None
    except Exception as exc:  # the SDK's and httpx's errors, one line each
        if cap.exceeded:
            raise DocsError(f"{url}: the server sent more than {cap.cap:,} bytes") from None
        raise DocsError(f"{url}: {_one_line(exc)}{_BOUNDS}") from None
    return _docs_of(tools)


def _one_line(exc: BaseException) -> str:
    """An exception (an exception group's first leaf included) as one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _docs_of(tools: Any) -> list[ToolDoc]:
    return [
        ToolDoc(name=t.name, description=t.description or "", parameters=dict(t.input_schema)) for t in tools
    ]


def docs_json(docs: list[ToolDoc]) -> str:
    """The normalised docs as the model sees them (stable order, compact but readable)."""
    return json.dumps([d.model_dump() for d in docs], indent=1, ensure_ascii=False)
