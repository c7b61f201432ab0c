"""Environment synthesis: tool documents in, executable and quality-gated envforge envs out.

`docs_input` normalises the four document formats into `ToolDoc`s; `pipeline.synthesize_env` asks a
model for schema, tools, seed, policy and the policy's checkable rules, and accepts the result only
if every gate passes (static AST allowlist before anything is imported, load, deterministic probes,
the dual-agent LLM probe, the rules file as the verifier reads it, verified tasks, every task still
solvable keeping the rules), feeding failures back to the model for up to R repair rounds.

This is the subpackage's public surface: the CLI and tests import from here, never from its
modules (ruff's banned-api checks it). Names load on first use, so importing the package costs
nothing until one is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .docs_input import (
        DOC_SUFFIXES,
        MAX_REF_HOPS,
        DocsError,
        ToolDoc,
        introspect_mcp,
        load_doc_set,
        load_docs,
        parse_markdown,
        parse_openapi,
    )
    from .llm import (
        LiteLLMResponder,
        LLMError,
        ReplayResponder,
        Reply,
        Responder,
        ResumingResponder,
        Structured,
        answer_key,
        load_recordings,
        strip_fences,
    )
    from .paging import paging_prologue, with_paging_prologue
    from .pipeline import SynthSettings, rejected_dir, schema_as_kept, synthesize_env
    from .probes import probe_env, schema_problems
    from .prompts import JSON_SCHEMAS, RULES_FORMAT, repair_hints, table_facts
    from .report import GATES, SynthesisReport, read_report
    from .rules import gate_kept, gate_rules
    from .sandbox import SeedRunError, run_seed_generator
    from .seed_template import reference_problems, schema_tables, seed_skeleton
    from .skeleton import (
        left_placeholders,
        speakable,
        tools_skeleton,
        with_awaited_db_calls,
        with_declared_writes,
        with_documented_signatures,
        with_sqlite_placeholders,
    )
    from .splice import (
        function_source,
        problems_by_tool,
        same_function,
        splice_tool,
        static_problems_by_tool,
        tables_touched,
    )

# name -> module (inside this subpackage) that defines it, imported on first access
_LAZY = {
    "DOC_SUFFIXES": "docs_input",
    "MAX_REF_HOPS": "docs_input",
    "DocsError": "docs_input",
    "ToolDoc": "docs_input",
    "introspect_mcp": "docs_input",
    "load_doc_set": "docs_input",
    "load_docs": "docs_input",
    "parse_markdown": "docs_input",
    "parse_openapi": "docs_input",
    "answer_key": "llm",
    "schema_as_kept": "pipeline",
    "table_facts": "prompts",
    "schema_tables": "seed_template",
    "same_function": "splice",
    "LiteLLMResponder": "llm",
    "ReplayResponder": "llm",
    "ResumingResponder": "llm",
    "Responder": "llm",
    "load_recordings": "llm",
    "LLMError": "llm",
    "Reply": "llm",
    "Structured": "llm",
    "strip_fences": "llm",
    "JSON_SCHEMAS": "prompts",
    "RULES_FORMAT": "prompts",
    "repair_hints": "prompts",
    "SynthSettings": "pipeline",
    "rejected_dir": "pipeline",
    "synthesize_env": "pipeline",
    "probe_env": "probes",
    "schema_problems": "probes",
    "GATES": "report",
    "SynthesisReport": "report",
    "read_report": "report",
    "gate_kept": "rules",
    "gate_rules": "rules",
    "SeedRunError": "sandbox",
    "run_seed_generator": "sandbox",
    "speakable": "skeleton",
    "tools_skeleton": "skeleton",
    "with_documented_signatures": "skeleton",
    "with_declared_writes": "skeleton",
    "with_awaited_db_calls": "skeleton",
    "with_sqlite_placeholders": "skeleton",
    "left_placeholders": "skeleton",
    "paging_prologue": "paging",
    "with_paging_prologue": "paging",
    "seed_skeleton": "seed_template",
    "reference_problems": "seed_template",
    "function_source": "splice",
    "problems_by_tool": "splice",
    "splice_tool": "splice",
    "static_problems_by_tool": "splice",
    "tables_touched": "splice",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "DOC_SUFFIXES",
    "GATES",
    "JSON_SCHEMAS",
    "MAX_REF_HOPS",
    "RULES_FORMAT",
    "DocsError",
    "LLMError",
    "LiteLLMResponder",
    "ReplayResponder",
    "Reply",
    "Responder",
    "ResumingResponder",
    "SeedRunError",
    "Structured",
    "SynthSettings",
    "SynthesisReport",
    "ToolDoc",
    "answer_key",
    "function_source",
    "gate_kept",
    "gate_rules",
    "introspect_mcp",
    "left_placeholders",
    "load_doc_set",
    "load_docs",
    "load_recordings",
    "paging_prologue",
    "parse_markdown",
    "parse_openapi",
    "probe_env",
    "problems_by_tool",
    "read_report",
    "reference_problems",
    "rejected_dir",
    "repair_hints",
    "run_seed_generator",
    "same_function",
    "schema_as_kept",
    "schema_problems",
    "schema_tables",
    "seed_skeleton",
    "speakable",
    "splice_tool",
    "static_problems_by_tool",
    "strip_fences",
    "synthesize_env",
    "table_facts",
    "tables_touched",
    "tools_skeleton",
    "with_awaited_db_calls",
    "with_declared_writes",
    "with_documented_signatures",
    "with_paging_prologue",
    "with_sqlite_placeholders",
]
