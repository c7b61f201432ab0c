"""Markdown tool docs as real READMEs write them: a `Tools` heading whose items are the tools.

The reference MCP servers document their tools as ``1. `git_status``` or ``- **set**`` items with
``Input:`` sub-bullets. Read with only the ``## tool_name`` shape, such a README became tools
named after its sections (``Overview``, ``Installation``, ``Configuration``) with no parameters,
and `synth env` would have asked a model to build those. The READMEs here are the corpus's, whole.
"""

from __future__ import annotations

from envforge.synth.envsynth import load_docs, parse_markdown

from support.paths import ENVS, REPO

CORPUS = REPO / "benchmarks" / "envsynth_corpus"


def test_a_numbered_tool_list_is_read_and_the_readme_sections_are_not_tools() -> None:
    docs = {d.name: d for d in load_docs(CORPUS / "md_git" / "docs")}
    assert len(docs) == 12 and all(n.startswith("git_") for n in docs), sorted(docs)
    diff = docs["git_diff"]
    assert diff.description.startswith("Shows differences between branches or commits")
    assert set(diff.properties) == {"repo_path", "target", "context_lines"}
    assert diff.required == ["repo_path", "target"]
    assert diff.properties["context_lines"]["type"] == "number"
    assert docs["git_add"].properties["files"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": "Array of file paths to stage",
    }


def test_bold_items_inline_inputs_and_optional_ones() -> None:
    docs = {d.name: d for d in load_docs(CORPUS / "md_redis" / "docs")}
    assert sorted(docs) == ["delete", "get", "list", "set"]
    assert docs["set"].required == ["key", "value"] and "expireSeconds" in docs["set"].properties
    assert docs["get"].properties == {"key": {"type": "string", "description": "Redis key to retrieve"}}
    assert docs["list"].required == [] and docs["list"].properties["pattern"]["type"] == "string"


def test_required_and_optional_input_lists_and_object_fields_stay_in_their_parameter() -> None:
    text = """# Demo

## Tools

1. `post_message`
   - Post a message
   - Required inputs:
     - `channel_id` (string): The channel
   - Optional inputs:
     - `thread` (string): Reply in this thread

- **create_entities**
  - Create entities
  - Input: `entities` (array of objects)
    - Each object contains:
      - `name` (string): Entity identifier

## Usage

1. `not_a_tool`
"""
    docs = {d.name: d for d in parse_markdown(text)}
    assert sorted(docs) == ["create_entities", "post_message"]
    assert docs["post_message"].required == ["channel_id"]
    assert set(docs["post_message"].properties) == {"channel_id", "thread"}
    assert list(docs["create_entities"].properties) == ["entities"]
    assert docs["create_entities"].properties["entities"]["type"] == "array"


def test_envforges_own_markdown_shape_is_read_as_before() -> None:
    docs = load_docs(ENVS / "gym" / "docs")
    assert "get_member" in {d.name for d in docs}
    member = next(d for d in docs if d.name == "get_member")
    assert member.required == ["member_id"]
