"""Tool calls in every form small models write them, and tools for models that have no tool format.

A server that parses its model's tool calls returns them as OpenAI `tool_calls`; many models and
servers do not, and the call arrives as text. The forms seen from the local models
(tests/fixtures/local_model_outputs.json keeps captured examples):

- Qwen/Hermes tags: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call
  (or, less often, a JSON list of calls in one block);
- a bare JSON object `{"name": ..., "arguments": {...}}` as the whole answer, often inside a
  ```json fence (Qwen2.5-Coder does this more often than it uses its tags);
- several such objects one after another, or a JSON list of them;
- prose around ```json blocks that each hold such calls ("Here are the calls: ...");
- a call followed by the result the model expects, `{"name": ...}{"capacity": 100}` (Qwen2.5-Coder
  in training): the leading calls are the calls, and what follows stays text, also when the
  token limit cut it off (`{"name": ...}\n{"message": "Expected`). A call written after
  such an invented result is not run: it would act on a value the env never returned;
- the arguments as a JSON string, `{"name": ..., "arguments": "{\"order_id\": \"O-1\"}"}` (the
  wire shape of OpenAI's own tool calls), decoded like any other arguments;
- doubled outer braces, `{{"name": ...}}` (or every brace doubled, as in a Python format string),
  and `// comments` after values, each repaired only when the repaired text is nothing but calls;
- one or two closing braces too many after the call (`{"name": ...}\n}`), dropped;
- a Python literal instead of JSON, `{'name': 'get_drug', 'arguments': {...}}`, read with
  `ast.literal_eval` (which evaluates no code) when the text is not JSON.

`extract_tool_calls` turns these into `ToolCall`s and leaves the rest of the text as the message's
content. A tagged block that is not a call (no JSON object, no function name) raises
`MalformedOutput`: the model tried to call a tool and failed, which is its own fault. Untagged
text that is not call-shaped stays text: a model may well answer with JSON for the user.

`tools_into_prompt` serves models whose chat template has no tool support (SmolLM2): the tools
go into the system prompt as one compact line each, earlier calls are written back in the tag
form the prompt asks for, and tool results become `<tool_response>` user turns.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from typing import Any

from .records import Message, ToolCall

__all__ = ["MalformedToolCall", "extract_tool_calls", "render_tools", "tools_into_prompt"]


class MalformedToolCall(ValueError):
    """A tagged tool call that is not one (bad JSON, no function name)."""


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCE = re.compile(r"^```(?:json|JSON)?\s*\n?(.*?)\n?\s*```$", re.S)
_FENCED_BLOCK = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)\n?[ \t]*```", re.S)
_DECODER = json.JSONDecoder()


def _arguments(raw: Any) -> dict[str, Any]:
    """Arguments as the orchestrator expects them: a dict, or `{"__unparsed__": ...}` (answered to
    the agent as a tool error) when they are not a JSON object."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw or "{}")
        except ValueError:
            return {"__unparsed__": raw}
        return value if isinstance(value, dict) else {"__unparsed__": raw}
    return {"__unparsed__": json.dumps(raw)}


def _call_shaped(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("name"), str) and bool(value["name"])


def _to_call(value: dict[str, Any], index: int) -> ToolCall:
    if isinstance(value.get("function"), dict) and "name" not in value:
        value = value["function"]  # an OpenAI-shaped call written out as text
    raw = value.get("arguments", value.get("parameters"))
    # Ids unique within a conversation: results are matched to calls by id.
    return ToolCall(
        id=f"call_{secrets.token_hex(6)}_{index}", name=str(value["name"]), arguments=_arguments(raw)
    )


def _json_spans(text: str) -> list[tuple[Any, int]] | None:
    """Every JSON value in `text` with where it starts, when the text is nothing but JSON values."""
    values: list[tuple[Any, int]] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,;":
            pos += 1
        if pos == len(text):
            return values
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except ValueError:
            return None
        values.append((value, pos))
        pos = end


def _json_values(text: str) -> list[Any] | None:
    """Every JSON value in `text`, when the text is nothing but JSON values; else None."""
    spans = _json_spans(text)
    return None if spans is None else [value for value, _ in spans]


_MOST_LITERAL_CHARS = 20_000
_MOST_STRAY_CLOSERS = 2


