"""Environment synthesis: tool documents in, executable and quality-gated envforge envs out.

`docs_input` normalises the four document formats into `ToolDoc`s; `pipeline.synthesize_env` asks a
model for schema, tools, seed and policy, and accepts the result only if every gate in `gates`
passes (static AST allowlist before anything is imported, load, deterministic probes, the dual-agent
LLM probe, verified tasks), feeding failures back to the model for up to R repair rounds.
"""