def _python_literal(text: str) -> list[Any] | None:
    """The values of a Python literal (a dict, or several separated by commas) that JSON could have
    written; None for anything else. `ast.literal_eval` parses literals only: no name is looked up
    and no code runs."""
    if not text.startswith(("{", "[")) or len(text) > _MOST_LITERAL_CHARS:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    values = list(value) if isinstance(value, tuple) else [value]
    try:  # sets, bytes, tuples and the like are not JSON: not a call the env could take
        normal = json.loads(json.dumps(values))
    except (TypeError, ValueError):
        return None
    return normal if normal == values else None


def _unfenced(text: str) -> str:
    match = _FENCE.match(text.strip())
    return match.group(1) if match else text


def _is_call(value: Any) -> bool:
    return isinstance(value, dict) and (_call_shaped(value) or _call_shaped(value.get("function")))


def _calls_in(value: Any) -> list[dict[str, Any]] | None:
    """The calls one JSON value holds: a call, or a non-empty list of calls; None otherwise."""
    items = value if isinstance(value, list) else [value]
    return items if items and all(_is_call(v) for v in items) else None


_LINE_COMMENT = re.compile(r'("(?:[^"\\\n]|\\.)*")|[ \t]*//[^\n]*')


def _repairs(text: str) -> list[str]:
    """`text` rewritten the ways small models miswrite JSON calls: doubled braces (the outer pair,
    or every one), `// comments` after values. Each is taken only if it then reads as calls."""
    out: list[str] = []
    if text.startswith("{{") and text.endswith("}}"):
        out += [text[1:-1], text.replace("{{", "{").replace("}}", "}")]
    if "//" in text:
        out += [_LINE_COMMENT.sub(lambda m: m.group(1) or "", t) for t in [text, *out]]
    return out


def _leading_calls(text: str) -> tuple[list[dict[str, Any]], str] | None:
    """(the calls, the rest) when `text` opens with complete calls and the rest is one JSON value
    the token limit cut off (`{"name": ...}\n{"message": "Expec`): the result the model was
    inventing, text; None otherwise."""
    calls: list[dict[str, Any]] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,;":
            pos += 1
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except ValueError:
            break
        found = _calls_in(value)
        if found is None:
            return None
        calls += found
        pos = end
    rest = text[pos:]
    return (calls, rest) if calls and rest.startswith(("{", "[")) else None


def _untagged_calls(text: str) -> tuple[list[dict[str, Any]], str] | None:
    """(the calls, the text after them) when the text (fenced or not) opens with call-shaped JSON
    and holds nothing but JSON values; None otherwise.

    What follows the leading calls is the model writing the result it expects, and stays text.
    """
    written = _unfenced(text).strip()
    body, spans = written, _json_spans(written)
    for _ in range(_MOST_STRAY_CLOSERS):  # `{"name": ...}}` or `{...}\n}`: a closer too many
        if spans is not None or not body.endswith(("}", "]")):
            break
        body = body[:-1].rstrip()
        spans = _json_spans(body)
    if spans is None:
        for repaired in _repairs(written):
            fixed = _json_spans(repaired)
            per_value = [_calls_in(v) for v, _ in fixed or []]
            if per_value and None not in per_value:
                return [c for calls in per_value for c in calls or []], ""
        leading = _leading_calls(written)
        if leading is not None:
            return leading
    if spans is None:  # a Python literal: calls only, nothing after them
        literal = _python_literal(written)
        per_value = [_calls_in(v) for v in literal or []]
        if not per_value or None in per_value:
            return None
        return [c for calls in per_value for c in calls or []], ""
    calls: list[dict[str, Any]] = []
    for value, start in spans:
        found = _calls_in(value)
        if found is None:
            return (calls, body[start:].strip()) if calls else None
        calls += found
    return (calls, "") if calls else None


def _tagged_calls(body: str) -> list[dict[str, Any]]:
    """The calls in one `<tool_call>` block: an object, or several (one after another or as a JSON
    list), each call-shaped; anything else in a tagged block is a malformed call."""
    written = _unfenced(body).strip()
    for candidate in [written, *_repairs(written)]:
        values = _json_values(candidate)
        flat = [v for value in values or [] for v in (value if isinstance(value, list) else [value])]
        if flat and all(_is_call(v) for v in flat):
            return flat
    raise MalformedToolCall(f"a <tool_call> block that is not a call: {body[:160]!r}")


def parse_tool_calls(content: str) -> tuple[str | None, list[ToolCall]]:
    """(the text left for the user, the calls) found in a model's text answer."""
    if "<tool_call>" in content:
        calls = [c for m in _TAGGED.finditer(content) for c in _tagged_calls(m.group(1))]
        rest = _TAGGED.sub("", content).strip()
        return rest or None, [_to_call(c, i) for i, c in enumerate(calls)]
    untagged = _untagged_calls(content)
    if untagged is not None:
        calls, rest = untagged
        return rest or None, [_to_call(c, i) for i, c in enumerate(calls)]
    fenced = _fenced_calls(content)
    if fenced is not None:
        rest, calls = fenced
        return rest or None, [_to_call(c, i) for i, c in enumerate(calls)]
    return content, []


def _fenced_calls(content: str) -> tuple[str, list[dict[str, Any]]] | None:
    """Prose around ```json blocks that are all calls ("Here are the calls: ```json {...}``` ..."):
    the calls, and the prose as text. A block that is not call-shaped leaves it all text."""
    blocks = list(_FENCED_BLOCK.finditer(content))
    if not blocks:
        return None
    calls = []
    for block in blocks:
        found = _untagged_calls(block.group(1))
        if found is None or found[1]:  # a block with more than calls in it is not a call block
            return None
        calls += found[0]
    rest = _FENCED_BLOCK.sub("", content)
    # A fence cut off by the token limit is not a call either: dropped from the text.
    rest = rest.split("```", 1)[0].strip()
    return rest, calls


def extract_tool_calls(message: Message) -> Message:
    """`message` with the tool calls its text holds turned into `tool_calls` (unchanged when it
    already has structured calls or none are written in its text)."""
    if message.tool_calls or not message.content:
        return message
    text, calls = parse_tool_calls(message.content)
    if not calls:
        return message
    return message.model_copy(update={"content": text, "tool_calls": calls})


# --------------------------------------------------------------------------- tools in the prompt

_TYPE_NAMES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}


def _type_of(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "|".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return "|".join(_type_of(s) for s in schema["anyOf"] if s.get("type") != "null") or "any"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list[{_type_of(schema.get('items', {}))}]"
    return _TYPE_NAMES.get(str(kind), str(kind))


def render_tools(tools: list[dict[str, Any]]) -> str:
    """Each tool as one line, `name(param: type, optional?: type): first line of its description`."""
    lines = []
    for tool in tools:
        fn = tool.get("function", tool)
        params = fn.get("parameters") or {}
        required = set(params.get("required", []))
        signature = ", ".join(
            f"{name}{'' if name in required else '?'}: {_type_of(schema)}"
            for name, schema in (params.get("properties") or {}).items()
        )
        summary = (fn.get("description") or "").strip().splitlines()
        lines.append(f"- {fn['name']}({signature})" + (f": {summary[0]}" if summary else ""))
    return "\n".join(lines)


TOOLS_PROMPT = """# Tools
You can call these tools:
{tools}

To call a tool, answer with only this, and nothing else:
<tool_call>{{"name": "<tool name>", "arguments": {{<argument>: <value>}}}}</tool_call>
The tool's result comes back in <tool_response> tags. To talk to the user, answer in plain text."""


def _as_text_call(call: dict[str, Any]) -> str:
    fn = call.get("function", {})
    raw = fn.get("arguments") or "{}"
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        arguments = raw
    return "<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": arguments}) + "</tool_call>"


def tools_into_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation for a model without tool support: tools in the system prompt, calls and
    results as text in the form that prompt describes."""
    block = TOOLS_PROMPT.format(tools=render_tools(tools))
    out: list[dict[str, Any]] = []
    if not messages or messages[0].get("role") != "system":
        out.append({"role": "system", "content": block})
    for i, m in enumerate(messages):
        role = m.get("role")
        if i == 0 and role == "system":
            out.append({"role": "system", "content": f"{m.get('content') or ''}\n\n{block}".strip()})
        elif role == "assistant" and m.get("tool_calls"):
            said = [m.get("content") or "", *(_as_text_call(c) for c in m["tool_calls"])]
            out.append({"role": "assistant", "content": "\n".join(s for s in said if s)})
        elif role == "tool":
            out.append(
                {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
            )
        else:
            out.append({"role": role, "content": m.get("content") or ""})
    return out
